// expandable_segments, physical units (expandable_unit_mb): growth maps fresh memory as few
// physical allocations of up to PoolOptions::expandable_max_unit, and the pool unmaps, moves and
// releases only whole units (the driver cannot cut one). The fake upstream refuses any unmap or
// move that is not whole units (bad_calls) and reports the units it holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {
constexpr std::size_t kPage = 2 * MiB;

PoolOptions uopt(std::size_t max_unit, FreeSync sync = FreeSync::fenced) {
  PoolOptions o;
  o.expandable_segments = true;
  o.expandable_slack = 0;       // exact page arithmetic: no growth slack
  o.expandable_large_page = 0;  // 2 MiB pages
  o.expandable_max_unit = max_unit;
  o.expandable_unit_share = 0;  // every unit up to the cap (UnitsScaleWithThePool: the default)
  o.free_sync = sync;
  return o;
}
struct URig : PoolRig {
  explicit URig(PoolOptions o) : PoolRig(o, 1 * GiB, /*auto_fence=*/true) { up.set_granularity(kPage); }
  void expect_clean() {
    expect_intact();  // check() includes: the units tile every mapped run exactly
    EXPECT_EQ(static_cast<std::size_t>(pool->stats().reserved_bytes[kAll].current), up.bytes_mapped());
    EXPECT_EQ(up.bad_calls(), 0u);
  }
  std::vector<std::size_t> units_mib() const {
    std::vector<std::size_t> v = up.unit_sizes();
    for (std::size_t& x : v) x /= MiB;
    return v;
  }
};
using V = std::vector<std::size_t>;
}  // namespace

TEST(PoolUnits, GrowthMapsUnitsUpToTheCap) {
  URig rig(uopt(16 * MiB));
  void* a = rig.alloc(100 * MiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(rig.units_mib(), (V{16, 16, 16, 16, 16, 16, 4}));
  EXPECT_EQ(rig.up.map_calls(), 7u);
  rig.expect_clean();
}

// The default: a growth maps units of at most 1/64 of the pool after it (a power of two, one
// page at least, the cap at most), so a small pool keeps small units.
TEST(PoolUnits, UnitsScaleWithThePool) {
  PoolOptions o = uopt(16 * MiB);
  o.expandable_unit_share = 64;
  URig rig(o);
  void* a = rig.alloc(100 * MiB);  // 100 MiB / 64 -> 1 MiB: one 2 MiB page per unit
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(rig.units_mib(), V(50, 2));
  void* b = rig.alloc(412 * MiB);  // 512 MiB / 64 = 8 MiB units: 51 of them and one of 4 MiB
  ASSERT_NE(b, nullptr);
  V want(50, 2);
  want.insert(want.end(), 51, 8);
  want.push_back(4);
  V got = rig.units_mib();
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  rig.expect_clean();
  // The cap still holds: 600 MiB of pool would allow 8 MiB units, a cap of 4 MiB keeps them at 4.
  PoolOptions c = uopt(4 * MiB);
  c.expandable_unit_share = 64;
  URig capped(c);
  ASSERT_NE(capped.alloc(600 * MiB), nullptr);
  EXPECT_EQ(capped.units_mib(), V(150, 4));
  capped.expect_clean();
}

TEST(PoolUnits, ZeroCapMapsOnePagePerUnit) {
  URig rig(uopt(0));
  ASSERT_NE(rig.alloc(20 * MiB), nullptr);
  EXPECT_EQ(rig.units_mib(), V(10, 2));
  // A cap that is not a whole number of pages rounds down to one.
  URig odd(uopt(5 * MiB));
  ASSERT_NE(odd.alloc(10 * MiB), nullptr);
  EXPECT_EQ(odd.units_mib(), (V{4, 4, 2}));
  odd.expect_clean();
}

// A unit partly in use stays mapped through empty_cache; the wholly free ones go, and the
// last one once its block is freed.
TEST(PoolUnits, OnlyWhollyFreeUnitsAreReleased) {
  URig rig(uopt(16 * MiB));
  void* a = rig.alloc(64 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* b = rig.alloc(3 * MiB);  // best fit: the start of a's free run, inside its first unit
  ASSERT_EQ(b, a);
  EXPECT_EQ(rig.pool->empty_cache(), 48 * MiB);
  EXPECT_EQ(rig.units_mib(), (V{16}));
  EXPECT_EQ(rig.up.bytes_mapped(), 16 * MiB);
  rig.expect_clean();
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 16 * MiB);
  EXPECT_EQ(rig.up.bytes_mapped(), 0u);
  rig.expect_clean();
}

// Growth past the high-water mark moves whole free units (one driver remap each, no new
// physical memory) instead of mapping fresh ones.
TEST(PoolUnits, RecyclingMovesWholeUnits) {
  URig rig(uopt(16 * MiB));
  void* a = rig.alloc(32 * MiB);
  void* b = rig.alloc(32 * MiB);
  void* c = rig.alloc(32 * MiB);
  void* d = rig.alloc(32 * MiB);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_EQ(rig.up.map_calls(), 8u);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(c), FreeStatus::ok);
  void* e = rig.alloc(64 * MiB);  // fits no free block; a's and c's units move behind d
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(rig.up.units_moved(), 4u);
  EXPECT_EQ(rig.up.map_calls(), 8u + rig.up.move_calls());  // nothing fresh: moves only
  EXPECT_EQ(rig.up.bytes_mapped(), 128 * MiB);
  EXPECT_EQ(rig.up.peak_bytes(), 128 * MiB);
  EXPECT_EQ(rig.units_mib(), V(8, 16));
  rig.expect_clean();
}

