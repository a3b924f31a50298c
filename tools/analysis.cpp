#include "tools/analysis.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "tools/units.h"

namespace cudapool::tools {

namespace {

struct Live {
  std::size_t size, requested;
};

// Segments as address ranges; segment_unmap may return part of a mapped range.
class SegmentSet {
 public:
  void add(std::uintptr_t base, std::size_t size, bool expandable) { ranges_[base] = {size, expandable}; }
  void remove(std::uintptr_t base, std::size_t size) {
    std::uintptr_t end = base + size;
    auto it = ranges_.upper_bound(base);
    if (it != ranges_.begin()) --it;
    while (it != ranges_.end() && it->first < end) {
      std::uintptr_t rb = it->first, re = rb + it->second.size;
      bool exp = it->second.expandable;
      if (re <= base) {
        ++it;
        continue;
      }
      it = ranges_.erase(it);
      if (rb < base) ranges_[rb] = {base - rb, exp};
      if (re > end) ranges_[end] = {re - end, exp};
    }
  }
  struct Range {
    std::size_t size;
    bool expandable;
  };
  const std::map<std::uintptr_t, Range>& ranges() const { return ranges_; }

 private:
  std::map<std::uintptr_t, Range> ranges_;
};

}  // namespace

TraceReport analyze_rows(const std::vector<TraceRow>& rows, int device, std::size_t top_sizes) {
  TraceReport rep;
  rep.device = device;
  std::int64_t start = -1, allocated = 0, reserved = 0;
  std::unordered_map<std::uintptr_t, Live> live;
  std::map<std::size_t, std::size_t> sizes;
  // Where allocated first reached its peak (a row index), and the segment figures then.
  std::size_t peak_row = rows.size();
  std::size_t allocs_then = 0, frees_then = 0;
  std::int64_t upstream_ns = 0, upstream_then = 0;
  std::size_t waits_then = 0;
  std::int64_t wait_ns_then = 0;
  // Pass 1: the timeline and the peaks.
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const TraceRow& r = rows[i];
    if (r.device != device) continue;
    if (start < 0) start = r.time_ns;
    std::int64_t before_a = allocated, before_r = reserved;
    switch (r.action) {
      case TraceAction::allocate:
        live[r.ptr] = {r.size, r.requested};
        allocated = add_bytes(allocated, r.size);
        ++sizes[r.requested];
        ++rep.allocations;
        break;
      case TraceAction::free:
        if (auto it = live.find(r.ptr); it != live.end()) {
          allocated = sub_bytes(allocated, it->second.size);
          live.erase(it);
        }
        ++rep.frees;
        break;
      case TraceAction::segment_alloc:
      case TraceAction::segment_map:
        reserved = add_bytes(reserved, r.size);
        ++rep.segment_allocs;
        upstream_ns = add_bytes(upstream_ns, static_cast<std::size_t>(std::max<std::int64_t>(r.duration_ns, 0)));
        break;
      case TraceAction::segment_free:
      case TraceAction::segment_unmap:
        reserved = sub_bytes(reserved, r.size);
        ++rep.segment_frees;
        upstream_ns = add_bytes(upstream_ns, static_cast<std::size_t>(std::max<std::int64_t>(r.duration_ns, 0)));
        break;
      case TraceAction::fence_wait:
        ++rep.fence_waits;
        rep.fence_wait_ns = add_bytes(rep.fence_wait_ns,
                                      static_cast<std::size_t>(std::max<std::int64_t>(r.duration_ns, 0)));
        break;
      case TraceAction::oom: ++rep.ooms; break;
      case TraceAction::allocate_failure: ++rep.failed_allocations; break;
      case TraceAction::gc: ++rep.gc_passes; break;
      default: break;
    }
    rep.duration_ns = r.time_ns - start;
    if (allocated != before_a || reserved != before_r) rep.timeline.push_back({r.time_ns - start, allocated, reserved});
    if (allocated > rep.peak_allocated) {
      peak_row = i;
      rep.peak_cause.t_ns = r.time_ns - start;
      allocs_then = rep.segment_allocs;
      frees_then = rep.segment_frees;
      upstream_then = upstream_ns;
      waits_then = rep.fence_waits;
      wait_ns_then = rep.fence_wait_ns;
    }
    rep.peak_allocated = std::max(rep.peak_allocated, allocated);
    rep.peak_reserved = std::max(rep.peak_reserved, reserved);
  }
  for (auto it = sizes.rbegin(); it != sizes.rend() && rep.largest_sizes.size() < top_sizes; ++it)
    rep.largest_sizes.push_back({it->first, it->second});
  if (peak_row < rows.size()) {
    PeakCause& pc = rep.peak_cause;
    pc.found = true;
    pc.size = rows[peak_row].size;
    pc.requested = rows[peak_row].requested;
    pc.stream = rows[peak_row].stream;
    pc.later_segment_allocs = rep.segment_allocs - allocs_then;
    pc.later_segment_frees = rep.segment_frees - frees_then;
    pc.later_upstream_ns = upstream_ns - upstream_then;
    pc.later_fence_waits = rep.fence_waits - waits_then;
    pc.later_fence_wait_ns = rep.fence_wait_ns - wait_ns_then;
    if (__builtin_sub_overflow(rep.duration_ns, pc.t_ns, &pc.later_ns) || pc.later_ns < 0) pc.later_ns = 0;
    // What was live then, by requested size (a replay of the rows up to that one).
    std::unordered_map<std::uintptr_t, std::size_t> held;  // pointer -> requested
    for (std::size_t i = 0; i <= peak_row; ++i) {
      const TraceRow& r = rows[i];
      if (r.device != device) continue;
      if (r.action == TraceAction::allocate) held[r.ptr] = r.requested;
      if (r.action == TraceAction::free) held.erase(r.ptr);
    }
    std::map<std::size_t, std::size_t> by_size;
    for (const auto& [ptr, req] : held) ++by_size[req];
    std::vector<SizeCount> v;
    v.reserve(by_size.size());
    for (const auto& [size, n] : by_size) v.push_back({size, n});
    auto bytes = [](const SizeCount& c) {
      return static_cast<long double>(c.size) * static_cast<long double>(c.count);
    };
    std::sort(v.begin(), v.end(), [&](const SizeCount& a, const SizeCount& b) {
      return bytes(a) != bytes(b) ? bytes(a) > bytes(b) : a.size > b.size;
    });
    if (v.size() > 5) v.resize(5);
    pc.live = held.size();
    pc.live_by_bytes = std::move(v);
  }

