// expandable_segments on the fake upstream (granularity 2 MiB): one reserved range per pool
// kind grown by mapping pages, wholly free pages unmapped by empty_cache / OOM handling / GC.
#include <set>

#include <gtest/gtest.h>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {
PoolOptions expandable(FreeSync sync = FreeSync::immediate) {
  PoolOptions o;
  o.expandable_segments = true;
  o.expandable_slack = 0;       // exact page arithmetic: no growth slack
  o.expandable_large_page = 0;  // 2 MiB pages in both ranges: the page arithmetic here assumes it
  o.expandable_max_unit = 0;    // one physical unit per page, likewise (pool_units_test.cpp: larger)
  o.free_sync = sync;
  return o;
}
struct XRig : PoolRig {
  explicit XRig(PoolOptions o = expandable(), std::size_t capacity = 1 * GiB, bool auto_fence = true)
      : PoolRig(o, capacity, auto_fence) {
    up.set_granularity(2 * MiB);
  }
};
}  // namespace

TEST(PoolExpandable, GrowsOneRangeByMappingPages) {
  XRig rig;
  // maps 6 MiB (3 pages); the 1 MiB rest is split off (in an expandable segment a large block
  // splits whenever a minimal block remains, as PyTorch's allocator does there)
  void* a = rig.alloc(5 * MiB);
  EXPECT_EQ(rig.up.reserve_calls(), 1u);
  EXPECT_EQ(rig.up.allocate_calls(), 0u);
  EXPECT_EQ(rig.up.bytes_mapped(), 6 * MiB);
  void* b = rig.alloc(3 * MiB);  // a's free 1 MiB rest, extended by one page
  EXPECT_EQ(b, at(a, 5 * MiB));
  EXPECT_EQ(rig.up.bytes_mapped(), 8 * MiB);
  EXPECT_EQ(rig.up.reserve_calls(), 1u);
  Stats s = rig.pool->stats();
  EXPECT_EQ(s.reserved_bytes[kAll].current, static_cast<std::int64_t>(8 * MiB));
  EXPECT_EQ(s.segment[kAll].current, 1);  // one mapped run
  Snapshot snap = rig.pool->snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_TRUE(snap.segments[0].is_expandable);
  EXPECT_EQ(snap.segments[0].total_size, 8 * MiB);
  auto info = rig.pool->address_info(b);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->expandable);
  EXPECT_FALSE(info->whole_segment);
  EXPECT_EQ(info->segment_base, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(info->segment_size, 8 * MiB);
  EXPECT_FALSE(rig.pool->owns(at(a, 8 * MiB)));  // reserved but unmapped
  EXPECT_EQ(rig.pool->free(at(a, 8 * MiB)), FreeStatus::not_owned);
  rig.expect_intact();
}

// In an expandable segment a large block splits whenever a minimal block remains (PyTorch's rule
// under expandable_segments), where a classic segment keeps tails up to 1 MiB
// (PoolRules.LargePoolSplitNeedsMoreThan1MiB): the tail is free memory the next block starts in.
TEST(PoolExpandable, LargeTailsSplitOffDownToAMinimalBlock) {
  PoolOptions o = expandable();
  o.max_split_size = 2 * MiB;  // no bound on splitting here: only on which blocks serve which requests
  XRig rig(o);
  void* a = rig.alloc(3 * MiB + 512 * KiB);  // one 4 MiB mapping; 512 KiB rest
  Stats s = rig.pool->stats();
  EXPECT_EQ(s.allocated_bytes[kLargePool].current, static_cast<std::int64_t>(3 * MiB + 512 * KiB));
  EXPECT_EQ(s.inactive_split_bytes[kLargePool].current, static_cast<std::int64_t>(512 * KiB));
  // From the rest on, one more page mapped: 512 B are left, split off as well.
  void* b = rig.alloc(2 * MiB + 512 * KiB - 512);
  EXPECT_EQ(b, at(a, 3 * MiB + 512 * KiB));
  EXPECT_EQ(rig.up.bytes_mapped(), 6 * MiB);
  s = rig.pool->stats();
  EXPECT_EQ(s.inactive_split_bytes[kLargePool].current, 512);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  EXPECT_EQ(rig.pool->stats().allocated_bytes[kLargePool].current, 0);
  // The pieces merged back: the whole 6 MiB serve one request, with nothing new mapped.
  void* c = rig.alloc(6 * MiB);
  EXPECT_EQ(c, a);
  EXPECT_EQ(rig.up.bytes_mapped(), 6 * MiB);
  rig.expect_intact();
}