// Recycling can only take a whole unit; when the unit is larger than what is left of the hole,
// it is given back (unmapped whole) and the hole gets a fresh unit of its own size: never a cut
// unit, and the mapped total still at or below the high-water mark.
TEST(PoolUnits, AUnitTooLargeForTheHoleIsReleasedNotCut) {
  URig rig(uopt(16 * MiB));
  void* a = rig.alloc(16 * MiB);  // unit [0, 16)
  void* b = rig.alloc(4 * MiB);   // unit [16, 20)
  void* c = rig.alloc(14 * MiB);  // unit [20, 34)
  ASSERT_TRUE(a && b && c);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(c), FreeStatus::ok);
  // 18 MiB fits neither free block; c's 14 plus 4 fresh MiB behind it is the cheapest growth,
  // which passes the mark by 4 MiB: a's 16 MiB unit is the only recyclable one.
  void* e = rig.alloc(18 * MiB);
  ASSERT_EQ(e, c);
  EXPECT_EQ(rig.up.units_moved(), 0u);
  EXPECT_EQ(rig.units_mib(), (V{4, 14, 4}));
  EXPECT_EQ(rig.up.bytes_mapped(), 22 * MiB);
  EXPECT_LE(rig.up.peak_bytes(), 34 * MiB);
  rig.expect_clean();
}

// Random sizes, frees and empty_cache calls with 16 MiB units: the pool's structures, the
// units and the fake's mapping agree after every step, and no unmap or move ever cuts a unit.
TEST(PoolUnits, RandomWorkKeepsUnitsWhole) {
  for (FreeSync sync : {FreeSync::fenced, FreeSync::immediate}) {
    for (unsigned seed = 1; seed <= 4; ++seed) {
      URig rig(uopt(16 * MiB, sync));
      std::mt19937 rng(seed);
      std::vector<void*> live;
      for (int i = 0; i < 3000; ++i) {
        const auto op = rng() % 10;
        if (op < 5 || live.empty()) {
          const std::size_t mib = 1 + rng() % (rng() % 4 == 0 ? 96 : 12);
          const std::size_t bytes = mib * MiB - (rng() % 2) * 300 * 1024;
          AllocResult r = rig.pool->allocate(bytes, 0);
          if (r.status == AllocStatus::ok) live.push_back(r.ptr);
        } else if (op < 9) {
          const std::size_t k = rng() % live.size();
          ASSERT_EQ(rig.pool->free(live[k]), FreeStatus::ok);
          live[k] = live.back();
          live.pop_back();
        } else {
          rig.pool->empty_cache();
        }
        if (i % 100 == 0) {
          ASSERT_EQ(rig.pool->check_consistency(), "") << "seed " << seed << " step " << i;
          ASSERT_EQ(rig.up.bad_calls(), 0u) << "seed " << seed << " step " << i;
        }
      }
      for (void* p : live) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
      rig.pool->empty_cache();
      rig.expect_clean();
      EXPECT_EQ(rig.up.bytes_mapped(), 0u);
      EXPECT_GT(rig.up.units_moved(), 0u) << "the run should exercise recycling";
    }
  }
}
