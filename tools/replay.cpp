#include "tools/replay.h"

#include "tools/metrics.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "allocator/pool.h"
#include "tools/row_sink.h"
#include "tools/sim_device.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

// The device with the most allocations (the first row's when none has any).
int busiest_device(const std::vector<TraceRow>& rows) {
  std::map<int, std::size_t> per_device;
  for (const auto& r : rows)
    if (r.action == TraceAction::allocate) ++per_device[r.device];
  std::size_t best = 0;
  int device = rows.empty() ? 0 : rows.front().device;
  for (auto [d, n] : per_device)
    if (n > best) best = n, device = d;
  return device;
}

// Turns one device's rows into replay ops, gathering the trace's facts on the way.
class Preparer {
 public:
  Preparer(std::size_t rows, int device) : device_(device) {
    out_.ops.reserve(rows);
    out_.facts.rows = rows;
    out_.facts.device = device;
    live_.reserve(1024);
  }

  void add(const TraceRow& r) {
    TraceFacts& f = out_.facts;
    // Process-wide rows, whatever their device column says.
    if (r.action == TraceAction::policy) return;  // its text comes through TraceMeta
    // Pinned host memory is not the device pool's: a replay of device memory passes over it.
    if (r.action == TraceAction::pinned_allocate || r.action == TraceAction::pinned_free) return;
    if (r.action == TraceAction::stream) {
      if (r.detail == TraceDetail::stream_non_blocking) {
        ++f.non_blocking_streams;
      } else {
        ++f.blocking_streams;
      }
      return;
    }
    if (r.device != device_) {
      others_.insert(r.device);
      return;
    }
    if (first_) f.start_ns = r.time_ns, first_ = false;
    if (r.action == TraceAction::allocate || r.action == TraceAction::free) threads_.insert(r.thread);
    if (r.duration_ns > 0 && (r.action == TraceAction::segment_alloc || r.action == TraceAction::segment_map))
      f.upstream_durations = true;
    f.end_ns = std::max(f.end_ns, r.time_ns);
    add_device_row(r);
  }

  PreparedTrace finish() {
    TraceFacts& f = out_.facts;
    f.streams = streams_.size();
    f.threads = threads_.size();
    f.other_devices.assign(others_.begin(), others_.end());
    std::sort(f.other_devices.begin(), f.other_devices.end());
    f.rmm_only = !saw_segments_;
    if (saw_segments_) f.recorded_peak_reserved = static_cast<std::size_t>(peak_reserved_);
    return std::move(out_);
  }

 private:
  struct LiveAlloc {
    std::uint32_t slot;
    std::size_t size;
  };

  void add_device_row(const TraceRow& r) {
    TraceFacts& f = out_.facts;
    switch (r.action) {
      case TraceAction::allocate: add_allocate(r); break;
      case TraceAction::free: add_free(r); break;
      case TraceAction::allocate_failure:
        out_.ops.push_back({ReplayOp::failed_allocate, 0, r.requested ? r.requested : r.size, r.stream, r.time_ns});
        ++f.failed_allocations;
        break;
      case TraceAction::empty_cache:
        out_.ops.push_back({ReplayOp::empty_cache, 0, 0, r.stream, r.time_ns});
        saw_segments_ = true;
        break;
      case TraceAction::segment_alloc:
      case TraceAction::segment_map:
        (r.action == TraceAction::segment_map ? f.expandable_rows : f.classic_rows) = true;
        saw_segments_ = true;
        reserved_ = add_bytes(reserved_, r.size);
        peak_reserved_ = std::max(peak_reserved_, reserved_);
        break;
      case TraceAction::segment_free:
      case TraceAction::segment_unmap:
        saw_segments_ = true;
        reserved_ = sub_bytes(reserved_, r.size);
        break;
      case TraceAction::device:
        if (!f.device_memory) f.device_memory = r.size;
        saw_segments_ = true;
        break;
      case TraceAction::oom:
      case TraceAction::gc:
      case TraceAction::fence_wait:
      case TraceAction::gpu_wait:
        saw_segments_ = true;  // the pool's own decisions: the replayed pool makes its own
        break;
      case TraceAction::policy:
      case TraceAction::stream:
      case TraceAction::pinned_allocate:
      case TraceAction::pinned_free: break;  // handled in add()
    }
  }

  void add_allocate(const TraceRow& r) {
    TraceFacts& f = out_.facts;
    std::uint32_t slot = out_.slots++;
    // A pointer allocated again without a free in between: the old allocation's free was
    // lost (e.g. a trace cut short); the newest allocation owns the pointer.
    live_[r.ptr] = {slot, r.size};
    allocated_ += r.size;
    f.recorded_peak_allocated = std::max(f.recorded_peak_allocated, allocated_);
    f.largest_allocation = std::max(f.largest_allocation, r.requested);
    out_.ops.push_back({ReplayOp::allocate, slot, r.requested, r.stream, r.time_ns, TraceDetail::none, r.site});
    ++f.allocations;
    streams_.insert(r.stream);
  }

  void add_free(const TraceRow& r) {
    TraceFacts& f = out_.facts;
    auto it = live_.find(r.ptr);
    if (it == live_.end()) {
      ++f.unmatched_frees;
      return;
    }
    allocated_ -= it->second.size;
    out_.ops.push_back({ReplayOp::free, it->second.slot, 0, r.stream, r.time_ns, r.detail});
    if (r.detail == TraceDetail::free_sync)
      ++f.sync_frees;
    else if (r.detail == TraceDetail::free_async)
      ++f.async_frees;
    else
      ++f.unknown_frees;
    live_.erase(it);
    ++f.frees;
  }

