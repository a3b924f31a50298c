// What `report` shows, computed from trace rows alone: memory over time, the segment map at the
// peak, the largest allocation sizes. A plain allocation log (no segment rows) is first replayed
// under a policy to obtain the pool's rows (see cmd_report.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "telemetry/trace.h"

namespace cudapool::tools {

struct TimePoint {
  std::int64_t t_ns;  // since the trace's first row
  std::int64_t allocated;
  std::int64_t reserved;
};

struct BlockView {
  std::uintptr_t offset;  // from the segment's base
  std::size_t size;
  std::size_t requested;
};

struct SegmentView {
  std::uintptr_t base;
  std::size_t size;
  bool expandable;                // made of segment_map rows
  std::vector<BlockView> blocks;  // live allocations in it, address order
};

struct SizeCount {
  std::size_t size;  // requested bytes
  std::size_t count;
};

// Where the allocated bytes first reach their peak, and what the upstream did from then on: in
// a program that repeats steps, the pool's segment calls after the peak are its churn in steady
// state, each one host time the program waits for.
struct PeakCause {
  bool found = false;                   // something was allocated
  std::int64_t t_ns = 0;                // since the trace's first row
  std::size_t size = 0, requested = 0;  // the allocation that reached the peak
  std::uintptr_t stream = 0;
  std::size_t live = 0;                  // live allocations at that moment, that one included
  std::vector<SizeCount> live_by_bytes;  // their requested sizes, most bytes first (at most 5)
  // From that moment to the trace's end: segment events and the time the upstream took for
  // them, as the rows say (a trace the shim recorded on a GPU: the driver's time).
  std::size_t later_segment_allocs = 0, later_segment_frees = 0;
  std::int64_t later_upstream_ns = 0;
  std::size_t later_fence_waits = 0;  // host waits on fences (fence_wait rows) in that span
  std::int64_t later_fence_wait_ns = 0;
  std::int64_t later_ns = 0;  // that span's length
};

struct TraceReport {
  int device = 0;
  std::vector<TimePoint> timeline;  // one point per row that changed allocated or reserved
  std::int64_t peak_allocated = 0, peak_reserved = 0;
  std::int64_t snapshot_t_ns = 0;  // when the segment map was taken
  std::int64_t snapshot_allocated = 0, snapshot_reserved = 0;
  std::vector<SegmentView> segments_at_peak;
  std::vector<SizeCount> largest_sizes;  // the largest distinct requested sizes, largest first
  std::size_t allocations = 0, frees = 0, segment_allocs = 0, segment_frees = 0;
  std::size_t ooms = 0, failed_allocations = 0, gc_passes = 0;
  std::size_t fence_waits = 0;     // the pool blocked the host on a fence (fence_wait rows)
  std::int64_t fence_wait_ns = 0;  // their time, as the rows say
  std::int64_t duration_ns = 0;
  PeakCause peak_cause;
};

// Rows of `device` only. The segment map is taken where reserved is at its peak; among those
// moments, the one with the most allocated (the fullest the pool ever was at its largest).
TraceReport analyze_rows(const std::vector<TraceRow>& rows, int device, std::size_t top_sizes = 20);

// Fragmentation at the peaks, as every command defines it (tools/metrics.h).
double peak_fragmentation(const TraceReport& r);
// The share of reserved that no allocation used at the segment map's moment (0 when none).
double unused_at_snapshot(const TraceReport& r);

// At most `max_points` points keeping each bucket's extremes, so a plot keeps its peaks.
std::vector<TimePoint> downsample(const std::vector<TimePoint>& points, std::size_t max_points);

}  // namespace cudapool::tools
