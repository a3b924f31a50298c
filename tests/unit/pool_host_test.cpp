// The pinned host pool (allocator/host_pool.h) with a fake upstream and fake fences: reuse after
// a free only once the free's fence completed, the size-class bound, the cap on cached bytes,
// the reserve, frees of memory that is not a live block, and a context that goes away.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "allocator/host_pool.h"
#include "tests/support/fake_fence.h"

namespace cudapool {
namespace {

using testing::FakeFence;

// Page-aligned host memory from malloc, counted, with a byte limit (beyond it: `refusal`).
class FakeHostUpstream : public HostUpstream {
 public:
  HostUpstreamResult allocate(std::size_t bytes, unsigned flags) override {
    if (held + bytes > limit) return {nullptr, refusal};
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) return {nullptr, kMallocFailed};
    live[p] = {bytes, flags};
    held += bytes;
    ++allocs;
    return {p, 0};
  }
  static constexpr int kMallocFailed = 2;
  void release(void* p, std::size_t bytes, unsigned flags, std::uintptr_t owner) override {
    owners_released.push_back(owner);
    auto it = live.find(p);
    if (it == live.end() || it->second.first != bytes || it->second.second != flags) {
      ++bad_releases;
      return;
    }
    live.erase(it);
    held -= bytes;
    ++frees;
    std::free(p);
  }
  ~FakeHostUpstream() override {
    for (auto& [p, s] : live) std::free(p);
  }
  void forget(void* p, std::size_t bytes) override { forgotten.push_back({p, bytes}); }
  std::vector<std::pair<void*, std::size_t>> forgotten;
  std::map<void*, std::pair<std::size_t, unsigned>> live;
  std::vector<std::uintptr_t> owners_released;
  std::size_t held = 0, limit = SIZE_MAX;
  int refusal = 2;  // the code of a refusal past the limit
  int allocs = 0, frees = 0, bad_releases = 0;
};

constexpr HostPool::Owner kCtx = 0x1000, kOtherCtx = 0x2000;

struct Rig {
  explicit Rig(HostPoolOptions o = {}) : pool(o, up, fences) {}
  FakeHostUpstream up;
  FakeFence fences;
  HostPool pool;
  void* alloc(std::size_t n, unsigned flags = 0, HostPool::Owner owner = kCtx) {
    HostPool::Result r = pool.allocate(n, flags, owner);
    EXPECT_EQ(r.status, AllocStatus::ok);
    return r.ptr;
  }
};

TEST(HostPool, SizeClassesWasteAtMostAQuarterAbove16KiB) {
  for (std::size_t s : {1ul, 4095ul, 4096ul, 4097ul, 16384ul}) {
    EXPECT_EQ(host_class_size(s, kNoLimit) % 4096, 0u) << s;
    EXPECT_LT(host_class_size(s, kNoLimit) - s, 4096u) << s;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const std::size_t s = 16385 + rng() % (std::size_t{8} << 30);
    const std::size_t c = host_class_size(s, kNoLimit), m = host_max_block(s, kNoLimit);
    ASSERT_GE(c, s);
    ASSERT_LE(c, s + s / 4) << s;
    ASSERT_LE(m, s + s / 4) << s;
    ASSERT_GE(m, c);
  }
  // Above the rounding threshold: whole pages, and only blocks of exactly that size.
  EXPECT_EQ(host_class_size(5 * MiB + 1, 4 * MiB), 5 * MiB + 4096);
  EXPECT_EQ(host_max_block(5 * MiB + 1, 4 * MiB), 5 * MiB + 4096);
  EXPECT_EQ(host_class_size(0, kNoLimit), 0u);
  EXPECT_EQ(host_class_size(std::size_t{2} << 40, kNoLimit), 0u);
}

TEST(HostPool, FreedBlockComesBackOnlyAfterItsFence) {
  Rig r;
  // Four live blocks: new memory for one more stays within the held-memory bound, so the pool
  // grows rather than waits (the bound's waits are the next tests').
  for (int i = 0; i < 4; ++i) r.alloc(1 * MiB);
  void* a = r.alloc(1 * MiB);
  EXPECT_EQ(r.pool.free(a), FreeStatus::ok);
  EXPECT_EQ(r.fences.device_records(), 1u);
  // The fence still runs (an async copy may still read the block): new memory, not the block,
  // also after asking again urgently (it still runs).
  void* b = r.alloc(1 * MiB);
  EXPECT_NE(b, a);
  EXPECT_EQ(r.up.allocs, 6);
  EXPECT_EQ(r.pool.stats().fence_skips, 1);
  EXPECT_EQ(r.fences.urgent_queries(), 1u);
  EXPECT_EQ(r.fences.waits(), 0u);
  r.fences.complete_all();
  void* c = r.alloc(1 * MiB);
  EXPECT_EQ(c, a);  // the GPU is done with it: reused, no new upstream call
  EXPECT_EQ(r.up.allocs, 6);
  EXPECT_EQ(r.pool.stats().cache_hits, 1);
  EXPECT_EQ(r.pool.check_consistency(), "");
  EXPECT_EQ(r.fences.bad_calls(), 0u);
}

// Before pinning new memory (the driver's milliseconds) a block whose fence a plain query did
// not see complete is asked again urgently: the shim's fences sweep the streams at once then,
// where a plain query waits for the next sweep.
TEST(HostPool, AsksAgainUrgentlyBeforePinningNewMemory) {
  Rig r;
  r.fences.set_urgent_completes(true);
  for (int i = 0; i < 4; ++i) r.alloc(1 * MiB);  // within the bound: no wait would be needed
  void* a = r.alloc(1 * MiB);
  ASSERT_EQ(r.pool.free(a), FreeStatus::ok);
  EXPECT_EQ(r.alloc(1 * MiB), a);
  EXPECT_EQ(r.up.allocs, 5);
  EXPECT_EQ(r.fences.urgent_queries(), 1u);
  EXPECT_EQ(r.fences.waits(), 0u);
  const HostStats s = r.pool.stats();
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.fence_skips, 0);
  EXPECT_EQ(s.bound_waits, 0);
  EXPECT_EQ(r.fences.bad_calls(), 0u);
}

