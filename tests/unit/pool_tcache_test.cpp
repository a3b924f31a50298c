// Per-thread caches (allocator/thread_cache.h, docs/design.md "Thread caches"): stats stay exact,
// cached blocks count as free and are reclaimed by empty_cache / the OOM path / thread exit, and a
// cached block is never handed to another stream early.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <future>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "allocator/thread_cache.h"
#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {
constexpr StreamId kS1 = 11, kS2 = 22, kS3 = 33;
constexpr std::size_t k64K = 64 * KiB;

// Thread caches engage only once a second thread has used the pool (single-threaded programs
// keep their exact placement): use it from this thread and another one, then give everything
// back so the test starts from an empty pool with zeroed accumulated stats.
void engage(PoolRig& rig) {
  auto touch = [&] {
    void* p = rig.pool->allocate(512, 999).ptr;
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(rig.pool->free_on_stream(p, 999), FreeStatus::ok);
  };
  touch();
  std::thread(touch).join();
  rig.pool->empty_cache();
  ASSERT_EQ(rig.up.bytes_held(), 0u);
  rig.pool->reset_accumulated_stats();
  rig.pool->reset_peak_stats();
}
}  // namespace

// The lent table (linear probing, backward-shift deletion): after any mix of inserts and erases,
// every lent pointer is found at an entry holding it and no other pointer is found.
TEST(PoolTcache, LentTableFindsEveryEntryAfterRandomErases) {
  auto tc = std::make_unique<detail::ThreadBlockCache>();
  std::mt19937_64 rng(42);
  std::set<std::uintptr_t> in;
  const std::uintptr_t base = 0x7f0000000000;
  for (int step = 0; step < 20000; ++step) {
    // Neighbouring 4 KiB blocks of a few segments: their home slots collide a lot.
    const std::uintptr_t p = base + (rng() % 600) * 4096;
    if (in.count(p) != 0) {
      const int i = tc->lent_find(p);
      ASSERT_GE(i, 0);
      ASSERT_EQ(tc->lent_at(i).ptr, p);
      tc->lent_erase(i);
      in.erase(p);
    } else if (tc->lent_count() < detail::ThreadBlockCache::kMaxLent) {
      detail::CachedBlock e;
      e.ptr = p;
      e.size = 4096;
      tc->lent_insert(e);
      in.insert(p);
    }
    ASSERT_EQ(tc->lent_count(), static_cast<int>(in.size()));
    if (step % 97 == 0) {
      for (std::uintptr_t q : in) ASSERT_GE(tc->lent_find(q), 0) << "step " << step;
      for (int k = 0; k < 20; ++k) {
        const std::uintptr_t q = base + (rng() % 600) * 4096;
        ASSERT_EQ(tc->lent_find(q) >= 0, in.count(q) == 1) << "step " << step;
      }
    }
  }
}

TEST(PoolTcache, SingleThreadedPoolDoesNotCache) {
  PoolRig rig(immediate_options());
  void* a = rig.alloc(k64K, kS1);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  // Without caches the free merged the block back into the rest of the segment: the next,
  // larger request on the same stream starts at the same address.
  EXPECT_EQ(rig.alloc(2 * k64K, kS1), a);
  rig.expect_intact();
}

