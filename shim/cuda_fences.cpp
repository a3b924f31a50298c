#include "shim/cuda_fences.h"

#include <algorithm>

#include "shim/cuda_upstream.h"
#include "shim/log.h"
#include "shim/streams.h"

namespace cudapool::shim {

namespace {
FenceHandle handle_of(void* f) { return reinterpret_cast<FenceHandle>(f); }
}  // namespace

CudaFences::Fence* CudaFences::new_fence_locked() {
  Fence* f;
  if (!free_fences_.empty()) {
    f = free_fences_.back();
    free_fences_.pop_back();
  } else {
    f = new Fence;
  }
  f->events.clear();
  f->deferred = f->done = false;
  f->generation = generation_;
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
  return true;
}

void CudaFences::record_locked(Fence* f) {
  if (f->device) {
    if (!record_on_locked(f, CU_STREAM_LEGACY)) {
      log_warn("could not record a fence on the legacy stream; freed memory is reused only "
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
    ScopedContext scope(d_, ctx_);
    record_locked(f);
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
    ScopedContext scope(d_, ctx_);
    record_locked(f);
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
    ScopedContext scope(d_, ctx_);
    record_locked(f);
    f->deferred = false;
  }
  for (CUevent e : f->events) {
    // Anything but "not ready" ends the wait: a sticky error means the context is unusable and
    // nothing will ever complete, so holding the block back would only leak it.
    if (d_.cuEventQuery(e) == CUDA_ERROR_NOT_READY) return false;
  }
  return f->done = true;
}

void CudaFences::wait(FenceHandle fence) {
  auto* f = reinterpret_cast<Fence*>(fence);
  std::lock_guard<std::mutex> lock(mu_);
  if (f->done || f->generation != generation_) return;
  if (f->deferred) {
    // A capture is still open; the work the fence must cover was issued before it, so recording
    // now (outside the capture's streams) is still after that work. The legacy stream is the
    // problem: skip it and wait on the non-blocking streams only.
    if (any_capture_active()) {
      log_warn("waiting for a fence while a graph capture is open: legacy-stream work not covered");
      for (CUstream s : non_blocking_) record_on_locked(f, s);
    } else {
      ScopedContext scope(d_, ctx_);
      record_locked(f);
    }
    f->deferred = false;
  }
  for (CUevent e : f->events) d_.cuEventSynchronize(e);
  f->done = true;
}

void CudaFences::release(FenceHandle fence) {
  auto* f = reinterpret_cast<Fence*>(fence);
  std::lock_guard<std::mutex> lock(mu_);
  // Events of a destroyed context are not reused (leaked: destroying them would call CUDA on a
  // dead context).
  if (f->generation == generation_) {
    free_events_.insert(free_events_.end(), f->events.begin(), f->events.end());
  }
  f->events.clear();
  free_fences_.push_back(f);
}

void CudaFences::add_stream(CUstream s, bool non_blocking) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.push_back(s);
  if (non_blocking) non_blocking_.push_back(s);
}

bool CudaFences::remove_stream(CUstream s) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(streams_.begin(), streams_.end(), s);
  if (it == streams_.end()) return false;
  streams_.erase(it);
  auto nb = std::find(non_blocking_.begin(), non_blocking_.end(), s);
  if (nb != non_blocking_.end()) non_blocking_.erase(nb);
  return true;
}

bool CudaFences::knows_stream(CUstream s) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::find(streams_.begin(), streams_.end(), s) != streams_.end();
}

void CudaFences::abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  free_events_.clear();
  streams_.clear();
  non_blocking_.clear();
}

}  // namespace cudapool::shim
