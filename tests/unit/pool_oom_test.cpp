// Driver refusal, limits, garbage collection and release_lock_on_cudamalloc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

TEST(PoolOom, InjectedFailureReleasesCacheAndSucceedsOnRetry) {
  PoolRig rig(immediate_options());
  void* s = rig.alloc(100);
  ASSERT_EQ(rig.pool->free(s), FreeStatus::ok);  // a cached, unsplit 2 MiB small segment
  rig.up.fail_next(1);
  AllocResult r = rig.pool->allocate(5 * MiB, 0);
  ASSERT_EQ(r.status, AllocStatus::ok);
  Stats st = rig.pool->stats();
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.num_sync_all_streams, 1);
  EXPECT_EQ(st.num_ooms, 0);
  EXPECT_EQ(st.num_device_free, 1);
  EXPECT_EQ(rig.up.allocate_calls(), 3u);    // small segment, refused, retry
  EXPECT_EQ(rig.up.bytes_held(), 20 * MiB);  // the small segment went back
  rig.expect_intact();
}

TEST(PoolOom, AfterWaitingThePoolIsSearchedAgain) {
  PoolRig rig(fenced_options(), 20 * MiB);  // fenced frees, room for one large segment
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);  // pending: fence not complete
  AllocResult r = rig.pool->allocate(20 * MiB, 0);
  ASSERT_EQ(r.status, AllocStatus::ok);
  EXPECT_EQ(r.ptr, a);  // found after the wait; nothing released, no retry
  Stats st = rig.pool->stats();
  EXPECT_EQ(st.num_alloc_retries, 0);
  EXPECT_EQ(st.num_device_free, 0);
  EXPECT_EQ(st.num_sync_all_streams, 1);
  EXPECT_EQ(rig.fence.waits(), 1u);
  rig.expect_intact();
}

TEST(PoolOom, GivesUpWithOutOfMemoryAndStaysIntact) {
  struct Sink : EventSink {
    int failures = 0, ooms = 0;
    void on_event(const Event& e) override {
      failures += e.kind == EventKind::allocate_failure;
      ooms += e.kind == EventKind::oom;
    }
  } sink;
  PoolRig rig({}, 30 * MiB);
  rig.pool->set_event_sink(&sink);
  void* a = rig.alloc(5 * MiB);
  AllocResult r = rig.pool->allocate(20 * MiB, 0);
  EXPECT_EQ(r.status, AllocStatus::out_of_memory);
  EXPECT_EQ(r.ptr, nullptr);
  Stats st = rig.pool->stats();
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(sink.failures, 1);
  EXPECT_EQ(sink.ooms, 2);  // first try and retry
  EXPECT_TRUE(rig.pool->owns(a));
  rig.expect_intact();
  EXPECT_EQ(rig.pool->free(a), FreeStatus::ok);
  rig.pool->set_event_sink(nullptr);
}

TEST(PoolOom, OtherUpstreamErrorsReturnAtOnce) {
  PoolRig rig;
  rig.up.fail_next(1, UpstreamStatus::error);
  AllocResult r = rig.pool->allocate(1 * MiB, 0);
  EXPECT_EQ(r.status, AllocStatus::upstream_error);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  EXPECT_EQ(rig.pool->stats().num_alloc_retries, 0);
  EXPECT_EQ(rig.pool->stats().num_ooms, 0);
  rig.expect_intact();
}

