// Stream and fence semantics (docs/design.md, "Streams and fences"). The fake fence completes
// only when the test says so, so "not before the fence" is observable.
#include <gtest/gtest.h>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {
constexpr StreamId kS1 = 11, kS2 = 22;
}

TEST(PoolStreams, FreeOnStreamIsReusableAtOnceOnThatStream) {
  PoolRig rig;
  void* a = rig.alloc(4 * KiB, kS1);
  ASSERT_EQ(rig.pool->free_on_stream(a, kS1), FreeStatus::ok);
  EXPECT_EQ(rig.alloc(4 * KiB, kS1), a);
  EXPECT_EQ(rig.fence.records(), 0u);  // no fence needed for same-stream reuse
  rig.expect_intact();
}

// a (1 MiB) comes from a fresh 2 MiB small segment; freed on S1 it swallows the segment's
// fresh rest, so the whole segment is local to S1.
TEST(PoolStreams, OtherStreamWaitsForFenceOnFreeingStream) {
  PoolRig rig;
  void* a = rig.alloc(1 * MiB, kS1);
  ASSERT_EQ(rig.pool->free_on_stream(a, kS1), FreeStatus::ok);
  void* other = rig.alloc(1 * MiB, kS2);  // miss: fence recorded on S1, not complete -> upstream
  EXPECT_NE(rig.pool->address_info(other)->segment_base, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(rig.fence.stream_records(), 1u);
  EXPECT_EQ(rig.up.allocate_calls(), 2u);
  EXPECT_EQ(rig.alloc(1 * MiB, kS2), at(other, 1 * MiB));  // fresh rest of the new segment
  void* third = rig.alloc(1 * MiB, kS2);                   // fence still running: another miss
  EXPECT_NE(rig.pool->address_info(third)->segment_base, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(rig.fence.stream_records(), 1u);  // once per batch
  EXPECT_EQ(rig.up.allocate_calls(), 3u);
  rig.fence.complete_all();
  EXPECT_EQ(rig.alloc(1 * MiB, kS2), at(third, 1 * MiB));  // best fit: the 1 MiB rest first
  EXPECT_EQ(rig.alloc(1 * MiB, kS2), a);                   // a was promoted to shared
  EXPECT_EQ(rig.fence.outstanding(), 0u);
  rig.expect_intact();
}

TEST(PoolStreams, FreeWaitsForDeviceFenceAndBatchesFrees) {
  PoolRig rig(fenced_options());
  std::vector<void*> ps;
  for (int i = 0; i < 10; ++i) ps.push_back(rig.alloc(4 * KiB, kS1));
  for (void* p : ps) ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  EXPECT_EQ(rig.pool->stats().pending_bytes, static_cast<std::int64_t>(40 * KiB));
  auto snap = rig.pool->snapshot();
  EXPECT_EQ(snap.segments[0].blocks[0].state, BlockState::active_pending_free);
  void* x = rig.alloc(4 * KiB, kS1);  // inside the batch window: served from the rest, no fence
  EXPECT_EQ(rig.fence.device_records(), 0u);
  for (void* p : ps) EXPECT_NE(x, p);
  rig.advance_clock();
  ASSERT_EQ(rig.pool->free(x), FreeStatus::ok);
  x = rig.alloc(4 * KiB, kS1);  // the window has passed: records ONE device fence for the frees
  EXPECT_EQ(rig.fence.device_records(), 1u);
  for (void* p : ps) EXPECT_NE(x, p);  // pending: never handed out before the fence
  rig.fence.complete_all();
  rig.advance_clock();                // past the query back-off: the next allocation asks again
  void* y = rig.alloc(4 * KiB, kS2);  // any stream may now reuse them
  EXPECT_EQ(y, ps[0]);
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  EXPECT_EQ(rig.fence.outstanding(), 0u);
  EXPECT_EQ(rig.fence.waits(), 0u);  // fenced mode never blocks outside the OOM path
  rig.expect_intact();
}

TEST(PoolStreams, FencedMissGoesUpstreamWithoutWaiting) {
  PoolRig rig(fenced_options());
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* b = rig.alloc(20 * MiB);
  EXPECT_NE(a, b);
  EXPECT_EQ(rig.fence.waits(), 0u);
  EXPECT_EQ(rig.up.allocate_calls(), 2u);
  rig.expect_intact();
}

TEST(PoolStreams, DeviceModeWaitsForPendingBeforeUpstream) {
  PoolOptions o;
  o.free_sync = FreeSync::device;
  PoolRig rig(o);
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* b = rig.alloc(20 * MiB);
  EXPECT_EQ(a, b);
  EXPECT_EQ(rig.fence.waits(), 1u);
  EXPECT_EQ(rig.pool->stats().fence_waits, 1);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  rig.expect_intact();
}

TEST(PoolStreams, ImmediateFreeIsLocalToAllocationStream) {
  PoolRig rig(immediate_options());
  void* a = rig.alloc(1 * MiB, kS1);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_EQ(rig.alloc(1 * MiB, kS1), a);  // at once, no fence
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* rest = rig.alloc(1 * MiB, kS2);
  EXPECT_NE(rest, a);
  void* b = rig.alloc(1 * MiB, kS2);
  EXPECT_NE(b, a);
  EXPECT_EQ(rig.fence.device_records(), 0u);
  rig.expect_intact();
}

TEST(PoolStreams, RetiredStreamBlocksWaitForItsFence) {
  PoolRig rig;
  void* a = rig.alloc(1 * MiB, kS1);
  void* keep = rig.alloc(1 * MiB, kS1);  // keeps a from merging with the fresh rest
  ASSERT_EQ(rig.pool->free_on_stream(a, kS1), FreeStatus::ok);
  rig.pool->retire_stream(kS1);
  EXPECT_EQ(rig.fence.stream_records(), 1u);
  auto snap = rig.pool->snapshot();
  EXPECT_EQ(snap.segments[0].blocks[0].state, BlockState::inactive);
  rig.expect_intact();
  void* b = rig.alloc(1 * MiB, kS1);  // the retiring block is nobody's until the fence completes
  EXPECT_NE(b, a);
  rig.fence.complete_all();
  rig.advance_clock();  // past the query back-off: the next allocation asks again
  EXPECT_EQ(rig.alloc(1 * MiB, kS2), a);
  (void)keep;
  rig.expect_intact();
}

TEST(PoolStreams, OomPathPromotesOtherStreamsLocalBlocks) {
  PoolRig rig({}, 2 * MiB);  // room for one small segment only
  void* a = rig.alloc(1 * MiB, kS1);
  void* rest = rig.alloc(1 * MiB, kS1);
  ASSERT_EQ(rig.pool->free_on_stream(a, kS1), FreeStatus::ok);
  AllocResult r = rig.pool->allocate(1 * MiB, kS2);  // upstream full: wait for S1, reuse a
  EXPECT_EQ(r.status, AllocStatus::ok);
  EXPECT_EQ(r.ptr, a);
  EXPECT_GE(rig.fence.waits(), 1u);
  EXPECT_EQ(rig.pool->stats().num_sync_all_streams, 1);
  EXPECT_EQ(rig.pool->stats().num_ooms, 0);
  (void)rest;
  rig.expect_intact();
}

TEST(PoolStreams, EmptyCacheWaitsThenReleasesFreeSegments) {
  PoolRig rig;
  void* a = rig.alloc(5 * MiB, kS1);
  void* b = rig.alloc(100, kS2);
  void* c = rig.alloc(100, kS2);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);                 // pending on a device fence
  ASSERT_EQ(rig.pool->free_on_stream(b, kS2), FreeStatus::ok);  // local to S2, c still live
  EXPECT_EQ(rig.pool->empty_cache(), 20 * MiB);
  EXPECT_EQ(rig.up.bytes_held(), 2 * MiB);  // c's segment stays
  EXPECT_EQ(rig.pool->cached_bytes(), 2 * MiB - 512);
  EXPECT_EQ(rig.fence.outstanding(), 0u);
  EXPECT_EQ(rig.pool->stats().empty_cache_calls, 1);
  ASSERT_EQ(rig.pool->free(c), FreeStatus::ok);
  rig.pool->empty_cache();
  EXPECT_EQ(rig.up.bytes_held(), 0u);
  EXPECT_EQ(rig.up.bad_calls(), 0u);
  rig.expect_intact();
}

TEST(PoolStreams, AbandonForgetsEverythingWithoutUpstreamCalls) {
  PoolRig rig;
  void* a = rig.alloc(5 * MiB);
  void* b = rig.alloc(100);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  rig.pool->abandon();
  EXPECT_EQ(rig.up.release_calls(), 0u);
  EXPECT_FALSE(rig.pool->owns(a));
  EXPECT_EQ(rig.pool->free(a), FreeStatus::not_owned);
  EXPECT_EQ(rig.pool->stats().reserved_bytes[kAll].current, 0);
  rig.expect_intact();
  void* c = rig.alloc(100);  // still usable afterwards
  EXPECT_TRUE(rig.pool->owns(c));
  rig.expect_intact();
}

TEST(PoolStreams, DestructorReleasesEverythingAndEveryFence) {
  FakeUpstream up;
  FakeFence fence;
  {
    DevicePool pool(0, PoolOptions{}, up, fence);
    void* a = pool.allocate(5 * MiB, 1).ptr;
    void* b = pool.allocate(100, 2).ptr;
    pool.free(a);
    pool.free_on_stream(b, 2);
    (void)pool.allocate(100, 3);  // records the device fence for a; S2's block gets promoted? no
    pool.retire_stream(2);
  }
  EXPECT_EQ(up.bytes_held(), 0u);
  EXPECT_EQ(up.bad_calls(), 0u);
  EXPECT_EQ(fence.outstanding(), 0u);
  EXPECT_EQ(fence.bad_calls(), 0u);
}

// FreeSync::immediate: a block allocated on a stream that was retired since must not become
// local to the dead stream (no fence could be recorded there): it waits for a device fence.
TEST(PoolStreams, ImmediateFreeAfterRetireUsesDeviceFence) {
  PoolRig rig(immediate_options());
  void* a = rig.alloc(1 * MiB, kS1);
  rig.pool->retire_stream(kS1);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_EQ(rig.pool->snapshot().segments[0].blocks[0].state, BlockState::active_pending_free);
  rig.advance_clock();  // past the batch window: the next allocate records the device fence
  void* b = rig.alloc(1 * MiB, kS2);
  EXPECT_NE(b, a);
  EXPECT_EQ(rig.fence.device_records(), 1u);
  EXPECT_EQ(rig.fence.stream_records(), 0u);  // nothing recorded on the dead stream
  rig.fence.complete_all();
  rig.advance_clock();  // past the query back-off: the next allocation asks again
  EXPECT_EQ(rig.alloc(1 * MiB, kS2), a);
  // The handle used again (CUDA reuses values): it is a live stream once more.
  void* c = rig.alloc(4 * KiB, kS1);
  ASSERT_EQ(rig.pool->free(c), FreeStatus::ok);
  EXPECT_EQ(rig.alloc(4 * KiB, kS1), c);  // local again, reusable at once
  rig.expect_intact();
}
