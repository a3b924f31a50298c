#include "shim/fences/event_pool.h"

namespace cudapool::shim {

CUevent EventPool::take() {
  if (!free_.empty()) {
    CUevent e = free_.back();
    free_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  if (d_.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return e;
}

bool EventPool::record(CUevent e, CUstream s) {
  calls_.add(FenceCall::event_record);
  return d_.cuEventRecord(e, s) == CUDA_SUCCESS;
}

CUevent EventPool::record_new(CUstream s) {
  CUevent e = take();
  if (e == nullptr) return nullptr;
  if (!record(e, s)) {
    put(e);
    return nullptr;
  }
  return e;
}

bool EventPool::completed(CUevent e) {
  calls_.add(FenceCall::event_query);
  return d_.cuEventQuery(e) != CUDA_ERROR_NOT_READY;
}

void EventPool::sync(CUevent e) {
  calls_.add(FenceCall::event_sync);
  d_.cuEventSynchronize(e);
}

}  // namespace cudapool::shim
