#include "shim/fences/fence_recorder.h"

#include "shim/fences/streams.h"
#include "shim/log.h"

namespace cudapool::shim {

void FenceRecorder::take(Fence* f) {
  if (any_capture_active()) {
    f->deferred = true;
  } else {
    record_now(f);
  }
}

void FenceRecorder::record_now(Fence* f) {
  context_.run([&] { record(f); });
}

bool FenceRecorder::record_on(Fence* f, CUstream s) {
  CUevent e = events_.record_new(s);
  if (e == nullptr) return false;
  f->events.push_back(e);
  f->on.push_back(s);
  return true;
}

void FenceRecorder::record(Fence* f) {
  if (!f->device) {
    record_on(f, stream_handle(f->stream));
    return;
  }
  // Context-wide: needed only where it replaces sweeps, or after a context-wide fence that may
  // still run (a legacy event recorded now would not cover what that one does).
  const bool wide_needed = streams_.any_non_blocking() || seq_.context_wide_running();
  if (wide_needed && wide_.record(f)) {
    seq_.recorded(f);
    return;
  }
  if (record_on(f, CU_STREAM_LEGACY)) {
    seq_.recorded(f);
  } else {
    log_warn(
        "could not record a fence on the legacy stream; freed memory is reused only "
        "after the sweeps of the other streams");
  }
  if (const std::uint64_t cover = sweeps_.cover_for_new(); cover != 0) f->cover = cover;
}

bool FenceRecorder::settle_deferred(Fence* f) {
  if (any_capture_active()) return false;
  record_now(f);
  f->deferred = false;
  return true;
}

void FenceRecorder::settle_for_wait(Fence* f) {
  if (!f->deferred) return;
  // A capture is still open; the work the fence must cover was issued before it, so recording now
  // (outside the capture's streams) is still after that work. The legacy stream is the problem:
  // skip it and rely on the sweep of the non-blocking streams only.
  if (any_capture_active()) {
    log_warn("waiting for a fence while a graph capture is open: legacy-stream work not covered");
    if (const std::uint64_t cover = sweeps_.cover_for_new(); cover != 0) f->cover = cover;
  } else {
    record_now(f);
  }
  f->deferred = false;
}

}  // namespace cudapool::shim
