// The pool's limits (limits.h): what they are computed from.
#include "allocator/limits.h"

#include <algorithm>

namespace cudapool::detail {

void Limits::ensure(Upstream& up, const PoolOptions& opt) {
  if (ready_) return;
  const bool need_total = opt.per_process_memory_fraction > 0.0 || opt.garbage_collection_threshold > 0.0 ||
                          opt.expandable_segments;
  if (opt.expandable_segments) granularity_ = up.granularity();  // 0: the upstream cannot
  if (need_total) {
    std::size_t free_bytes = 0;
    up.mem_info(&free_bytes, &device_total_);
  }
  limit_ = opt.max_reserved;
  if (opt.per_process_memory_fraction > 0.0) {
    const auto by_fraction = static_cast<std::size_t>(opt.per_process_memory_fraction *
                                                      static_cast<double>(device_total_));
    limit_ = std::min(limit_, by_fraction);
  }
  ready_ = true;
}

}  // namespace cudapool::detail
