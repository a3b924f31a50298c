#include "shim/cuda_fences.h"

#include <algorithm>

#include "allocator/pool_clock.h"
#include "shim/cuda_upstream.h"
#include "shim/log.h"
#include "shim/streams.h"

namespace cudapool::shim {

namespace {
FenceHandle handle_of(void* f) { return reinterpret_cast<FenceHandle>(f); }
// The pool's clock (allocator/pool_clock.h): the sweep gap and the newest fence's recheck are
// back-offs as the pool's own are, timed by the same clock, which a test can drive.
std::int64_t clock_ns() { return cudapool::detail::pool_clock_ns(); }
// The context the calling thread's hook has verified as current (ContextGuard), or nullptr.
thread_local CUcontext tl_known_current = nullptr;
}  // namespace

template <class F>
auto CudaFences::in_context_locked(F&& f) {
  if (tl_known_current == ctx_) return f();  // the hook already read the current context
  n_ctx_.add();
  ScopedContext scope(d_, ctx_);
  return f();
}

CudaFences::ContextGuard::ContextGuard(CUcontext ctx) noexcept : prev_(tl_known_current) { tl_known_current = ctx; }
CudaFences::ContextGuard::~ContextGuard() { tl_known_current = prev_; }

void CudaFences::record_now_locked(Fence* f) {
  in_context_locked([&] { record_locked(f); });
}

CudaFences::CallCounts CudaFences::call_counts() const noexcept {
  CallCounts c;
  c.event_record = n_record_.get();
  c.event_query = n_query_.get();
  c.event_sync = n_sync_.get();
  c.stream_wait = n_wait_.get();
  c.context_switch = n_ctx_.get();
  c.stream_query = n_stream_query_.get();
  c.sweeps = n_sweeps_.get();
  c.non_blocking_streams = n_non_blocking_.get();
  c.context_record = n_context_record_.get();
  c.context_wait = n_context_wait_.get();
  return c;
}

CudaFences::Fence* CudaFences::new_fence_locked() {
  Fence* f;
  if (!free_fences_.empty()) {
    f = free_fences_.back();
    free_fences_.pop_back();
  } else {
    f = new Fence;
  }
  f->events.clear();
  f->on.clear();
  f->deferred = f->done = f->events_done = f->context_wide = false;
  f->generation = generation_;
  f->seq = 0;
  f->cover = 0;
  return f;
}

CUevent CudaFences::take_event_locked() {
  if (!free_events_.empty()) {
    CUevent e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  if (d_.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return e;
}

bool CudaFences::record_on_locked(Fence* f, CUstream s) {
  CUevent e = take_event_locked();
  if (e == nullptr) return false;
  n_record_.add();
  if (d_.cuEventRecord(e, s) != CUDA_SUCCESS) {
    free_events_.push_back(e);
    return false;
  }
  f->events.push_back(e);
  f->on.push_back(s);
  return true;
}

bool CudaFences::record_context_locked(Fence* f) {
  if (!context_events_) return false;
  if (d_.cuCtxRecordEvent == nullptr || d_.cuCtxWaitEvent == nullptr) {
    context_events_ = false;
    return false;
  }
  // Needed only where it replaces sweeps, or after a context-wide fence that may still run.
  if (non_blocking_.empty() && last_context_seq_ <= completed_all_seq_) return false;
  CUevent e = take_event_locked();
  if (e == nullptr) return false;
  if (!context_wide_begin()) {  // a capture began once in this process: never again
    free_events_.push_back(e);
    return false;
  }
  n_context_record_.add();
  const CUresult r = d_.cuCtxRecordEvent(ctx_, e);
  context_wide_end();
  if (r != CUDA_SUCCESS) {
    free_events_.push_back(e);
    context_events_ = false;
    log_info("cuCtxRecordEvent refused (CUresult {}): device fences use legacy-stream events and sweeps",
             static_cast<int>(r));
    return false;
  }
  f->events.push_back(e);
  f->on.push_back(nullptr);  // no stream: the whole context
  f->context_wide = true;
  f->seq = next_seq_++;
  last_context_seq_ = f->seq;
  newest_ = f;
  return true;
}

bool CudaFences::wait_context_locked(const Fence* f) {
  if (!context_wide_begin()) return false;
  n_context_wait_.add();
  const CUresult r = d_.cuCtxWaitEvent(ctx_, f->events.front());
  context_wide_end();
  return r == CUDA_SUCCESS;
}

void CudaFences::record_locked(Fence* f) {
  if (!f->device) {
    record_on_locked(f, stream_handle(f->stream));
    return;
  }
  if (record_context_locked(f)) return;
  if (record_on_locked(f, CU_STREAM_LEGACY)) {
    f->seq = next_seq_++;
    newest_ = f;
  } else {
    log_warn(
        "could not record a fence on the legacy stream; freed memory is reused only "
        "after the sweeps of the other streams");
  }
  // The non-blocking streams are not asked now: the next sweep begun from here on covers them.
  if (!non_blocking_.empty()) {
    f->cover = sweep_started_ + 1;
    cover_wanted_ = std::max(cover_wanted_, f->cover);
  }
}

bool CudaFences::gather_stream_locked() {
  if (gather_ != nullptr) return true;
  if (gather_failed_ || d_.cuStreamCreate == nullptr || d_.cuStreamWaitEvent == nullptr) return false;
  // The driver's own call, not the hook: the pool's stream is no program stream to track.
  if (d_.cuStreamCreate(&gather_, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    gather_ = nullptr;
    gather_failed_ = true;
    log_warn("could not create the fence stream; sweeps ask each non-blocking stream instead");
    return false;
  }
  return true;
}

void CudaFences::sweep_by_gathering_locked() {
  bool gathered = false;
  for (CUstream s : non_blocking_) {
    CUevent e = take_event_locked();
    if (e == nullptr) {  // nothing marks this stream's work: the sweep cannot finish
      sweep_events_.push_back({nullptr, s});
      continue;
    }
    n_record_.add();
    if (d_.cuEventRecord(e, s) != CUDA_SUCCESS) {
      free_events_.push_back(e);
      // Then asked, as a sweep that asks would: any answer but "not ready" (a stream the driver
      // no longer knows) leaves nothing running there; else nothing marks its work.
      bool running = true;
      if (d_.cuStreamQuery != nullptr) {
        n_stream_query_.add();
        running = d_.cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
      }
      if (running) sweep_events_.push_back({nullptr, s});
      continue;
    }
    n_wait_.add();
    if (d_.cuStreamWaitEvent(gather_, e, 0) != CUDA_SUCCESS) {
      sweep_events_.push_back({e, s});  // asked on its own
      continue;
    }
    // The wait took the work the event marks now; recording the event again does not change it.
    free_events_.push_back(e);
    gathered = true;
  }
  if (!gathered) return;
  CUevent g = take_event_locked();
  if (g != nullptr) {
    n_record_.add();
    if (d_.cuEventRecord(g, gather_) == CUDA_SUCCESS) {
      sweep_events_.push_back({g, gather_});
      return;
    }
    free_events_.push_back(g);
  }
  sweep_events_.push_back({nullptr, gather_});  // the gathered waits are marked by nothing
}

void CudaFences::sweep_by_queries_locked() {
  for (CUstream s : non_blocking_) {
    if (d_.cuStreamQuery != nullptr) {
      n_stream_query_.add();
      // Idle: everything ever issued on it has finished. Any other answer than "not ready" is
      // an error that leaves nothing running there either.
      if (d_.cuStreamQuery(s) != CUDA_ERROR_NOT_READY) continue;
    }
    CUevent e = take_event_locked();
    if (e == nullptr) {
      // No event to mark the stream's work with: the sweep stays unfinished until a later one
      // gets its events.
      sweep_events_.push_back({nullptr, s});
      continue;
    }
    n_record_.add();
    if (d_.cuEventRecord(e, s) != CUDA_SUCCESS) {
      free_events_.push_back(e);
      sweep_events_.push_back({nullptr, s});
      continue;
    }
    sweep_events_.push_back({e, s});
  }
}

void CudaFences::begin_sweep_locked() {
  auto sweep = [&] {
    // A newer sweep covers everything an older one did: the older one's events are not needed.
    for (const SweepEvent& se : sweep_events_)
      if (se.event != nullptr) free_events_.push_back(se.event);
    sweep_events_.clear();
    ++sweep_started_;
    n_sweeps_.add();
    last_sweep_ns_ = clock_ns();
    if (!non_blocking_.empty()) {
      if (gather_stream_locked())
        sweep_by_gathering_locked();
      else
        sweep_by_queries_locked();
    }
    if (sweep_events_.empty()) sweep_done_ = sweep_started_;
  };
  in_context_locked(sweep);
}

bool CudaFences::sweep_finished_locked() {
  while (!sweep_events_.empty()) {
    const SweepEvent& se = sweep_events_.back();
    if (se.event == nullptr) return false;
    n_query_.add();
    if (d_.cuEventQuery(se.event) == CUDA_ERROR_NOT_READY) return false;
    free_events_.push_back(se.event);
    sweep_events_.pop_back();
  }
  sweep_done_ = sweep_started_;
  return true;
}

bool CudaFences::covered_locked(const Fence* f, std::int64_t gap_ns) {
  if (f->cover <= sweep_done_) return true;
  if (f->cover <= sweep_started_) {  // the sweep in flight covers it
    if (sweep_finished_locked()) return true;
    const bool marked = std::none_of(sweep_events_.begin(), sweep_events_.end(),
                                     [](const SweepEvent& se) { return se.event == nullptr; });
    if (marked) return false;  // still running; it finishes by itself
    // A busy stream got no event (none could be created or recorded): only a new sweep helps.
  }
  // No sweep begun since the fence: begin one, unless one began less than kSweepGapNs ago (a
  // sweep asks every non-blocking stream; a burst of fences shares one) or a capture is open (a
  // record on a capturing stream would join its graph).
  if (gap_ns > 0 && clock_ns() - last_sweep_ns_ < gap_ns) return false;
  if (any_capture_active()) return false;
  begin_sweep_locked();
  return sweep_finished_locked();
}

bool CudaFences::events_complete_locked(Fence* f) {
  if (f->events_done) return true;
  // A newer device fence that covers what this one does was seen complete: this one is too (see
  // the header), no driver call.
  if (known_complete_locked(f)) return f->events_done = true;
  const bool newest_asked_lately = newest_ != nullptr && newest_->seq == newest_running_seq_ &&
                                   clock_ns() - newest_running_ns_ < kNewestRecheckNs;
  if (f == newest_ && newest_asked_lately) return false;  // found running just now
  // Several device fences outstanding (the pool asks oldest first): ask the newest once; if it
  // completed, this one and every one in between are answered without further driver calls. Not
  // again while it was found running less than kNewestRecheckNs ago (a poll asking several
  // fences in a row would otherwise pay that query once for each).
  if (f->seq != 0 && newest_ != nullptr && newest_ != f && !newest_->events_done && newest_->seq > f->seq &&
      (newest_->context_wide || !f->context_wide)) {
    if (!newest_asked_lately) {
      if (query_events_locked(newest_)) return f->events_done = true;
      newest_running_seq_ = newest_->seq;
      newest_running_ns_ = clock_ns();
    }
  }
  return query_events_locked(f);
}

FenceHandle CudaFences::record_device() {
  std::lock_guard<std::mutex> lock(mu_);
  Fence* f = new_fence_locked();
  f->device = true;
  if (any_capture_active()) {
    f->deferred = true;
  } else {
    record_now_locked(f);
  }
  return handle_of(f);
}

FenceHandle CudaFences::record_stream(StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Fence* f = new_fence_locked();
  f->device = false;
  f->stream = stream;
  if (any_capture_active()) {
    f->deferred = true;
  } else {
    record_now_locked(f);
  }
  return handle_of(f);
}

bool CudaFences::query(FenceHandle fence) {
  std::lock_guard<std::mutex> lock(mu_);
  return query_locked(reinterpret_cast<Fence*>(fence), kSweepGapNs);
}

bool CudaFences::query_urgent(FenceHandle fence) {
  std::lock_guard<std::mutex> lock(mu_);
  return query_locked(reinterpret_cast<Fence*>(fence), 0);
}

bool CudaFences::query_locked(Fence* f, std::int64_t gap_ns) {
  if (f->done) return true;
  if (f->generation != generation_) return f->done = true;  // its context is gone
  if (f->deferred) {
    if (any_capture_active()) return false;
    record_now_locked(f);
    f->deferred = false;
  }
  // A newer context-wide fence completed: it covered everything this one needs.
  if (f->seq != 0 && f->seq <= completed_all_seq_) return f->done = true;
  if (!events_complete_locked(f)) return false;
  if (!covered_locked(f, gap_ns)) return false;
  return f->done = true;
}

bool CudaFences::query_events_locked(Fence* f) {
  for (CUevent e : f->events) {
    n_query_.add();
    // Anything but "not ready" ends the wait: a sticky error means the context is unusable and
    // nothing will ever complete, so holding the block back would only leak it.
    if (d_.cuEventQuery(e) == CUDA_ERROR_NOT_READY) return false;
  }
  note_complete_locked(f);
  return f->events_done = true;
}

bool CudaFences::known_complete_locked(const Fence* f) const {
  return f->seq != 0 && f->seq <= (f->context_wide ? completed_all_seq_ : completed_seq_);
}

void CudaFences::note_complete_locked(const Fence* f) {
  if (f->seq > completed_seq_) completed_seq_ = f->seq;
  if (f->context_wide && f->seq > completed_all_seq_) completed_all_seq_ = f->seq;
}

bool CudaFences::can_wait(FenceHandle fence) {
  auto* f = reinterpret_cast<Fence*>(fence);
  std::lock_guard<std::mutex> lock(mu_);
  if (f->done || f->generation != generation_) return true;
  if (!any_capture_active()) return true;
  // A capture is open: a fence not yet recorded, or one whose non-blocking streams no sweep has
  // asked yet, cannot be completed now.
  return !f->deferred && f->cover <= sweep_started_;
}

void CudaFences::wait(FenceHandle fence) {
  auto* f = reinterpret_cast<Fence*>(fence);
  std::lock_guard<std::mutex> lock(mu_);
  if (f->done || f->generation != generation_) return;
  if (f->deferred) {
    // A capture is still open; the work the fence must cover was issued before it, so recording
    // now (outside the capture's streams) is still after that work. The legacy stream is the
    // problem: skip it and rely on the sweep of the non-blocking streams only.
    if (any_capture_active()) {
      log_warn("waiting for a fence while a graph capture is open: legacy-stream work not covered");
      if (!non_blocking_.empty()) {
        f->cover = sweep_started_ + 1;
        cover_wanted_ = std::max(cover_wanted_, f->cover);
      }
    } else {
      record_now_locked(f);
    }
    f->deferred = false;
  }
  if (f->seq != 0 && f->seq <= completed_all_seq_) {  // a newer context-wide fence completed
    f->done = true;
    return;
  }
  if (!f->events_done && !known_complete_locked(f)) {
    for (CUevent e : f->events) {
      n_sync_.add();
      d_.cuEventSynchronize(e);
    }
    note_complete_locked(f);
  }
  f->events_done = true;
  if (f->cover > sweep_done_) {
    auto unmarked = [&] {
      return std::any_of(sweep_events_.begin(), sweep_events_.end(),
                         [](const SweepEvent& se) { return se.event == nullptr; });
    };
    // A sweep begun after the fence, with an event on every busy stream (a new one if the one in
    // flight left a busy stream unmarked); none can be begun while a capture is open.
    if (f->cover > sweep_started_ || unmarked()) {
      if (any_capture_active()) {
        log_warn("waiting for a fence while a graph capture is open: non-blocking streams not asked");
        f->done = true;
        return;
      }
      begin_sweep_locked();
    }
    for (const SweepEvent& se : sweep_events_) {
      if (se.event == nullptr) continue;
      n_sync_.add();
      d_.cuEventSynchronize(se.event);
    }
    if (unmarked()) {
      log_warn(
          "waiting for a fence: no event could be recorded on a busy non-blocking stream; its work is not covered");
    } else {
      sweep_finished_locked();
    }
  }
  f->done = true;
}

void CudaFences::release(FenceHandle fence) {
  auto* f = reinterpret_cast<Fence*>(fence);
  std::lock_guard<std::mutex> lock(mu_);
  if (f == unjoined_) {
    unjoined_ = nullptr;
    // Memory was reused after it without a join: streams created from now on must still wait for
    // its event unless it is known complete, so the event becomes a join instead of being reused.
    if (f->generation == generation_ && !f->done) {
      joins_.push_back(f->events.front());
      f->events.erase(f->events.begin());
    }
  }
  // Events of a destroyed context are not reused (leaked: destroying them would call CUDA on a
  // dead context).
  if (f->generation == generation_) {
    free_events_.insert(free_events_.end(), f->events.begin(), f->events.end());
  }
  f->events.clear();
  f->on.clear();
  if (newest_ == f) newest_ = nullptr;
  free_fences_.push_back(f);
}

bool CudaFences::order_after(const FenceHandle* handles, std::size_t n) {
  if (d_.cuStreamWaitEvent == nullptr) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (any_capture_active()) return false;
  auto order = [&]() -> bool {
    // Context-wide fences still running: one wait on the newest orders all later work after it,
    // and after every fence recorded before it.
    Fence* wide = nullptr;
    for (std::size_t i = 0; i < n; ++i) {
      auto* f = reinterpret_cast<Fence*>(handles[i]);
      if (f->done || f->generation != generation_ || !f->context_wide) continue;
      // Not asked: a wait on an event that has completed costs the GPU nothing, and a query
      // finding it complete costs the host ~10 times the wait (see orders_for_free).
      if (f->seq <= completed_all_seq_ || f->events_done) {
        f->done = true;
        continue;
      }
      if (wide == nullptr || f->seq > wide->seq) wide = f;
    }
    if (wide != nullptr && !wait_context_locked(wide)) return false;
    const std::uint64_t ordered_seq = wide != nullptr ? wide->seq : 0;
    // Only the legacy stream and the streams that follow it exist: a fence that is one event on
    // the legacy stream runs before anything issued from now on, on any of them.
    const bool legacy_orders_all = non_blocking_.empty();
    Fence* unjoined = nullptr;
    // The events still running: on the legacy stream, and the sweep's on non-blocking streams.
    bool legacy_running = false;
    bool sweep_running = false;
    for (std::size_t i = 0; i < n; ++i) {
      auto* f = reinterpret_cast<Fence*>(handles[i]);
      if (f->done || f->generation != generation_) continue;
      if (f->deferred) {  // no capture is open now: it can be recorded (after the work it covers)
        record_locked(f);
        f->deferred = false;
        if (f->context_wide) {  // recorded just now: ordered by a wait of its own
          if (!wait_context_locked(f)) return false;
          continue;
        }
      }
      if (f->context_wide || (f->seq != 0 && f->seq <= ordered_seq)) continue;  // the wait above covers it
      const bool covered = covered_locked(f, 0);
      if (legacy_orders_all && covered && f->seq != 0 && f->events.size() == 1 && f->on.front() == CU_STREAM_LEGACY &&
          !(f->seq <= completed_seq_)) {
        if (unjoined == nullptr || f->seq > unjoined->seq) unjoined = f;
        continue;
      }
      const bool events_done = events_complete_locked(f);
      if (!events_done) legacy_running = true;
      if (!covered) sweep_running = true;
      if (events_done && covered) f->done = true;
    }
    if (unjoined != nullptr && (unjoined_ == nullptr || unjoined->seq > unjoined_->seq)) unjoined_ = unjoined;
    if (!legacy_running && !sweep_running) return true;  // all complete or ordered: nothing to wait for
    // Join on the legacy stream: it waits for the sweep's events still running on the
    // non-blocking streams, and one event recorded after those waits covers everything.
    CUstream only = nullptr;  // the single non-blocking stream every running event is on, if any
    bool several = false;
    if (sweep_running) {
      for (const SweepEvent& se : sweep_events_) {
        if (se.event == nullptr) return false;  // that stream's work has no event to wait for
        n_wait_.add();
        if (d_.cuStreamWaitEvent(CU_STREAM_LEGACY, se.event, 0) != CUDA_SUCCESS) return false;
        if (only == nullptr)
          only = se.stream;
        else if (only != se.stream)
          several = true;
      }
    }
    CUevent join = take_event_locked();
    if (join == nullptr) return false;
    n_record_.add();
    if (d_.cuEventRecord(join, CU_STREAM_LEGACY) != CUDA_SUCCESS) {
      free_events_.push_back(join);
      return false;
    }
    for (CUstream s : non_blocking_) {
      if (!legacy_running && !several && s == only) continue;  // all it would wait for ran on it
      n_wait_.add();
      if (d_.cuStreamWaitEvent(s, join, 0) != CUDA_SUCCESS) {
        free_events_.push_back(join);  // waits already made only add order; the memory stays pending
        return false;
      }
    }
    // The new join covers every older one (it was recorded on the legacy stream after them).
    free_events_.insert(free_events_.end(), joins_.begin(), joins_.end());
    joins_.assign(1, join);
    return true;
  };
  return in_context_locked(order);
}

bool CudaFences::orders_for_free() {
  if (d_.cuStreamWaitEvent == nullptr) return false;  // order_after refuses everything
  std::lock_guard<std::mutex> lock(mu_);
  if (any_capture_active()) return false;
  // Legacy-stream fences only: no driver call at all.
  if (non_blocking_.empty() && last_context_seq_ <= completed_all_seq_) return true;
  // Context-wide fences: one cuCtxWaitEvent on the newest, without asking it first. Its record
  // costs ~0.16 us and the wait ~0.13 us, but a query that finds it complete ~1.3 us while the
  // GPU runs behind the host (measured on an H100, tests/gpu/fence_costs.cpp): asking each fence
  // once cost ResNet-50 inference under PyTorch more than all its other pool calls.
  return context_events_ && d_.cuCtxRecordEvent != nullptr && d_.cuCtxWaitEvent != nullptr && !capture_ever_began();
}

void CudaFences::prune_joins_locked() {
  std::size_t kept = 0;
  for (CUevent e : joins_) {
    n_query_.add();
    if (d_.cuEventQuery(e) == CUDA_ERROR_NOT_READY)
      joins_[kept++] = e;
    else
      free_events_.push_back(e);
  }
  joins_.resize(kept);
}

void CudaFences::add_stream(CUstream s, bool non_blocking) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.push_back(s);
  if (!non_blocking) return;  // blocking streams follow the legacy stream, which already waits
  non_blocking_.push_back(s);
  n_non_blocking_.add();
  // Memory handed out under a GPU-side wait that may still be running: the new stream must not
  // run ahead of it either. (Called in the creating thread, whose current context is ctx_.)
  if (d_.cuStreamWaitEvent == nullptr) return;
  prune_joins_locked();
  for (CUevent e : joins_) d_.cuStreamWaitEvent(s, e, 0);
  if (unjoined_ != nullptr && !unjoined_->done) d_.cuStreamWaitEvent(s, unjoined_->events.front(), 0);
}

void CudaFences::finish_stream_locked(CUstream s) {
  auto finish = [&] {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d_.cuStreamIsCapturing != nullptr && d_.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS &&
        st != CU_STREAM_CAPTURE_STATUS_NONE) {
      return;  // its own capture ends with the destroy: no work of it runs
    }
    if (d_.cuStreamQuery != nullptr) {
      n_stream_query_.add();
      if (d_.cuStreamQuery(s) != CUDA_ERROR_NOT_READY) return;
    }
    CUevent e = take_event_locked();
    if (e == nullptr) return;
    n_record_.add();
    if (d_.cuEventRecord(e, s) == CUDA_SUCCESS) {
      n_sync_.add();
      d_.cuEventSynchronize(e);
    }
    free_events_.push_back(e);
  };
  in_context_locked(finish);
}

bool CudaFences::remove_stream(CUstream s) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(streams_.begin(), streams_.end(), s);
  if (it == streams_.end()) return false;
  streams_.erase(it);
  streams_version_.fetch_add(1, std::memory_order_acq_rel);
  auto nb = std::find(non_blocking_.begin(), non_blocking_.end(), s);
  if (nb != non_blocking_.end()) {
    // Fences recorded since the last sweep need this stream asked while it still exists: sweep
    // now (its work keeps running after the destroy; an event recorded before it still marks it).
    // While a capture is open no sweep may record on the other streams: the host waits for the
    // dying stream's own work instead (rare: a stream destroyed during another one's capture).
    if (cover_wanted_ > sweep_started_) {
      if (!any_capture_active()) {
        begin_sweep_locked();
      } else {
        finish_stream_locked(s);
      }
    }
    non_blocking_.erase(std::find(non_blocking_.begin(), non_blocking_.end(), s));
  }
  return true;
}

namespace {
struct KnownStream {
  const CudaFences* fences = nullptr;
  CUstream stream = nullptr;
  unsigned version = 0;
};
thread_local KnownStream tl_known_stream;
}  // namespace

bool CudaFences::knows_stream(CUstream s) {
  const unsigned v = streams_version_.load(std::memory_order_acquire);
  KnownStream& k = tl_known_stream;
  if (k.fences == this && k.stream == s && k.version == v) return true;
  std::lock_guard<std::mutex> lock(mu_);
  const bool known = std::find(streams_.begin(), streams_.end(), s) != streams_.end();
  if (known) k = {this, s, streams_version_.load(std::memory_order_relaxed)};
  return known;
}

void CudaFences::abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  streams_version_.fetch_add(1, std::memory_order_acq_rel);
  newest_ = nullptr;
  unjoined_ = nullptr;
  joins_.clear();
  free_events_.clear();
  sweep_events_.clear();
  sweep_done_ = sweep_started_ = cover_wanted_ = 0;
  completed_seq_ = completed_all_seq_ = last_context_seq_ = 0;
  newest_running_seq_ = 0;
  context_events_ = true;
  last_sweep_ns_ = 0;
  gather_ = nullptr;  // went with the context
  gather_failed_ = false;
  streams_.clear();
  non_blocking_.clear();
}

}  // namespace cudapool::shim
