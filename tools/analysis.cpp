#include "tools/analysis.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "tools/metrics.h"
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

using LiveMap = std::unordered_map<std::uintptr_t, Live>;

std::size_t row_duration(const TraceRow& r) {
  return static_cast<std::size_t>(std::max<std::int64_t>(r.duration_ns, 0));
}

// Pass 1's running figures: allocated and reserved bytes, the live allocations, the requested
// sizes seen, the upstream's time so far.
struct Running {
  std::int64_t start = -1, allocated = 0, reserved = 0, upstream_ns = 0;
  LiveMap live;
  std::map<std::size_t, std::size_t> sizes;
};

// Where allocated first reached its peak (a row index), and the segment figures then.
struct PeakMark {
  std::size_t row;
  std::size_t allocs = 0, frees = 0, waits = 0;
  std::int64_t upstream_ns = 0, wait_ns = 0;
};

// One row's effect on the running figures and the report's counts.
void count_row(const TraceRow& r, Running* run, TraceReport* rep) {
  switch (r.action) {
    case TraceAction::allocate:
      run->live[r.ptr] = {r.size, r.requested};
      run->allocated = add_bytes(run->allocated, r.size);
      ++run->sizes[r.requested];
      ++rep->allocations;
      break;
    case TraceAction::free:
      if (auto it = run->live.find(r.ptr); it != run->live.end()) {
        run->allocated = sub_bytes(run->allocated, it->second.size);
        run->live.erase(it);
      }
      ++rep->frees;
      break;
    case TraceAction::segment_alloc:
    case TraceAction::segment_map:
      run->reserved = add_bytes(run->reserved, r.size);
      ++rep->segment_allocs;
      run->upstream_ns = add_bytes(run->upstream_ns, row_duration(r));
      break;
    case TraceAction::segment_free:
    case TraceAction::segment_unmap:
      run->reserved = sub_bytes(run->reserved, r.size);
      ++rep->segment_frees;
      run->upstream_ns = add_bytes(run->upstream_ns, row_duration(r));
      break;
    case TraceAction::fence_wait:
      ++rep->fence_waits;
      rep->fence_wait_ns = add_bytes(rep->fence_wait_ns, row_duration(r));
      break;
    case TraceAction::oom: ++rep->ooms; break;
    case TraceAction::allocate_failure: ++rep->failed_allocations; break;
    case TraceAction::gc: ++rep->gc_passes; break;
    default: break;
  }
}

// Pass 1: the timeline, the counts and the peaks; where allocated first peaked.
PeakMark timeline_pass(const std::vector<TraceRow>& rows, int device, Running* run, TraceReport* rep) {
  PeakMark mark{rows.size()};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const TraceRow& r = rows[i];
    if (r.device != device) continue;
    if (run->start < 0) run->start = r.time_ns;
    std::int64_t before_a = run->allocated, before_r = run->reserved;
    count_row(r, run, rep);
    rep->duration_ns = r.time_ns - run->start;
    if (run->allocated != before_a || run->reserved != before_r)
      rep->timeline.push_back({r.time_ns - run->start, run->allocated, run->reserved});
    if (run->allocated > rep->peak_allocated) {
      mark = {i, rep->segment_allocs, rep->segment_frees, rep->fence_waits, run->upstream_ns, rep->fence_wait_ns};
      rep->peak_cause.t_ns = r.time_ns - run->start;
    }
    rep->peak_allocated = std::max(rep->peak_allocated, run->allocated);
    rep->peak_reserved = std::max(rep->peak_reserved, run->reserved);
  }
  return mark;
}

