#include "shim/cuda_upstream.h"

#include "shim/log.h"

namespace cudapool::shim {

namespace {
thread_local CUresult tl_last_error = CUDA_SUCCESS;
}

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

UpstreamStatus CudaUpstream::allocate(std::size_t bytes, void** out) {
  ScopedContext scope(d_, ctx_);
  CUdeviceptr p = 0;
  CUresult r = d_.cuMemAlloc_v2(&p, bytes);
  if (r == CUDA_SUCCESS) {
    *out = reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
    return UpstreamStatus::ok;
  }
  tl_last_error = r;
  return r == CUDA_ERROR_OUT_OF_MEMORY ? UpstreamStatus::out_of_memory : UpstreamStatus::error;
}

void CudaUpstream::release(void* base, std::size_t bytes) {
  ScopedContext scope(d_, ctx_);
  CUresult r = d_.cuMemFree_v2(reinterpret_cast<CUdeviceptr>(base));
  if (r != CUDA_SUCCESS) {
    log_warn("cuMemFree of segment {} ({} bytes) failed: CUDA error {}", base, bytes, r);
  }
}

void CudaUpstream::mem_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  ScopedContext scope(d_, ctx_);
  std::size_t f = 0, t = 0;
  if (d_.cuMemGetInfo_v2(&f, &t) != CUDA_SUCCESS) f = t = 0;
  *free_bytes = f;
  *total_bytes = t;
}

CUresult CudaUpstream::last_error() noexcept { return tl_last_error; }

}  // namespace cudapool::shim