  PreparedTrace out_;
  int device_;
  std::unordered_map<std::uintptr_t, LiveAlloc> live_;  // trace pointer -> its allocation
  std::unordered_set<std::uintptr_t> streams_;
  std::unordered_set<std::uint64_t> threads_;
  std::unordered_set<int> others_;
  bool saw_segments_ = false;
  bool first_ = true;
  std::int64_t reserved_ = 0, peak_reserved_ = 0;
  std::size_t allocated_ = 0;
};

}  // namespace

PreparedTrace prepare_trace(const std::vector<TraceRow>& rows, int device) {
  if (device < 0) device = busiest_device(rows);
  Preparer preparer(rows.size(), device);
  for (const auto& r : rows) preparer.add(r);
  return preparer.finish();
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

// Runs replay ops on the pool: keeps each slot's pointer (and call site), the peak so far and the
// snapshot, into the result.
class OpRunner {
 public:
  OpRunner(const PreparedTrace& trace, const ReplayConfig& config, DevicePool& pool, CountingSink& counter,
           ReplayResult* res)
      : trace_(trace), config_(config), pool_(pool), counter_(counter), res_(*res), slots_(trace.slots, nullptr) {}

  void run(const ReplayOp& op) {
    switch (op.kind) {
      case ReplayOp::allocate: allocate_slot(op); break;
      case ReplayOp::free: free_slot(op); break;
      case ReplayOp::failed_allocate: {
        // The program survived a refusal; if this policy can serve it, give it straight back.
        AllocResult a = pool_.allocate(op.size, op.stream);
        if (a.status == AllocStatus::ok) {
          ++res_.recorded_failures_served;
          pool_.free_on_stream(a.ptr, op.stream);
        }
        break;
      }
      case ReplayOp::empty_cache: pool_.empty_cache(); break;
    }
  }

  // After the op of that index: the peak, and the snapshot when it is the one asked for.
  void after(std::size_t done) {
    if (config_.track_peak && (counter_.reserved > best_reserved_ ||
                               (counter_.reserved == best_reserved_ && counter_.allocated > best_allocated_))) {
      best_reserved_ = counter_.reserved;
      best_allocated_ = counter_.allocated;
      res_.peak_op = done;
    }
    if (config_.snapshot_after_op && *config_.snapshot_after_op == done) {
      res_.snapshot = pool_.snapshot();
      for (std::size_t i = 0; i < slot_sites_.size(); ++i)
        if (slot_sites_[i] != 0 && slots_[i] != nullptr)
          res_.block_sites[reinterpret_cast<std::uintptr_t>(slots_[i])] = slot_sites_[i];
      counter_.stop_forwarding();  // the rows end where the snapshot is taken
    }
  }

 private:
  void allocate_slot(const ReplayOp& op) {
    const std::size_t before = res_.rows.size();
    AllocResult a = pool_.allocate(op.size, op.stream);
    if (a.status == AllocStatus::ok)
      slots_[op.slot] = a.ptr;
    else
      ++res_.failed_allocations;
    if (op.site == 0 || a.status != AllocStatus::ok) return;
    if (slot_sites_.empty()) slot_sites_.resize(trace_.slots, 0);
    slot_sites_[op.slot] = op.site;
    // The collected allocate row is this allocation's: it gets the call site too.
    for (std::size_t i = res_.rows.size(); i > before; --i)
      if (res_.rows[i - 1].action == TraceAction::allocate &&
          res_.rows[i - 1].ptr == reinterpret_cast<std::uintptr_t>(a.ptr)) {
        res_.rows[i - 1].site = op.site;
        break;
      }
  }

  void free_slot(const ReplayOp& op) {
    void* p = slots_[op.slot];
    if (!p) return;  // its allocation failed in this replay
    const bool sync = config_.free_mode == FreeMode::sync ||
                      (config_.free_mode == FreeMode::recorded && op.detail == TraceDetail::free_sync);
    FreeStatus s = sync ? pool_.free(p) : pool_.free_on_stream(p, op.stream);
    if (s != FreeStatus::ok) ++res_.bad_frees;
    slots_[op.slot] = nullptr;
  }

  const PreparedTrace& trace_;
  const ReplayConfig& config_;
  DevicePool& pool_;
  CountingSink& counter_;
  ReplayResult& res_;
  std::vector<void*> slots_;
  std::vector<std::uint32_t> slot_sites_;  // call site per slot, when the trace has any
  std::int64_t best_reserved_ = -1, best_allocated_ = -1;
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
  auto start = std::chrono::steady_clock::now();
  const bool counting = config.track_peak || config.snapshot_after_op;
  CountingSink counter(config.collect_rows ? &collector : nullptr);
  EventSink* sink = counting ? &counter : config.collect_rows ? static_cast<EventSink*>(&collector) : nullptr;
  {
    DevicePool pool(trace.facts.device, config.pool, upstream, fences, sink);
    OpRunner runner(trace, config, pool, counter, &res);
    std::uint64_t index = 0;
    for (const ReplayOp& op : trace.ops) {
      fences.advance(++index, op.time_ns);
      now = op.time_ns;
      runner.run(op);
      runner.after(static_cast<std::size_t>(index - 1));
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
