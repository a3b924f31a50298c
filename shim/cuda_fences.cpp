#include "shim/cuda_fences.h"

#include <algorithm>

#include "shim/cuda_upstream.h"
#include "shim/log.h"
#include "shim/streams.h"

namespace cudapool::shim {

namespace {
FenceHandle handle_of(void* f) { return reinterpret_cast<FenceHandle>(f); }
// The context the calling thread's hook has verified as current (ContextGuard), or nullptr.
thread_local CUcontext tl_known_current = nullptr;
}  // namespace

CudaFences::ContextGuard::ContextGuard(CUcontext ctx) noexcept : prev_(tl_known_current) { tl_known_current = ctx; }
CudaFences::ContextGuard::~ContextGuard() { tl_known_current = prev_; }

void CudaFences::record_now_locked(Fence* f) {
  if (tl_known_current == ctx_) {
    record_locked(f);  // the hook already read the current context: no cuCtxGetCurrent
  } else {
    ScopedContext scope(d_, ctx_);
    record_locked(f);
  }
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
  f->deferred = f->done = false;
  f->generation = generation_;
  f->seq = 0;
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
  if (d_.cuEventRecord(e, s) != CUDA_SUCCESS) {
    free_events_.push_back(e);
    return false;
  }
  f->events.push_back(e);
  f->on.push_back(s);
  return true;
}

void CudaFences::record_locked(Fence* f) {
  if (f->device) {
    if (record_on_locked(f, CU_STREAM_LEGACY)) {
      f->seq = next_seq_++;
      f->stream_epoch = streams_epoch_;
      newest_ = f;
    } else {
      log_warn(
          "could not record a fence on the legacy stream; freed memory is reused only "
          "after the events on other streams");
    }
    for (CUstream s : non_blocking_) record_on_locked(f, s);
  } else {
    record_on_locked(f, stream_handle(f->stream));
  }
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
  auto* f = reinterpret_cast<Fence*>(fence);
  std::lock_guard<std::mutex> lock(mu_);
  if (f->done) return true;
  if (f->generation != generation_) return f->done = true;  // its context is gone
  if (f->deferred) {
    if (any_capture_active()) return false;
    record_now_locked(f);
    f->deferred = false;
  }
  // A newer device fence was seen complete: this one is too (see the header), no driver call.
  if (f->seq != 0 && f->seq <= completed_seq_ && f->stream_epoch == completed_epoch_) return f->done = true;
  // Several device fences outstanding (the pool asks oldest first): ask the newest once; if it
  // completed, this one and every one in between are answered without further driver calls.
  if (f->seq != 0 && newest_ != nullptr && newest_ != f && !newest_->done && newest_->seq > f->seq &&
      newest_->stream_epoch == f->stream_epoch && query_events_locked(newest_)) {
    return f->done = true;
  }
  return query_events_locked(f);
}

bool CudaFences::query_events_locked(Fence* f) {
  for (CUevent e : f->events) {
    // Anything but "not ready" ends the wait: a sticky error means the context is unusable and
    // nothing will ever complete, so holding the block back would only leak it.
    if (d_.cuEventQuery(e) == CUDA_ERROR_NOT_READY) return false;
  }
  note_complete_locked(f);
  return f->done = true;
}

void CudaFences::note_complete_locked(const Fence* f) {
  if (f->seq == 0) return;
  if (f->stream_epoch > completed_epoch_ || (f->stream_epoch == completed_epoch_ && f->seq > completed_seq_)) {
    completed_seq_ = f->seq;
    completed_epoch_ = f->stream_epoch;
  }
}

bool CudaFences::can_wait(FenceHandle fence) {
  auto* f = reinterpret_cast<Fence*>(fence);
  std::lock_guard<std::mutex> lock(mu_);
  return f->done || f->generation != generation_ || !f->deferred || !any_capture_active();
}

void CudaFences::wait(FenceHandle fence) {
  auto* f = reinterpret_cast<Fence*>(fence);
  std::lock_guard<std::mutex> lock(mu_);
  if (f->done || f->generation != generation_) return;
  if (f->seq != 0 && f->seq <= completed_seq_ && f->stream_epoch == completed_epoch_) {
    f->done = true;
    return;
  }
  if (f->deferred) {
    // A capture is still open; the work the fence must cover was issued before it, so recording
    // now (outside the capture's streams) is still after that work. The legacy stream is the
    // problem: skip it and wait on the non-blocking streams only.
    if (any_capture_active()) {
      log_warn("waiting for a fence while a graph capture is open: legacy-stream work not covered");
      for (CUstream s : non_blocking_) record_on_locked(f, s);
    } else {
      record_now_locked(f);
    }
    f->deferred = false;
  }
  for (CUevent e : f->events) d_.cuEventSynchronize(e);
  f->done = true;
  note_complete_locked(f);
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
    // Only the legacy stream and the streams that follow it exist: a fence that is one event on
    // the legacy stream runs before anything issued from now on, on any of them.
    const bool legacy_orders_all = non_blocking_.empty();
    Fence* unjoined = nullptr;
    // The events still running: on the legacy stream, and on non-blocking streams.
    bool legacy_running = false;
    CUstream only = nullptr;  // the single non-blocking stream every running event is on, if any
    bool several = false;
    std::vector<CUevent> others;
    for (std::size_t i = 0; i < n; ++i) {
      auto* f = reinterpret_cast<Fence*>(handles[i]);
      if (f->done || f->generation != generation_) continue;
      if (f->seq != 0 && f->seq <= completed_seq_ && f->stream_epoch == completed_epoch_) {
        f->done = true;
        continue;
      }
      if (f->deferred) {  // no capture is open now: it can be recorded (after the work it covers)
        record_locked(f);
        f->deferred = false;
      }
      if (legacy_orders_all && f->seq != 0 && f->events.size() == 1 && f->on.front() == CU_STREAM_LEGACY) {
        if (unjoined == nullptr || f->seq > unjoined->seq) unjoined = f;
        continue;
      }
      bool running = false;
      for (std::size_t k = 0; k < f->events.size(); ++k) {
        if (d_.cuEventQuery(f->events[k]) != CUDA_ERROR_NOT_READY) continue;
        running = true;
        if (f->on[k] == CU_STREAM_LEGACY) {
          legacy_running = true;
        } else {
          others.push_back(f->events[k]);
          if (only == nullptr)
            only = f->on[k];
          else if (only != f->on[k])
            several = true;
        }
      }
      if (!running) {
        f->done = true;
        note_complete_locked(f);
      }
    }
    if (unjoined != nullptr && (unjoined_ == nullptr || unjoined->seq > unjoined_->seq)) unjoined_ = unjoined;
    if (!legacy_running && others.empty()) return true;  // all complete or ordered: nothing to wait for
    // Join on the legacy stream: it waits for the other streams' events, and one event recorded
    // after those waits covers everything.
    for (CUevent e : others)
      if (d_.cuStreamWaitEvent(CU_STREAM_LEGACY, e, 0) != CUDA_SUCCESS) return false;
    CUevent join = take_event_locked();
    if (join == nullptr) return false;
    if (d_.cuEventRecord(join, CU_STREAM_LEGACY) != CUDA_SUCCESS) {
      free_events_.push_back(join);
      return false;
    }
    for (CUstream s : non_blocking_) {
      if (!legacy_running && !several && s == only) continue;  // all it would wait for ran on it
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
  if (tl_known_current == ctx_) return order();
  ScopedContext scope(d_, ctx_);
  return order();
}

bool CudaFences::orders_for_free() {
  if (d_.cuStreamWaitEvent == nullptr) return false;  // order_after refuses everything
  std::lock_guard<std::mutex> lock(mu_);
  return non_blocking_.empty() && !any_capture_active();
}

void CudaFences::prune_joins_locked() {
  std::size_t kept = 0;
  for (CUevent e : joins_) {
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
  // Memory handed out under a GPU-side wait that may still be running: the new stream must not
  // run ahead of it either. (Called in the creating thread, whose current context is ctx_.)
  if (d_.cuStreamWaitEvent == nullptr) return;
  prune_joins_locked();
  for (CUevent e : joins_) d_.cuStreamWaitEvent(s, e, 0);
  if (unjoined_ != nullptr && !unjoined_->done) d_.cuStreamWaitEvent(s, unjoined_->events.front(), 0);
}

bool CudaFences::remove_stream(CUstream s) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(streams_.begin(), streams_.end(), s);
  if (it == streams_.end()) return false;
  streams_.erase(it);
  streams_version_.fetch_add(1, std::memory_order_acq_rel);
  auto nb = std::find(non_blocking_.begin(), non_blocking_.end(), s);
  if (nb != non_blocking_.end()) {
    non_blocking_.erase(nb);
    ++streams_epoch_;  // older device fences have an event on it that newer ones lack
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
  streams_.clear();
  non_blocking_.clear();
}

}  // namespace cudapool::shim
