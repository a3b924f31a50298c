// Internal: the one place where statistics counters change. Every event the pool counts is a
// named operation here (a block allocated, pages mapped, a segment removed, ...), so the rule
// for "what moves which counter" is written once, for the pool's own counters (StatsLedger)
// and for a thread cache's unmerged operations (StatsDelta) alike.
//
// The block families (allocation, active, inactive_split, their bytes, requested_bytes) follow
// a block's life: allocated -> unallocated (freed, still active while its fence is pending) ->
// deactivated (free). A free block that is part of a split segment counts in inactive_split.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "allocator/stats.h"

namespace cudapool::detail {

// Host time of upstream calls (stats' upstream_ns, event durations): always the real clock, unlike
// the pool's injectable clock_ns() that drives its fence timing.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline StatPool stat_pool(bool small) { return small ? kSmallPool : kLargePool; }

// Counter arithmetic: current moves by d, peak follows current, allocated/freed sum the moves.
// On a delta that starts at zero this yields current = net change and peak = highest running net.
inline void add_stat(StatCounter& c, std::int64_t d) {
  c.current += d;
  if (d >= 0) {
    c.allocated += d;
    if (c.current > c.peak) c.peak = c.current;
  } else {
    c.freed -= d;
  }
}
inline void bump(StatArray& a, StatPool pool, std::int64_t d) {
  add_stat(a[kAll], d);
  add_stat(a[pool], d);
}

// The block families' operations, on any record that has those families (Stats or StatsDelta).
template <class S>
inline void count_block_allocated(S& s, bool small, std::size_t size, std::size_t requested) {
  const StatPool p = stat_pool(small);
  const auto sz = static_cast<std::int64_t>(size);
  bump(s.allocation, p, 1);
  bump(s.allocated_bytes, p, sz);
  bump(s.active, p, 1);
  bump(s.active_bytes, p, sz);
  bump(s.requested_bytes, p, static_cast<std::int64_t>(requested));
}
template <class S>
inline void count_block_unallocated(S& s, bool small, std::size_t size) {
  const StatPool p = stat_pool(small);
  bump(s.allocation, p, -1);
  bump(s.allocated_bytes, p, -static_cast<std::int64_t>(size));
}
template <class S>
inline void count_block_deactivated(S& s, bool small, std::size_t size, std::size_t requested) {
  const StatPool p = stat_pool(small);
  bump(s.active, p, -1);
  bump(s.active_bytes, p, -static_cast<std::int64_t>(size));
  bump(s.requested_bytes, p, -static_cast<std::int64_t>(requested));
}
template <class S>
inline void count_inactive_split(S& s, bool small, std::size_t size, int sign) {
  const StatPool p = stat_pool(small);
  bump(s.inactive_split, p, sign);
  bump(s.inactive_split_bytes, p, sign * static_cast<std::int64_t>(size));
}

// A thread cache's operations not yet applied to its pool's counters (thread_cache.h). Only
// the families a cached operation can touch; oversize blocks never enter a cache.
struct StatsDelta {
  StatArray allocation{}, allocated_bytes{}, active{}, active_bytes{}, requested_bytes{};
  StatArray inactive_split{}, inactive_split_bytes{};
  std::int64_t cache_hits = 0;
  std::int64_t pending_bytes = 0;    // fenced frees waiting in the cache's batch
  std::int64_t fences_recorded = 0;  // the cache's batch fences

  void block_allocated(bool small, std::size_t size, std::size_t requested) {
    count_block_allocated(*this, small, size, requested);
  }
  void block_unallocated(bool small, std::size_t size) { count_block_unallocated(*this, small, size); }
  void block_deactivated(bool small, std::size_t size, std::size_t requested) {
    count_block_deactivated(*this, small, size, requested);
  }
  void inactive_split_changed(bool small, std::size_t size, int sign) {
    count_inactive_split(*this, small, size, sign);
  }
  void cache_hit() { ++cache_hits; }
  void pending_added(std::size_t size) { pending_bytes += static_cast<std::int64_t>(size); }
  void pending_removed(std::size_t size) { pending_bytes -= static_cast<std::int64_t>(size); }
  void fence_recorded() { ++fences_recorded; }
};

// The pool's counters. Reads go through view(); every change is one of the operations below.
class StatsLedger {
 public:
  // max_split_size: blocks and segments at least this large count as oversize (kNoLimit: none).
  explicit StatsLedger(std::size_t max_split_size);

