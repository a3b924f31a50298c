// Internal: how much the pool may reserve, and the device facts that rule depends on. Read from
// the upstream on first need (mem_info may be slow), then fixed, except the bytes in flight.
//
//  * limit: reserved bytes may not exceed min(max_reserved, per_process_memory_fraction x the
//    device's total memory); a request that would pass it is refused without an upstream call,
//    like PyTorch's memory fraction.
//  * in flight: segment bytes being allocated or released with the pool lock dropped
//    (release_lock_on_cudamalloc) still count against the limit, so two threads cannot both
//    squeeze under it.
//  * external: device memory the program maps itself (cuMemCreate outside the pool), which the
//    shim counts against the same limit, so that a cap holds whatever way the memory was taken.
//  * device total: also the base of garbage_collection_threshold when no limit is set, and the
//    size of an expandable range (expandable_ranges.cpp).
//  * granularity: the driver's page size for expandable segments; 0 = expandable segments off
//    (not asked for, not ready yet, or the upstream cannot map pages).
// The pool lock guards it, as everything else in the pool.
#pragma once
#include <cstddef>

#include "allocator/options.h"
#include "allocator/upstream.h"

namespace cudapool::detail {

class Limits {
 public:
  // The first call asks the upstream what the options need; later calls return at once.
  void ensure(Upstream& up, const PoolOptions& opt);

  std::size_t limit() const { return limit_; }
  std::size_t device_total() const { return device_total_; }
  std::size_t granularity() const { return granularity_; }
  // The page of a pool kind's expandable range: the granularity, or for the large pool
  // PoolOptions::expandable_large_page rounded up to it.
  std::size_t page_bytes(bool small, const PoolOptions& opt) const {
    const std::size_t want = small || granularity_ == 0 ? 0 : opt.expandable_large_page;
    return want <= granularity_ ? granularity_ : (want + granularity_ - 1) / granularity_ * granularity_;
  }

  // true: `bytes` more on top of `reserved` (and the bytes in flight or external) would pass the limit.
  bool refuses(std::size_t reserved, std::size_t bytes) const {
    return limit_ != kNoLimit && (bytes > limit_ || reserved + inflight_ + external_ > limit_ - bytes);
  }
  // true: `bytes` more on top of `reserved` (and the bytes in flight or external) stay within the limit.
  bool admits(std::size_t reserved, std::size_t bytes) const {
    return limit_ == kNoLimit || reserved + inflight_ + external_ + bytes <= limit_;
  }
  // How far `bytes` more on top of `reserved` (and the bytes in flight or external) would pass the limit; 0 if not.
  std::size_t excess(std::size_t reserved, std::size_t bytes) const {
    if (limit_ == kNoLimit || reserved + inflight_ + external_ + bytes <= limit_) return 0;
    return reserved + inflight_ + external_ + bytes - limit_;
  }
  // The bytes garbage_collection_threshold is a fraction of: the limit, else the device's memory.
  std::size_t gc_allowed() const { return limit_ != kNoLimit ? limit_ : device_total_; }

  // Bytes an upstream call handles while the pool lock is dropped: counted from hold() to unhold().
  void hold(std::size_t bytes) { inflight_ += bytes; }
  void unhold(std::size_t bytes) { inflight_ -= bytes; }
  // Device memory taken outside the pool, counted from add_external() to remove_external().
  void add_external(std::size_t bytes) { external_ += bytes; }
  void remove_external(std::size_t bytes) { external_ -= bytes < external_ ? bytes : external_; }
  std::size_t external() const { return external_; }

 private:
  bool ready_ = false;
  std::size_t device_total_ = 0;
  std::size_t limit_ = kNoLimit;
  std::size_t inflight_ = 0;
  std::size_t external_ = 0;
  std::size_t granularity_ = 0;
};

}  // namespace cudapool::detail
