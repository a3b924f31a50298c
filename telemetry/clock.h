// Internal: the trace's time stamps. The hot path reads a raw counter (the x86 TSC when it is
// invariant, else CLOCK_MONOTONIC); the formatter converts counts to ns since the Unix epoch by
// interpolating between an anchor taken at open and one taken at format time. Reading the TSC
// costs about a third of clock_gettime, which matters when the whole hit path is ~50 ns.
#pragma once
#include <time.h>

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace cudapool::trace_detail {

inline std::int64_t clock_ns(clockid_t id) noexcept {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

class StampClock {
 public:
  // Decides the source (TSC only if the CPU says it is constant and non-stop) and takes the
  // first anchor. Reads /proc/cpuinfo: call at open, not on a hot path.
  void init();
  // A raw stamp. Async-signal-safe.
  std::uint64_t now() const noexcept {
#if defined(__x86_64__) || defined(__i386__)
    if (use_tsc_) return __rdtsc();
#endif
    return static_cast<std::uint64_t>(clock_ns(CLOCK_MONOTONIC));
  }

  // Converts stamps taken since init() to epoch ns. begin_batch() takes a fresh anchor; the
  // conversion is linear between the two anchors. Results never go backwards (clamped).
  void begin_batch() noexcept;
  std::int64_t to_epoch_ns(std::uint64_t stamp) noexcept;

 private:
  struct Anchor {
    std::uint64_t stamp = 0;
    std::int64_t mono_ns = 0;
  };
  Anchor anchor() const noexcept;

  bool use_tsc_ = false;
  Anchor a0_;
  std::int64_t real0_ns_ = 0;  // CLOCK_REALTIME at a0_
  double ns_per_stamp_ = 1.0;
  std::int64_t last_ns_ = 0;
};

}  // namespace cudapool::trace_detail
