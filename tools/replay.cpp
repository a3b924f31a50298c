#include "tools/replay.h"

#include "tools/metrics.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "allocator/pool.h"
#include "tools/row_sink.h"
#include "tools/sim_device.h"
#include "tools/units.h"

namespace cudapool::tools {

PreparedTrace prepare_trace(const std::vector<TraceRow>& rows, int device) {
  PreparedTrace out;
  out.ops.reserve(rows.size());
  TraceFacts& f = out.facts;
  f.rows = rows.size();
  if (device < 0) {  // the device with the most allocations
    std::map<int, std::size_t> per_device;
    for (const auto& r : rows)
      if (r.action == TraceAction::allocate) ++per_device[r.device];
    std::size_t best = 0;
    device = rows.empty() ? 0 : rows.front().device;
    for (auto [d, n] : per_device)
      if (n > best) best = n, device = d;
  }
  f.device = device;
  struct LiveAlloc {
    std::uint32_t slot;
    std::size_t size;
  };
  std::unordered_map<std::uintptr_t, LiveAlloc> live;  // trace pointer -> its allocation
  live.reserve(1024);
  std::unordered_set<std::uintptr_t> streams;
  std::unordered_set<std::uint64_t> threads;
  std::unordered_set<int> others;
  bool saw_segments = false;
  std::int64_t reserved = 0, peak_reserved = 0;
  std::size_t allocated = 0;
  bool first = true;
  for (const auto& r : rows) {
    // Process-wide rows, whatever their device column says.
    if (r.action == TraceAction::policy) continue;  // its text comes through TraceMeta
    // Pinned host memory is not the device pool's: a replay of device memory passes over it.
    if (r.action == TraceAction::pinned_allocate || r.action == TraceAction::pinned_free) continue;
    if (r.action == TraceAction::stream) {
      if (r.detail == TraceDetail::stream_non_blocking) {
        ++f.non_blocking_streams;
      } else {
        ++f.blocking_streams;
      }
      continue;
    }
    if (r.device != device) {
      others.insert(r.device);
      continue;
    }
    if (first) f.start_ns = r.time_ns, first = false;
    if (r.action == TraceAction::allocate || r.action == TraceAction::free) threads.insert(r.thread);
    if (r.duration_ns > 0 && (r.action == TraceAction::segment_alloc || r.action == TraceAction::segment_map))
      f.upstream_durations = true;
    f.end_ns = std::max(f.end_ns, r.time_ns);
    switch (r.action) {
      case TraceAction::allocate: {
        std::uint32_t slot = out.slots++;
        // A pointer allocated again without a free in between: the old allocation's free was
        // lost (e.g. a trace cut short); the newest allocation owns the pointer.
        live[r.ptr] = {slot, r.size};
        allocated += r.size;
        f.recorded_peak_allocated = std::max(f.recorded_peak_allocated, allocated);
        f.largest_allocation = std::max(f.largest_allocation, r.requested);
        out.ops.push_back({ReplayOp::allocate, slot, r.requested, r.stream, r.time_ns, TraceDetail::none, r.site});
        ++f.allocations;
        streams.insert(r.stream);
        break;
      }
      case TraceAction::free: {
        auto it = live.find(r.ptr);
        if (it == live.end()) {
          ++f.unmatched_frees;
          break;
        }
        allocated -= it->second.size;
        out.ops.push_back({ReplayOp::free, it->second.slot, 0, r.stream, r.time_ns, r.detail});
        if (r.detail == TraceDetail::free_sync)
          ++f.sync_frees;
        else if (r.detail == TraceDetail::free_async)
          ++f.async_frees;
        else
          ++f.unknown_frees;
        live.erase(it);
        ++f.frees;
        break;
      }
      case TraceAction::allocate_failure:
        out.ops.push_back({ReplayOp::failed_allocate, 0, r.requested ? r.requested : r.size, r.stream, r.time_ns});
        ++f.failed_allocations;
        break;
      case TraceAction::empty_cache:
        out.ops.push_back({ReplayOp::empty_cache, 0, 0, r.stream, r.time_ns});
        saw_segments = true;
        break;
      case TraceAction::segment_alloc:
      case TraceAction::segment_map:
        (r.action == TraceAction::segment_map ? f.expandable_rows : f.classic_rows) = true;
        saw_segments = true;
        reserved = add_bytes(reserved, r.size);
        peak_reserved = std::max(peak_reserved, reserved);
        break;
      case TraceAction::segment_free:
      case TraceAction::segment_unmap:
        saw_segments = true;
        reserved = sub_bytes(reserved, r.size);
        break;
      case TraceAction::device:
        if (!f.device_memory) f.device_memory = r.size;
        saw_segments = true;
        break;
      case TraceAction::oom:
      case TraceAction::gc:
      case TraceAction::fence_wait:
      case TraceAction::gpu_wait:
        saw_segments = true;  // the pool's own decisions: the replayed pool makes its own
        break;
      case TraceAction::policy:
      case TraceAction::stream:
      case TraceAction::pinned_allocate:
      case TraceAction::pinned_free: break;  // handled above
    }
  }
  f.streams = streams.size();
  f.threads = threads.size();
  f.other_devices.assign(others.begin(), others.end());
  std::sort(f.other_devices.begin(), f.other_devices.end());
  f.rmm_only = !saw_segments;
  if (saw_segments) f.recorded_peak_reserved = static_cast<std::size_t>(peak_reserved);
  return out;
}

namespace {

// Counts reserved and allocated bytes from the pool's events (forwarding them to the row sink,
// when rows are kept), so the replay can find its peak without asking the pool for its stats
// after every op.
class CountingSink : public EventSink {
 public:
  explicit CountingSink(EventSink* next) : next_(next) {}
  void on_event(const Event& e) override {
    if (next_ != nullptr && !stopped_) next_->on_event(e);
    const auto n = static_cast<std::int64_t>(e.size);
    switch (e.kind) {
      case EventKind::segment_alloc:
      case EventKind::segment_map: reserved += n; break;
      case EventKind::segment_free:
      case EventKind::segment_unmap: reserved -= n; break;
      case EventKind::allocate: allocated += n; break;
      case EventKind::free: allocated -= n; break;
      default: break;
    }
  }
  void stop_forwarding() { stopped_ = true; }
  std::int64_t reserved = 0, allocated = 0;

