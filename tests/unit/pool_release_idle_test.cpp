// DevicePool::release_idle(want): gives back at least `want` bytes of idle cached memory when the
// pool has them, the longest-cached first and not much more (whole segments, whole units), never
// a live block; pending memory only after its fence, and only when the idle memory is not enough.
#include <gtest/gtest.h>

#include <vector>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {

std::int64_t reserved(const PoolRig& rig) { return rig.pool->stats().reserved_bytes[kAll].current; }

// Classic segments: three 40 MiB blocks cached one after another (A first); asking for 30 MiB
// gives back A's segment alone, then 50 MiB gives back B's and C's; the live block stays.
TEST(PoolReleaseIdle, ClassicOldestSegmentsFirstAndNoMore) {
  PoolOptions o;
  o.free_sync = FreeSync::fenced;
  PoolRig rig(o, 80 * GiB, /*auto_fence=*/true);  // fences complete once recorded
  void* live = rig.alloc(40 * MiB);
  void* a = rig.alloc(40 * MiB);
  void* b = rig.alloc(40 * MiB);
  void* c = rig.alloc(40 * MiB);
  // Each free's batch gets its fence at the next allocation past the window, and its block is
  // cached from then on: A first, then B, then C.
  for (void* p : {a, b, c}) {
    rig.pool->free(p);
    rig.advance_clock();
    (void)rig.alloc(1000);
    rig.advance_clock();
    (void)rig.alloc(1000);
  }
  const std::int64_t before = reserved(rig);
  EXPECT_EQ(rig.pool->release_idle(0), 0u);
  EXPECT_EQ(rig.pool->release_idle(30 * MiB), 40 * MiB);
  EXPECT_EQ(reserved(rig), before - static_cast<std::int64_t>(40 * MiB));
  EXPECT_FALSE(rig.pool->owns(a)) << "the oldest cached segment went";
  EXPECT_TRUE(rig.pool->owns(b));
  EXPECT_TRUE(rig.pool->owns(c));
  EXPECT_EQ(rig.pool->release_idle(50 * MiB), 80 * MiB);
  EXPECT_TRUE(rig.pool->owns(live));
  EXPECT_EQ(rig.pool->release_idle(1 * GiB), 0u) << "nothing idle is left but the small segment's split block";
  ASSERT_TRUE(rig.pool->address_info(live).has_value());
  rig.expect_intact();
}

// Expandable segments: one 96 MiB free block in 16 MiB units; asking for 20 MiB unmaps two
// units (32 MiB), the rest stays mapped and serves the next request without a driver call.
TEST(PoolReleaseIdle, ExpandableWholeUnitsAsFewAsCoverTheRequest) {
  PoolOptions o;
  o.expandable_segments = true;
  o.expandable_slack = 0;
  o.expandable_max_unit = 16 * MiB;
  o.expandable_unit_share = 0;  // every unit 16 MiB, however small the pool
  o.free_sync = FreeSync::fenced;
  PoolRig rig(o, 1 * GiB, /*auto_fence=*/true);
  rig.up.set_granularity(2 * MiB);
  void* p = rig.alloc(96 * MiB);
  rig.pool->free(p);
  rig.advance_clock();  // release_idle records the free's fence (complete at once): the block is idle
  ASSERT_EQ(reserved(rig), static_cast<std::int64_t>(96 * MiB));
  EXPECT_EQ(rig.pool->release_idle(20 * MiB), 32 * MiB);
  EXPECT_EQ(reserved(rig), static_cast<std::int64_t>(64 * MiB));
  EXPECT_EQ(rig.up.bad_calls(), 0u);
  const std::int64_t maps = rig.pool->stats().num_device_map;
  (void)rig.alloc(60 * MiB);
  EXPECT_EQ(rig.pool->stats().num_device_map, maps) << "what was kept serves 60 MiB as it is";
  EXPECT_EQ(reserved(rig), static_cast<std::int64_t>(64 * MiB)) << "the kept units, and no more";
  rig.expect_intact();
}

// Pending memory (a cudaFree whose fence has not passed) is not idle: with idle memory enough, it
// stays; with none, release_idle waits for the fence as empty_cache would and then gives it back.
TEST(PoolReleaseIdle, PendingMemoryOnlyAfterItsFenceAndOnlyWhenNeeded) {
  PoolOptions o;
  o.free_sync = FreeSync::fenced;
  PoolRig rig(o);
  void* idle = rig.alloc(40 * MiB);
  void* pending = rig.alloc(40 * MiB);
  rig.pool->free(idle);
  rig.advance_clock();
  (void)rig.alloc(1000);  // records the idle block's fence
  rig.fence.complete_all();
  rig.pool->free(pending);        // in the open batch: no fence yet
  PoolRig::advance_clock(5'000);  // past the pause between fence queries, not past the batch window
  const std::int64_t waits0 = rig.pool->stats().fence_waits;
  EXPECT_EQ(rig.pool->release_idle(40 * MiB), 40 * MiB);
  EXPECT_EQ(rig.pool->stats().fence_waits, waits0) << "idle memory was enough: no wait";
  EXPECT_FALSE(rig.pool->owns(idle));
  EXPECT_TRUE(rig.pool->owns(pending)) << "enough idle memory: the pending block was not waited for";
  const std::int64_t waits = rig.pool->stats().fence_waits;
  EXPECT_EQ(rig.pool->release_idle(40 * MiB), 40 * MiB);
  EXPECT_GT(rig.pool->stats().fence_waits, waits) << "the pending block went only after its fence";
  EXPECT_FALSE(rig.pool->owns(pending));
  rig.expect_intact();
}

}  // namespace
