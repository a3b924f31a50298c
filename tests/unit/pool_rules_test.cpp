// Best fit, split, merge and oversize rules (PyTorch's, "Finding, splitting, merging").
// Expected addresses and sizes are worked out by hand in the comments.
#include <gtest/gtest.h>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {
constexpr StreamId kS = 5;
}

// Segment layout (small pool, one 2 MiB segment), all on stream kS with immediate frees:
//   a1 4 KiB | g1 512 | a2 8 KiB | g2 512 | a3 4 KiB | g3 512 | rest
// Freeing a1, a2, a3 leaves three free holes (the gaps keep them apart) plus the rest.
TEST(PoolRules, BestFitBySizeThenAddress) {
  PoolRig rig(immediate_options());
  void* a1 = rig.alloc(4 * KiB, kS);
  void* g1 = rig.alloc(512, kS);
  void* a2 = rig.alloc(8 * KiB, kS);
  void* g2 = rig.alloc(512, kS);
  void* a3 = rig.alloc(4 * KiB, kS);
  void* g3 = rig.alloc(512, kS);
  ASSERT_EQ(g1, at(a1, 4 * KiB));
  ASSERT_EQ(a3, at(a1, 4 * KiB + 512 + 8 * KiB + 512));
  for (void* p : {a1, a2, a3}) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  rig.expect_intact();
  EXPECT_EQ(rig.alloc(3 * KiB, kS), a1);  // smallest fitting (4 KiB), lowest address of the two
  EXPECT_EQ(rig.alloc(4 * KiB, kS), a3);  // the other 4 KiB hole
  EXPECT_EQ(rig.alloc(6 * KiB, kS), a2);  // only the 8 KiB hole fits; split, 2 KiB stay free
  EXPECT_EQ(rig.alloc(2 * KiB, kS), at(a2, 6 * KiB));
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  (void)g2;
  (void)g3;
  rig.expect_intact();
}

TEST(PoolRules, SmallPoolSplitsDownTo512) {
  PoolRig rig(immediate_options());
  void* a = rig.alloc(1 * MiB);        // small pool (<= 1 MiB), 2 MiB segment
  void* b = rig.alloc(1 * MiB - 512);  // leaves exactly 512 B: still split
  EXPECT_EQ(b, at(a, 1 * MiB));
  auto s = rig.pool->stats();
  EXPECT_EQ(s.allocated_bytes[kSmallPool].current, static_cast<std::int64_t>(2 * MiB - 512));
  EXPECT_EQ(s.allocated_bytes[kLargePool].current, 0);
  EXPECT_EQ(s.inactive_split_bytes[kSmallPool].current, 512);
  void* c = rig.alloc(512);
  EXPECT_EQ(c, at(a, 2 * MiB - 512));
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  rig.expect_intact();
}

// Large pool, classic segments: split only if the remainder is > 1 MiB (and the request <
// max_split_size). Expandable segments: PoolExpandable.LargeTailsSplitOffDownToAMinimalBlock.
TEST(PoolRules, LargePoolSplitNeedsMoreThan1MiB) {
  PoolRig rig(immediate_options());
  void* a = rig.alloc(19 * MiB);  // segment 20 MiB, remainder 1 MiB: not split
  auto s = rig.pool->stats();
  EXPECT_EQ(s.allocated_bytes[kLargePool].current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(s.requested_bytes[kLargePool].current, static_cast<std::int64_t>(19 * MiB));
  EXPECT_EQ(s.inactive_split[kLargePool].current, 0);
  void* b = rig.alloc(18 * MiB + 512);  // new 20 MiB segment, remainder 2 MiB - 512: split
  s = rig.pool->stats();
  EXPECT_EQ(s.allocated_bytes[kLargePool].current, static_cast<std::int64_t>(38 * MiB + 512));
  EXPECT_EQ(s.inactive_split_bytes[kLargePool].current, static_cast<std::int64_t>(2 * MiB - 512));
  EXPECT_NE(rig.segment_size_of(a), 0u);
  EXPECT_NE(rig.segment_size_of(b), 0u);
  rig.expect_intact();
}

TEST(PoolRules, FreeMergesNeighboursBackIntoOneBlock) {
  PoolRig rig(immediate_options());
  void* a = rig.alloc(1 * KiB, kS);
  void* b = rig.alloc(1 * KiB, kS);
  void* c = rig.alloc(1 * KiB, kS);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(c), FreeStatus::ok);
  auto snap = rig.pool->snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  // a (free, local) | b | c + the fresh rest: a local block swallows shared neighbours.
  EXPECT_EQ(snap.segments[0].blocks.size(), 3u);
  EXPECT_EQ(snap.segments[0].blocks[2].size, 2 * MiB - 2 * KiB);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  snap = rig.pool->snapshot();
  ASSERT_EQ(snap.segments[0].blocks.size(), 1u);  // whole again
  EXPECT_EQ(snap.segments[0].blocks[0].size, 2 * MiB);
  EXPECT_EQ(rig.pool->stats().inactive_split[kAll].current, 0);
  rig.expect_intact();
  // empty_cache promotes (fence on kS), merges the segment back whole and releases it.
  EXPECT_EQ(rig.pool->empty_cache(), 2 * MiB);
  EXPECT_EQ(rig.up.bytes_held(), 0u);
  rig.expect_intact();
}