// Threads hold cached blocks (lent and free) while another thread reads the stats: the counts are
// exact at every view, and identical to a recount from the snapshot.
TEST(PoolTcache, StatsExactWhileThreadsCache) {
  PoolRig rig(immediate_options(), 80 * GiB, true);
  constexpr int kThreads = 4, kRounds = 500, kHeld = 40;  // kHeld > the free bound (32)
  std::barrier sync(kThreads + 1);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      const auto s = static_cast<StreamId>(100 + t);
      for (int i = 0; i < kRounds; ++i) {
        void* p = rig.pool->allocate(k64K, s).ptr;
        ASSERT_NE(p, nullptr);
        ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
      }
      std::vector<void*> held;
      for (int i = 0; i < kHeld; ++i) held.push_back(rig.pool->allocate(k64K - 100, s).ptr);
      sync.arrive_and_wait();  // main looks at the stats
      sync.arrive_and_wait();
      for (void* p : held) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
      sync.arrive_and_wait();  // main looks again; we are still alive (caches not yet exited)
      sync.arrive_and_wait();
    });
  }
  sync.arrive_and_wait();
  Stats s = rig.pool->stats();
  EXPECT_EQ(s.allocation[kAll].current, kThreads * kHeld);
  EXPECT_EQ(s.allocation[kAll].allocated, kThreads * (kRounds + kHeld));
  EXPECT_EQ(s.allocation[kAll].freed, kThreads * kRounds);
  EXPECT_EQ(s.allocated_bytes[kAll].current, static_cast<std::int64_t>(kThreads * kHeld * k64K));
  EXPECT_EQ(s.requested_bytes[kAll].current, static_cast<std::int64_t>(kThreads * kHeld * (k64K - 100)));
  EXPECT_EQ(s.cache_hits + s.cache_misses, kThreads * (kRounds + kHeld));
  EXPECT_GE(s.allocation[kAll].peak, kThreads * kHeld);
  rig.expect_intact();
  sync.arrive_and_wait();
  sync.arrive_and_wait();
  s = rig.pool->stats();
  EXPECT_EQ(s.allocation[kAll].current, 0);
  EXPECT_EQ(s.allocated_bytes[kAll].current, 0);
  EXPECT_EQ(s.active_bytes[kAll].current, 0);
  EXPECT_EQ(s.requested_bytes[kAll].current, 0);
  EXPECT_EQ(s.allocation[kAll].freed, kThreads * (kRounds + kHeld));
  EXPECT_EQ(rig.pool->cached_bytes(), static_cast<std::size_t>(s.reserved_bytes[kAll].current));
  rig.expect_intact();
  sync.arrive_and_wait();
  for (auto& t : ts) t.join();
}

// cache_from_first_thread (the shim's setting under immediate frees): one thread is enough.
TEST(PoolTcache, CacheFromFirstThreadEngagesWithOneThread) {
  PoolOptions o = immediate_options();
  o.cache_from_first_thread = true;
  PoolRig rig(o);
  void* a = rig.alloc(k64K, kS1);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  // Parked in this thread's cache, not merged: a larger request cannot start at a (without the
  // cache it would: SingleThreadedPoolDoesNotCache).
  EXPECT_NE(rig.alloc(2 * k64K, kS1), a);
  EXPECT_EQ(rig.alloc(k64K, kS1), a);
  EXPECT_EQ(rig.pool->stats().allocation[kAll].current, 2);
  rig.expect_intact();
}

TEST(PoolTcache, TwoThreadsEngageTheCache) {
  PoolRig rig(immediate_options());
  engage(rig);
  void* a = rig.alloc(k64K, kS1);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  // Parked in this thread's cache, not merged: a larger request cannot start at a.
  EXPECT_NE(rig.alloc(2 * k64K, kS1), a);
  EXPECT_EQ(rig.alloc(k64K, kS1), a);  // the cached one, for the same size
  rig.expect_intact();
}

// Same thread, same stream: reused at once. Another stream never gets the cached block early.
TEST(PoolTcache, NoReuseAcrossStreams) {
  PoolRig rig(immediate_options());
  engage(rig);
  void* a = rig.alloc(k64K, kS1);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);  // immediate: local to kS1
  void* b = rig.alloc(k64K, kS2);
  EXPECT_NE(b, a);
  void* c = rig.alloc(k64K, kS1);
  EXPECT_EQ(c, a);                                              // the cache hands it back at once
  ASSERT_EQ(rig.pool->free_on_stream(c, kS3), FreeStatus::ok);  // now local to kS3
  void* d = rig.alloc(k64K, kS1);
  EXPECT_NE(d, a);
  EXPECT_EQ(rig.alloc(k64K, kS3), a);
  rig.expect_intact();
}