// The result says who refused, and carries the upstream's own error code.
TEST(PoolOom, RefusalCarriesItsCause) {
  {
    PoolOptions o;
    o.max_reserved = 30 * MiB;
    PoolRig rig(o);
    AllocResult r = rig.pool->allocate(40 * MiB, 0);
    EXPECT_EQ(r.status, AllocStatus::out_of_memory);
    EXPECT_EQ(r.refusal, Refusal::limit);
    EXPECT_EQ(r.upstream_error, 0);
    EXPECT_EQ(r.asked_bytes, segment_size_for(40 * MiB));  // the segment the limit would not allow
    EXPECT_EQ(rig.up.allocate_calls(), 0u);                // the limit refuses without asking
  }
  {
    PoolRig rig({}, 30 * MiB);
    rig.up.fail_next(1, UpstreamStatus{UpstreamStatus::out_of_memory, 2});
    AllocResult r = rig.pool->allocate(40 * MiB, 0);
    EXPECT_EQ(r.status, AllocStatus::out_of_memory);
    EXPECT_EQ(r.refusal, Refusal::device);
    EXPECT_EQ(r.upstream_error, 2);
    EXPECT_EQ(r.asked_bytes, segment_size_for(40 * MiB));
  }
  {
    // The budget refuses first, the device the retry: the budget's refusal sticks, since
    // other holders of the budget may give memory back.
    PoolRig rig({}, 30 * MiB);
    rig.up.fail_next(1, UpstreamStatus{UpstreamStatus::out_of_memory, 2, true});
    AllocResult r = rig.pool->allocate(40 * MiB, 0);
    EXPECT_EQ(r.status, AllocStatus::out_of_memory);
    EXPECT_EQ(r.refusal, Refusal::budget);
    EXPECT_EQ(r.upstream_error, 2);  // the budget's refusal's own code, not the device's
    EXPECT_EQ(rig.up.allocate_calls(), 2u);
    // The next allocation starts afresh: the device alone refuses it.
    r = rig.pool->allocate(40 * MiB, 0);
    EXPECT_EQ(r.refusal, Refusal::device);
    rig.expect_intact();
  }
  {
    PoolRig rig;
    rig.up.fail_next(1, UpstreamStatus{UpstreamStatus::error, 999});
    AllocResult r = rig.pool->allocate(1 * MiB, 0);
    EXPECT_EQ(r.status, AllocStatus::upstream_error);
    EXPECT_EQ(r.upstream_error, 999);
    EXPECT_EQ(r.refusal, Refusal::none);
    EXPECT_EQ(r.asked_bytes, 0u);
    r = rig.pool->allocate(1 * MiB, 0);  // nothing lingers from the failed call
    EXPECT_EQ(r.status, AllocStatus::ok);
    EXPECT_EQ(r.upstream_error, 0);
    rig.expect_intact();
  }
}

// max_split_size 20 MiB, a cached (shared) 40 MiB oversize block, room for nothing else:
// step 1 releases it and the retry succeeds without waiting or the full release.
TEST(PoolOom, OversizeBlocksReleasedFirst) {
  PoolOptions o;
  o.max_split_size = 20 * MiB;
  PoolRig rig(o, 50 * MiB, /*auto_fence=*/true);
  void* big = rig.alloc(40 * MiB);
  ASSERT_EQ(rig.pool->free(big), FreeStatus::ok);
  AllocResult res = rig.pool->allocate(20 * MiB, 0);  // 40 >= 20 + 20: not reusable; 40 + 20 > 50
  ASSERT_EQ(res.status, AllocStatus::ok);
  Stats st = rig.pool->stats();
  EXPECT_EQ(st.num_alloc_retries, 0);
  EXPECT_EQ(st.num_sync_all_streams, 0);
  EXPECT_EQ(st.num_device_free, 1);
  EXPECT_EQ(st.oversize_segments.current, 1);  // the new 20 MiB one (>= M)
  EXPECT_FALSE(rig.up.holds_segment(big));
  rig.expect_intact();
}

TEST(PoolLimits, MaxReservedFailsWithoutUpstreamCall) {
  PoolOptions o;
  o.max_reserved = 30 * MiB;
  PoolRig rig(o);
  void* a = rig.alloc(5 * MiB);  // 20 MiB segment
  ASSERT_NE(a, nullptr);
  AllocResult r = rig.pool->allocate(16 * MiB, 0);  // 15 MiB left there; 16 MiB segment: 36 > 30
  EXPECT_EQ(r.status, AllocStatus::out_of_memory);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  EXPECT_EQ(rig.pool->stats().num_ooms, 1);
  rig.expect_intact();
}

TEST(PoolLimits, LimitRefusalGoesThroughReleaseAndRetry) {
  PoolOptions o = immediate_options();
  o.max_reserved = 21 * MiB;
  PoolRig rig(o);
  void* s = rig.alloc(100);
  ASSERT_EQ(rig.pool->free(s), FreeStatus::ok);
  rig.fence.set_auto_complete(true);
  AllocResult r = rig.pool->allocate(5 * MiB, 0);  // 2 + 20 > 21: refused, small one released
  ASSERT_EQ(r.status, AllocStatus::ok);
  EXPECT_EQ(rig.up.allocate_calls(), 2u);  // the refused attempt never reached the upstream
  EXPECT_EQ(rig.up.release_calls(), 1u);
  EXPECT_EQ(rig.pool->stats().num_alloc_retries, 1);
  rig.expect_intact();
}