// New memory that would take the pool past the held-memory bound (1.25x the live requests) is
// not pinned while a fitting cached block only waits for its fence: the pool waits for that fence
// (no longer than the program's own cudaFreeHost would have), then hands the block out.
TEST(HostPool, WaitsForAFittingBlockRatherThanGrowPastTheBound) {
  Rig r;
  void* a = r.alloc(1 * MiB);
  ASSERT_EQ(r.pool.free(a), FreeStatus::ok);
  EXPECT_EQ(r.fences.outstanding(), 1u);
  // Held would be 2 MiB for 1 MiB live: over the bound.
  EXPECT_EQ(r.alloc(1 * MiB), a);
  EXPECT_EQ(r.up.allocs, 1);
  EXPECT_EQ(r.fences.waits(), 1u);        // the fence was waited for (the fake GPU caught up) ...
  EXPECT_EQ(r.fences.outstanding(), 0u);  // ... and released before the block went out
  HostStats s = r.pool.stats();
  EXPECT_EQ(s.bound_waits, 1);
  EXPECT_EQ(s.fence_waits, 1);
  EXPECT_EQ(s.cache_hits, 1);
  // A request no cached block fits is not held up: it grows (the bound then gives back only
  // segments the GPU is done with).
  void* b = r.alloc(1 * MiB);
  ASSERT_EQ(r.pool.free(b), FreeStatus::ok);
  EXPECT_NE(r.alloc(3 * MiB), b);
  EXPECT_EQ(r.up.allocs, 3);
  s = r.pool.stats();
  EXPECT_EQ(s.bound_waits, 1);
  EXPECT_EQ(r.fences.waits(), 1u);
  EXPECT_EQ(r.pool.check_consistency(), "");
  EXPECT_EQ(r.fences.bad_calls(), 0u);
}

// A fence that cannot be waited for now (the shim's, while a graph capture is open) is never
// waited for to keep the bound: the pool grows instead, and the block stays pending.
TEST(HostPool, NoBoundWaitOnAFenceThatCannotBeWaitedFor) {
  Rig r;
  r.fences.set_can_wait(false);
  void* a = r.alloc(1 * MiB);
  ASSERT_EQ(r.pool.free(a), FreeStatus::ok);
  EXPECT_NE(r.alloc(1 * MiB), a);
  EXPECT_EQ(r.up.allocs, 2);
  EXPECT_EQ(r.fences.waits(), 0u);
  EXPECT_EQ(r.pool.stats().bound_waits, 0);
  EXPECT_EQ(r.pool.stats().fence_skips, 1);
  EXPECT_EQ(r.pool.check_consistency(), "");
}