// Fenced pool: a block lent through the cache (this thread used free_on_stream before) that is
// then freed with free() still waits for its device fence.
TEST(PoolTcache, FencedFreeOfLentBlockWaitsForFence) {
  PoolRig rig;  // FreeSync::fenced, fences complete only when told
  engage(rig);
  void* a = rig.alloc(k64K, kS1);
  ASSERT_EQ(rig.pool->free_on_stream(a, kS1), FreeStatus::ok);
  void* b = rig.alloc(k64K, kS1);  // lent through the cache now
  ASSERT_EQ(b, a);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);  // cudaFree meaning
  void* c = rig.alloc(k64K, kS1);
  EXPECT_NE(c, a);
  EXPECT_EQ(rig.pool->stats().pending_bytes, static_cast<std::int64_t>(k64K));
  rig.expect_intact();
}

// Fenced pool, several threads: a thread's free() of a block its cache lent joins the cache's own
// batch (no pool lock); one device fence covers the batch; once it completed the blocks serve any
// stream from the cache. Before that, nobody gets them. Stats stay exact throughout.
TEST(PoolTcache, FencedFreesBatchInTheCacheUntilTheirFence) {
  PoolRig rig;  // FreeSync::fenced, fences complete only when told
  engage(rig);
  std::vector<void*> first;
  for (int i = 0; i < 4; ++i) first.push_back(rig.alloc(k64K, kS1));  // lent through the cache
  const std::size_t records0 = rig.fence.device_records();
  for (void* p : first) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  EXPECT_EQ(rig.fence.device_records(), records0);  // inside the window: no fence yet
  Stats s = rig.pool->stats();
  EXPECT_EQ(s.pending_bytes, static_cast<std::int64_t>(4 * k64K));
  EXPECT_EQ(s.allocation[kAll].current, 0);
  EXPECT_EQ(s.active_bytes[kAll].current, static_cast<std::int64_t>(4 * k64K));  // pending is active
  rig.expect_intact();  // (flushes the cache into the pool's batch; the pool keeps them pending)
  std::vector<void*> others;
  for (int i = 0; i < 4; ++i) others.push_back(rig.alloc(k64K, kS1));
  for (void* p : others) EXPECT_EQ(std::count(first.begin(), first.end(), p), 0);
  for (void* p : others) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  EXPECT_EQ(rig.pool->empty_cache(), 2 * MiB);  // waits for every fence, the caches' included
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);

  // Again without a stats view in between (a view flushes caches): the cache's own batch.
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) held.push_back(rig.alloc(k64K, kS2));
  const std::size_t records1 = rig.fence.device_records();
  for (void* p : held) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  rig.advance_clock();             // the window passes
  void* x = rig.alloc(k64K, kS2);  // a miss in the cache closes its batch: one fence
  EXPECT_EQ(rig.fence.device_records(), records1 + 1);
  EXPECT_EQ(std::count(held.begin(), held.end(), x), 0);  // fence not complete: not reused
  rig.fence.complete_all();
  rig.advance_clock();
  void* y = rig.alloc(k64K, kS3);  // any stream may have them now
  EXPECT_EQ(std::count(held.begin(), held.end(), y), 1);
  EXPECT_EQ(rig.fence.device_records(), records1 + 1);  // the cache's one fence covered 8 frees
  s = rig.pool->stats();
  EXPECT_EQ(s.pending_bytes, 0);
  EXPECT_EQ(s.allocation[kAll].current, 2);
  EXPECT_EQ(s.allocated_bytes[kAll].current, static_cast<std::int64_t>(2 * k64K));
  EXPECT_EQ(rig.fence.bad_calls(), 0u);
  rig.expect_intact();
}