  // The moment for the segment map: reserved at its peak, allocated highest among those.
  std::size_t snap = 0;
  bool found = false;
  for (std::size_t i = 0; i < rep.timeline.size(); ++i) {
    const auto& p = rep.timeline[i];
    if (p.reserved == rep.peak_reserved && (!found || p.allocated > rep.timeline[snap].allocated)) {
      snap = i;
      found = true;
    }
  }
  if (!found) return rep;  // nothing reserved (a plain log not replayed): no map to draw
  rep.snapshot_t_ns = rep.timeline[snap].t_ns;
  rep.snapshot_allocated = rep.timeline[snap].allocated;
  rep.snapshot_reserved = rep.timeline[snap].reserved;

  // Pass 2: rebuild the state up to that point (the snap-th changing row).
  live.clear();
  SegmentSet segs;
  std::size_t changes = 0;
  allocated = reserved = 0;
  for (const auto& r : rows) {
    if (r.device != device) continue;
    std::int64_t before_a = allocated, before_r = reserved;
    switch (r.action) {
      case TraceAction::allocate:
        live[r.ptr] = {r.size, r.requested};
        allocated = add_bytes(allocated, r.size);
        break;
      case TraceAction::free:
        if (auto it = live.find(r.ptr); it != live.end()) {
          allocated = sub_bytes(allocated, it->second.size);
          live.erase(it);
        }
        break;
      case TraceAction::segment_alloc:
        segs.add(r.ptr, r.size, false);
        reserved = add_bytes(reserved, r.size);
        break;
      case TraceAction::segment_map:
        segs.add(r.ptr, r.size, true);
        reserved = add_bytes(reserved, r.size);
        break;
      case TraceAction::segment_free:
      case TraceAction::segment_unmap:
        segs.remove(r.ptr, r.size);
        reserved = sub_bytes(reserved, r.size);
        break;
      default: break;
    }
    if (allocated != before_a || reserved != before_r) {
      if (changes == snap) break;
      ++changes;
    }
  }
  // Expandable pages mapped back to back are one segment to the reader.
  for (const auto& [base, range] : segs.ranges()) {
    auto& v = rep.segments_at_peak;
    if (range.expandable && !v.empty() && v.back().expandable && v.back().base + v.back().size == base)
      v.back().size += range.size;
    else
      v.push_back({base, range.size, range.expandable, {}});
  }
  std::vector<std::pair<std::uintptr_t, Live>> blocks(live.begin(), live.end());
  std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  auto& v = rep.segments_at_peak;
  std::size_t s = 0;
  for (const auto& [ptr, l] : blocks) {
    while (s < v.size() && v[s].base + v[s].size <= ptr) ++s;
    if (s == v.size()) break;
    if (ptr >= v[s].base) v[s].blocks.push_back({ptr - v[s].base, l.size, l.requested});
  }
  return rep;
}

std::vector<TimePoint> downsample(const std::vector<TimePoint>& points, std::size_t max_points) {
  if (points.size() <= max_points || max_points < 4) return points;
  std::vector<TimePoint> out;
  std::size_t buckets = max_points / 2;
  std::size_t per = (points.size() + buckets - 1) / buckets;
  for (std::size_t b = 0; b < points.size(); b += per) {
    std::size_t e = std::min(points.size(), b + per);
    // Keep the bucket's highest-reserved and highest-allocated points, in time order.
    std::size_t hr = b, ha = b;
    for (std::size_t i = b; i < e; ++i) {
      if (points[i].reserved > points[hr].reserved) hr = i;
      if (points[i].allocated > points[ha].allocated) ha = i;
    }
    out.push_back(points[std::min(hr, ha)]);
    if (hr != ha) out.push_back(points[std::max(hr, ha)]);
  }
  if (out.back().t_ns != points.back().t_ns) out.push_back(points.back());
  return out;
}

}  // namespace cudapool::tools
