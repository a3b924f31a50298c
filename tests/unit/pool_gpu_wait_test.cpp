// FreeSync::gpu_wait, the default: memory freed with free() whose fence still runs is handed out
// at once when the pool would otherwise grow, with the GPU made to wait for the fence
// (FenceProvider::order_after); nothing goes back to the upstream before such a fence completed.
#include <gtest/gtest.h>

#include "allocator/reuse.h"
#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {

PoolOptions gpu_wait() {
  PoolOptions o;
  EXPECT_EQ(o.free_sync, FreeSync::gpu_wait);  // the default
  return o;
}

}  // namespace

TEST(PoolGpuWait, PendingMemoryIsReusedWithoutGrowingOrWaiting) {
  PoolRig rig(gpu_wait());  // fences complete only when told
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* b = rig.alloc(20 * MiB);
  EXPECT_EQ(b, a);                         // the pending block, at once
  EXPECT_EQ(rig.up.allocate_calls(), 1u);  // no new segment
  EXPECT_EQ(rig.fence.waits(), 0u);        // the host did not wait
  EXPECT_EQ(rig.fence.order_calls(), 1u);
  EXPECT_EQ(rig.fence.ordered_running(), 1u);  // the GPU had something to wait for
  EXPECT_EQ(rig.pool->stats().gpu_waits, 1);
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  rig.expect_intact();
  // The ordered fence stays the pool's until it completes, then it is released.
  EXPECT_EQ(rig.fence.outstanding(), 1u);
  rig.fence.complete_all();
  rig.advance_clock();
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  (void)rig.alloc(4 * KiB);  // fence service: the completed ordered fence is released
  EXPECT_EQ(rig.fence.bad_calls(), 0u);
}

// A miss asks the pending fences urgently (the shim then asks its non-blocking streams at once):
// a fence that this completes frees its memory as usual, cold, with no GPU-side wait and no growth.
// Its negative control is the test above: a provider whose urgent answer is no better orders.
TEST(PoolGpuWait, AMissAsksUrgentlyBeforeOrderingTheGpu) {
  PoolRig rig(gpu_wait());
  rig.fence.set_urgent_completes(true);
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* b = rig.alloc(20 * MiB);
  EXPECT_EQ(b, a);
  EXPECT_GE(rig.fence.urgent_queries(), 1u);
  EXPECT_EQ(rig.fence.order_calls(), 0u);  // complete: nothing for the GPU to wait for
  EXPECT_EQ(rig.pool->stats().gpu_waits, 0);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);
  EXPECT_EQ(rig.fence.waits(), 0u);
  rig.expect_intact();
  EXPECT_EQ(rig.fence.bad_calls(), 0u);
}

// The same sequence in fenced mode grows instead: the negative control of the test above.
TEST(PoolGpuWait, FencedModeGrowsInstead) {
  PoolRig rig(fenced_options());
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_NE(rig.alloc(20 * MiB), a);
  EXPECT_EQ(rig.up.allocate_calls(), 2u);
  EXPECT_EQ(rig.fence.order_calls(), 0u);
}

// A provider that cannot order (a capture is open, the driver refused) leaves the memory pending:
// the pool grows, exactly as in fenced mode.
TEST(PoolGpuWait, RefusedOrderKeepsTheMemoryPending) {
  PoolRig rig(gpu_wait());
  rig.fence.set_can_order(false);
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_NE(rig.alloc(20 * MiB), a);
  EXPECT_EQ(rig.fence.order_calls(), 1u);
  EXPECT_EQ(rig.up.allocate_calls(), 2u);
  EXPECT_EQ(rig.pool->stats().gpu_waits, 0);
  EXPECT_GT(rig.pool->stats().pending_bytes, 0);
  rig.expect_intact();
}

// Pending memory that could not serve the request is not worth a GPU-side wait.
TEST(PoolGpuWait, TooLittlePendingMemoryOrdersNothing) {
  PoolRig rig(gpu_wait());
  void* small = rig.alloc(64 * KiB);
  void* large = rig.alloc(4 * MiB);
  ASSERT_EQ(rig.pool->free(small), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(large), FreeStatus::ok);
  (void)rig.alloc(30 * MiB);  // 4 MiB of large blocks pending: cannot serve 30 MiB
  EXPECT_EQ(rig.fence.order_calls(), 0u);
  EXPECT_EQ(rig.fence.waits(), 0u);
  rig.expect_intact();
}

