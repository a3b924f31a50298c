// The pool's clock (allocator/pool_clock.h): the counter's scaling, and the clock against
// steady_clock once the counter's rate is measured.
#include "allocator/pool_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "allocator/pool.h"
#include "allocator/stats_ledger.h"  // now_ns: steady_clock
#include "tests/unit/pool_helpers.h"

namespace cudapool::detail {
namespace {

TEST(PoolClock, ScalingIsExactToANanosecond) {
  // A 3 GHz counter: a third of a nanosecond per tick.
  const std::uint64_t mult = counter_mult(1'000'000'000, 3'000'000'000ULL);
  ASSERT_NE(mult, 0u);
  const CounterScale s{1'000, 5'000'000'000, mult};
  EXPECT_LE(std::llabs(scale_counter(s, 1'000 + 3'000'000'000ULL) - 6'000'000'000), 1);
  EXPECT_LE(std::llabs(scale_counter(s, 1'000 + 3) - 5'000'000'001), 1);
  // A year of ticks: no overflow; off by the scale's truncation (2^-32 ns per tick) alone.
  const std::uint64_t year_ticks = 3'000'000'000ULL * 365 * 24 * 3600;
  const double year_ns = 365.0 * 24 * 3600 * 1e9;
  EXPECT_NEAR(static_cast<double>(scale_counter(s, 1'000 + year_ticks) - s.ns0), year_ns, year_ns * 1e-9);
  // A counter behind the start (another core, a little behind) reads as the start, not as a
  // time 2^64 ticks ahead.
  EXPECT_EQ(scale_counter(s, 999), s.ns0);
  EXPECT_EQ(scale_counter(s, 0), s.ns0);
}

TEST(PoolClock, RatesThatCannotBeScaledAreRefused) {
  EXPECT_EQ(counter_mult(1'000, 0), 0u);        // the counter did not move
  EXPECT_EQ(counter_mult(0, 1'000), 0u);        // steady time did not move
  EXPECT_EQ(counter_mult(-5, 1'000), 0u);       // or went back
  EXPECT_EQ(counter_mult(INT64_MAX, 1), 0u);    // > 2^32 ns per tick: does not fit 32.32
  EXPECT_EQ(counter_mult(1, UINT64_MAX), 0u);   // < 2^-32 ns per tick: rounds to nothing
  EXPECT_EQ(counter_mult(10, 10), 1ULL << 32);  // one nanosecond per tick
}

// Both clocks at one moment: the counter clock read between two steady_clock reads, again until
// no preemption split them (on a loaded machine a test thread can lose the CPU between reads).
struct Both {
  std::int64_t counter, steady;
};
Both read_both() {
  for (int attempt = 0;; ++attempt) {
    const std::int64_t before = now_ns();
    const std::int64_t counter = counter_clock_ns();
    const std::int64_t after = now_ns();
    if (after - before <= 20'000 || attempt == 1000) return Both{counter, before + (after - before) / 2};
  }
}

// Once the rate is measured (kCounterMeasureNs after the first reading), the clock advances as
// steady_clock does. Where the counter is not used the clock is steady_clock itself, and there is
// nothing to compare.
TEST(PoolClock, CounterClockKeepsStepWithSteadyClock) {
  const std::int64_t until = now_ns() + 3 * kCounterMeasureNs;
  while (!counter_clock_active() && now_ns() < until) {
    (void)counter_clock_ns();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!counter_clock_active())
    GTEST_SKIP() << "this CPU's time-stamp counter is not used (not invariant, not x86-64, or dearer than the vDSO)";
  for (int round = 0; round < 3; ++round) {
    const Both t0 = read_both();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const Both t1 = read_both();
    const double steady = static_cast<double>(t1.steady - t0.steady);
    const double counter = static_cast<double>(t1.counter - t0.counter);
    EXPECT_GE(steady, 20e6);
    // The rate's error (its reads are the tightest of several tries: a few microseconds over
    // 10 ms) and these reads' own gaps: 1 % and 100 us.
    EXPECT_NEAR(counter, steady, steady * 0.01 + 100e3) << "round " << round;
  }
  // Readings a test or the replay installs come first; nullptr gives the counter clock back.
  set_pool_clock_for_testing([] { return std::int64_t{42}; });
  EXPECT_EQ(pool_clock_ns(), 42);
  set_pool_clock_for_testing(nullptr);
  const std::int64_t c = pool_clock_ns(), s = now_ns();
  EXPECT_NEAR(static_cast<double>(c), static_cast<double>(s), 1e6);  // within a millisecond of steady time
  cudapool::testing::restore_pool_clock();  // the speed sweep's (tests/speed_sweep.sh), if one runs
}

}  // namespace
}  // namespace cudapool::detail
