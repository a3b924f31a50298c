// expandable_segments, growth by recycling: before the mapped total would pass its
// high-water mark, whole free pages elsewhere in the ranges are unmapped first (only from shared
// blocks, i.e. after their fence), the growth goes where the fewest new pages are needed, and
// (expandable_wait) the pool waits for the oldest fence of freed memory that covers the growth
// instead of mapping new pages. Fake upstream with 2 MiB pages; the fakes count every call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

#include "allocator/reuse.h"
#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {
constexpr std::size_t kPage = 2 * MiB;

PoolOptions xopt(FreeSync sync, bool wait = true) {
  PoolOptions o;
  o.expandable_segments = true;
  o.expandable_slack = 0;       // exact page arithmetic: no growth slack
  o.expandable_large_page = 0;  // 2 MiB pages in both ranges: the page arithmetic here assumes it
  o.expandable_max_unit = 0;    // one physical unit per page, likewise (pool_units_test.cpp: larger)
  o.free_sync = sync;
  o.expandable_wait = wait;
  return o;
}
struct XRig : PoolRig {
  explicit XRig(PoolOptions o, bool auto_fence = true, std::size_t capacity = 1 * GiB)
      : PoolRig(o, capacity, auto_fence) {
    up.set_granularity(kPage);
  }
  void expect_mapped_equals_reserved() {
    EXPECT_EQ(static_cast<std::size_t>(pool->stats().reserved_bytes[kAll].current), up.bytes_mapped());
    EXPECT_EQ(up.bad_calls(), 0u);  // no page mapped twice, none unmapped that was not mapped
    EXPECT_EQ(fence.bad_calls(), 0u);
  }
};

// Four 4 MiB blocks [0, 16); a and c freed. An 8 MiB request fits in no free block.
struct Checkerboard {
  void *a, *b, *c, *d;
  explicit Checkerboard(XRig& rig) {
    a = rig.alloc(4 * MiB);
    b = rig.alloc(4 * MiB);
    c = rig.alloc(4 * MiB);
    d = rig.alloc(4 * MiB);
    EXPECT_EQ(rig.up.bytes_mapped(), 16 * MiB);
    EXPECT_EQ(rig.pool->free(a), FreeStatus::ok);
    EXPECT_EQ(rig.pool->free(c), FreeStatus::ok);
  }
};
}  // namespace

TEST(PoolXRecycle, GrowthUnmapsFreePagesInsteadOfRaisingThePeak) {
  XRig rig(xopt(FreeSync::fenced));  // fences complete at once
  Checkerboard cb(rig);
  void* e = rig.alloc(8 * MiB);  // before: 8 new MiB (24 mapped); now a's and c's pages move
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.up.bytes_mapped(), 16 * MiB);
  EXPECT_EQ(rig.up.peak_bytes(), 16 * MiB);
  EXPECT_EQ(rig.up.unmap_calls(), 2u);
  EXPECT_EQ(rig.up.move_calls(), 2u);  // the recycled pages are moved, not unmapped and re-made
  const Stats s = rig.pool->stats();
  EXPECT_EQ(s.reserved_bytes[kAll].peak, static_cast<std::int64_t>(16 * MiB));
  EXPECT_EQ(s.segment[kAll].current, 2);  // [4,8) b, [12, 24) d + e: two mapped runs
  EXPECT_EQ(rig.pool->snapshot().segments.size(), 2u);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
  for (void* p : {cb.b, cb.d, e}) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  rig.pool->empty_cache();
  EXPECT_EQ(rig.up.bytes_mapped(), 0u);
  rig.expect_intact();
  rig.pool.reset();
  EXPECT_EQ(rig.up.reservations_held(), 0u);
  EXPECT_EQ(rig.up.bad_calls(), 0u);
}

// expandable_headroom: up to the live peak times 1 + headroom the range grows by fresh pages,
// without moving any; past it, recycling takes over for the rest.
TEST(PoolXRecycle, HeadroomMapsFreshPagesUpToItsBound) {
  PoolOptions o = xopt(FreeSync::fenced);
  o.expandable_headroom = 0.5;  // live peak 16 MiB: mapping up to 24 MiB needs no recycling
  XRig rig(o);
  Checkerboard cb(rig);
  void* e = rig.alloc(8 * MiB);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.up.move_calls(), 0u);
  EXPECT_EQ(rig.up.bytes_mapped(), 24 * MiB);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();

  o.expandable_headroom = 0.25;  // bound 20 MiB: 4 MiB fresh, the other 4 MiB moved
  XRig tight(o);
  Checkerboard cb2(tight);
  ASSERT_NE(tight.alloc(8 * MiB), nullptr);
  EXPECT_GE(tight.up.move_calls(), 1u);
  EXPECT_EQ(tight.up.bytes_mapped(), 20 * MiB);
  tight.expect_intact();
  tight.expect_mapped_equals_reserved();
}