 private:
  EventSink* next_;
  bool stopped_ = false;
};

}  // namespace

std::size_t op_at_time(const PreparedTrace& trace, std::int64_t ns_since_start) {
  const std::int64_t t = trace.facts.start_ns + ns_since_start;
  std::size_t at = 0;
  for (std::size_t i = 0; i < trace.ops.size() && trace.ops[i].time_ns <= t; ++i) at = i;
  return at;
}

ReplayResult replay_trace(const PreparedTrace& trace, const ReplayConfig& config) {
  ReplayResult res;
  res.device_memory = config.device_memory ? *config.device_memory
                                           : trace.facts.device_memory.value_or(kUnknownDeviceMemory);
  SimUpstream upstream(res.device_memory,
                       config.granularity.value_or(trace.facts.granularity.value_or(kAssumedGranularity)));
  // The shim on a CUDA 12.5+ driver reuses memory freed with cudaFree as soon as its fence is
  // recorded, whatever the streams (FenceProvider::orders_for_free: no driver call where every
  // stream follows the legacy one, one cuCtxWaitEvent otherwise); so does the replay.
  SimFences fences(config.fence_latency_ns, true);
  std::int64_t now = trace.facts.start_ns;
  RowSink collector(&res.rows, &now);
  TraceClock clock(&now);
  std::vector<void*> slots(trace.slots, nullptr);
  std::vector<std::uint32_t> slot_sites;  // call site per slot, when the trace has any
  auto start = std::chrono::steady_clock::now();
  const bool counting = config.track_peak || config.snapshot_after_op;
  CountingSink counter(config.collect_rows ? &collector : nullptr);
  EventSink* sink = counting ? &counter : config.collect_rows ? static_cast<EventSink*>(&collector) : nullptr;
  std::int64_t best_reserved = -1, best_allocated = -1;
  {
    DevicePool pool(trace.facts.device, config.pool, upstream, fences, sink);
    std::uint64_t index = 0;
    for (const ReplayOp& op : trace.ops) {
      fences.advance(++index, op.time_ns);
      now = op.time_ns;
      switch (op.kind) {
        case ReplayOp::allocate: {
          const std::size_t before = res.rows.size();
          AllocResult a = pool.allocate(op.size, op.stream);
          if (a.status == AllocStatus::ok)
            slots[op.slot] = a.ptr;
          else
            ++res.failed_allocations;
          if (op.site != 0 && a.status == AllocStatus::ok) {
            if (slot_sites.empty()) slot_sites.resize(trace.slots, 0);
            slot_sites[op.slot] = op.site;
            // The collected allocate row is this allocation's: it gets the call site too.
            for (std::size_t i = res.rows.size(); i > before; --i)
              if (res.rows[i - 1].action == TraceAction::allocate &&
                  res.rows[i - 1].ptr == reinterpret_cast<std::uintptr_t>(a.ptr)) {
                res.rows[i - 1].site = op.site;
                break;
              }
          }
          break;
        }
        case ReplayOp::free: {
          void* p = slots[op.slot];
          if (!p) break;  // its allocation failed in this replay
          const bool sync = config.free_mode == FreeMode::sync ||
                            (config.free_mode == FreeMode::recorded && op.detail == TraceDetail::free_sync);
          FreeStatus s = sync ? pool.free(p) : pool.free_on_stream(p, op.stream);
          if (s != FreeStatus::ok) ++res.bad_frees;
          slots[op.slot] = nullptr;
          break;
        }
        case ReplayOp::failed_allocate: {
          // The program survived a refusal; if this policy can serve it, give it straight back.
          AllocResult a = pool.allocate(op.size, op.stream);
          if (a.status == AllocStatus::ok) {
            ++res.recorded_failures_served;
            pool.free_on_stream(a.ptr, op.stream);
          }
          break;
        }
        case ReplayOp::empty_cache: pool.empty_cache(); break;
      }
      const std::size_t done = static_cast<std::size_t>(index - 1);
      if (config.track_peak && (counter.reserved > best_reserved ||
                                (counter.reserved == best_reserved && counter.allocated > best_allocated))) {
        best_reserved = counter.reserved;
        best_allocated = counter.allocated;
        res.peak_op = done;
      }
      if (config.snapshot_after_op && *config.snapshot_after_op == done) {
        res.snapshot = pool.snapshot();
        for (std::size_t i = 0; i < slot_sites.size(); ++i)
          if (slot_sites[i] != 0 && slots[i] != nullptr)
            res.block_sites[reinterpret_cast<std::uintptr_t>(slots[i])] = slot_sites[i];
        counter.stop_forwarding();  // the rows end where the snapshot is taken
      }
    }
    res.stats = pool.stats();
    // The pool's own count (tools/metrics.h), the same a run under the library reports; the
    // simulated device's count of the calls it received must agree with it.
    res.upstream_calls = static_cast<std::uint64_t>(upstream_calls(res.stats));
    res.device_calls = upstream.calls();
    res.unit_ops = upstream.unit_ops();
    pool.set_event_sink(nullptr);  // the destructor's releases are not part of the program's run
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  res.ops = trace.ops.size();
  res.fences = fences.recorded();
  res.fence_waits = fences.waits();
  return res;
}

}  // namespace cudapool::tools