TEST(PoolExpandable, FreedSpaceServesAnySizeWithoutNewMemory) {
  XRig rig;
  void* a = rig.alloc(4 * MiB);
  void* b = rig.alloc(4 * MiB);
  void* c = rig.alloc(4 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  const std::size_t mapped = rig.up.bytes_mapped();
  void* d = rig.alloc(7 * MiB);  // fits where a and b were: no new pages
  EXPECT_EQ(d, a);
  EXPECT_EQ(rig.up.bytes_mapped(), mapped);
  (void)c;
  rig.expect_intact();
}

TEST(PoolExpandable, ExtendsTheFreeTailInsteadOfStartingOver) {
  XRig rig;
  void* a = rig.alloc(4 * MiB);
  void* b = rig.alloc(4 * MiB);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);  // free 4 MiB at the end of the mapped run
  void* c = rig.alloc(7 * MiB);                  // reuses those 4 MiB + maps 4 more (2 pages)
  EXPECT_EQ(c, b);
  EXPECT_EQ(rig.up.bytes_mapped(), 12 * MiB);
  (void)a;
  rig.expect_intact();
}

TEST(PoolExpandable, EmptyCacheUnmapsWholeFreePagesOnly) {
  XRig rig;
  // Each block starts at the split-off rest of the one before (MiB, k = 512 B):
  void* a = rig.alloc(1 * MiB + 512);  // [0, 1+k): a 2 MiB page
  void* b = rig.alloc(5 * MiB);        // [1+k, 6+k): three more pages
  void* c = rig.alloc(3 * MiB);        // [6+k, 9+k): one more
  EXPECT_EQ(b, at(a, 1 * MiB + 512));
  EXPECT_EQ(c, at(a, 6 * MiB + 512));
  EXPECT_EQ(rig.up.bytes_mapped(), 10 * MiB);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);  // [1+k, 6+k) free: pages [2, 6) wholly
  EXPECT_EQ(rig.pool->empty_cache(), 4 * MiB);
  EXPECT_EQ(rig.up.bytes_mapped(), 6 * MiB);
  EXPECT_EQ(rig.up.unmap_calls(), 1u);
  Stats s = rig.pool->stats();
  EXPECT_EQ(s.segment[kAll].current, 2);  // the hole splits the run in two
  EXPECT_EQ(s.reserved_bytes[kAll].current, static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(rig.pool->snapshot().segments.size(), 2u);
  rig.expect_intact();
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(c), FreeStatus::ok);
  rig.pool->empty_cache();
  EXPECT_EQ(rig.up.bytes_mapped(), 0u);
  EXPECT_EQ(rig.pool->stats().segment[kAll].current, 0);
  EXPECT_EQ(rig.up.reservations_held(), 1u);  // the range stays reserved until teardown
  rig.expect_intact();
  rig.pool.reset();
  EXPECT_EQ(rig.up.reservations_held(), 0u);
  EXPECT_EQ(rig.up.bad_calls(), 0u);
}