  const Stats& view() const { return s_; }
  std::size_t reserved_bytes() const { return static_cast<std::size_t>(s_.reserved_bytes[kAll].current); }
  std::size_t allocated_bytes() const { return static_cast<std::size_t>(s_.allocated_bytes[kAll].current); }
  std::size_t allocated_peak() const { return static_cast<std::size_t>(s_.allocated_bytes[kAll].peak); }

  // ---- blocks ----
  void block_allocated(bool small, std::size_t size, std::size_t requested) {
    count_block_allocated(s_, small, size, requested);
    if (size >= oversize_) add_stat(s_.oversize_allocations, 1);
  }
  // Allocated -> no longer allocated (still active until it becomes free).
  void block_unallocated(bool small, std::size_t size) {
    count_block_unallocated(s_, small, size);
    if (size >= oversize_) add_stat(s_.oversize_allocations, -1);
  }
  // Active (allocated or pending) -> inactive.
  void block_deactivated(bool small, std::size_t size, std::size_t requested) {
    count_block_deactivated(s_, small, size, requested);
  }
  // A free block of a split segment starts (+1) or stops (-1) counting in inactive_split.
  void inactive_split_changed(bool small, std::size_t size, int sign) { count_inactive_split(s_, small, size, sign); }
  // free() made a block pending on a fence / its fence completed.
  void pending_added(std::size_t size) { s_.pending_bytes += static_cast<std::int64_t>(size); }
  void pending_removed(std::size_t size) { s_.pending_bytes -= static_cast<std::int64_t>(size); }

  // ---- reserved memory ----
  // A classic segment from Upstream::allocate, and its release.
  void segment_added(bool small, std::size_t size) {
    const StatPool p = stat_pool(small);
    bump(s_.segment, p, 1);
    bump(s_.reserved_bytes, p, static_cast<std::int64_t>(size));
    if (size >= oversize_) add_stat(s_.oversize_segments, 1);
  }
  void segment_removed(bool small, std::size_t size) {
    const StatPool p = stat_pool(small);
    bump(s_.segment, p, -1);
    bump(s_.reserved_bytes, p, -static_cast<std::int64_t>(size));
    if (size >= oversize_) add_stat(s_.oversize_segments, -1);
  }
  // Expandable ranges: each maximal mapped run counts as one segment; `delta` runs appeared
  // (or, negative, disappeared). Mapped bytes are reserved bytes.
  void runs_changed(bool small, std::int64_t delta) { bump(s_.segment, stat_pool(small), delta); }
  void pages_mapped(bool small, std::size_t bytes) {
    bump(s_.reserved_bytes, stat_pool(small), static_cast<std::int64_t>(bytes));
  }
  void pages_unmapped(bool small, std::size_t bytes) {
    bump(s_.reserved_bytes, stat_pool(small), -static_cast<std::int64_t>(bytes));
  }

  // ---- upstream calls ----
  void upstream_time(std::int64_t ns) { s_.upstream_ns += ns; }
  void device_alloc() { ++s_.num_device_alloc; }
  void device_free() { ++s_.num_device_free; }
  void device_map() { ++s_.num_device_map; }
  void device_unmap() { ++s_.num_device_unmap; }
  void device_alias() { ++s_.num_device_alias; }  // counted besides its map

  // ---- the allocation path ----
  void cache_hit() { ++s_.cache_hits; }
  void cache_miss() { ++s_.cache_misses; }
  void alloc_retry() { ++s_.num_alloc_retries; }
  void oom() { ++s_.num_ooms; }
  void bad_free() { ++s_.bad_frees; }

  // ---- fences ----
  void fence_recorded() { ++s_.fences_recorded; }
  void fence_wait() { ++s_.fence_waits; }
  void gpu_wait() { ++s_.gpu_waits; }
  void sync_all_streams() { ++s_.num_sync_all_streams; }

  // ---- giving memory back ----
  void gc_pass(std::size_t freed) {
    ++s_.gc_passes;
    s_.gc_freed_bytes += static_cast<std::int64_t>(freed);
  }
  void empty_cache_call() { ++s_.empty_cache_calls; }

  // ---- whole-ledger operations (stats_ledger.cpp) ----
  // A thread cache's operations, replayed as if they ran back to back now; d is zeroed.
  void merge(StatsDelta& d);
  void reset_peaks();        // reset_peak_stats(): every peak = its current
  void reset_accumulated();  // reset_accumulated_stats(): sums and event counts to zero
  // The context is gone (abandon): every current goes to zero, counted as freed.
  void forget_all();

 private:
  std::size_t oversize_;
  Stats s_;
};

}  // namespace cudapool::detail
