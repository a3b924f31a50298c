// DevicePool::prefill, the warm start's growth: memory reserved ahead and free at once, with
// nothing of it counted as the program's (allocations, peaks, OOMs), and the program's later
// requests served from it without the upstream, for classic and expandable pools.
#include <gtest/gtest.h>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {

PoolOptions expandable() {
  PoolOptions o;
  o.expandable_segments = true;
  o.expandable_slack = 0;
  o.expandable_large_page = 0;  // 2 MiB pages in both ranges
  o.expandable_max_unit = 0;    // one physical unit per page
  return o;
}

struct Rig : PoolRig {
  explicit Rig(PoolOptions o, std::size_t capacity = 1 * GiB) : PoolRig(o, capacity, /*auto_fence=*/true) {
    if (o.expandable_segments) up.set_granularity(2 * MiB);
  }
};

void expect_nothing_counted_as_allocated(const Stats& s) {
  EXPECT_EQ(s.allocation[kAll].allocated, 0);
  EXPECT_EQ(s.allocated_bytes[kAll].peak, 0);
  EXPECT_EQ(s.active_bytes[kAll].peak, 0);
  EXPECT_EQ(s.requested_bytes[kAll].peak, 0);
  EXPECT_EQ(s.cache_misses, 0);
  EXPECT_EQ(s.num_ooms, 0);
}

}  // namespace

TEST(PoolPrefill, ReservesAheadAndCountsNothingAsAllocated) {
  for (const bool pages : {false, true}) {
    SCOPED_TRACE(pages ? "expandable" : "classic");
    Rig rig(pages ? expandable() : PoolOptions{});
    // The large pool: one 60 MiB growth; the small pool: two growths (pages: one 4 MiB run).
    ASSERT_EQ(rig.pool->prefill(60 * MiB, false, 0).status, AllocStatus::ok);
    ASSERT_EQ(rig.pool->prefill(pages ? 4 * MiB : kSmallSize, true, 0).status, AllocStatus::ok);
    if (!pages) {
      ASSERT_EQ(rig.pool->prefill(kSmallSize, true, 0).status, AllocStatus::ok);
    }
    Stats s = rig.pool->stats();
    EXPECT_EQ(s.reserved_bytes[kLargePool].current, static_cast<std::int64_t>(60 * MiB));
    EXPECT_EQ(s.reserved_bytes[kSmallPool].current, static_cast<std::int64_t>(4 * MiB));
    expect_nothing_counted_as_allocated(s);
    rig.expect_intact();

    // The program's requests up to what was reserved take no upstream call.
    const std::size_t calls = rig.up.allocate_calls() + rig.up.map_calls();
    std::vector<void*> held;
    for (std::size_t n : {20 * MiB, 20 * MiB, 20 * MiB}) held.push_back(rig.alloc(n));
    for (int i = 0; i < 6; ++i) held.push_back(rig.alloc(512 * KiB));
    EXPECT_EQ(rig.up.allocate_calls() + rig.up.map_calls(), calls);
    s = rig.pool->stats();
    EXPECT_EQ(s.allocated_bytes[kAll].peak, static_cast<std::int64_t>(60 * MiB + 3 * MiB));
    EXPECT_EQ(s.cache_misses, 0);
    for (void* p : held) EXPECT_EQ(rig.pool->free_on_stream(p, 0), FreeStatus::ok);
    rig.expect_intact();
  }
}

// A prefill the limit or the upstream refuses says who refused and what it asked for, and is no
// out-of-memory of the program's: no count, nothing released, no fence waited for.
TEST(PoolPrefill, ARefusalIsReportedNotCounted) {
  PoolOptions o;
  o.max_reserved = 50 * MiB;
  Rig rig(o);
  void* kept = rig.alloc(4 * MiB);  // a cached segment the refusal must leave alone
  EXPECT_EQ(rig.pool->free_on_stream(kept, 0), FreeStatus::ok);
  const std::int64_t reserved = rig.pool->stats().reserved_bytes[kAll].current;
  AllocResult r = rig.pool->prefill(40 * MiB, false, 0);
  EXPECT_EQ(r.status, AllocStatus::out_of_memory);
  EXPECT_EQ(r.refusal, Refusal::limit);
  EXPECT_EQ(r.asked_bytes, 40 * MiB);
  Stats s = rig.pool->stats();
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.reserved_bytes[kAll].current, reserved);  // the cached segment stayed

  Rig dev(expandable(), 16 * MiB);  // the device holds 16 MiB
  r = dev.pool->prefill(64 * MiB, false, 0);
  EXPECT_EQ(r.status, AllocStatus::out_of_memory);
  EXPECT_EQ(r.refusal, Refusal::device);
  EXPECT_EQ(dev.pool->stats().num_ooms, 0);
  dev.expect_intact();
  rig.expect_intact();
}