TEST(HostPool, ReuseSplitsToTheClassAndKeepsOwnerAndFlags) {
  Rig r;
  void* a = r.alloc(100 * KiB);  // class 112 KiB
  ASSERT_EQ(r.pool.free(a), FreeStatus::ok);
  r.fences.complete_all();
  // A smaller request takes the block's start, split to its own class (80 KiB); the rest stays
  // free and serves the next one.
  auto* b = static_cast<char*>(r.alloc(80 * KiB));
  EXPECT_EQ(b, a);
  EXPECT_EQ(r.alloc(32 * KiB), b + 80 * KiB);
  EXPECT_EQ(r.up.allocs, 1);
  EXPECT_EQ(r.pool.stats().allocated_bytes.current, static_cast<std::int64_t>(112 * KiB));
  // Freed again, the two halves merge back into one block that serves the first size.
  ASSERT_EQ(r.pool.free(b), FreeStatus::ok);
  ASSERT_EQ(r.pool.free(b + 80 * KiB), FreeStatus::ok);
  r.fences.complete_all();
  EXPECT_EQ(r.alloc(100 * KiB), a);
  EXPECT_EQ(r.pool.stats().cache_hits, 3);
  ASSERT_EQ(r.pool.free(a), FreeStatus::ok);
  r.fences.complete_all();
  // Another kind of pinned memory, another context's: new memory, never the cached block.
  r.alloc(100 * KiB, /*flags=*/2);
  r.alloc(100 * KiB, 0, kOtherCtx);
  EXPECT_EQ(r.up.allocs, 3);
  EXPECT_EQ(r.pool.stats().cache_hits, 3);
  EXPECT_EQ(r.pool.check_consistency(), "");
}

// New memory is mapped only within 1.25x of the live requests: cached segments the GPU is done
// with go back first; one whose fence still runs stays.
TEST(HostPool, GrowthKeepsHeldMemoryWithinTheBound) {
  Rig r;
  void* a = r.alloc(1 * MiB);
  void* b = r.alloc(1 * MiB);
  ASSERT_EQ(r.pool.free(a), FreeStatus::ok);
  ASSERT_EQ(r.pool.free(b), FreeStatus::ok);
  r.fences.complete(1);  // a's fence only
  r.alloc(2 * MiB);      // fits neither: a's segment goes back, b's (still in use) stays
  EXPECT_EQ(r.up.frees, 1);
  EXPECT_FALSE(r.pool.owns(a));
  EXPECT_TRUE(r.pool.owns(b));
  EXPECT_EQ(r.pool.stats().bound_releases, 1);
  EXPECT_EQ(r.pool.check_consistency(), "");
}

TEST(HostPool, CachedBytesStayUnderTheCap) {
  HostPoolOptions o;
  o.max_cached = 3 * MiB;
  Rig r(o);
  std::vector<void*> v;
  for (int i = 0; i < 6; ++i) v.push_back(r.alloc(1 * MiB));
  for (void* p : v) ASSERT_EQ(r.pool.free(p), FreeStatus::ok);
  const HostStats s = r.pool.stats();
  EXPECT_EQ(s.cached_bytes.current, static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(s.upstream_frees, 3);
  EXPECT_EQ(r.up.held, 3 * MiB);
  // The oldest went back; the newest three stay.
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(r.pool.owns(v[static_cast<std::size_t>(i)]));
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(r.pool.owns(v[static_cast<std::size_t>(i)]));
  EXPECT_EQ(r.up.bad_releases, 0);
  EXPECT_EQ(r.pool.empty_cache(), 3 * MiB);
  EXPECT_EQ(r.up.held, 0u);
  EXPECT_EQ(r.up.owners_released, std::vector<std::uintptr_t>(6, kCtx));  // released in the owner's context
  EXPECT_EQ(r.pool.check_consistency(), "");
}

TEST(HostPool, FreesOfWhatIsNotALiveBlock) {
  Rig r;
  int on_stack = 0;
  EXPECT_EQ(r.pool.free(&on_stack), FreeStatus::not_owned);  // foreign: the caller passes it on
  auto* a = static_cast<char*>(r.alloc(64 * KiB));
  EXPECT_EQ(r.pool.free(a + 4096), FreeStatus::interior_pointer);
  EXPECT_EQ(r.pool.free(a), FreeStatus::ok);
  EXPECT_EQ(r.pool.free(a), FreeStatus::double_free);  // cached, not live: never the driver's to free
  EXPECT_EQ(r.pool.stats().bad_frees, 2);
  EXPECT_EQ(r.up.frees, 0);
  EXPECT_EQ(r.pool.check_consistency(), "");
}

TEST(HostPool, ReserveServesSmallRequestsFirst) {
  HostPoolOptions o;
  o.reserve_segment = 4 * MiB;
  Rig r(o);
  void* a = r.alloc(1 * MiB);
  void* b = r.alloc(1 * MiB);
  EXPECT_EQ(r.up.allocs, 1);  // the reserve only
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), static_cast<std::ptrdiff_t>(1 * MiB));
  void* c = r.alloc(1 * MiB, /*flags=*/1);  // other flags: not from the reserve
  EXPECT_EQ(r.up.allocs, 2);
  r.alloc(3 * MiB);  // does not fit what is left: new memory
  EXPECT_EQ(r.up.allocs, 3);
  ASSERT_EQ(r.pool.free(a), FreeStatus::ok);
  ASSERT_EQ(r.pool.free(c), FreeStatus::ok);
  r.fences.complete_all();
  EXPECT_EQ(r.pool.empty_cache(), 1 * MiB);  // the reserve's block stays
  EXPECT_EQ(r.alloc(1 * MiB), a);
  EXPECT_EQ(r.pool.stats().reserved_bytes.current, static_cast<std::int64_t>(7 * MiB));
  EXPECT_EQ(r.pool.check_consistency(), "");
}

