// The fence batch window (docs/design.md, "The batch window"): free()d blocks wait in an open
// batch whose ONE device fence is recorded when the window passes, at the size bounds, on a
// miss, or before anything waits for pending memory. The test clock (PoolRig) moves only when
// a test advances it.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "tests/unit/pool_helpers.h"

namespace cudapool::testing {
namespace {

// 1000 alloc/free pairs, clock frozen, fences complete at once: only the 256-block bound closes
// the batch, so a handful of fences cover all the frees and one segment serves everything.
TEST(PoolWindow, TightLoopRecordsAHandfulOfFences) {
  PoolRig rig({}, 80 * GiB, /*auto_fence=*/true);
  for (int i = 0; i < 1000; ++i) {
    void* p = rig.alloc(4 * KiB);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  }
  EXPECT_LE(rig.fence.device_records(), 4u);
  EXPECT_GE(rig.fence.device_records(), 1u);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  rig.expect_intact();
}

// Same loop with fences that never complete: pending blocks are never handed out, the pool
// moves on through free memory (and a second segment once the first is used up).
TEST(PoolWindow, TightLoopNeverReusesPendingBlocks) {
  PoolRig rig(fenced_options());
  std::set<void*> seen;
  for (int i = 0; i < 1000; ++i) {
    void* p = rig.alloc(4 * KiB);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(seen.insert(p).second) << "pending block handed out before its fence: " << i;
    ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  }
  EXPECT_LE(rig.fence.device_records(), 6u);  // bound closes (256 blocks) plus one miss
  EXPECT_EQ(rig.fence.waits(), 0u);
  rig.expect_intact();
}

TEST(PoolWindow, RecordsWhenTheWindowPasses) {
  PoolRig rig({}, 80 * GiB, /*auto_fence=*/true);
  void* a = rig.alloc(4 * KiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* b = rig.alloc(4 * KiB);  // window open: no fence, served from the segment's rest
  EXPECT_NE(b, a);
  EXPECT_EQ(rig.fence.device_records(), 0u);
  rig.advance_clock(19'000);
  void* c = rig.alloc(4 * KiB);
  EXPECT_EQ(rig.fence.device_records(), 0u);
  rig.advance_clock(2'000);  // 21 us since the batch opened
  void* d = rig.alloc(4 * KiB);
  EXPECT_EQ(rig.fence.device_records(), 1u);
  EXPECT_EQ(d, a);  // the fence completed at once (auto): a is shared again, best fit
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  for (void* p : {b, c, d}) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  // Pairs 1 us apart: one fence per ~20 us window, not one per pair.
  const std::size_t before = rig.fence.device_records();
  for (int i = 0; i < 100; ++i) {
    rig.advance_clock(1'000);
    void* p = rig.alloc(4 * KiB);
    ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  }
  const std::size_t n = rig.fence.device_records() - before;
  EXPECT_GE(n, 4u);
  EXPECT_LE(n, 6u);
  rig.expect_intact();
}

// Where ordering is free (the default, FenceProvider::orders_for_free) the window is 1 ms: a
// batch closed early would cost a record and a GPU-side wait and buy nothing, since a miss closes
// it and hands its blocks out at once. Where ordering needs a query the window stays 20 us
// (RecordsWhenTheWindowPasses).
TEST(PoolWindow, WhereOrderingIsFreeTheWindowIsLongAndAMissStillClosesIt) {
  PoolRig rig;  // the default, fences complete only when told
  rig.fence.set_orders_for_free(true);
  void* a = rig.alloc(4 * KiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  rig.advance_clock(21'000);  // past the short window
  void* b = rig.alloc(4 * KiB);
  EXPECT_NE(b, a);
  EXPECT_EQ(rig.fence.device_records(), 0u);
  rig.advance_clock(978'000);  // 999 us since the batch opened
  void* c = rig.alloc(4 * KiB);
  EXPECT_EQ(rig.fence.device_records(), 0u);
  EXPECT_GT(rig.pool->stats().pending_bytes, 0);
  rig.advance_clock(2'000);  // 1.001 ms: recorded and ordered at once, not asked
  void* d = rig.alloc(4 * KiB);
  EXPECT_EQ(rig.fence.device_records(), 1u);
  EXPECT_EQ(rig.fence.order_calls(), 1u);
  EXPECT_EQ(d, a);
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  for (void* p : {b, c, d}) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);

  // A miss inside the long window: the freed 20 MiB block is the only fit, and it is handed out
  // again at once under one GPU-side wait (no new memory), 5 us after its free.
  void* big = rig.alloc(20 * MiB);
  const std::size_t segments = rig.up.allocate_calls();
  const std::size_t records = rig.fence.device_records(), orders = rig.fence.order_calls();
  ASSERT_EQ(rig.pool->free(big), FreeStatus::ok);
  rig.advance_clock(5'000);
  EXPECT_EQ(rig.alloc(20 * MiB), big);
  EXPECT_EQ(rig.up.allocate_calls(), segments);
  EXPECT_EQ(rig.fence.device_records(), records + 1);
  EXPECT_EQ(rig.fence.order_calls(), orders + 1);
  EXPECT_EQ(rig.fence.bad_calls(), 0u);
  rig.expect_intact();
}

// A miss closes the open batch at once and queries it before going to the upstream.
TEST(PoolWindow, MissRecordsAtOnce) {
  {
    PoolRig rig(fenced_options());  // fences complete only when told
    void* a = rig.alloc(20 * MiB);
    ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
    EXPECT_EQ(rig.fence.device_records(), 0u);
    void* b = rig.alloc(20 * MiB);  // nothing else fits: record now; not complete -> upstream
    EXPECT_EQ(rig.fence.device_records(), 1u);
    EXPECT_GE(rig.fence.queries(), 1u);
    EXPECT_NE(b, a);
    EXPECT_EQ(rig.up.allocate_calls(), 2u);
    rig.expect_intact();
  }
  {
    PoolRig rig({}, 80 * GiB, /*auto_fence=*/true);
    void* a = rig.alloc(20 * MiB);
    ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
    EXPECT_EQ(rig.alloc(20 * MiB), a);  // recorded, queried, complete: reused, no upstream call
    EXPECT_EQ(rig.fence.device_records(), 1u);
    EXPECT_EQ(rig.up.allocate_calls(), 1u);
    EXPECT_EQ(rig.pool->stats().cache_hits, 1);
    rig.expect_intact();
  }
}

TEST(PoolWindow, SizeBoundsCloseTheBatch) {
  {
    PoolRig rig;
    std::vector<void*> ps;
    for (int i = 0; i < 256; ++i) ps.push_back(rig.alloc(4 * KiB));
    for (std::size_t i = 0; i < 255; ++i) ASSERT_EQ(rig.pool->free(ps[i]), FreeStatus::ok);
    EXPECT_EQ(rig.fence.device_records(), 0u);
    ASSERT_EQ(rig.pool->free(ps[255]), FreeStatus::ok);  // the 256th block
    EXPECT_EQ(rig.fence.device_records(), 1u);
    rig.expect_intact();
  }
  {
    PoolRig rig;
    std::vector<void*> ps;
    for (int i = 0; i < 4; ++i) ps.push_back(rig.alloc(20 * MiB));
    for (std::size_t i = 0; i < 3; ++i) ASSERT_EQ(rig.pool->free(ps[i]), FreeStatus::ok);  // 60 MiB
    EXPECT_EQ(rig.fence.device_records(), 0u);
    ASSERT_EQ(rig.pool->free(ps[3]), FreeStatus::ok);  // 80 MiB >= 64 MiB
    EXPECT_EQ(rig.fence.device_records(), 1u);
    rig.expect_intact();
  }
}

// The byte bound grows with the pool (a quarter of reserved): frees of big blocks share a fence.
TEST(PoolWindow, ByteBoundScalesWithThePool) {
  PoolRig rig({}, 80 * GiB);
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(rig.alloc(512 * MiB));  // 4 GiB reserved: bound 1 GiB
  ASSERT_EQ(rig.pool->stats().reserved_bytes[kAll].current, static_cast<std::int64_t>(4 * GiB));
  ASSERT_EQ(rig.pool->free(ps[0]), FreeStatus::ok);
  EXPECT_EQ(rig.fence.device_records(), 0u);         // 512 MiB: under a flat 64 MiB bound this recorded
  ASSERT_EQ(rig.pool->free(ps[1]), FreeStatus::ok);  // 1 GiB: the bound
  EXPECT_EQ(rig.fence.device_records(), 1u);
  for (std::size_t i = 2; i < 8; ++i) ASSERT_EQ(rig.pool->free(ps[i]), FreeStatus::ok);
  EXPECT_EQ(rig.fence.device_records(), 4u);  // 8 frees, 4 fences
  EXPECT_EQ(rig.pool->stats().pending_bytes, static_cast<std::int64_t>(4 * GiB));
  rig.expect_intact();
}

// Query back-off: once a fence was found still running, allocations in the next 4 us do not ask
// again (a query costs about as much as the whole pair); after that they do, and the first
// allocation to ask after completion gets the block back.
TEST(PoolWindow, RunningFenceIsNotAskedOnEveryAllocation) {
  PoolRig rig;
  void* a = rig.alloc(4 * KiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  rig.advance_clock();
  void* b = rig.alloc(4 * KiB);  // the window passed: records, asks once (running)
  EXPECT_NE(b, a);
  ASSERT_EQ(rig.fence.device_records(), 1u);
  const std::size_t q0 = rig.fence.queries();
  std::vector<void*> held;
  for (int i = 0; i < 10; ++i) {
    rig.advance_clock(300);  // 3 us in all: inside the back-off
    held.push_back(rig.alloc(4 * KiB));
  }
  EXPECT_EQ(rig.fence.queries(), q0);
  rig.fence.complete_all();
  rig.advance_clock(1'000);  // 4 us since the query
  EXPECT_EQ(rig.alloc(4 * KiB), a);
  EXPECT_EQ(rig.fence.queries(), q0 + 1);
  rig.expect_intact();
}

TEST(PoolWindow, EmptyCacheClosesTheBatch) {
  PoolRig rig;
  void* a = rig.alloc(4 * KiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_EQ(rig.fence.device_records(), 0u);
  EXPECT_EQ(rig.pool->empty_cache(), 2 * MiB);
  EXPECT_EQ(rig.fence.device_records(), 1u);
  EXPECT_EQ(rig.fence.waits(), 1u);
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  EXPECT_EQ(rig.up.bytes_held(), 0u);
  rig.expect_intact();
}

// The OOM path waits for the open batch's fence (recorded by the miss) and reuses the block.
TEST(PoolWindow, OomPathClosesTheBatch) {
  PoolRig rig(fenced_options(), 20 * MiB);
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_EQ(rig.alloc(20 * MiB), a);
  EXPECT_EQ(rig.fence.device_records(), 1u);
  EXPECT_EQ(rig.fence.waits(), 1u);
  EXPECT_EQ(rig.pool->stats().num_ooms, 0);
  rig.expect_intact();
}

// FreeSync::device waits for pending memory on a miss: the open batch is closed first.
TEST(PoolWindow, DeviceSyncClosesTheBatch) {
  PoolOptions o;
  o.free_sync = FreeSync::device;
  PoolRig rig(o);
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_EQ(rig.alloc(20 * MiB), a);
  EXPECT_EQ(rig.fence.device_records(), 1u);
  EXPECT_EQ(rig.fence.waits(), 1u);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  rig.expect_intact();
}

TEST(PoolWindow, RetireStreamClosesTheBatch) {
  PoolRig rig;
  void* a = rig.alloc(4 * KiB, 7);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  rig.pool->retire_stream(9);
  EXPECT_EQ(rig.fence.device_records(), 1u);
  rig.fence.complete_all();
  rig.advance_clock();
  EXPECT_EQ(rig.alloc(4 * KiB, 9), a);
  rig.expect_intact();
}

}  // namespace
}  // namespace cudapool::testing