// Completed fences need no GPU-side wait: the batch simply completes.
TEST(PoolGpuWait, CompletedFencesAreNotOrdered) {
  PoolRig rig(gpu_wait(), 80 * GiB, /*auto_fence=*/true);
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_EQ(rig.alloc(20 * MiB), a);
  EXPECT_EQ(rig.fence.order_calls(), 0u);
  EXPECT_EQ(rig.pool->stats().gpu_waits, 0);
}

// Memory handed out under a running GPU-side wait is never given back to the upstream before
// that fence completed: empty_cache (like GC and the OOM path) waits for it first.
TEST(PoolGpuWait, ReleaseWaitsForOrderedFences) {
  PoolRig rig(gpu_wait());
  void* a = rig.alloc(20 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  void* b = rig.alloc(20 * MiB);
  ASSERT_EQ(b, a);
  ASSERT_EQ(rig.fence.ordered_incomplete(), 1u);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);
  const std::size_t waits = rig.fence.waits();
  EXPECT_EQ(rig.pool->empty_cache(), 20 * MiB);
  EXPECT_GT(rig.fence.waits(), waits);
  EXPECT_EQ(rig.fence.ordered_incomplete(), 0u);
  EXPECT_EQ(rig.up.bytes_held(), 0u);
  EXPECT_EQ(rig.fence.outstanding(), 0u);
  EXPECT_EQ(rig.fence.bad_calls(), 0u);
}

// Several batches pending: one order covers them all, and every block comes back.
TEST(PoolGpuWait, OneOrderCoversEveryPendingBatch) {
  PoolRig rig(gpu_wait());
  std::vector<void*> ps;
  for (int i = 0; i < 3; ++i) ps.push_back(rig.alloc(20 * MiB));
  for (void* p : ps) {
    ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
    rig.advance_clock();
    (void)rig.pool->allocate(512, 0);  // the window passes: each free gets its own batch
  }
  const std::size_t records = rig.fence.device_records();
  EXPECT_GE(records, 3u);
  void* big = rig.alloc(20 * MiB);
  EXPECT_TRUE(big == ps[0] || big == ps[1] || big == ps[2]);
  EXPECT_EQ(rig.fence.order_calls(), 1u);
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  for (int i = 0; i < 2; ++i) (void)rig.alloc(20 * MiB);
  EXPECT_EQ(rig.fence.order_calls(), 1u);  // the other two were already free
  EXPECT_EQ(rig.up.allocate_calls(), 4u);  // three large segments + the small one
  rig.expect_intact();
}

