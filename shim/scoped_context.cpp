// A context made current for a scope (shim/scoped_context.h).
#include "shim/scoped_context.h"

namespace cudapool::shim {

ScopedContext::ScopedContext(const RealDriver& d, CUcontext ctx) noexcept : d_(d) {
  CUcontext cur = nullptr;
  if (d_.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx) return;
  if (d_.cuCtxPushCurrent_v2 != nullptr && d_.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) pushed_ = true;
}

ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext popped = nullptr;
    d_.cuCtxPopCurrent_v2(&popped);
  }
}

}  // namespace cudapool::shim