TEST(HostPool, OutOfMemoryGivesCachedBlocksBackFirst) {
  Rig r;
  r.up.limit = 4 * MiB;
  void* a = r.alloc(2 * MiB);
  void* b = r.alloc(2 * MiB);
  ASSERT_EQ(r.pool.free(a), FreeStatus::ok);
  ASSERT_EQ(r.pool.free(b), FreeStatus::ok);
  // 3 MiB fits neither cached block: they go back (after their fences) and it fits.
  EXPECT_NE(r.alloc(3 * MiB), nullptr);
  EXPECT_EQ(r.fences.waits(), 2u);
  EXPECT_EQ(r.up.frees, 2);
  EXPECT_EQ(r.pool.allocate(2 * MiB, 0, kCtx).status, AllocStatus::out_of_memory);
  EXPECT_EQ(r.pool.check_consistency(), "");
}

// The upstream's own reason for a refusal reaches the caller (the shim answers it as the
// CUresult of cudaHostAlloc); a success after a refused reserve carries none.
TEST(HostPool, AnUpstreamRefusalCarriesItsCode) {
  HostPoolOptions o;
  o.reserve_segment = 8 * MiB;
  Rig r(o);
  r.up.limit = 4 * MiB;
  r.up.refusal = 999;  // not out-of-memory's code: a lost reason would read as 0
  const HostPool::Result ok = r.pool.allocate(1 * MiB, 0, kCtx);  // the reserve refused, then this fits
  EXPECT_EQ(ok.status, AllocStatus::ok);
  EXPECT_EQ(ok.upstream_error, 0);
  const HostPool::Result refused = r.pool.allocate(4 * MiB, 0, kCtx);
  EXPECT_EQ(refused.status, AllocStatus::out_of_memory);
  EXPECT_EQ(refused.ptr, nullptr);
  EXPECT_EQ(refused.upstream_error, 999);
  EXPECT_EQ(r.pool.check_consistency(), "");
}

TEST(HostPool, AGoneContextsMemoryIsForgotten) {
  Rig r;
  void* live = r.alloc(1 * MiB);
  void* cached = r.alloc(1 * MiB);
  void* other = r.alloc(1 * MiB, 0, kOtherCtx);
  ASSERT_EQ(r.pool.free(cached), FreeStatus::ok);
  r.fences.complete_all();
  r.pool.forget_owner(kCtx);
  EXPECT_EQ(r.up.frees, 0);  // the driver freed it with the context: nothing to give back
  // The upstream undoes its own part at once for the cached segment, at the free for the live one.
  EXPECT_EQ(r.up.forgotten, (std::vector<std::pair<void*, std::size_t>>{{cached, 1 * MiB}}));
  EXPECT_FALSE(r.pool.owns(cached));
  EXPECT_NE(r.alloc(1 * MiB), cached);           // never handed out again
  EXPECT_EQ(r.pool.free(live), FreeStatus::ok);  // the program's free of a gone block is accepted
  EXPECT_EQ(r.up.forgotten.size(), 2u);
  EXPECT_EQ(r.up.forgotten.back().first, live);
  EXPECT_EQ(r.pool.free(live), FreeStatus::not_owned);
  EXPECT_TRUE(r.pool.owns(other));
  EXPECT_EQ(r.pool.check_consistency(), "");
}

