#include "shim/fences/cuda_fences.h"

#include "shim/fences/streams.h"

namespace cudapool::shim {

CudaFences::CudaFences(const RealDriver& d, CUcontext ctx)
    : d_(d),
      events_(d, calls_),
      context_(d, ctx, calls_),
      seq_(events_),
      wide_(d, ctx, events_, calls_),
      sweeps_(d, context_, events_, streams_, calls_),
      recorder_(context_, events_, wide_, seq_, sweeps_, streams_),
      ordering_(d, events_, calls_, {slab_, recorder_, seq_, sweeps_, wide_, streams_}) {}

FenceHandle CudaFences::record_device() {
  std::lock_guard<std::mutex> lock(mu_);
  Fence* f = slab_.make();
  f->device = true;
  recorder_.take(f);
  return f->handle();
}

FenceHandle CudaFences::record_stream(StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Fence* f = slab_.make();
  f->device = false;
  f->stream = stream;
  recorder_.take(f);
  return f->handle();
}

bool CudaFences::query(FenceHandle fence) {
  std::lock_guard<std::mutex> lock(mu_);
  return query_locked(Fence::of(fence), FenceSweeps::kSweepGapNs);
}

bool CudaFences::query_urgent(FenceHandle fence) {
  std::lock_guard<std::mutex> lock(mu_);
  return query_locked(Fence::of(fence), 0);
}

bool CudaFences::query_locked(Fence* f, std::int64_t gap_ns) {
  if (f->done) return true;
  if (slab_.stale(f)) return f->done = true;  // its context is gone
  if (!recorder_.settle(f)) return false;
  // A newer context-wide fence completed: it covered everything this one needs.
  if (seq_.all_complete(f)) return f->done = true;
  if (!seq_.events_complete(f)) return false;
  if (!sweeps_.covered(f->cover, gap_ns)) return false;
  return f->done = true;
}

bool CudaFences::can_wait(FenceHandle fence) {
  Fence* f = Fence::of(fence);
  std::lock_guard<std::mutex> lock(mu_);
  if (f->done || slab_.stale(f)) return true;
  if (!any_capture_active()) return true;
  // A capture is open: a fence not yet recorded, or one whose non-blocking streams no sweep has
  // asked yet, cannot be completed now.
  return !f->deferred && sweeps_.begun_for(f->cover);
}

void CudaFences::wait(FenceHandle fence) {
  Fence* f = Fence::of(fence);
  std::lock_guard<std::mutex> lock(mu_);
  if (f->done || slab_.stale(f)) return;
  recorder_.settle_for_wait(f);
  if (seq_.all_complete(f)) {  // a newer context-wide fence completed
    f->done = true;
    return;
  }
  if (!f->events_done && !seq_.known_complete(f)) {
    for (CUevent e : f->events) events_.sync(e);
    seq_.note_complete(f);
  }
  f->events_done = true;
  sweeps_.wait_for(f->cover);
  f->done = true;
}

void CudaFences::release(FenceHandle fence) {
  Fence* f = Fence::of(fence);
  std::lock_guard<std::mutex> lock(mu_);
  const bool stale = slab_.stale(f);
  ordering_.released(f, stale);
  // Events of a destroyed context are not reused (leaked: destroying them would call CUDA on a
  // dead context).
  if (!stale) events_.put(f->events.begin(), f->events.end());
  f->events.clear();
  f->on.clear();
  seq_.released(f);
  slab_.recycle(f);
}

bool CudaFences::order_after(const FenceHandle* fences, std::size_t n) {
  if (d_.cuStreamWaitEvent == nullptr) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (any_capture_active()) return false;
  return context_.run([&] { return ordering_.order(fences, n); });
}

bool CudaFences::orders_for_free() {
  if (d_.cuStreamWaitEvent == nullptr) return false;  // order_after refuses everything
  std::lock_guard<std::mutex> lock(mu_);
  if (any_capture_active()) return false;
  return ordering_.free_now();
}

void CudaFences::add_stream(CUstream s, bool non_blocking) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.add(s, non_blocking);
  if (!non_blocking) return;  // blocking streams follow the legacy stream, which already waits
  calls_.add(FenceCall::non_blocking_streams);
  ordering_.stream_added(s);
}

void CudaFences::finish_stream_locked(CUstream s) {
  context_.run([&] {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d_.cuStreamIsCapturing != nullptr && d_.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS &&
        st != CU_STREAM_CAPTURE_STATUS_NONE) {
      return;  // its own capture ends with the destroy: no work of it runs
    }
    if (d_.cuStreamQuery != nullptr) {
      calls_.add(FenceCall::stream_query);
      if (d_.cuStreamQuery(s) != CUDA_ERROR_NOT_READY) return;
    }
    CUevent e = events_.take();
    if (e == nullptr) return;
    if (events_.record(e, s)) events_.sync(e);
    events_.put(e);
  });
}

bool CudaFences::remove_stream(CUstream s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!streams_.forget(s)) return false;
  if (streams_.non_blocking(s)) {
    // Fences recorded since the last sweep need this stream asked while it still exists: sweep
    // now (its work keeps running after the destroy; an event recorded before it still marks it).
    // While a capture is open no sweep may record on the other streams: the host waits for the
    // dying stream's own work instead (rare: a stream destroyed during another one's capture).
    if (sweeps_.wanted()) {
      if (!any_capture_active()) {
        sweeps_.begin();
      } else {
        finish_stream_locked(s);
      }
    }
    streams_.drop_non_blocking(s);
  }
  return true;
}

bool CudaFences::knows_stream(CUstream s) {
  if (streams_.known_here(s)) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return streams_.knows_locked(s);
}

void CudaFences::abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  slab_.next_generation();
  streams_.clear();
  seq_.reset();
  ordering_.reset();
  events_.forget();
  sweeps_.reset();
  wide_.reset();
}

}  // namespace cudapool::shim
