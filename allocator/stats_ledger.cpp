// The statistics ledger's whole-ledger operations (stats_ledger.h has the per-event ones).
#include "allocator/stats_ledger.h"

#include <algorithm>

#include "allocator/options.h"

namespace cudapool::detail {

namespace {

template <class F>
void for_each_counter(Stats& s, F f) {
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes, &s.reserved_bytes,
                       &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes})
    for (StatCounter& c : *a) f(c);
  f(s.oversize_allocations);
  f(s.oversize_segments);
}

// The delta's moves on top of the global counter: its peak is the global current plus the
// delta's highest running net.
void merge_array(StatArray& global, StatArray& delta) {
  for (std::size_t i = 0; i < global.size(); ++i) {
    StatCounter& g = global[i];
    StatCounter& t = delta[i];
    g.peak = std::max(g.peak, g.current + t.peak);
    g.current += t.current;
    g.allocated += t.allocated;
    g.freed += t.freed;
    t = StatCounter{};
  }
}

}  // namespace

StatsLedger::StatsLedger(std::size_t max_split_size) : oversize_(max_split_size) {
  s_.max_split_size = max_split_size == kNoLimit ? -1 : static_cast<std::int64_t>(max_split_size);
}

void StatsLedger::merge(StatsDelta& d) {
  merge_array(s_.allocation, d.allocation);
  merge_array(s_.allocated_bytes, d.allocated_bytes);
  merge_array(s_.active, d.active);
  merge_array(s_.active_bytes, d.active_bytes);
  merge_array(s_.requested_bytes, d.requested_bytes);
  merge_array(s_.inactive_split, d.inactive_split);
  merge_array(s_.inactive_split_bytes, d.inactive_split_bytes);
  s_.cache_hits += d.cache_hits;
  s_.pending_bytes += d.pending_bytes;
  s_.fences_recorded += d.fences_recorded;
  d.cache_hits = d.pending_bytes = d.fences_recorded = 0;
}

void StatsLedger::reset_peaks() {
  for_each_counter(s_, [](StatCounter& c) { c.peak = c.current; });
}

void StatsLedger::reset_accumulated() {
  Stats& s = s_;
  for_each_counter(s, [](StatCounter& c) { c.allocated = c.freed = 0; });
  s.num_alloc_retries = s.num_ooms = s.num_sync_all_streams = s.num_device_alloc = s.num_device_free = 0;
  s.num_device_map = s.num_device_unmap = s.num_device_alias = 0;
  s.cache_hits = s.cache_misses = s.upstream_ns = s.fences_recorded = s.fence_waits = s.gpu_waits = 0;
  s.gc_passes = s.gc_freed_bytes = s.empty_cache_calls = s.bad_frees = 0;
}

void StatsLedger::forget_all() {
  for_each_counter(s_, [](StatCounter& c) {
    if (c.current > 0) {
      c.freed += c.current;
      c.current = 0;
    }
  });
  s_.pending_bytes = 0;
}

}  // namespace cudapool::detail