// The bounce rule: a loop whose large buffers and small ones take turns. A large round (8 MiB +
// 512 B) and a small round (three 1 MiB blocks: two small pages) each free everything. At the
// high-water mark each round would move a page from the other range and the next round move it
// back; the rule maps that page fresh once instead, so the mark rises by the traded page and the
// rounds after cost no driver call at all.
namespace {
struct Rounds {
  XRig& rig;
  void large() {
    void* l = rig.alloc(8 * MiB);
    void* s = rig.alloc(512);
    ASSERT_NE(l, nullptr);
    ASSERT_NE(s, nullptr);
    ASSERT_EQ(rig.pool->free(s), FreeStatus::ok);
    ASSERT_EQ(rig.pool->free(l), FreeStatus::ok);
  }
  void small() {
    void* p[3];
    for (void*& q : p) ASSERT_NE(q = rig.alloc(1 * MiB), nullptr);
    for (void* q : p) ASSERT_EQ(rig.pool->free(q), FreeStatus::ok);
  }
};
}  // namespace

TEST(PoolXRecycle, PagesTradedBackAndForthAreMappedOnceInstead) {
  XRig rig(xopt(FreeSync::fenced));
  Rounds r{rig};
  r.large();  // 4 large pages + 1 small page: the mark is 10 MiB
  r.small();  // the small range needs a second page: one free large page moves over
  EXPECT_EQ(rig.up.move_calls(), 1u);
  r.large();  // taking it back would start the bounce: a fresh page instead
  EXPECT_EQ(rig.up.move_calls(), 1u);
  EXPECT_EQ(rig.up.bytes_mapped(), 12 * MiB);
  const std::size_t maps = rig.up.map_calls(), unmaps = rig.up.unmap_calls();
  for (int i = 0; i < 10; ++i) {
    r.small();
    r.large();
  }
  EXPECT_EQ(rig.up.map_calls(), maps);  // each range keeps what its round needs
  EXPECT_EQ(rig.up.unmap_calls(), unmaps);
  EXPECT_EQ(rig.pool->stats().reserved_bytes[kAll].peak, static_cast<std::int64_t>(12 * MiB));
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// A hard limit comes first: at max_reserved the pages still move, every round, and every
// request is served.
TEST(PoolXRecycle, TradedPagesStillMoveAtAHardLimit) {
  PoolOptions o = xopt(FreeSync::fenced);
  o.max_reserved = 10 * MiB;
  XRig rig(o);
  Rounds r{rig};
  r.large();
  for (int i = 0; i < 5; ++i) {
    r.small();
    r.large();
  }
  EXPECT_EQ(rig.up.move_calls(), 10u);
  EXPECT_EQ(rig.up.peak_bytes(), 10 * MiB);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// A move that fails (here: the map half) leaves the source unmapped and the target unmapped;
// the pool's accounting follows, and the request still succeeds through the OOM path.
TEST(PoolXRecycle, FailedMoveKeepsTheAccountingExact) {
  XRig rig(xopt(FreeSync::fenced));
  Checkerboard cb(rig);
  rig.up.fail_next(1);  // the first move's map
  void* e = rig.alloc(8 * MiB);
  ASSERT_NE(e, nullptr);
  EXPECT_GE(rig.up.move_calls(), 1u);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
  EXPECT_EQ(rig.up.bytes_mapped(), 16 * MiB);
}

TEST(PoolXRecycle, NoRecyclingBelowTheHighWaterMark) {
  XRig rig(xopt(FreeSync::fenced));
  void* big = rig.alloc(16 * MiB);
  ASSERT_EQ(rig.pool->free(big), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 16 * MiB);  // mapped 0, high-water mark 16
  Checkerboard cb(rig);                          // maps 16 again, all below the mark
  const std::size_t unmaps = rig.up.unmap_calls();
  void* e = rig.alloc(8 * MiB);  // 16 + 8 > 16: recycling is needed for the peak, so it happens
  ASSERT_NE(e, nullptr);
  EXPECT_GT(rig.up.unmap_calls(), unmaps);
  // Growth that stays under the mark costs no driver call beyond the map itself.
  ASSERT_EQ(rig.pool->free(e), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(cb.b), FreeStatus::ok);
  rig.pool->empty_cache();
  const std::size_t unmaps2 = rig.up.unmap_calls();
  void* f = rig.alloc(6 * MiB);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(rig.up.unmap_calls(), unmaps2);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// Hole [8, 16) between x2 (allocated) and x5 (free, [16, 20)); x6 keeps the tail hole away.
// A 6 MiB request: forward from the hole needs 6 new MiB, backward (the hole's last page joined
// to x5) needs 2: the pool takes the second.
TEST(PoolXRecycle, GrowsBackwardIntoTheHoleBeforeAFreeBlock) {
  XRig rig(xopt(FreeSync::fenced));
  std::vector<void*> x;
  for (int i = 0; i < 6; ++i) x.push_back(rig.alloc(4 * MiB));
  ASSERT_EQ(rig.pool->free(x[2]), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(x[3]), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 8 * MiB);
  ASSERT_EQ(rig.pool->free(x[4]), FreeStatus::ok);
  const std::size_t maps = rig.up.map_calls();
  void* y = rig.alloc(6 * MiB);
  EXPECT_EQ(y, at(x[0], 14 * MiB));
  EXPECT_EQ(rig.up.map_calls(), maps + 1);
  EXPECT_EQ(rig.up.bytes_mapped(), 18 * MiB);
  EXPECT_EQ(rig.pool->stats().segment[kAll].current, 2);  // [0, 8) and [14, 24)
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// The hole whose free neighbours cover most of the request wins over the first hole that fits.
TEST(PoolXRecycle, GrowsWhereFewestPagesAreNeeded) {
  XRig rig(xopt(FreeSync::fenced));
  std::vector<void*> x;
  for (int i = 0; i < 8; ++i) x.push_back(rig.alloc(4 * MiB));  // [0, 32)
  ASSERT_EQ(rig.pool->free(x[1]), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(x[2]), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 8 * MiB);  // hole [4, 12), no free neighbour
  ASSERT_EQ(rig.pool->free(x[4]), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(x[5]), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 8 * MiB);      // hole [16, 24)
  ASSERT_EQ(rig.pool->free(x[3]), FreeStatus::ok);  // free [12, 16) before the second hole
  // One new page: [10, 12) before x3 (backward, the lowest address among the one-page
  // candidates; [16, 18) after it would do as well), not three at [4, 10).
  void* y = rig.alloc(6 * MiB);
  EXPECT_EQ(y, at(x[0], 10 * MiB));
  EXPECT_EQ(rig.up.bytes_mapped(), 18 * MiB);
  EXPECT_EQ(rig.up.unmap_calls(), 2u);  // only empty_cache's: below the mark, no recycling
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// Pending frees are not unmapped: without the wait the pool maps new pages and unmaps nothing.
TEST(PoolXRecycle, PendingPagesAreNotRecycledWithoutTheirFence) {
  XRig rig(xopt(FreeSync::fenced, /*wait=*/false), /*auto_fence=*/false);
  Checkerboard cb(rig);
  void* e = rig.alloc(8 * MiB);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.up.unmap_calls(), 0u);
  EXPECT_EQ(rig.up.bytes_mapped(), 24 * MiB);
  EXPECT_EQ(rig.fence.waits(), 0u);
  // Once the fence has completed, the next growth past the mark recycles a's and c's pages.
  rig.fence.complete_all();
  void* f = rig.alloc(8 * MiB);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(rig.up.bytes_mapped(), 24 * MiB);
  EXPECT_EQ(rig.up.peak_bytes(), 24 * MiB);
  EXPECT_EQ(rig.fence.waits(), 0u);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// expandable_wait: the pool waits for the OLDEST device fence that makes enough memory reusable.
// Small allocations (hits in the small range) close the open batch once its window has passed,
// so a's and c's frees get fences of their own without a miss.
TEST(PoolXRecycle, WaitsForTheOldestSufficientFenceInsteadOfGrowing) {
  XRig rig(xopt(FreeSync::fenced), /*auto_fence=*/false);
  (void)rig.alloc(512);  // the small range: one page
  void* a = rig.alloc(4 * MiB);
  void* b = rig.alloc(4 * MiB);
  void* c = rig.alloc(4 * MiB);
  void* d = rig.alloc(4 * MiB);
  const std::size_t mapped = rig.up.bytes_mapped();  // 18 MiB, the high-water mark
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  PoolRig::advance_clock();
  (void)rig.alloc(512);  // a hit; records a's fence
  ASSERT_EQ(rig.pool->free(c), FreeStatus::ok);
  PoolRig::advance_clock();
  const FenceHandle c_fence = rig.fence.next_handle();
  (void)rig.alloc(512);  // records c's fence
  EXPECT_EQ(rig.fence.waits(), 0u);
  // 4 MiB more would pass the mark; a's batch alone covers it: wait for it, not for c's.
  void* e = rig.alloc(4 * MiB);
  EXPECT_EQ(e, a);
  EXPECT_EQ(rig.up.bytes_mapped(), mapped);
  EXPECT_EQ(rig.fence.waits(), 1u);
  EXPECT_FALSE(rig.fence.is_completed(c_fence));
  EXPECT_EQ(rig.pool->stats().fence_waits, 1);
  // 8 MiB over the mark, only c's 4 MiB pending: no wait (it would not avoid the growth).
  void* f = rig.alloc(8 * MiB);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(rig.fence.waits(), 1u);
  EXPECT_EQ(rig.up.bytes_mapped(), mapped + 8 * MiB);
  EXPECT_EQ(rig.up.unmap_calls(), 0u);
  (void)b;
  (void)d;
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

TEST(PoolXRecycle, NoWaitWhenPendingMemoryCannotCoverTheGrowth) {
  XRig rig(xopt(FreeSync::fenced), /*auto_fence=*/false);
  void* a = rig.alloc(4 * MiB);
  (void)rig.alloc(4 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* e = rig.alloc(12 * MiB);  // 12 MiB over the mark; only 4 MiB pending
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.fence.waits(), 0u);
  EXPECT_EQ(rig.up.bytes_mapped(), 20 * MiB);
  EXPECT_EQ(rig.up.unmap_calls(), 0u);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// free_sync:immediate: freed blocks are local to their stream (reusable in stream order, but not
// unmappable); a fence on the stream, kept in flight by misses, makes them shared and recyclable.
TEST(PoolXRecycle, ImmediateModeRecyclesAfterAStreamFence) {
  XRig rig(xopt(FreeSync::immediate));  // the stream fence completes at once
  Checkerboard cb(rig);
  void* e = rig.alloc(8 * MiB);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.up.bytes_mapped(), 16 * MiB);
  EXPECT_EQ(rig.up.peak_bytes(), 16 * MiB);
  EXPECT_GE(rig.fence.stream_records(), 1u);
  EXPECT_EQ(rig.fence.waits(), 0u);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

TEST(PoolXRecycle, ImmediateModeWithoutWaitNeverUnmapsBeforeTheStreamFence) {
  XRig rig(xopt(FreeSync::immediate, /*wait=*/false), /*auto_fence=*/false);
  rig.up.set_alias(false);  // an upstream that cannot alias: the stream's own pages stay where they are
  Checkerboard cb(rig);
  void* e = rig.alloc(8 * MiB);  // a stream fence is recorded now, but has not completed
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.up.unmap_calls(), 0u);
  EXPECT_EQ(rig.up.bytes_mapped(), 24 * MiB);
  EXPECT_EQ(rig.fence.waits(), 0u);
  ASSERT_EQ(rig.pool->free(e), FreeStatus::ok);
  (void)rig.alloc(4 * MiB, 0);  // reuses a's place on stream 0 in stream order
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// With the wait, the last resort is a fence on the stream recorded now (a stream synchronize,
// what PyTorch does before every unmap of expandable pages), only when the stream's own free
// blocks cover the growth.
TEST(PoolXRecycle, ImmediateModeSynchronizesTheStreamAsALastResort) {
  XRig rig(xopt(FreeSync::immediate), /*auto_fence=*/false);
  rig.up.set_alias(false);  // with aliasing the stream's pages move without a wait (below)
  Checkerboard cb(rig);
  const FenceHandle f = rig.fence.next_handle();
  void* e = rig.alloc(8 * MiB);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.fence.waits(), 1u);
  EXPECT_TRUE(rig.fence.covered(f, StreamId{0}));
  EXPECT_EQ(rig.up.bytes_mapped(), 16 * MiB);
  EXPECT_EQ(rig.up.peak_bytes(), 16 * MiB);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// The stream's own free blocks need only cover half the growth for that wait: a and c (8 MiB)
// cover 8 of a 12 MiB growth, so 4 MiB are mapped new. A quarter (8 of 32 MiB) is not worth a
// stream synchronize: the growth maps all its pages without waiting.
TEST(PoolXRecycle, StreamSynchronizeWhenOwnBlocksCoverHalfTheGrowth) {
  XRig rig(xopt(FreeSync::immediate), /*auto_fence=*/false);
  rig.up.set_alias(false);
  Checkerboard cb(rig);
  const FenceHandle f = rig.fence.next_handle();
  void* e = rig.alloc(12 * MiB);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.fence.waits(), 1u);
  EXPECT_TRUE(rig.fence.covered(f, StreamId{0}));
  EXPECT_EQ(rig.up.bytes_mapped(), 20 * MiB);
  EXPECT_EQ(rig.up.peak_bytes(), 20 * MiB);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();

  XRig quarter(xopt(FreeSync::immediate), /*auto_fence=*/false);
  quarter.up.set_alias(false);
  Checkerboard cb2(quarter);
  void* g = quarter.alloc(32 * MiB);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(quarter.fence.waits(), 0u);
  EXPECT_EQ(quarter.up.bytes_mapped(), 48 * MiB);
  quarter.expect_intact();
  quarter.expect_mapped_equals_reserved();
}

// An own-stream fence recorded by an EARLIER miss that covers the growth is waited for (no
// new fence recorded for the purpose).
TEST(PoolXRecycle, ImmediateModeWaitsForAnOlderStreamFence) {
  XRig rig(xopt(FreeSync::immediate), /*auto_fence=*/false);
  rig.up.set_alias(false);
  void* z = rig.alloc(32 * MiB);
  ASSERT_EQ(rig.pool->free(z), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 32 * MiB);  // the mark stays at 32 MiB
  const std::size_t waits0 = rig.fence.waits();
  Checkerboard cb(rig);  // 16 MiB mapped, a and c local to stream 0
  const FenceHandle older = rig.fence.next_handle();
  (void)rig.alloc(6 * MiB);  // a miss under the mark: records the stream fence, maps 6 MiB
  EXPECT_EQ(rig.up.bytes_mapped(), 22 * MiB);
  EXPECT_FALSE(rig.fence.is_completed(older));
  const std::size_t records = rig.fence.records();
  void* e = rig.alloc(16 * MiB);  // 6 MiB over the mark: wait for that fence, recycle a and c
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.fence.waits(), waits0 + 1);
  EXPECT_EQ(rig.fence.records(), records);
  EXPECT_EQ(rig.up.bytes_mapped(), 32 * MiB);
  EXPECT_EQ(rig.up.peak_bytes(), 32 * MiB);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
}

// Stream-ordered frees with an upstream that can alias: the stream's own free pages serve its
// growth at once at a second address (its new work follows its old work on the stream itself),
// with no host wait and no new memory. The growth stays the stream's own until a fence on it
// has completed, and the old address keeps its mapping until then.
namespace {
struct OwnGrowth {
  static constexpr StreamId kS = 7, kOther = 9;
  XRig rig;
  void *a, *b, *c, *d, *e = nullptr;
  FenceHandle order_fence = 0;
  // `alias`: whether the upstream can alias; `refused_aliases`: alias() calls it fails first.
  explicit OwnGrowth(bool wait, bool alias = true, int refused_aliases = 0)
      : rig(xopt(FreeSync::fenced, wait), /*auto_fence=*/false) {
    rig.up.set_alias(alias);
    rig.up.fail_next_alias(refused_aliases);
    a = rig.alloc(4 * MiB, kS);
    b = rig.alloc(4 * MiB, kS);
    c = rig.alloc(4 * MiB, kS);
    d = rig.alloc(4 * MiB, kS);
    EXPECT_EQ(rig.pool->free_on_stream(a, kS), FreeStatus::ok);
    EXPECT_EQ(rig.pool->free_on_stream(c, kS), FreeStatus::ok);
    order_fence = rig.fence.next_handle();
    e = rig.alloc(8 * MiB, kS);  // fits in no free block: 8 MiB past the mark
  }
};
}  // namespace

TEST(PoolXRecycle, OwnStreamPagesAreAliasedIntoItsGrowthWithoutWaiting) {
  for (bool wait : {true, false}) {
    SCOPED_TRACE(wait ? "expandable_wait:True" : "expandable_wait:False");
    OwnGrowth g(wait);
    XRig& rig = g.rig;
    ASSERT_NE(g.e, nullptr);
    EXPECT_EQ(rig.fence.waits(), 0u);            // no stream synchronize...
    EXPECT_EQ(rig.up.bytes_mapped(), 16 * MiB);  // ...and no new memory: a's and c's pages serve e
    EXPECT_EQ(rig.up.aliased_bytes(), 8 * MiB);  // their old mappings stay while old work may run
    EXPECT_TRUE(rig.up.alias_at(g.a));
    EXPECT_TRUE(rig.up.alias_at(g.c));
    EXPECT_EQ(rig.up.unmap_calls(), 0u);
    EXPECT_EQ(rig.up.move_calls(), 0u);
    EXPECT_GE(rig.fence.stream_records(), 1u);
    EXPECT_FALSE(rig.fence.is_completed(g.order_fence));
    EXPECT_EQ(rig.pool->stats().num_device_alias, 2);  // a and c are not contiguous: two calls
    rig.expect_intact();
    rig.expect_mapped_equals_reserved();

    // Freed on the stream while the fence runs: its own stream reuses e at once, another stream
    // does not get those pages (it maps new ones), and nothing is dropped or moved, though the
    // fences of aliased pages are asked again (past their poll gap).
    rig.advance_clock(2 * cudapool::detail::FenceBatches::kOrderedPollGapNs);
    ASSERT_EQ(rig.pool->free_on_stream(g.e, OwnGrowth::kS), FreeStatus::ok);
    void* other = rig.alloc(8 * MiB, OwnGrowth::kOther);
    ASSERT_NE(other, nullptr);
    EXPECT_NE(other, g.e);
    const auto lo = reinterpret_cast<std::uintptr_t>(g.e);
    const auto o = reinterpret_cast<std::uintptr_t>(other);
    EXPECT_TRUE(o + 8 * MiB <= lo || lo + 8 * MiB <= o);
    void* again = rig.alloc(8 * MiB, OwnGrowth::kS);
    EXPECT_EQ(again, g.e);
    EXPECT_EQ(rig.up.aliased_bytes(), 8 * MiB);
    EXPECT_EQ(rig.up.unalias_calls(), 0u);
    rig.expect_intact();

    // The stream's fence completes: the old mappings go at the next fence service, and their
    // address space becomes a hole again.
    rig.fence.complete_all();
    rig.advance_clock(2 * cudapool::detail::FenceBatches::kOrderedPollGapNs);
    (void)rig.pool->free(rig.alloc(4 * KiB));
    EXPECT_EQ(rig.up.aliased_bytes(), 0u);
    EXPECT_EQ(rig.up.unalias_calls(), 2u);
    EXPECT_EQ(rig.up.bad_calls(), 0u);  // nothing mapped over an old mapping, nothing cut
    rig.expect_intact();
    rig.expect_mapped_equals_reserved();
    for (void* p : {g.b, g.d, again, other}) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
    rig.fence.complete_all();
    rig.advance_clock();
    const std::size_t mapped = rig.up.bytes_mapped();
    EXPECT_EQ(rig.pool->empty_cache(), mapped);
    EXPECT_EQ(rig.up.bytes_mapped(), 0u);
    rig.expect_intact();
  }
}

// The negative control: the same program with an upstream that cannot alias waits for the
// stream (expandable_wait) or maps new memory (without it).
TEST(PoolXRecycle, WithoutAliasingOwnStreamPagesNeedAWaitOrNewMemory) {
  for (bool wait : {true, false}) {
    SCOPED_TRACE(wait ? "expandable_wait:True" : "expandable_wait:False");
    OwnGrowth g(wait, /*alias=*/false);
    XRig& rig = g.rig;
    ASSERT_NE(g.e, nullptr);
    EXPECT_EQ(rig.up.alias_calls(), 0u);
    EXPECT_EQ(rig.fence.waits(), wait ? 1u : 0u);
    EXPECT_EQ(rig.up.bytes_mapped(), wait ? 16 * MiB : 24 * MiB);
    rig.expect_intact();
    rig.expect_mapped_equals_reserved();
    for (void* p : {g.b, g.d, g.e}) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  }
}

// Aliases of the stream's own pages that the upstream refuses change nothing: the pages stay the
// stream's free blocks, fresh pages serve the growth, and the pool stays exact.
TEST(PoolXRecycle, RefusedOwnAliasMapsFreshPages) {
  OwnGrowth g(/*wait=*/false, /*alias=*/true, /*refused_aliases=*/2);
  XRig& rig = g.rig;
  ASSERT_NE(g.e, nullptr);
  EXPECT_EQ(rig.up.aliased_bytes(), 0u);
  EXPECT_EQ(rig.up.bytes_mapped(), 24 * MiB);
  EXPECT_EQ(rig.pool->stats().num_device_alias, 0);
  EXPECT_EQ(rig.up.bad_calls(), 0u);
  rig.expect_intact();
  rig.expect_mapped_equals_reserved();
  // a and c are still the stream's free blocks, reused in place.
  EXPECT_EQ(rig.alloc(4 * MiB, OwnGrowth::kS), g.a);
  for (void* p : {g.b, g.d, g.e}) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  rig.expect_intact();
}

namespace {
// A fake upstream that checks, at every unmap, that no page freed by the test is unmapped
// before a fence recorded after its free has completed.
struct FreedRange {
  std::uintptr_t lo, hi;
  FenceHandle since;
  std::optional<StreamId> stream;  // nullopt: free() (device fence); else cudaFreeAsync's stream
};
struct CheckingUpstream : FakeUpstream {
  FakeFence* fence = nullptr;
  std::vector<FreedRange>* freed = nullptr;
  std::size_t violations = 0;
  using FakeUpstream::FakeUpstream;
  // Memory leaves its address by unmap or by move: either must come after the fence.
  void check_gone(void* addr, std::size_t bytes) {
    const auto lo = reinterpret_cast<std::uintptr_t>(addr);
    for (const FreedRange& r : *freed)
      if (r.lo < lo + bytes && lo < r.hi && !fence->covered(r.since, r.stream)) ++violations;
  }
  void unmap(void* addr, std::size_t bytes) override {
    check_gone(addr, bytes);
    FakeUpstream::unmap(addr, bytes);
  }
  UpstreamStatus move(void* from, void* to, std::size_t bytes) override {
    check_gone(from, bytes);
    return FakeUpstream::move(from, to, bytes);
  }
  // An alias leaves the old address once unaliased: after the fence, as an unmap. Until then the
  // pages are at two addresses, and the new one is as pending as the old: it must not be
  // unmapped or moved before the same fence either.
  void unalias(void* addr, std::size_t bytes) override {
    check_gone(addr, bytes);
    FakeUpstream::unalias(addr, bytes);
  }
  UpstreamStatus alias(void* from, void* to, std::size_t bytes) override {
    const UpstreamStatus us = FakeUpstream::alias(from, to, bytes);
    if (us != UpstreamStatus::ok) return us;
    ++aliases;
    const auto lo = reinterpret_cast<std::uintptr_t>(from);
    const auto dst = reinterpret_cast<std::uintptr_t>(to);
    std::vector<FreedRange> moved;
    for (const FreedRange& r : *freed)
      if (r.lo < lo + bytes && lo < r.hi && !fence->covered(r.since, r.stream))
        moved.push_back({std::max(r.lo, lo) - lo + dst, std::min(r.hi, lo + bytes) - lo + dst, r.since, r.stream});
    freed->insert(freed->end(), moved.begin(), moved.end());
    return us;
  }
  std::size_t aliases = 0;
};

struct RunResult {
  std::size_t peak_mapped = 0, peak_allocated = 0, violations = 0, unmaps = 0, waits = 0, aliases = 0;
};

// Training-like steps with a varying sequence length: per step, activations of sizes ~L are
// allocated (some freed early), then freed in reverse. Fences complete at random.
RunResult training_run(PoolOptions o, bool async_frees, unsigned seed) {
  set_pool_clock_for_testing(&test_clock);
  CheckingUpstream up(4 * GiB);
  up.set_granularity(kPage);
  FakeFence fence(false);
  std::vector<FreedRange> freed;
  up.fence = &fence;
  up.freed = &freed;
  RunResult out;
  {
    DevicePool pool(0, o, up, fence);
    std::mt19937 rng(seed);
    auto free_one = [&](void* p) {
      auto info = pool.address_info(p);
      const FenceHandle since = fence.next_handle();
      const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(p);
      const std::size_t sz = info ? info->block_size : 0;
      if (async_frees || o.free_sync == FreeSync::immediate) {  // reusable in stream order
        EXPECT_EQ(async_frees ? pool.free_on_stream(p, 0) : pool.free(p), FreeStatus::ok);
        freed.push_back({lo, lo + sz, since, StreamId{0}});
      } else {
        EXPECT_EQ(pool.free(p), FreeStatus::ok);
        freed.push_back({lo, lo + sz, since, std::nullopt});
      }
    };
    for (int step = 0; step < 30; ++step) {
      const std::size_t L = 1 + rng() % 8;  // "sequence length"
      std::vector<void*> acts;
      for (int layer = 0; layer < 12; ++layer) {
        const std::size_t sz = (L * (3 + rng() % 5) * MiB) / 2 + (rng() % 64) * 512;
        AllocResult r = pool.allocate(sz, 0);
        EXPECT_EQ(r.status, AllocStatus::ok);
        acts.push_back(r.ptr);
        if (rng() % 3 == 0) {  // a temporary
          AllocResult t = pool.allocate(sz / 3 + 512, 0);
          EXPECT_EQ(t.status, AllocStatus::ok);
          free_one(t.ptr);
        }
        if (rng() % 4 == 0) fence.complete_some(rng, 0.5);
        if (rng() % 8 == 0) PoolRig::advance_clock();
      }
      while (!acts.empty()) {
        free_one(acts.back());
        acts.pop_back();
        if (rng() % 4 == 0) fence.complete_some(rng, 0.5);
      }
      // Drop what is covered (keeps the registry short).
      std::erase_if(freed, [&](const FreedRange& r) { return fence.covered(r.since, r.stream); });
      EXPECT_EQ(pool.check_consistency(), "");
      EXPECT_EQ(compare_with_recount(pool.stats(), pool.snapshot()), "");
      EXPECT_EQ(static_cast<std::size_t>(pool.stats().reserved_bytes[kAll].current), up.bytes_mapped());
    }
    out.violations = up.violations;
    out.aliases = up.aliases;
    out.unmaps = up.unmap_calls();  // before teardown, which unmaps everything
    freed.clear();                  // teardown unmaps everything without fences (the shim never destroys pools)
    const Stats s = pool.stats();
    out.peak_allocated = static_cast<std::size_t>(s.allocated_bytes[kAll].peak);
    out.waits = static_cast<std::size_t>(s.fence_waits);
  }
  EXPECT_EQ(up.bad_calls(), 0u);
  EXPECT_EQ(up.bytes_mapped(), 0u);
  EXPECT_EQ(up.reservations_held(), 0u);
  out.peak_mapped = up.peak_bytes();
  restore_pool_clock();
  return out;
}
}  // namespace

// The old pool (map only where the first hole fits, unmap only on GC / empty_cache / OOM) kept
// the high-water mark of address usage mapped: 1.3-1.5x the live peak on these runs. Recycling
// keeps the mapped peak within a few pages of the live peak, in every free mode.
TEST(PoolXRecycle, MappedPeakFollowsTheLivePeak) {
  struct Case {
    FreeSync sync;
    bool async;
  };
  for (const Case c : {Case{FreeSync::fenced, false}, Case{FreeSync::fenced, true}, Case{FreeSync::immediate, false}}) {
    for (unsigned seed = 1; seed <= 3; ++seed) {
      const RunResult r = training_run(xopt(c.sync), c.async, seed);
      std::printf(
          "sync %d async %d seed %u: peak mapped %zu MiB, peak allocated %zu MiB, unmaps %zu, waits %zu, aliases %zu\n",
          static_cast<int>(c.sync), c.async ? 1 : 0, seed, r.peak_mapped / MiB, r.peak_allocated / MiB, r.unmaps,
          r.waits, r.aliases);
      SCOPED_TRACE(::testing::Message() << "sync " << static_cast<int>(c.sync) << " async " << c.async << " seed "
                                        << seed << ": peak mapped " << r.peak_mapped / MiB << " MiB, peak allocated "
                                        << r.peak_allocated / MiB << " MiB, unmaps " << r.unmaps << ", waits "
                                        << r.waits);
      EXPECT_EQ(r.violations, 0u);
      EXPECT_LE(r.peak_mapped, r.peak_allocated + r.peak_allocated / 20 + 8 * kPage);
      if (c.sync == FreeSync::fenced && !c.async) {  // the old pool's worst case: it recycles
        EXPECT_GT(r.unmaps, 0u);
      }
      if (c.async) {  // stream-ordered frees: the stream's own pages are aliased, never waited for
        EXPECT_GT(r.aliases, 0u);
        EXPECT_EQ(r.waits, 0u);
      }
    }
  }
}

// The same runs with the default 16 MiB physical units: a unit goes back or moves only whole, so
// the mapped peak may sit a few units above the live peak, never more, and nothing pending is
// ever unmapped or moved (a move takes memory from its address like an unmap).
TEST(PoolXRecycle, MappedPeakFollowsTheLivePeakWithUnits) {
  for (const FreeSync sync : {FreeSync::fenced, FreeSync::immediate}) {
    for (unsigned seed = 1; seed <= 3; ++seed) {
      PoolOptions o = xopt(sync);
      o.expandable_max_unit = 16 * MiB;
      const RunResult r = training_run(o, seed % 2 == 0, seed);
      std::printf("units: sync %d seed %u: peak mapped %zu MiB, peak allocated %zu MiB, unmaps %zu, waits %zu\n",
                  static_cast<int>(sync), seed, r.peak_mapped / MiB, r.peak_allocated / MiB, r.unmaps, r.waits);
      EXPECT_EQ(r.violations, 0u) << "seed " << seed;
      EXPECT_LE(r.peak_mapped, r.peak_allocated + r.peak_allocated / 20 + 4 * 16 * MiB) << "seed " << seed;
    }
  }
}

// Without the wait, nothing pending is ever unmapped, and the peak is still bounded by the live
// peak plus what fences hold back.
TEST(PoolXRecycle, RandomFencesNeverLetAPendingPageBeUnmapped) {
  for (unsigned seed = 10; seed < 14; ++seed) {
    for (bool wait : {false, true}) {
      const RunResult r = training_run(xopt(FreeSync::fenced, wait), seed % 2 == 0, seed);
      EXPECT_EQ(r.violations, 0u) << "seed " << seed << " wait " << wait;
      if (!wait) {
        EXPECT_EQ(r.waits, 0u);
      }
    }
  }
}
