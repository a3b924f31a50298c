// Size rules, expected values worked out by hand from PyTorch's documented rules
// (docs/design.md, "Size rules").
#include <gtest/gtest.h>

#include <limits>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

TEST(PoolSizes, RoundsTo512) {
  PoolOptions o;
  EXPECT_EQ(round_size(1, o), 512u);
  EXPECT_EQ(round_size(512, o), 512u);
  EXPECT_EQ(round_size(513, o), 1024u);
  EXPECT_EQ(round_size(1200, o), 1536u);
  EXPECT_EQ(round_size(1 * MiB + 1, o), 1 * MiB + 512);
  EXPECT_EQ(round_size(12 * MiB + 16, o), 12 * MiB + 512);
}

TEST(PoolSizes, SmallAndLargePools) {
  EXPECT_TRUE(is_small(512));
  EXPECT_TRUE(is_small(1 * MiB));
  EXPECT_FALSE(is_small(1 * MiB + 512));
}

TEST(PoolSizes, SegmentSizes) {
  EXPECT_EQ(segment_size_for(512), 2 * MiB);
  EXPECT_EQ(segment_size_for(1 * MiB), 2 * MiB);
  EXPECT_EQ(segment_size_for(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(segment_size_for(5 * MiB), 20 * MiB);
  EXPECT_EQ(segment_size_for(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(segment_size_for(10 * MiB), 10 * MiB);
  EXPECT_EQ(segment_size_for(12 * MiB + 512), 14 * MiB);
  EXPECT_EQ(segment_size_for(14 * MiB), 14 * MiB);
}

TEST(PoolSizes, PoolAsksUpstreamForPyTorchSegmentSizes) {
  PoolRig rig;
  void* a = rig.alloc(5 * MiB);
  EXPECT_EQ(rig.up.bytes_held(), 20 * MiB);
  EXPECT_EQ(rig.segment_size_of(a), 20 * MiB);
  // 12 MiB + 16 B fits the 15 MiB remainder of that segment: no new segment (best fit).
  void* b = rig.alloc(12 * MiB + 16);
  EXPECT_EQ(b, at(a, 5 * MiB));
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  void* c = rig.alloc(100);
  EXPECT_EQ(rig.segment_size_of(c), 2 * MiB);
  EXPECT_EQ(rig.up.allocate_calls(), 2u);
  rig.expect_intact();

  PoolRig fresh;
  void* d = fresh.alloc(12 * MiB + 16);
  EXPECT_EQ(fresh.segment_size_of(d), 14 * MiB);
  EXPECT_EQ(fresh.up.bytes_held(), 14 * MiB);
  EXPECT_EQ(fresh.pool->stats().allocated_bytes[kAll].current, static_cast<std::int64_t>(12 * MiB + 512));
  fresh.expect_intact();
}

// roundup_power2_divisions: N steps between floor_pow2(s) and 2*floor_pow2(s), applied only when
// s > 512 * N (below that plain 512 B rounding, as PyTorch's round_size does).
TEST(PoolSizes, PowerOfTwoDivisionsScalar) {
  PoolOptions o;
  o.roundup_power2_divisions.fill(4);
  // 1200 <= 512*4 = 2048: PyTorch's code rounds it to 512 multiples (1536), not 1280.
  EXPECT_EQ(round_size(1200, o), 1536u);
  EXPECT_EQ(round_size(2100, o), 2560u);                       // floor 2048, step 512
  EXPECT_EQ(round_size(5000, o), 5120u);                       // floor 4096, step 1024
  EXPECT_EQ(round_size(4096, o), 4096u);                       // powers of two stay
  EXPECT_EQ(round_size(1 * MiB + 1, o), 1 * MiB + 256 * KiB);  // floor 1 MiB, step 256 KiB
  EXPECT_EQ(round_size(3 * MiB, o), 3 * MiB);                  // already on a step (2, 2.5, 3, 3.5 MiB)
  EXPECT_EQ(round_size(3 * MiB + 1, o), 3 * MiB + 512 * KiB);
  o.roundup_power2_divisions.fill(2);
  EXPECT_EQ(round_size(1200, o), 1536u);  // 1200 > 1024: floor 1024, step 512
  EXPECT_EQ(round_size(1600, o), 2048u);
}

// List form [256:1,512:2,>:4] as config/ turns it into the bucket array: bucket i covers
// [2^(20+i), 2^(21+i)); 256 MiB is bucket 8, 512 MiB bucket 9; the first entry also covers
// every smaller bucket, '>' every bucket above the last key.
TEST(PoolSizes, PowerOfTwoDivisionsListForm) {
  PoolOptions o;
  for (std::size_t i = 0; i <= 8; ++i) o.roundup_power2_divisions[i] = 1;
  o.roundup_power2_divisions[9] = 2;
  for (std::size_t i = 10; i < kRoundupIntervals; ++i) o.roundup_power2_divisions[i] = 4;
  EXPECT_EQ(round_size(3 * MiB + 1, o), 3 * MiB + 512);      // bucket 1: off
  EXPECT_EQ(round_size(300 * MiB + 1, o), 300 * MiB + 512);  // bucket 8: 1 = off
  EXPECT_EQ(round_size(600 * MiB + 1, o), 768 * MiB);        // bucket 9: halves of 512 MiB
  EXPECT_EQ(round_size(1100 * MiB, o), 1280 * MiB);          // bucket 10: quarters of 1 GiB
  EXPECT_EQ(round_size(40 * GiB + 1, o), 48 * GiB);          // last bucket: quarters of 32 GiB
}

TEST(PoolSizes, BucketBoundaries) {
  PoolOptions o;
  o.roundup_power2_divisions[1] = 8;  // only [2 MiB, 4 MiB)
  EXPECT_EQ(round_size(2 * MiB + 1, o), 2 * MiB + 256 * KiB);
  EXPECT_EQ(round_size(4 * MiB + 1, o), 4 * MiB + 512);  // bucket 2 is off
  EXPECT_EQ(round_size(2 * MiB - 1, o), 2 * MiB);        // bucket 0 is off
}

TEST(PoolSizes, AbsurdSizes) {
  PoolOptions o;
  EXPECT_EQ(round_size(kMaxRequestSize + 1, o), 0u);
  EXPECT_EQ(round_size(std::numeric_limits<std::size_t>::max(), o), 0u);
  EXPECT_EQ(round_size(kMaxRequestSize, o), kMaxRequestSize);
  o.roundup_power2_divisions.fill(4);
  EXPECT_EQ(round_size(kMaxRequestSize - 1, o), kMaxRequestSize);  // no overflow near the cap
}