// Layout (MiB): a = [0, 2.5) (4 MiB mapped, 1.5 MiB rest split off), b = [2.5, 7.5) (the rest
// extended by two pages; its 0.5 MiB rest split off too). Freeing a frees page 0 wholly, page 1 only
// partly (b starts inside it).
TEST(PoolExpandable, PartialPagesStayMapped) {
  XRig rig;
  void* a = rig.alloc(2 * MiB + 512 * KiB);
  void* b = rig.alloc(5 * MiB);
  EXPECT_EQ(b, at(a, 2 * MiB + 512 * KiB));
  EXPECT_EQ(rig.up.bytes_mapped(), 8 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 2 * MiB);
  EXPECT_EQ(rig.up.bytes_mapped(), 6 * MiB);
  rig.expect_intact();
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 6 * MiB);
  EXPECT_EQ(rig.up.bytes_mapped(), 0u);
  rig.expect_intact();
}

TEST(PoolExpandable, OomUnmapsCachedPagesAndRetries) {
  XRig rig(expandable(), 16 * MiB, /*auto_fence=*/false);
  void* a = rig.alloc(12 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);     // local to stream 0
  void* s1 = rig.alloc(100, 1);                     // small pool: its own range, one 2 MiB page
  AllocResult r = rig.pool->allocate(14 * MiB, 5);  // 12 + 2 + 14 > 16
  ASSERT_EQ(r.status, AllocStatus::ok);             // wait (a becomes shared), unmap a's pages, map again
  Stats st = rig.pool->stats();
  EXPECT_EQ(st.num_sync_all_streams, 1);
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(rig.up.bytes_mapped(), 16 * MiB);
  EXPECT_GE(rig.up.unmap_calls(), 1u);
  (void)s1;
  rig.expect_intact();
}

TEST(PoolExpandable, LimitRefusesWithoutMapping) {
  PoolOptions o = expandable();
  o.max_reserved = 8 * MiB;
  XRig rig(o);
  void* a = rig.alloc(6 * MiB);
  ASSERT_NE(a, nullptr);
  const std::size_t maps = rig.up.map_calls();
  EXPECT_EQ(rig.pool->allocate(4 * MiB, 0).status, AllocStatus::out_of_memory);
  EXPECT_EQ(rig.up.map_calls(), maps);
  rig.expect_intact();
}

