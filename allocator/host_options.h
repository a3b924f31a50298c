// The knobs of the pinned host pool (allocator/host_pool.h), apart from the pool itself so that
// the policy can carry them without the pool's headers.
#pragma once
#include <cstddef>

#include "allocator/options.h"

namespace cudapool {

struct HostPoolOptions {
  bool enabled = false;  // pinned_cache: serve pinned allocations from the pool
  // pinned_use_cuda_host_register: the upstream pins memory it maps itself (cuMemHostRegister)
  // instead of asking the driver to allocate it (cuMemHostAlloc).
  bool use_host_register = false;
  int register_threads = 1;         // pinned_num_register_threads: threads that fault pages in first
  std::size_t reserve_segment = 0;  // pinned_reserve_segment_size_mb: one segment carved first (0 = none)
  // pinned_max_round_threshold_mb: requests above it are not rounded to a size class (whole
  // pages only) and take only blocks of exactly their size.
  std::size_t max_round_threshold = kNoLimit;
  std::size_t max_cached = kNoLimit;  // pinned_max_cached_size_mb: cached (free) bytes kept at most
};

}  // namespace cudapool
