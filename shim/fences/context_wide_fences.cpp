#include "shim/fences/context_wide_fences.h"

#include "shim/fences/streams.h"
#include "shim/log.h"

namespace cudapool::shim {

bool ContextWideFences::available() {
  if (!enabled_) return false;
  if (d_.cuCtxRecordEvent == nullptr || d_.cuCtxWaitEvent == nullptr) {
    enabled_ = false;
    return false;
  }
  return true;
}

bool ContextWideFences::record(Fence* f) {
  if (!available()) return false;
  CUevent e = events_.take();
  if (e == nullptr) return false;
  if (!context_wide_begin()) {  // a capture began once in this process: never again
    events_.put(e);
    return false;
  }
  calls_.add(FenceCall::context_record);
  const CUresult r = d_.cuCtxRecordEvent(ctx_, e);
  context_wide_end();
  if (r != CUDA_SUCCESS) {
    events_.put(e);
    enabled_ = false;
    log_info("cuCtxRecordEvent refused (CUresult {}): device fences use legacy-stream events and sweeps",
             static_cast<int>(r));
    return false;
  }
  f->events.push_back(e);
  f->on.push_back(nullptr);  // no stream: the whole context
  f->context_wide = true;
  return true;
}

bool ContextWideFences::wait(const Fence* f) {
  if (!context_wide_begin()) return false;
  calls_.add(FenceCall::context_wait);
  const CUresult r = d_.cuCtxWaitEvent(ctx_, f->events.front());
  context_wide_end();
  return r == CUDA_SUCCESS;
}

bool ContextWideFences::usable() const noexcept {
  return enabled_ && d_.cuCtxRecordEvent != nullptr && d_.cuCtxWaitEvent != nullptr && !capture_ever_began();
}

}  // namespace cudapool::shim
