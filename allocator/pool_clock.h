// Internal: the pool's clock, in nanoseconds. The fence batch windows and the query back-offs
// (reuse.h: the pool's and the thread caches'; the shim's sweep gap in cuda_fences.cpp) read
// it on every allocation that finds fence work, which under the default policy is nearly every
// one, so its cost is part of each pair's.
//
// pool_clock_ns() reads the clock a test or the replay tool installed (set_pool_clock_for_testing,
// pool.h; cudapool_set_clock_for_testing in the shim's C API), else counter_clock_ns(): steady
// time, interpolated from the CPU's time-stamp counter where that is cheaper than steady_clock
// (one instruction against the vDSO's clock_gettime, which on virtual machines costs 25-50 ns),
// else steady_clock itself. The counter is used only when
// the CPU says it ticks at a constant rate in every power state (an invariant TSC, x86-64), and
// only after its rate has been measured against steady_clock over kCounterMeasureNs; until then, and on
// other CPUs, the clock is steady_clock.
//
// Nothing the pool decides for safety reads this clock: it times heuristics (when to record a
// fence, when to ask one again). A counter that jumps (a guest moved between hosts) only makes a
// batch close early or late; a reading behind the previous one counts as no time passed.
#pragma once
#include <cstdint>

namespace cudapool::detail {

std::int64_t pool_clock_ns();

// Steady time: the counter scaled once it is measured, else steady_clock.
std::int64_t counter_clock_ns();

// Whether counter_clock_ns() reads the time-stamp counter now (for tests); false before the rate
// is measured and wherever the counter is not used.
bool counter_clock_active();

// The rate is measured over this long: each end's reads lie within a few microseconds of each
// other (pool_clock.cpp, read_pair), so the rate is off by a few 1e-4 at most.
inline constexpr std::int64_t kCounterMeasureNs = 10'000'000;

// The scaling, exposed for its test: counter ticks since `tsc0` to nanoseconds since `ns0` at
// `mult` nanoseconds per tick in 32.32 fixed point. A counter behind tsc0 reads as ns0.
struct CounterScale {
  std::uint64_t tsc0 = 0;
  std::int64_t ns0 = 0;
  std::uint64_t mult = 0;
};
std::int64_t scale_counter(const CounterScale& s, std::uint64_t tsc);
// mult for `ns` nanoseconds over `ticks` ticks (0 when ticks is 0 or the rate does not fit).
std::uint64_t counter_mult(std::int64_t ns, std::uint64_t ticks);

}  // namespace cudapool::detail
