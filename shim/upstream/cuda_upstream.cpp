#include "shim/upstream/cuda_upstream.h"

#include <algorithm>

#include "shim/log.h"

namespace cudapool::shim {

bool CudaUpstream::charge(std::size_t bytes) noexcept {
  if (gate_ == nullptr) return true;
  if (!gate_->acquire(bytes)) return false;
  gated_.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void CudaUpstream::credit(std::size_t bytes) noexcept {
  if (gate_ == nullptr) return;
  // Never more than was taken: a context's share may already have gone back whole (drop_gated).
  std::size_t cur = gated_.load(std::memory_order_relaxed), n = 0;
  do {
    n = std::min(cur, bytes);
  } while (!gated_.compare_exchange_weak(cur, cur - n, std::memory_order_relaxed));
  if (n != 0) gate_->release(n);
}

void CudaUpstream::drop_gated() noexcept {
  if (gate_ == nullptr) return;
  const std::size_t n = gated_.exchange(0, std::memory_order_relaxed);
  if (n != 0) gate_->release(n);
}

UpstreamStatus CudaUpstream::allocate(std::size_t bytes, void** out) {
  if (!charge(bytes)) return budget_refusal();
  ScopedContext scope(d_, ctx_);
  CUdeviceptr p = 0;
  CUresult r = d_.cuMemAlloc_v2(&p, bytes);
  if (r == CUDA_SUCCESS) {
    *out = reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
    return UpstreamStatus::ok;
  }
  credit(bytes);
  return driver_failure(r);
}

void CudaUpstream::release(void* base, std::size_t bytes) {
  ScopedContext scope(d_, ctx_);
  CUresult r = d_.cuMemFree_v2(reinterpret_cast<CUdeviceptr>(base));
  credit(bytes);  // a failed free leaves nothing the pool could use again either
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

}  // namespace cudapool::shim
