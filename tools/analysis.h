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
  std::int64_t duration_ns = 0;
};

// Rows of `device` only. The segment map is taken where reserved is at its peak; among those
// moments, the one with the most allocated (the fullest the pool ever was at its largest).
TraceReport analyze_rows(const std::vector<TraceRow>& rows, int device, std::size_t top_sizes = 20);

// At most `max_points` points keeping each bucket's extremes, so a plot keeps its peaks.
std::vector<TimePoint> downsample(const std::vector<TimePoint>& points, std::size_t max_points);

}  // namespace cudapool::tools
