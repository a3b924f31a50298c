// Shared pieces of the hook files (internal).
#pragma once
#include <cstddef>

#include "shim/runtime.h"

namespace cudapool::shim {

// Returned by the helpers below when the call must go to the real driver instead.
inline constexpr CUresult kPassThrough = -1;

// Allocates from the current context's pool. kPassThrough when there is no current context.
// With `device` >= 0 (the pluggable allocator's entry points), CUDA_ERROR_INVALID_DEVICE when the
// current context belongs to another device.
CUresult pool_allocate(Runtime& rt, CUdeviceptr* dptr, std::size_t bytes, StreamId stream, int device = -1);
// The pool work of pool_allocate in `cp`, the pool of the calling thread's current context.
CUresult pool_allocate_in(Runtime& rt, ContextPool& cp, CUdeviceptr* dptr, std::size_t bytes, StreamId stream);
// cudaFree meaning (stream == nullptr) or cudaFreeAsync meaning. kPassThrough for memory the
// pool does not own.
CUresult pool_free(Runtime& rt, CUdeviceptr dptr, const StreamId* stream, CUstream raw_stream);

// A call to cudart's cudaMalloc / cudaFree that the runtime API hooks make with the pool's
// answer already in hand (shim/hooks/hooks_runtime_api.cpp): where the shim serves these itself, a
// failure still goes through cudart so that cudart sets its own error state (cudaGetLastError).
// The answer stays with the hook that got it, on its stack, for the length of cudart's call;
// the cuMemAlloc_v2 / cuMemFree_v2 hook that cudart calls on the same thread is handed it
// (cudart_call_in_flight) and returns it instead of asking the pool again (which would log an
// out-of-memory twice or count a foreign pointer twice). kPassThrough as the answer: the
// driver's own. Only the request it was made for (the same size or pointer) takes it, once.
class CudartCall {
 public:
  static CudartCall for_alloc(std::size_t bytes, CUresult answer) noexcept { return {false, bytes, 0, answer}; }
  static CudartCall for_free(CUdeviceptr ptr, CUresult answer) noexcept { return {true, 0, ptr, answer}; }

  bool take_alloc(std::size_t b, CUresult* r) noexcept { return take(!free_ && b == bytes_, r); }
  bool take_free(CUdeviceptr p, CUresult* r) noexcept { return take(free_ && p == ptr_, r); }

 private:
  CudartCall(bool free, std::size_t bytes, CUdeviceptr ptr, CUresult answer) noexcept
      : free_(free), bytes_(bytes), ptr_(ptr), answer_(answer) {}
  bool take(bool matches, CUresult* r) noexcept {
    if (taken_ || !matches) return false;
    taken_ = true;
    *r = answer_;
    return true;
  }
  bool free_;
  bool taken_ = false;
  std::size_t bytes_;
  CUdeviceptr ptr_;
  CUresult answer_;
};
// The cudart call the runtime API hook is making on this thread (nullptr: none): set by that
// hook around the call only, so a driver hook reached any other way sees nullptr.
extern constinit thread_local CudartCall* tl_cudart_call;

// The wrapper to hand out for a driver symbol, by its exact ABI name ("cuMemAlloc_v2",
// "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2", …); nullptr if the shim does not hook it.
void* wrapper_for_symbol(const char* abi_name) noexcept;

// shim/hooks/hooks_host.cpp: the context is gone, and its pinned host memory with it.
void host_forget_context(CUcontext ctx) noexcept;

}  // namespace cudapool::shim