TEST(PoolLimits, PerProcessMemoryFraction) {
  PoolOptions o;
  o.per_process_memory_fraction = 0.5;
  PoolRig rig(o, 64 * MiB);  // allowed: 32 MiB
  void* a = rig.alloc(20 * MiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(rig.pool->allocate(20 * MiB, 0).status, AllocStatus::out_of_memory);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  EXPECT_EQ(rig.pool->allocate(12 * MiB, 0).status, AllocStatus::ok);  // 20 + 12 = 32
  rig.expect_intact();
}

// GC: three free unsplit large segments A (old), B (young), plus D (split, serving the hits),
// C live. reserved = 80 MiB, allowed 100 MiB, threshold 0.65 -> target 15 MiB: only A (age >=
// average) goes. Then the miss gets a new 30 MiB segment.
static void run_gc_case(PoolOptions o, std::size_t capacity) {
  o.garbage_collection_threshold = 0.65;
  PoolRig rig(o, capacity, /*auto_fence=*/true);
  void* A = rig.alloc(20 * MiB);
  void* B = rig.alloc(20 * MiB);
  void* C = rig.alloc(20 * MiB);
  void* D = rig.alloc(5 * MiB);  // new 20 MiB segment, split
  ASSERT_EQ(rig.pool->free(A), FreeStatus::ok);
  for (int i = 0; i < 10; ++i) {  // ten large-pool searches age A
    rig.advance_clock();          // each allocate closes the batch window: h comes back to D's segment
    void* h = rig.alloc(5 * MiB);
    ASSERT_EQ(rig.pool->free(h), FreeStatus::ok);
  }
  ASSERT_EQ(rig.pool->free(B), FreeStatus::ok);
  rig.advance_clock();
  void* E = rig.alloc(30 * MiB);  // miss -> GC -> new segment
  ASSERT_NE(E, nullptr);
  EXPECT_FALSE(rig.up.holds_segment(A));
  EXPECT_TRUE(rig.up.holds_segment(B));
  Stats st = rig.pool->stats();
  EXPECT_EQ(st.gc_passes, 1);
  EXPECT_EQ(st.gc_freed_bytes, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(st.reserved_bytes[kAll].current, static_cast<std::int64_t>(90 * MiB));
  (void)C;
  (void)D;
  rig.expect_intact();
}

TEST(PoolGc, FreesOldBlocksOnlyUnderMaxReserved) {
  PoolOptions o;
  o.max_reserved = 100 * MiB;
  run_gc_case(o, 1 * GiB);
}

// No fraction / cap set: PyTorch would do nothing; cudapool applies it to the device total.
TEST(PoolGc, AppliesToDeviceTotalWhenNoLimitIsSet) { run_gc_case(PoolOptions{}, 100 * MiB); }

TEST(PoolGc, NothingBelowThreshold) {
  PoolOptions o;
  o.garbage_collection_threshold = 0.9;
  PoolRig rig(o, 100 * MiB, true);
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  (void)rig.alloc(30 * MiB);  // reserved 20 <= 90: no GC
  EXPECT_EQ(rig.pool->stats().gc_passes, 0);
  EXPECT_TRUE(rig.up.holds_segment(a));
}

TEST(PoolLock, ReleaseLockOnCudaMallocDropsTheMutex) {
  PoolOptions o;
  o.release_lock_on_cudamalloc = true;
  PoolRig rig(o);
  std::atomic<int> reached{0};
  rig.up.set_hook([&](std::size_t) {
    // Another thread must be able to use the pool while the upstream works.
    auto f = std::async(std::launch::async, [&] { return rig.pool->stats().cache_misses; });
    if (f.wait_for(std::chrono::seconds(5)) == std::future_status::ready) reached.fetch_add(1);
  });
  void* a = rig.alloc(5 * MiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reached.load(), 1);
  rig.up.set_hook(nullptr);
  rig.expect_intact();
}

TEST(PoolLock, ConcurrentMissesRespectTheCapWithLockDropped) {
  PoolOptions o = immediate_options();
  o.release_lock_on_cudamalloc = true;
  o.max_reserved = 100 * MiB;  // five 20 MiB segments
  PoolRig rig(o);
  rig.up.set_hook([](std::size_t) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
  std::atomic<int> ok{0}, oom{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      AllocResult r = rig.pool->allocate(20 * MiB, static_cast<StreamId>(t));
      (r.status == AllocStatus::ok ? ok : oom).fetch_add(1);
    });
  for (auto& th : threads) th.join();
  rig.up.set_hook(nullptr);
  EXPECT_EQ(ok.load(), 5);
  EXPECT_EQ(oom.load(), 3);
  EXPECT_LE(rig.up.peak_bytes(), 100 * MiB);
  EXPECT_LE(rig.pool->stats().reserved_bytes[kAll].peak, static_cast<std::int64_t>(100 * MiB));
  rig.expect_intact();
}