// What was live after row `last`, by requested size (a replay of the rows up to that one): the
// count, and the five sizes holding the most bytes.
void live_at(const std::vector<TraceRow>& rows, int device, std::size_t last, PeakCause* pc) {
  std::unordered_map<std::uintptr_t, std::size_t> held;  // pointer -> requested
  for (std::size_t i = 0; i <= last; ++i) {
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
  auto bytes = [](const SizeCount& c) { return static_cast<long double>(c.size) * static_cast<long double>(c.count); };
  std::sort(v.begin(), v.end(), [&](const SizeCount& a, const SizeCount& b) {
    return bytes(a) != bytes(b) ? bytes(a) > bytes(b) : a.size > b.size;
  });
  if (v.size() > 5) v.resize(5);
  pc->live = held.size();
  pc->live_by_bytes = std::move(v);
}

// The allocation that reached the peak, and what the upstream did from then to the end.
void describe_peak_cause(const std::vector<TraceRow>& rows, int device, const PeakMark& mark, std::int64_t upstream_ns,
                         TraceReport* rep) {
  PeakCause& pc = rep->peak_cause;
  pc.found = true;
  pc.size = rows[mark.row].size;
  pc.requested = rows[mark.row].requested;
  pc.stream = rows[mark.row].stream;
  pc.later_segment_allocs = rep->segment_allocs - mark.allocs;
  pc.later_segment_frees = rep->segment_frees - mark.frees;
  pc.later_upstream_ns = upstream_ns - mark.upstream_ns;
  pc.later_fence_waits = rep->fence_waits - mark.waits;
  pc.later_fence_wait_ns = rep->fence_wait_ns - mark.wait_ns;
  if (__builtin_sub_overflow(rep->duration_ns, pc.t_ns, &pc.later_ns) || pc.later_ns < 0) pc.later_ns = 0;
  live_at(rows, device, mark.row, &pc);
}

// The moment for the segment map: reserved at its peak, allocated highest among those (an index
// of the timeline); false when nothing was reserved.
bool snapshot_point(const TraceReport& rep, std::size_t* snap) {
  bool found = false;
  for (std::size_t i = 0; i < rep.timeline.size(); ++i) {
    const auto& p = rep.timeline[i];
    if (p.reserved == rep.peak_reserved && (!found || p.allocated > rep.timeline[*snap].allocated)) {
      *snap = i;
      found = true;
    }
  }
  return found;
}

// One row's effect on the live allocations and the segments.
void map_row(const TraceRow& r, LiveMap* live, SegmentSet* segs, std::int64_t* allocated, std::int64_t* reserved) {
  switch (r.action) {
    case TraceAction::allocate:
      (*live)[r.ptr] = {r.size, r.requested};
      *allocated = add_bytes(*allocated, r.size);
      break;
    case TraceAction::free:
      if (auto it = live->find(r.ptr); it != live->end()) {
        *allocated = sub_bytes(*allocated, it->second.size);
        live->erase(it);
      }
      break;
    case TraceAction::segment_alloc:
      segs->add(r.ptr, r.size, false);
      *reserved = add_bytes(*reserved, r.size);
      break;
    case TraceAction::segment_map:
      segs->add(r.ptr, r.size, true);
      *reserved = add_bytes(*reserved, r.size);
      break;
    case TraceAction::segment_free:
    case TraceAction::segment_unmap:
      segs->remove(r.ptr, r.size);
      *reserved = sub_bytes(*reserved, r.size);
      break;
    default: break;
  }
}

// Pass 2: the live allocations and segments up to the snap-th row that changed either.
void rebuild_until(const std::vector<TraceRow>& rows, int device, std::size_t snap, LiveMap* live, SegmentSet* segs) {
  std::size_t changes = 0;
  std::int64_t allocated = 0, reserved = 0;
  for (const auto& r : rows) {
    if (r.device != device) continue;
    std::int64_t before_a = allocated, before_r = reserved;
    map_row(r, live, segs, &allocated, &reserved);
    if (allocated != before_a || reserved != before_r) {
      if (changes == snap) break;
      ++changes;
    }
  }
}

// The segments (expandable pages mapped back to back are one segment to the reader), each with
// the live allocations in it.
void fill_segments(const SegmentSet& segs, const LiveMap& live, std::vector<SegmentView>* v) {
  for (const auto& [base, range] : segs.ranges()) {
    if (range.expandable && !v->empty() && v->back().expandable && v->back().base + v->back().size == base)
      v->back().size += range.size;
    else
      v->push_back({base, range.size, range.expandable, {}});
  }
  std::vector<std::pair<std::uintptr_t, Live>> blocks(live.begin(), live.end());
  std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::size_t s = 0;
  for (const auto& [ptr, l] : blocks) {
    while (s < v->size() && (*v)[s].base + (*v)[s].size <= ptr) ++s;
    if (s == v->size()) break;
    if (ptr >= (*v)[s].base) (*v)[s].blocks.push_back({ptr - (*v)[s].base, l.size, l.requested});
  }
}

}  // namespace

TraceReport analyze_rows(const std::vector<TraceRow>& rows, int device, std::size_t top_sizes) {
  TraceReport rep;
  rep.device = device;
  Running run;
  const PeakMark mark = timeline_pass(rows, device, &run, &rep);
  for (auto it = run.sizes.rbegin(); it != run.sizes.rend() && rep.largest_sizes.size() < top_sizes; ++it)
    rep.largest_sizes.push_back({it->first, it->second});
  if (mark.row < rows.size()) describe_peak_cause(rows, device, mark, run.upstream_ns, &rep);
  std::size_t snap = 0;
  if (!snapshot_point(rep, &snap)) return rep;  // nothing reserved (a plain log not replayed): no map to draw
  rep.snapshot_t_ns = rep.timeline[snap].t_ns;
  rep.snapshot_allocated = rep.timeline[snap].allocated;
  rep.snapshot_reserved = rep.timeline[snap].reserved;
  LiveMap live;
  SegmentSet segs;
  rebuild_until(rows, device, snap, &live, &segs);
  fill_segments(segs, live, &rep.segments_at_peak);
  return rep;
}

double peak_fragmentation(const TraceReport& r) {
  return fragmentation(static_cast<double>(r.peak_allocated), static_cast<double>(r.peak_reserved));
}

double unused_at_snapshot(const TraceReport& r) {
  return r.snapshot_reserved > 0
             ? 1.0 - static_cast<double>(r.snapshot_allocated) / static_cast<double>(r.snapshot_reserved)
             : 0;
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