// A full batch (kMaxPend frees) records its fence at the free; while it is outstanding the next
// frees fill a second batch, and beyond that they go to the pool's own batch. empty_cache()
// waits for all of them and returns every segment.
TEST(PoolTcache, FencedCacheBatchesAreBoundedAndReclaimed) {
  PoolRig rig;
  engage(rig);
  constexpr int kMax = 32;  // ThreadBlockCache::kMaxPend (allocator/thread_cache.h)
  std::vector<void*> held;
  for (int i = 0; i < 2 * kMax + 5; ++i) held.push_back(rig.alloc(4 * KiB, kS1));
  const std::size_t records0 = rig.fence.device_records();
  for (std::size_t i = 0; i < kMax; ++i) ASSERT_EQ(rig.pool->free(held[i]), FreeStatus::ok);
  EXPECT_EQ(rig.fence.device_records(), records0 + 1);  // full: recorded by the free itself
  for (std::size_t i = kMax; i < held.size(); ++i) ASSERT_EQ(rig.pool->free(held[i]), FreeStatus::ok);
  EXPECT_EQ(rig.pool->stats().pending_bytes, static_cast<std::int64_t>(held.size() * 4 * KiB));
  EXPECT_EQ(rig.pool->empty_cache(), 2 * MiB);
  EXPECT_EQ(rig.up.bytes_held(), 0u);
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  EXPECT_EQ(rig.fence.bad_calls(), 0u);
  rig.expect_intact();
}

// Another thread's miss collects fenced frees that wait in a cache whose owner stopped allocating:
// they join the pool's batch, get its fence and, once that completed, serve the other thread
// instead of a new segment.
TEST(PoolTcache, MissCollectsFencedFreesFromIdleThreadsCaches) {
  PoolRig rig;
  engage(rig);
  void* a = rig.alloc(MiB, kS1);  // both lent through this thread's cache: one 2 MiB segment
  void* b = rig.alloc(MiB, kS1);
  const std::size_t held = rig.up.bytes_held();
  ASSERT_EQ(held, 2 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);  // into this cache's open batch; we allocate no more
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  rig.fence.set_auto_complete(true);  // the GPU is idle: fences complete at once
  // An owner still busy keeps its batch (another thread's miss would only send it back to the
  // pool lock): no collection yet, a new segment instead.
  std::thread([&] {
    void* q = rig.pool->allocate(MiB, kS2).ptr;
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(rig.pool->free_on_stream(q, kS2), FreeStatus::ok);
  }).join();
  EXPECT_EQ(rig.up.bytes_held(), 2 * held);
  EXPECT_EQ(rig.pool->empty_cache(), 2 * held);  // both segments (our cache is flushed too): start again
  a = rig.alloc(MiB, kS1);
  b = rig.alloc(MiB, kS1);
  ASSERT_EQ(rig.up.bytes_held(), held);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  rig.advance_clock();  // 1 ms: this thread has left its batch alone, as an idle thread would
  std::thread([&] {
    void* q = rig.pool->allocate(MiB, kS2).ptr;  // a miss: nothing free in the pool itself
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(rig.pool->free_on_stream(q, kS2), FreeStatus::ok);
  }).join();
  EXPECT_EQ(rig.up.bytes_held(), held);  // no new segment: the freed blocks were reused
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  rig.expect_intact();
}

TEST(PoolTcache, CachedBlocksCountAsFreeAndEmptyCacheReclaimsThem) {
  PoolRig rig(immediate_options());
  engage(rig);
  std::promise<void> cached, done;
  std::thread t([&] {
    void* p = rig.pool->allocate(k64K, kS1).ptr;
    rig.pool->free(p);  // parked in this thread's cache
    cached.set_value();
    done.get_future().wait();
  });
  cached.get_future().wait();
  EXPECT_EQ(rig.pool->cached_bytes(), 2 * MiB);  // the whole small segment is free
  EXPECT_EQ(rig.pool->empty_cache(), 2 * MiB);
  EXPECT_EQ(rig.up.bytes_held(), 0u);
  done.set_value();
  t.join();
  rig.expect_intact();
}

