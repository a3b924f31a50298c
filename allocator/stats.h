// Statistics under PyTorch's torch.cuda.memory_stats() names, plus cudapool's own counters,
// and the snapshot the tools render.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "allocator/types.h"

namespace cudapool {

struct StatCounter {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // total ever added
  std::int64_t freed = 0;      // total ever removed
};

enum StatPool : std::size_t { kAll = 0, kSmallPool = 1, kLargePool = 2, kNumStatPools = 3 };
using StatArray = std::array<StatCounter, kNumStatPools>;

struct Stats {
  // PyTorch families: <family>.<all|small_pool|large_pool>.<current|peak|allocated|freed>
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  StatCounter oversize_allocations, oversize_segments;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  std::int64_t max_split_size = -1;  // bytes; -1 when unset (PyTorch's convention)

  // cudapool's own.
  std::int64_t cache_hits = 0;    // allocations served without the upstream
  std::int64_t cache_misses = 0;  // allocations that asked the upstream for a segment
  std::int64_t upstream_ns = 0;   // time spent inside Upstream::allocate/release/map/unmap
  // Expandable segments: pages mapped into / unmapped from a range (a move counts as both).
  // With num_device_alloc/free they make the tools' "upstream calls" (docs/tools.md, Metrics).
  std::int64_t num_device_map = 0;
  std::int64_t num_device_unmap = 0;
  // Of the maps, those that mapped hot pages a second time instead of fresh memory (Upstream::alias;
  // the old mapping's removal later counts as an unmap).
  std::int64_t num_device_alias = 0;
  std::int64_t fences_recorded = 0;
  std::int64_t fence_waits = 0;    // host blocked on a fence
  std::int64_t gpu_waits = 0;      // pending memory reused with the GPU made to wait (order_after)
  std::int64_t pending_bytes = 0;  // freed, waiting for a fence (current)
  std::int64_t gc_passes = 0;
  std::int64_t gc_freed_bytes = 0;
  std::int64_t empty_cache_calls = 0;
  std::int64_t bad_frees = 0;  // double / interior frees refused
};

enum class BlockState : std::uint8_t { active_allocated, active_pending_free, inactive };
// PyTorch's snapshot names of the states ("active_allocated", ...).
const char* to_string(BlockState s) noexcept;

struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;
  BlockState state = BlockState::inactive;
};

struct SegmentInfo {
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  StreamId stream = 0;
  bool is_small = false;  // segment_type 'small' vs 'large'
  bool is_expandable = false;
  std::vector<BlockInfo> blocks;  // in address order, covering the segment
};

struct Snapshot {
  std::vector<SegmentInfo> segments;  // in address order
};

}  // namespace cudapool
