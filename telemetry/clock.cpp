#include "telemetry/clock.h"

#include <cstdio>
#include <cstring>

namespace cudapool::trace_detail {
namespace {

bool cpu_has_invariant_tsc() {
#if defined(__x86_64__) || defined(__i386__)
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return false;
  char line[8192];
  bool constant = false, nonstop = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "flags", 5) != 0) continue;
    constant = std::strstr(line, " constant_tsc") != nullptr;
    nonstop = std::strstr(line, " nonstop_tsc") != nullptr;
    break;  // the first CPU's flags speak for all
  }
  std::fclose(f);
  return constant && nonstop;
#else
  return false;
#endif
}

}  // namespace

StampClock::Anchor StampClock::anchor() const noexcept {
  // Bracket the clock read with two stamps and use their midpoint: halves the skew.
  const std::uint64_t s1 = now();
  const std::int64_t mono = clock_ns(CLOCK_MONOTONIC);
  const std::uint64_t s2 = now();
  return Anchor{s1 + (s2 - s1) / 2, mono};
}

void StampClock::init() {
  use_tsc_ = cpu_has_invariant_tsc();
  a0_ = anchor();
  real0_ns_ = clock_ns(CLOCK_REALTIME) - (clock_ns(CLOCK_MONOTONIC) - a0_.mono_ns);
  ns_per_stamp_ = 1.0;
  last_ns_ = 0;
}

void StampClock::begin_batch() noexcept {
  if (!use_tsc_) return;  // stamps are already monotonic ns
  const Anchor a1 = anchor();
  const double dstamp = static_cast<double>(a1.stamp - a0_.stamp);
  const double dns = static_cast<double>(a1.mono_ns - a0_.mono_ns);
  // Every stamp being converted lies between the two anchors, so interpolating between them is
  // accurate to the anchors' own skew (tens of ns) however short the interval is.
  if (dstamp >= 1000 && dns > 0) ns_per_stamp_ = dns / dstamp;
}

std::int64_t StampClock::to_epoch_ns(std::uint64_t stamp) noexcept {
  std::int64_t since;
  if (use_tsc_) {
    // Stamps from before a0_ (cannot happen after init) would wrap; treat them as a0_.
    const std::uint64_t d = stamp >= a0_.stamp ? stamp - a0_.stamp : 0;
    since = static_cast<std::int64_t>(static_cast<double>(d) * ns_per_stamp_);
  } else {
    since = static_cast<std::int64_t>(stamp) - a0_.mono_ns;
  }
  std::int64_t ns = real0_ns_ + since;
  if (ns < last_ns_) ns = last_ns_;
  last_ns_ = ns;
  return ns;
}

}  // namespace cudapool::trace_detail