// Expandable ranges: pending pages are reused in place instead of a host wait or page moves.
TEST(PoolGpuWait, ExpandableReusesPendingPagesInPlace) {
  PoolOptions o = gpu_wait();
  o.expandable_segments = true;
  PoolRig rig(o);
  rig.up.set_granularity(2 * MiB);
  void* a = rig.alloc(32 * MiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  const std::size_t maps = rig.up.map_calls();
  void* b = rig.alloc(32 * MiB);
  EXPECT_EQ(b, a);
  EXPECT_EQ(rig.up.map_calls(), maps);
  EXPECT_EQ(rig.up.unmap_calls(), 0u);
  EXPECT_EQ(rig.fence.waits(), 0u);
  EXPECT_EQ(rig.fence.ordered_running(), 1u);
  rig.expect_intact();
}

// Past the high-water mark, free pages reused under a still-running GPU-side wait cannot be
// unmapped or moved until it completes. An upstream that can alias maps them a second time where
// the growth needs them, with no host wait and no new memory, and keeps the old mapping until the
// wait completed. Without aliasing, expandable_wait (default) waits and recycles them, False maps
// new pages instead.
namespace {
struct HotGrowth {
  PoolRig rig;
  void* b = nullptr;
  void* c = nullptr;
  void* d = nullptr;
  void* hot_start = nullptr;  // where the 14 free hot MiB begin
  std::size_t waits = 0;
  // `refused_aliases`: alias() calls the upstream fails first.
  HotGrowth(bool alias, bool wait, int refused_aliases = 0) : rig(options(wait)) {
    rig.up.set_granularity(2 * MiB);
    rig.up.set_alias(alias);
    rig.up.fail_next_alias(refused_aliases);
    void* big = rig.alloc(34 * MiB);  // the high-water mark: 34 MiB
    EXPECT_EQ(rig.pool->free(big), FreeStatus::ok);
    rig.fence.complete_all();
    rig.advance_clock();
    EXPECT_EQ(rig.pool->empty_cache(), 34 * MiB);
    void* a = rig.alloc(16 * MiB);
    b = rig.alloc(16 * MiB);
    EXPECT_EQ(rig.pool->free(a), FreeStatus::ok);
    c = rig.alloc(2 * MiB);  // a's pages reused under a GPU-side wait; 14 MiB stay free, hot
    EXPECT_EQ(c, a);
    hot_start = static_cast<char*>(a) + 2 * MiB;
    EXPECT_EQ(rig.fence.ordered_incomplete(), 1u);
    waits = rig.fence.waits();
    d = rig.alloc(16 * MiB);  // fits nowhere: growth 14 MiB past the mark
    EXPECT_NE(d, nullptr);
  }
  static PoolOptions options(bool wait) {
    PoolOptions o = gpu_wait();
    o.expandable_segments = true;
    o.expandable_large_page = 0;
    o.expandable_max_unit = 0;  // one unit per 2 MiB page: any run of pages can move
    o.expandable_wait = wait;
    o.expandable_slack = 0;  // exact page arithmetic: no growth slack
    return o;
  }
  void free_all() {
    for (void* p : {b, c, d}) EXPECT_EQ(rig.pool->free(p), FreeStatus::ok);
  }
};
}  // namespace

TEST(PoolGpuWait, HotPagesAreAliasedIntoGrowthWithoutWaiting) {
  for (bool wait : {true, false}) {
    SCOPED_TRACE(wait ? "expandable_wait:True" : "expandable_wait:False");
    HotGrowth g(/*alias=*/true, wait);
    PoolRig& rig = g.rig;
    EXPECT_EQ(rig.fence.waits(), g.waits);        // no host wait…
    EXPECT_EQ(rig.up.bytes_mapped(), 34 * MiB);   // …and no new memory: the hot pages moved
    EXPECT_EQ(rig.up.alias_calls(), 1u);          // one run, one call
    EXPECT_EQ(rig.up.aliased_bytes(), 14 * MiB);  // the old mapping stays while old work may run
    EXPECT_TRUE(rig.up.alias_at(g.hot_start));
    EXPECT_EQ(rig.pool->stats().num_device_alias, 1);
    EXPECT_EQ(rig.pool->stats().reserved_bytes[kAll].current, static_cast<std::int64_t>(34 * MiB));
    rig.expect_intact();
    // More traffic while the fence runs: the old range is neither dropped nor grown into.
    for (int i = 0; i < 4; ++i) {
      rig.advance_clock();
      void* e = rig.alloc(8 * MiB);
      EXPECT_EQ(rig.pool->free(e), FreeStatus::ok);
    }
    EXPECT_EQ(rig.up.aliased_bytes(), 14 * MiB);
    EXPECT_EQ(rig.up.unalias_calls(), 0u);
    // The GPU-side wait completes: the old mapping goes at the next fence service, and its
    // address space becomes a hole again.
    rig.fence.complete_all();
    rig.advance_clock();
    (void)rig.pool->free(rig.alloc(4 * KiB));
    EXPECT_EQ(rig.up.aliased_bytes(), 0u);
    EXPECT_EQ(rig.up.unalias_calls(), 1u);
    rig.expect_intact();
    g.free_all();
    rig.fence.complete_all();
    rig.advance_clock();
    const std::size_t mapped = rig.up.bytes_mapped();  // 34 MiB and what the 8 MiB requests grew
    EXPECT_EQ(rig.pool->empty_cache(), mapped);
    EXPECT_EQ(rig.up.bytes_mapped(), 0u);
    EXPECT_EQ(rig.up.bad_calls(), 0u);  // nothing was mapped over the old mapping, nothing cut
    rig.expect_intact();
  }
}

TEST(PoolGpuWait, WithoutAliasingExpandableWaitSettlesHotPages) {
  for (bool wait : {true, false}) {
    SCOPED_TRACE(wait ? "expandable_wait:True" : "expandable_wait:False");
    HotGrowth g(/*alias=*/false, wait);
    PoolRig& rig = g.rig;
    EXPECT_EQ(rig.up.alias_calls(), 0u);
    if (wait) {
      EXPECT_GT(rig.fence.waits(), g.waits);       // waited for the GPU-side wait's fence…
      EXPECT_EQ(rig.up.bytes_mapped(), 34 * MiB);  // …and recycled the hot pages
    } else {
      EXPECT_EQ(rig.fence.waits(), g.waits);       // never blocks…
      EXPECT_EQ(rig.up.bytes_mapped(), 48 * MiB);  // …maps new memory instead
      EXPECT_EQ(rig.fence.ordered_incomplete(), 1u);
    }
    EXPECT_EQ(rig.up.bad_calls(), 0u);
    rig.expect_intact();
    g.free_all();
  }
}

// An alias the upstream refuses changes nothing: the hot pages stay where they are, fresh pages
// serve the growth, and no old mapping is left behind.
TEST(PoolGpuWait, RefusedAliasMapsFreshPages) {
  HotGrowth g(/*alias=*/true, /*wait=*/false, /*refused_aliases=*/1);
  PoolRig& rig = g.rig;
  EXPECT_EQ(rig.up.alias_calls(), 1u);
  EXPECT_EQ(rig.up.aliased_bytes(), 0u);
  EXPECT_EQ(rig.up.bytes_mapped(), 48 * MiB);
  EXPECT_EQ(rig.pool->stats().num_device_alias, 0);
  EXPECT_EQ(rig.up.bad_calls(), 0u);
  rig.expect_intact();
  g.free_all();
}

namespace {

// Two 64 KiB blocks freed into one batch, the window passed, one more 64 KiB allocated (the
// allocation that records the batch's fence): what it got, and the fence queries before it.
struct ReuseAfterWindow {
  void* a;
  void* b;
  void* c;
  std::size_t queries_before;
};
ReuseAfterWindow free_two_then_allocate(PoolRig& rig) {
  ReuseAfterWindow r{rig.alloc(64 * KiB), rig.alloc(64 * KiB), nullptr, 0};
  EXPECT_EQ(rig.pool->free(r.a), FreeStatus::ok);
  EXPECT_EQ(rig.pool->free(r.b), FreeStatus::ok);
  rig.advance_clock();
  r.queries_before = rig.fence.queries();
  r.c = rig.alloc(64 * KiB);
  return r;
}

}  // namespace

// Where ordering is free (every stream follows the legacy stream), a batch is reused as soon as
// its fence is recorded: ordered at once, never asked first, so a program that frees and
// allocates every iteration pays one record per batch (its window: 1 ms here) and a query per
// kOrderedPollGapNs or per kOrderedPollCount new orders, whichever comes first.
TEST(PoolGpuWait, FreeOrderingReusesRecordedBatchesWithoutQueries) {
  PoolRig rig(gpu_wait());  // fences complete only when told
  rig.fence.set_orders_for_free(true);
  const ReuseAfterWindow r = free_two_then_allocate(rig);
  void* c = r.c;
  EXPECT_TRUE(c == r.a || c == r.b) << "the recorded batch was not reused at once";
  EXPECT_EQ(rig.fence.device_records(), 1u);
  EXPECT_EQ(rig.fence.order_calls(), 1u);
  EXPECT_EQ(rig.fence.ordered_running(), 1u);  // ordered while still running, not asked first
  EXPECT_EQ(rig.fence.queries(), r.queries_before);
  EXPECT_EQ(rig.pool->stats().pending_bytes, 0);
  EXPECT_EQ(rig.pool->stats().gpu_waits, 1);
  rig.expect_intact();

  // 100 iterations 50 us apart, each freeing and allocating again (served from the segment's
  // rest: no miss): one record and one order per 1 ms window, not one per iteration (the short
  // window's rate), and the ordered fences are asked once per ms (5 ms in all) or per 8 new
  // orders; none completes here, so each time one query finds the oldest still running.
  ASSERT_EQ(rig.pool->free(c), FreeStatus::ok);
  const std::size_t q0 = rig.fence.queries(), records0 = rig.fence.device_records();
  const std::size_t orders0 = rig.fence.order_calls();
  for (int i = 0; i < 100; ++i) {
    rig.advance_clock(50'000);
    void* p = rig.alloc(64 * KiB);
    ASSERT_EQ(rig.pool->free(p), FreeStatus::ok);
  }
  EXPECT_GE(rig.fence.device_records() - records0, 4u);
  EXPECT_LE(rig.fence.device_records() - records0, 6u);
  EXPECT_EQ(rig.fence.order_calls() - orders0, rig.fence.device_records() - records0);
  EXPECT_LE(rig.fence.queries() - q0, 100u * 50'000 / 1'000'000 + 100u / 8 + 1);
  EXPECT_EQ(rig.up.allocate_calls(), 1u);  // all of it from the first segment
  // Nothing goes back to the upstream while an ordered fence may run.
  EXPECT_GT(rig.fence.ordered_incomplete(), 0u);
  const std::size_t waits = rig.fence.waits();
  (void)rig.pool->empty_cache();
  EXPECT_GT(rig.fence.waits(), waits);
  EXPECT_EQ(rig.fence.ordered_incomplete(), 0u);
  EXPECT_EQ(rig.fence.outstanding(), 0u);
  EXPECT_EQ(rig.fence.bad_calls(), 0u);
  rig.expect_intact();
}

// Negative control: the same first steps where ordering is not free ask the fence instead (and,
// with the fence still running, leave the blocks pending: c comes from the rest of the segment).
TEST(PoolGpuWait, WithoutFreeOrderingRecordedBatchesAreAsked) {
  PoolRig rig(gpu_wait());
  const ReuseAfterWindow r = free_two_then_allocate(rig);
  EXPECT_NE(r.c, r.a);
  EXPECT_NE(r.c, r.b);
  EXPECT_GT(rig.fence.queries(), r.queries_before);
  EXPECT_EQ(rig.fence.order_calls(), 0u);
  EXPECT_GT(rig.pool->stats().pending_bytes, 0);
  rig.expect_intact();
}

// A provider that would order for free but refuses the order (a capture began in between) leaves
// the batch pending, as without free ordering.
TEST(PoolGpuWait, FreeOrderingRefusedLeavesTheBatchPending) {
  PoolRig rig(gpu_wait());
  rig.fence.set_orders_for_free(true);
  void* a = rig.alloc(64 * KiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  rig.fence.set_can_order(false);
  rig.advance_clock();
  EXPECT_NE(rig.alloc(64 * KiB), a);
  EXPECT_GT(rig.pool->stats().pending_bytes, 0);
  EXPECT_EQ(rig.pool->stats().gpu_waits, 0);
  rig.expect_intact();
}

// Free ordering is for the default policy only: fenced frees still wait for their fences.
TEST(PoolGpuWait, FencedModeNeverOrdersEvenWhenFree) {
  PoolRig rig(fenced_options());
  rig.fence.set_orders_for_free(true);
  void* a = rig.alloc(64 * KiB);
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  rig.advance_clock();
  EXPECT_NE(rig.alloc(64 * KiB), a);
  EXPECT_EQ(rig.fence.order_calls(), 0u);
  rig.expect_intact();
}

// The fences of GPU-side waits are polled by bisection (device fences complete in recording
// order): exactly the complete prefix is released, with one query when the oldest still runs,
// and a fence that runs is never released even where a newer one completed out of order (every
// fence is asked before it is released).
TEST(PoolGpuWait, OrderedFencesPollReleasesExactlyTheCompletePrefix) {
  FakeFence fence;
  detail::FenceBatches batches;
  std::vector<FenceHandle> h;
  for (int i = 0; i < 64; ++i) {
    h.push_back(fence.record_device());
    batches.add_ordered(h.back(), batches.new_order());
  }
  const std::size_t q = fence.queries();
  batches.poll_ordered(fence);
  EXPECT_EQ(fence.queries() - q, 1u);  // the oldest runs: nothing else is asked
  EXPECT_EQ(batches.order_done(), 0u);
  for (int i = 0; i < 40; ++i) fence.complete(h[static_cast<std::size_t>(i)]);
  batches.poll_ordered(fence);
  EXPECT_EQ(batches.order_done(), 40u);
  EXPECT_EQ(fence.releases(), 40u);
  // Out of order: 41-49 and 60 complete, 50 runs.
  for (int i = 41; i < 50; ++i) fence.complete(h[static_cast<std::size_t>(i)]);
  fence.complete(h[60]);
  batches.poll_ordered(fence);
  EXPECT_EQ(batches.order_done(), 40u);  // 40 still runs
  fence.complete(h[40]);
  batches.poll_ordered(fence);
  EXPECT_EQ(batches.order_done(), 50u);  // 50 runs; 60 stays too
  EXPECT_EQ(fence.releases(), 50u);
  EXPECT_EQ(fence.bad_calls(), 0u);
  fence.complete_all();
  batches.poll_ordered(fence);
  EXPECT_EQ(batches.order_done(), 64u);
  EXPECT_EQ(fence.releases(), 64u);
  EXPECT_FALSE(batches.has_ordered());
}