TEST(PoolExpandable, GcUnmapsOldFreePages) {
  PoolOptions o = expandable(FreeSync::fenced);
  o.garbage_collection_threshold = 0.5;
  o.max_reserved = 40 * MiB;  // GC above 20 MiB
  XRig rig(o);
  void* a = rig.alloc(10 * MiB);
  void* b = rig.alloc(10 * MiB);
  void* c = rig.alloc(4 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  (void)rig.alloc(2 * MiB);       // a+b become shared (fenced) and merge; 2 MiB come from them
  void* d = rig.alloc(30 * MiB);  // miss: reserved 24 > 20 -> GC unmaps the old free pages
  EXPECT_EQ(d == nullptr, false);
  EXPECT_EQ(rig.pool->stats().gc_passes, 1);
  EXPECT_GT(rig.pool->stats().gc_freed_bytes, 0);
  (void)c;
  rig.expect_intact();
}

TEST(PoolExpandable, FallsBackToSegmentsWithoutGranularity) {
  PoolRig rig(expandable());  // the fake reports granularity 0: unsupported
  void* a = rig.alloc(5 * MiB);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  EXPECT_EQ(rig.up.reserve_calls(), 0u);
  EXPECT_FALSE(rig.pool->address_info(a)->expandable);
  rig.expect_intact();
}

// The default page of the large range is 20 MiB (one physical allocation upstream, ~10x fewer
// driver calls per byte on a GPU); the small range keeps the driver's granularity.
TEST(PoolExpandable, LargeRangeMapsTwentyMiBPages) {
  PoolOptions o = expandable();
  o.expandable_large_page = 20 * MiB;
  XRig rig(o);
  void* a = rig.alloc(3 * MiB);  // large pool: one 20 MiB page, 17 MiB of it left free
  EXPECT_EQ(rig.up.bytes_mapped(), 20 * MiB);
  EXPECT_EQ(rig.up.pages_mapped(), 1u);
  void* b = rig.alloc(15 * MiB);  // fits in the rest of that page: no driver call
  EXPECT_EQ(b, at(a, 3 * MiB));
  EXPECT_EQ(rig.up.map_calls(), 1u);
  void* s = rig.alloc(1000);  // small pool: its own range in 2 MiB pages
  EXPECT_EQ(rig.up.bytes_mapped(), 22 * MiB);
  EXPECT_EQ(rig.up.reservation_pages().size(), 2u);
  std::vector<std::size_t> pages = rig.up.reservation_pages();
  std::sort(pages.begin(), pages.end());
  EXPECT_EQ(pages, (std::vector<std::size_t>{2 * MiB, 20 * MiB}));
  void* c = rig.alloc(30 * MiB);  // 2 MiB free at the end of the run + 2 new pages (40 MiB)
  EXPECT_EQ(c, at(a, 18 * MiB));
  EXPECT_EQ(rig.up.bytes_mapped(), 62 * MiB);
  EXPECT_EQ(rig.up.pages_mapped(), 1u + 1u + 2u);
  EXPECT_EQ(rig.pool->stats().reserved_bytes[kAll].current, static_cast<std::int64_t>(62 * MiB));
  rig.expect_intact();
  for (void* p : {a, b, c, s}) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  rig.pool->empty_cache();  // every page wholly free again: all go back, in whole pages
  EXPECT_EQ(rig.up.bytes_mapped(), 0u);
  EXPECT_EQ(rig.up.bad_calls(), 0u);
  rig.expect_intact();
}

// A 20 MiB page is released only when all of it is free: a live block keeps its pages mapped.
TEST(PoolExpandable, LargePageStaysWhileAnyOfItIsLive) {
  PoolOptions o = expandable();
  o.expandable_large_page = 20 * MiB;
  XRig rig(o);
  void* a = rig.alloc(18 * MiB);
  void* b = rig.alloc(4 * MiB);  // 2 MiB at the end of page 0, 2 MiB into page 1
  EXPECT_EQ(b, at(a, 18 * MiB));
  EXPECT_EQ(rig.up.bytes_mapped(), 40 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  rig.pool->empty_cache();  // page 0 holds part of b, page 1 too: nothing can go back
  EXPECT_EQ(rig.up.bytes_mapped(), 40 * MiB);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  rig.pool->empty_cache();
  EXPECT_EQ(rig.up.bytes_mapped(), 0u);
  EXPECT_EQ(rig.up.bad_calls(), 0u);
  rig.expect_intact();
}

// Recycling never moves a 2 MiB page of the small range into the 20 MiB-page large range (a
// page is one physical allocation upstream): the large range maps its own.
TEST(PoolExpandable, NoRecyclingAcrossPageSizes) {
  PoolOptions o = expandable(FreeSync::immediate);
  o.expandable_large_page = 20 * MiB;
  XRig rig(o);
  std::vector<void*> small;
  for (int i = 0; i < 40; ++i) small.push_back(rig.alloc(1 * MiB));  // 20 small pages
  for (void* p : small) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  EXPECT_EQ(rig.up.bytes_mapped(), 40 * MiB);
  void* big = rig.alloc(20 * MiB);  // above the high-water mark: recycling is looked for
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(rig.up.move_calls(), 0u);
  EXPECT_EQ(rig.up.bad_calls(), 0u);
  EXPECT_EQ(rig.up.pages_mapped(), 20u + 1u);
  rig.expect_intact();
}

// Fresh pages are shared at once, as a classic segment is: streams that allocate small blocks in
// turn (threads on their own streams, cudaFree meaning) split one page between them, and a GPU-side
// wait is asked only once a page's blocks are all pending, not on every other allocation (each
// wait is driver calls on every stream). Fences here never complete by themselves.
TEST(PoolExpandable, StreamsInTurnSplitOnePageWithoutGpuWaitsPerPair) {
  for (bool xs : {false, true}) {
    PoolOptions o = xs ? expandable(FreeSync::gpu_wait) : PoolOptions{};  // no growth slack (below)
    o.free_sync = FreeSync::gpu_wait;
    PoolRig rig(o, 1 * GiB, /*auto_fence=*/false);
    rig.up.set_granularity(2 * MiB);
    constexpr int kPairs = 4000;
    std::set<void*> seen;
    for (int i = 0; i < kPairs; ++i) {
      void* p = rig.alloc(64 << 10, static_cast<StreamId>(100 + i % 4));
      seen.insert(p);
      ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
    }
    // 32 blocks of 64 KiB to a 2 MiB page: one wait per page's worth of pairs, for either kind.
    EXPECT_LE(rig.fence.order_calls(), static_cast<std::size_t>(kPairs / 32 + 2)) << "expandable=" << xs;
    EXPECT_EQ(seen.size(), 32u) << "expandable=" << xs;  // the whole page, across the four streams
    EXPECT_EQ(rig.pool->stats().reserved_bytes[kAll].peak, static_cast<std::int64_t>(2 * MiB));
    rig.expect_intact();
  }
}

// The growth slack (PoolOptions::expandable_slack, 16 MiB by default): small growth past the live
// peak maps fresh pages instead of making every stream wait on the GPU for pending frees; it stops
// at the slack, and then the GPU-side waits take over.
TEST(PoolExpandable, GrowthWithinTheSlackMapsInsteadOfWaitingOnTheGpu) {
  for (std::size_t slack : {std::size_t{0}, 16 * MiB}) {
    PoolOptions o = expandable(FreeSync::gpu_wait);
    o.expandable_slack = slack;
    PoolRig rig(o, 1 * GiB, /*auto_fence=*/false);
    rig.up.set_granularity(2 * MiB);
    constexpr int kPairs = 4000;
    for (int i = 0; i < kPairs; ++i) {
      void* p = rig.alloc(64 << 10, static_cast<StreamId>(100 + i % 4));
      ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
    }
    const auto peak = static_cast<std::size_t>(rig.pool->stats().reserved_bytes[kAll].peak);
    if (slack == 0) {
      EXPECT_EQ(peak, 2 * MiB);
      EXPECT_GE(rig.fence.order_calls(), static_cast<std::size_t>(kPairs / 32 - 2));
    } else {
      // Eight pages of 32 blocks before the first wait; the live peak is one block.
      EXPECT_EQ(peak, 16 * MiB);
      EXPECT_LE(rig.fence.order_calls(), static_cast<std::size_t>(kPairs / 32 - 8 + 2));
      EXPECT_GE(rig.up.map_calls(), 8u);
    }
    rig.expect_intact();
  }
}

// Growth by mapping pages reports its refusals as a segment would: the budget's, then the
// driver's own error code.
TEST(PoolExpandable, MapRefusalCarriesItsCause) {
  XRig rig;
  rig.up.fail_next(3, UpstreamStatus{UpstreamStatus::out_of_memory, 2, true});
  AllocResult r = rig.pool->allocate(5 * MiB, 0);
  EXPECT_EQ(r.status, AllocStatus::out_of_memory);
  EXPECT_EQ(r.refusal, Refusal::budget);
  EXPECT_EQ(r.upstream_error, 2);
  // What it asked for is the pages of the growth, not the classic segment of the size.
  EXPECT_GE(r.asked_bytes, 5 * MiB);
  EXPECT_EQ(r.asked_bytes % (2 * MiB), 0u);  // whole pages
  EXPECT_LT(r.asked_bytes, segment_size_for(5 * MiB)) << r.asked_bytes;
  rig.up.fail_next(1, UpstreamStatus{UpstreamStatus::error, 700});
  r = rig.pool->allocate(5 * MiB, 0);
  EXPECT_EQ(r.status, AllocStatus::upstream_error);
  EXPECT_EQ(r.upstream_error, 700);
  EXPECT_EQ(rig.up.bytes_mapped(), 0u);
  rig.expect_intact();
}