TEST(PoolRules, BlocksOfDifferentStreamsDoNotMerge) {
  PoolRig rig(immediate_options());
  void* a = rig.alloc(1 * KiB, 1);
  void* b = rig.alloc(1 * KiB, 1);
  ASSERT_EQ(rig.pool->free_on_stream(a, 1), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free_on_stream(b, 2), FreeStatus::ok);
  // a is local to 1; b (local to 2) swallowed the fresh shared rest but not a.
  auto snap = rig.pool->snapshot();
  EXPECT_EQ(snap.segments[0].blocks.size(), 2u);
  EXPECT_EQ(snap.segments[0].blocks[0].size, 1 * KiB);
  EXPECT_EQ(rig.pool->stats().inactive_split[kSmallPool].current, 2);
  rig.expect_intact();
}

// max_split_size = 20 MiB: a cached 40 MiB block is oversize.
TEST(PoolRules, OversizeBlockNotGivenToSmallerRequest) {
  PoolOptions o = immediate_options();
  o.max_split_size = 20 * MiB;
  PoolRig rig(o);
  void* big = rig.alloc(40 * MiB);
  EXPECT_EQ(rig.pool->stats().oversize_segments.current, 1);
  EXPECT_EQ(rig.pool->stats().oversize_allocations.current, 1);
  ASSERT_EQ(rig.pool->free(big), FreeStatus::ok);
  EXPECT_EQ(rig.pool->stats().oversize_allocations.current, 0);
  void* small = rig.alloc(5 * MiB);  // < M: must not take the 40 MiB block
  EXPECT_NE(small, big);
  EXPECT_EQ(rig.up.allocate_calls(), 2u);
  // >= M but 40 >= 20 + 20 (max_non_split_rounding): not given either.
  void* twenty = rig.alloc(20 * MiB);
  EXPECT_NE(twenty, big);
  EXPECT_EQ(rig.up.allocate_calls(), 3u);
  // 30 MiB: 40 < 30 + 20: given whole, not split.
  void* thirty = rig.alloc(30 * MiB);
  EXPECT_EQ(thirty, big);
  EXPECT_EQ(rig.up.allocate_calls(), 3u);
  EXPECT_EQ(rig.pool->stats().allocated_bytes[kLargePool].current, static_cast<std::int64_t>(40 + 5 + 20) * MiB);
  rig.expect_intact();
}

TEST(PoolRules, MaxNonSplitRoundingWidensOversizeReuse) {
  PoolOptions o = immediate_options();
  o.max_split_size = 20 * MiB;
  o.max_non_split_rounding = 30 * MiB;
  PoolRig rig(o);
  void* big = rig.alloc(40 * MiB);
  ASSERT_EQ(rig.pool->free(big), FreeStatus::ok);
  EXPECT_EQ(rig.alloc(20 * MiB), big);  // 40 < 20 + 30
  rig.expect_intact();
}

// A fresh segment bigger than M made for a request below M is used (PyTorch's alloc_block),
// and split normally.
TEST(PoolRules, FreshSegmentServesRequestBelowMaxSplit) {
  PoolOptions o = immediate_options();
  o.max_split_size = 20 * MiB;
  PoolRig rig(o);
  void* a = rig.alloc(5 * MiB);
  EXPECT_EQ(rig.segment_size_of(a), 20 * MiB);
  EXPECT_EQ(rig.pool->stats().allocated_bytes[kAll].current, static_cast<std::int64_t>(5 * MiB));
  EXPECT_EQ(rig.pool->stats().oversize_segments.current, 1);
  rig.expect_intact();
}
