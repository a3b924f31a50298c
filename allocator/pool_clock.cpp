// The pool's clock (pool_clock.h): the injectable hook and the counter-based steady clock.
#include "allocator/pool_clock.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "allocator/pool.h"
#include "allocator/stats_ledger.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace cudapool {

namespace detail {

namespace {

#if defined(__x86_64__)
std::uint64_t read_counter() { return __rdtsc(); }

// CPUID leaf 0x80000007, EDX bit 8: the counter runs at a constant rate in every P-, C- and
// T-state. Without it the rate follows the core's frequency and a scale measured once is wrong.
bool invariant_counter() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, a, b, c, d);
  return (d & (1u << 8)) != 0;
}

// Whether 32 counter reads take less time than 32 steady_clock reads (the best of three tries,
// so a preemption in one try does not decide it). A hypervisor that traps the instruction makes
// it far dearer than the vDSO: then the counter is not used.
bool counter_is_cheaper() {
  constexpr int kReads = 32;
  // Neither read can be optimised away: rdtsc is a volatile instruction, steady_clock::now() a
  // call into the C library.
  std::int64_t best_counter = INT64_MAX, best_steady = INT64_MAX;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::int64_t t0 = now_ns();
    for (int i = 0; i < kReads; ++i) (void)read_counter();
    std::int64_t t1 = now_ns();
    best_counter = std::min(best_counter, t1 - t0);
    t0 = now_ns();
    for (int i = 0; i < kReads; ++i) (void)now_ns();
    t1 = now_ns();
    best_steady = std::min(best_steady, t1 - t0);
  }
  return best_counter < best_steady;
}
#else
std::uint64_t read_counter() { return 0; }
bool invariant_counter() { return false; }
bool counter_is_cheaper() { return false; }
#endif

// Both clocks at one moment: the counter read between two steady_clock reads, the tightest of a
// few tries, so that a preemption between the reads cannot skew the measured rate (a 1 ms
// preemption against the 10 ms measurement would be a 10 % error).
struct Pair {
  std::uint64_t tsc;
  std::int64_t ns;
};
Pair read_pair() {
  Pair best{0, 0};
  std::int64_t best_gap = INT64_MAX;
  for (int attempt = 0; attempt < 8 && best_gap > 2'000; ++attempt) {
    const std::int64_t before = now_ns();
    const std::uint64_t tsc = read_counter();
    const std::int64_t after = now_ns();
    if (after - before < best_gap) {
      best_gap = after - before;
      best = Pair{tsc, before + (after - before) / 2};
    }
  }
  return best;
}

// The first reading: where the measurement of the rate starts, and whether it may.
struct Start {
  Pair at;
  bool usable;
};
Start make_start() {
  const bool usable = invariant_counter() && counter_is_cheaper();
  return Start{read_pair(), usable};
}
const Start& start() {
  static const Start s = make_start();
  return s;
}

CounterScale g_scale_storage;
std::atomic<const CounterScale*> g_scale{nullptr};

// Measured once, by the first reading kCounterMeasureNs after the start.
void measure(const Start& st) {
  static std::once_flag once;
  std::call_once(once, [&st] {
    const Pair now = read_pair();
    const std::uint64_t mult = now.tsc > st.at.tsc ? counter_mult(now.ns - st.at.ns, now.tsc - st.at.tsc) : 0;
    if (mult == 0) return;  // the counter did not advance: stay on steady_clock
    g_scale_storage = CounterScale{now.tsc, now.ns, mult};
    g_scale.store(&g_scale_storage, std::memory_order_release);
  });
}

std::atomic<PoolClockFn> g_clock{&counter_clock_ns};

}  // namespace

std::uint64_t counter_mult(std::int64_t ns, std::uint64_t ticks) {
  if (ticks == 0 || ns <= 0) return 0;
  const unsigned __int128 mult = (static_cast<unsigned __int128>(ns) << 32) / ticks;
  return mult == 0 || mult > UINT64_MAX ? 0 : static_cast<std::uint64_t>(mult);
}

std::int64_t scale_counter(const CounterScale& s, std::uint64_t tsc) {
  if (tsc <= s.tsc0) return s.ns0;  // read on a core whose counter is a little behind
  const unsigned __int128 ns = (static_cast<unsigned __int128>(tsc - s.tsc0) * s.mult) >> 32;
  return s.ns0 + static_cast<std::int64_t>(ns);
}

std::int64_t counter_clock_ns() {
  if (const CounterScale* s = g_scale.load(std::memory_order_acquire)) return scale_counter(*s, read_counter());
  const std::int64_t now = now_ns();
  const Start& st = start();
  if (st.usable && now - st.at.ns >= kCounterMeasureNs) measure(st);
  return now;
}

bool counter_clock_active() { return g_scale.load(std::memory_order_acquire) != nullptr; }

std::int64_t pool_clock_ns() { return g_clock.load(std::memory_order_relaxed)(); }

}  // namespace detail

void set_pool_clock_for_testing(PoolClockFn clock) {
  detail::g_clock.store(clock != nullptr ? clock : &detail::counter_clock_ns, std::memory_order_relaxed);
}

}  // namespace cudapool