// The waste bound under a data loader's pattern: batches of changing sizes, a few in flight,
// each freed once copied. Pinned memory held (live + cached) stays within 1.25x of the live
// bytes at their peak, and most batches are served from the cache.
TEST(HostPool, HeldMemoryAtPeakIsWithinAQuarterOfLive) {
  HostPoolOptions o;
  o.max_cached = 64 * MiB;
  Rig r(o);
  r.fences.set_auto_complete(true);
  std::mt19937 rng(3);
  std::vector<std::pair<void*, std::size_t>> inflight;
  std::size_t live = 0, peak_live = 0;
  std::int64_t held_at_peak = 0, peak_held = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::size_t batch = (24 + rng() % 41) * 3 * 224 * 224 * 4 / 8;  // 24-64 images, varying
    inflight.push_back({r.alloc(batch), batch});
    live += batch;
    if (live > peak_live) {
      peak_live = live;
      held_at_peak = r.pool.stats().reserved_bytes.current;
    }
    peak_held = std::max(peak_held, r.pool.stats().reserved_bytes.current);
    if (inflight.size() > 4) {
      ASSERT_EQ(r.pool.free(inflight.front().first), FreeStatus::ok);
      live -= inflight.front().second;
      inflight.erase(inflight.begin());
    }
  }
  const HostStats s = r.pool.stats();
  const double ratio = static_cast<double>(held_at_peak) / static_cast<double>(peak_live);
  const double peak_ratio = static_cast<double>(peak_held) / static_cast<double>(peak_live);
  std::printf("peak live %zu B, held then %lld B (%.3fx), peak held %lld B (%.3fx); hits %lld of %lld\n", peak_live,
              static_cast<long long>(held_at_peak), ratio, static_cast<long long>(peak_held), peak_ratio,
              static_cast<long long>(s.cache_hits), static_cast<long long>(s.cache_hits + s.cache_misses));
  EXPECT_LE(ratio, 1.25);
  EXPECT_LE(peak_ratio, 1.25);
  EXPECT_GT(s.cache_hits, 3000);
  EXPECT_EQ(r.pool.check_consistency(), "");
}

}  // namespace
}  // namespace cudapool
namespace cudapool {
namespace {

// The loader pattern as a GPU shows it: full-size image batches of 16-64 images, four in flight,
// and a free's fence that a plain query sees complete only a step later (the shim asks the
// non-blocking streams at most once a millisecond; a step here is about as long), while an urgent
// query sees it at once. Without the urgent second look the pool pinned new memory for batches
// its cache could serve and held 1.38-1.47x the live bytes at their peak.
TEST(HostPool, HeldBoundHoldsWhenFencesAreSeenLate) {
  for (unsigned seed : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u}) {
    Rig r;
    r.fences.set_urgent_completes(true);
    std::mt19937 rng(seed);
    std::vector<std::pair<void*, std::size_t>> inflight;
    std::size_t live = 0, peak_live = 0;
    std::int64_t peak_held = 0;
    for (int i = 0; i < 300; ++i) {
      const std::size_t batch = (16 + rng() % 49) * 3 * 224 * 224 * 4;
      if (i % 2 == 0) r.fences.complete_all();  // a sweep every other step
      inflight.push_back({r.alloc(batch), batch});
      live += batch;
      peak_live = std::max(peak_live, live);
      if (inflight.size() > 4) {
        ASSERT_EQ(r.pool.free(inflight.front().first), FreeStatus::ok);
        live -= inflight.front().second;
        inflight.erase(inflight.begin());
      }
      peak_held = std::max(peak_held, r.pool.stats().reserved_bytes.current);
    }
    const HostStats s = r.pool.stats();
    const double ratio = static_cast<double>(peak_held) / static_cast<double>(peak_live);
    std::printf("seed %u: held/live at peak %.3f, %lld of 300 from the cache, %d driver allocations\n", seed, ratio,
                static_cast<long long>(s.cache_hits), r.up.allocs);
    EXPECT_LE(ratio, 1.25) << "seed " << seed;
    EXPECT_GE(s.cache_hits, 280) << "seed " << seed;
    EXPECT_EQ(s.bound_waits, 0) << "seed " << seed;  // the urgent look sufficed: no host wait
    EXPECT_EQ(r.pool.check_consistency(), "");
    EXPECT_EQ(r.fences.bad_calls(), 0u);
  }
}

}  // namespace
}  // namespace cudapool
