// Stats under PyTorch's names with hand-computed values, the snapshot, events, and bad input.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

TEST(PoolStats, HandComputedValues) {
  PoolRig rig(immediate_options());
  void* big = rig.alloc(5 * MiB);  // large: 20 MiB segment, 5 MiB block, 15 MiB free split
  void* small = rig.alloc(1000);   // small: 2 MiB segment, 1024 B block
  Stats s = rig.pool->stats();
  EXPECT_EQ(s.segment[kAll].current, 2);
  EXPECT_EQ(s.segment[kLargePool].current, 1);
  EXPECT_EQ(s.reserved_bytes[kAll].current, static_cast<std::int64_t>(22 * MiB));
  EXPECT_EQ(s.reserved_bytes[kSmallPool].current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(s.allocated_bytes[kLargePool].current, static_cast<std::int64_t>(5 * MiB));
  EXPECT_EQ(s.allocated_bytes[kSmallPool].current, 1024);
  EXPECT_EQ(s.requested_bytes[kSmallPool].current, 1000);
  EXPECT_EQ(s.allocation[kAll].current, 2);
  EXPECT_EQ(s.active[kAll].current, 2);
  EXPECT_EQ(s.inactive_split[kAll].current, 2);
  EXPECT_EQ(s.inactive_split_bytes[kLargePool].current, static_cast<std::int64_t>(15 * MiB));
  EXPECT_EQ(s.inactive_split_bytes[kSmallPool].current, static_cast<std::int64_t>(2 * MiB - 1024));
  EXPECT_EQ(s.num_device_alloc, 2);
  EXPECT_EQ(s.cache_misses, 2);
  EXPECT_EQ(s.cache_hits, 0);
  EXPECT_EQ(rig.pool->cached_bytes(), 22 * MiB - 5 * MiB - 1024);
  ASSERT_EQ(rig.pool->free(big), FreeStatus::ok);
  ASSERT_EQ(rig.pool->free(small), FreeStatus::ok);
  s = rig.pool->stats();
  EXPECT_EQ(s.allocated_bytes[kAll].current, 0);
  EXPECT_EQ(s.allocated_bytes[kAll].peak, static_cast<std::int64_t>(5 * MiB + 1024));
  EXPECT_EQ(s.allocated_bytes[kAll].allocated, static_cast<std::int64_t>(5 * MiB + 1024));
  EXPECT_EQ(s.allocated_bytes[kAll].freed, static_cast<std::int64_t>(5 * MiB + 1024));
  EXPECT_EQ(s.inactive_split[kAll].current, 0);  // merged back into whole segments
  EXPECT_EQ(s.requested_bytes[kAll].current, 0);
  (void)rig.alloc(1000);
  EXPECT_EQ(rig.pool->stats().cache_hits, 1);
  rig.pool->reset_peak_stats();
  EXPECT_EQ(rig.pool->stats().allocated_bytes[kAll].peak, 1024);
  rig.pool->reset_accumulated_stats();
  s = rig.pool->stats();
  EXPECT_EQ(s.allocated_bytes[kAll].allocated, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  EXPECT_EQ(s.allocated_bytes[kAll].current, 1024);
  rig.expect_intact();
}

TEST(PoolStats, MaxSplitSizeReported) {
  PoolOptions o;
  EXPECT_EQ(PoolRig(o).pool->stats().max_split_size, -1);  // PyTorch's value for no max split
  o.max_split_size = 64 * MiB;
  EXPECT_EQ(PoolRig(o).pool->stats().max_split_size, static_cast<std::int64_t>(64 * MiB));
}

TEST(PoolSnapshot, SegmentsAndBlocks) {
  PoolRig rig;
  void* a = rig.alloc(5 * MiB, 7);
  void* b = rig.alloc(2 * MiB, 7);
  ASSERT_EQ(rig.pool->free(b), FreeStatus::ok);  // pending
  Snapshot snap = rig.pool->snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  const SegmentInfo& seg = snap.segments[0];
  EXPECT_EQ(seg.address, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(seg.total_size, 20 * MiB);
  EXPECT_EQ(seg.stream, 7u);
  EXPECT_FALSE(seg.is_small);
  EXPECT_EQ(seg.allocated_size, 5 * MiB);
  EXPECT_EQ(seg.active_size, 7 * MiB);
  EXPECT_EQ(seg.requested_size, 7 * MiB);
  ASSERT_EQ(seg.blocks.size(), 3u);
  EXPECT_EQ(seg.blocks[0].state, BlockState::active_allocated);
  EXPECT_EQ(seg.blocks[1].state, BlockState::active_pending_free);
  EXPECT_EQ(seg.blocks[1].address, reinterpret_cast<std::uintptr_t>(b));
  EXPECT_EQ(seg.blocks[2].state, BlockState::inactive);
  EXPECT_EQ(seg.blocks[2].size, 13 * MiB);
  EXPECT_EQ(compare_with_recount(rig.pool->stats(), snap), "");
}

TEST(PoolAddress, InfoForLiveBlocksOnly) {
  PoolRig rig;
  void* a = rig.alloc(5 * MiB);
  auto info = rig.pool->address_info(at(a, 4 * MiB));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->block_base, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(info->block_size, 5 * MiB);
  EXPECT_EQ(info->segment_size, 20 * MiB);
  EXPECT_FALSE(info->whole_segment);
  EXPECT_FALSE(rig.pool->address_info(at(a, 6 * MiB)).has_value());  // free part
  EXPECT_TRUE(rig.pool->owns(at(a, 6 * MiB)));
  EXPECT_FALSE(rig.pool->owns(at(a, 20 * MiB)));
  void* w = rig.alloc(20 * MiB);
  EXPECT_TRUE(rig.pool->address_info(w)->whole_segment);
}

namespace {
// Keeps every event the pool emits, in order.
struct RecordingSink : EventSink {
  std::vector<Event> events;
  void on_event(const Event& e) override { events.push_back(e); }
};
}  // namespace

TEST(PoolEvents, SinkSeesAllocationAndSegmentEvents) {
  RecordingSink sink;
  FakeUpstream up;
  FakeFence fence(true);
  PoolOptions o;
  DevicePool pool(3, o, up, fence, &sink);
  void* a = pool.allocate(1000, 9).ptr;
  pool.free(a);
  pool.empty_cache();
  std::vector<EventKind> kinds;
  for (auto& e : sink.events) kinds.push_back(e.kind);
  // empty_cache waits for the free's fence (a fence_wait) before it releases the segment.
  std::vector<EventKind> want = {EventKind::segment_alloc, EventKind::allocate,     EventKind::free,
                                 EventKind::fence_wait,    EventKind::segment_free, EventKind::empty_cache};
  EXPECT_EQ(kinds, want);
  EXPECT_EQ(sink.events[1].device, 3);
  EXPECT_EQ(sink.events[1].size, 1024u);
  EXPECT_EQ(sink.events[1].requested, 1000u);
  EXPECT_EQ(sink.events[1].stream, 9u);
  EXPECT_EQ(sink.events[0].size, 2 * MiB);
  EXPECT_EQ(sink.events[5].size, 2 * MiB);
}

// A host wait on a fence is an event of its own, with the stream it waited for and how long:
// the trace is where a user sees that the pool stalled the program.
TEST(PoolEvents, FenceWaitsAreEventsWithTheirDuration) {
  RecordingSink sink;
  FakeUpstream up;
  FakeFence fence;  // fences complete only when waited for
  PoolOptions o;
  o.free_sync = FreeSync::device;  // a miss waits for the pending free instead of growing
  DevicePool pool(0, o, up, fence, &sink);
  void* a = pool.allocate(20 * MiB, 0).ptr;
  pool.free(a);
  EXPECT_EQ(pool.allocate(20 * MiB, 0).ptr, a);
  std::size_t waits = 0;
  for (const Event& e : sink.events) {
    if (e.kind != EventKind::fence_wait) continue;
    ++waits;
    EXPECT_EQ(e.stream, 0u);
    EXPECT_GE(e.duration_ns, 0);
    EXPECT_EQ(e.size, 0u);
  }
  EXPECT_EQ(waits, 1u);
  EXPECT_EQ(static_cast<std::size_t>(pool.stats().fence_waits), waits);
  EXPECT_STREQ(to_string(EventKind::fence_wait), "fence_wait");
}

TEST(PoolBadInput, BadFreesAreRefusedAndLeaveThePoolUntouched) {
  PoolRig rig;
  void* a = rig.alloc(4 * KiB);
  void* b = rig.alloc(4 * KiB);
  const Snapshot before = rig.pool->snapshot();
  int unknown = 0;
  EXPECT_EQ(rig.pool->free(nullptr), FreeStatus::not_owned);
  EXPECT_EQ(rig.pool->free(&unknown), FreeStatus::not_owned);
  EXPECT_EQ(rig.pool->free_on_stream(&unknown, 3), FreeStatus::not_owned);
  EXPECT_EQ(rig.pool->free(at(a, 512)), FreeStatus::interior_pointer);
  EXPECT_EQ(rig.pool->free(at(a, 1)), FreeStatus::interior_pointer);
  EXPECT_EQ(rig.pool->free(at(b, 8 * KiB)), FreeStatus::interior_pointer);  // inside the free rest
  EXPECT_EQ(rig.pool->stats().bad_frees, 3);
  const Snapshot same = rig.pool->snapshot();
  ASSERT_EQ(same.segments.size(), before.segments.size());
  EXPECT_EQ(same.segments[0].blocks.size(), before.segments[0].blocks.size());
  ASSERT_EQ(rig.pool->free(a), FreeStatus::ok);
  EXPECT_EQ(rig.pool->free(a), FreeStatus::double_free);  // pending
  EXPECT_EQ(rig.pool->free_on_stream(a, 0), FreeStatus::double_free);
  rig.fence.set_auto_complete(true);
  (void)rig.alloc(512 * KiB);  // a becomes a shared free block (b keeps it from merging)
  EXPECT_EQ(rig.pool->free(a), FreeStatus::double_free);
  rig.expect_intact();
  EXPECT_EQ(rig.pool->free(b), FreeStatus::ok);
  EXPECT_EQ(rig.pool->free(b), FreeStatus::double_free);
  rig.expect_intact();
}

TEST(PoolBadInput, SizeZeroAndAbsurdSizes) {
  PoolRig rig;
  AllocResult z = rig.pool->allocate(0, 0);
  EXPECT_EQ(z.status, AllocStatus::ok);
  EXPECT_EQ(z.ptr, nullptr);
  EXPECT_EQ(rig.pool->allocate(kMaxRequestSize + 1, 0).status, AllocStatus::invalid_size);
  EXPECT_EQ(rig.pool->allocate(std::numeric_limits<std::size_t>::max(), 0).status, AllocStatus::invalid_size);
  EXPECT_EQ(rig.pool->allocate(std::numeric_limits<std::size_t>::max() - 100, 1).status, AllocStatus::invalid_size);
  EXPECT_EQ(rig.up.allocate_calls(), 0u);
  // Large but legal on a smaller device: a clean out_of_memory.
  EXPECT_EQ(rig.pool->allocate(kMaxRequestSize, 0).status, AllocStatus::out_of_memory);
  rig.expect_intact();
  EXPECT_NE(rig.alloc(100), nullptr);
  rig.expect_intact();
}