// The OOM path reclaims a block parked in another (live) thread's cache instead of failing.
TEST(PoolTcache, OomPathReclaimsOtherThreadsCache) {
  PoolRig rig(immediate_options(), 2 * MiB, true);  // room for one small segment only
  engage(rig);
  std::promise<void*> cached;
  std::promise<void> done;
  std::thread t([&] {
    void* p1 = rig.pool->allocate(1 * MiB, kS1).ptr;
    void* p2 = rig.pool->allocate(1 * MiB, kS1).ptr;  // the segment is full
    EXPECT_NE(p2, nullptr);
    rig.pool->free(p1);  // parked in this thread's cache
    cached.set_value(p1);
    done.get_future().wait();
  });
  void* p1 = cached.get_future().get();
  ASSERT_NE(p1, nullptr);
  AllocResult r = rig.pool->allocate(1 * MiB, kS2);  // upstream refuses: must reclaim p1
  EXPECT_EQ(r.status, AllocStatus::ok);
  EXPECT_EQ(r.ptr, p1);
  EXPECT_EQ(rig.up.failed_calls(), 1u);  // one refusal, then the reclaimed block served it
  EXPECT_EQ(rig.pool->stats().num_ooms, 0);
  done.set_value();
  t.join();
  rig.expect_intact();
}

TEST(PoolTcache, ThreadExitFlushesFreeAndLentBlocks) {
  PoolRig rig(immediate_options());
  engage(rig);
  void* freed = nullptr;
  void* kept = nullptr;
  std::thread([&] {
    freed = rig.pool->allocate(k64K, kS1).ptr;
    kept = rig.pool->allocate(k64K, kS1).ptr;  // lent, never freed by this thread
    rig.pool->free(freed);
  }).join();
  // The exited thread's free block went back to the pool, local to kS1: this thread gets it.
  EXPECT_EQ(rig.alloc(k64K, kS1), freed);
  // Its lent block is an ordinary live block again: freeable here, and only once.
  EXPECT_EQ(rig.pool->free(kept), FreeStatus::ok);
  EXPECT_EQ(rig.pool->free(kept), FreeStatus::double_free);
  rig.expect_intact();
}

TEST(PoolTcache, CrossThreadFreeAndQueriesOfLentBlock) {
  PoolRig rig(immediate_options());
  engage(rig);
  std::promise<void*> lent;
  std::promise<void> done;
  std::thread t([&] {
    void* p = rig.pool->allocate(k64K, kS1).ptr;
    rig.pool->free(p);
    lent.set_value(rig.pool->allocate(k64K - 1000, kS1).ptr);  // served by the cache
    done.get_future().wait();
  });
  void* p = lent.get_future().get();
  auto info = rig.pool->address_info(static_cast<char*>(p) + 10);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->block_base, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(info->block_size, k64K - 1000);
  EXPECT_EQ(rig.pool->free(static_cast<char*>(p) + 512), FreeStatus::interior_pointer);
  EXPECT_EQ(rig.pool->free(p), FreeStatus::ok);
  EXPECT_EQ(rig.pool->free(p), FreeStatus::double_free);
  done.set_value();
  t.join();
  rig.expect_intact();
}

// A pool destroyed while a thread still has a cache for it: the thread's exit must not touch it.
TEST(PoolTcache, PoolDestroyedBeforeThreadExit) {
  auto rig = std::make_unique<PoolRig>(immediate_options());
  engage(*rig);
  std::promise<void> cached, destroyed;
  std::thread t([&] {
    rig->pool->free(rig->pool->allocate(k64K, kS1).ptr);
    cached.set_value();
    destroyed.get_future().wait();
  });
  cached.get_future().wait();
  rig.reset();
  destroyed.set_value();
  t.join();                            // ASan / TSan builds catch any touch of the dead pool
  PoolRig again(immediate_options());  // a new pool (maybe at the same address) starts clean
  void* p = again.alloc(k64K, kS1);
  EXPECT_EQ(again.pool->free(p), FreeStatus::ok);
  again.expect_intact();
}

// retire_stream takes the stream's blocks out of every thread cache: none is reused early.
TEST(PoolTcache, RetireStreamFlushesCaches) {
  PoolRig rig(immediate_options());
  engage(rig);
  void* a = rig.alloc(k64K, kS1);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  const std::size_t before = rig.fence.stream_records();
  rig.pool->retire_stream(kS1);
  EXPECT_NE(rig.alloc(k64K, kS2), a);  // retiring: waits for the fence on kS1
  EXPECT_NE(rig.alloc(k64K, kS1), a);  // not even kS1 (a new stream with a reused handle) gets it
  EXPECT_EQ(rig.fence.stream_records(), before + 1);
  rig.expect_intact();
}
