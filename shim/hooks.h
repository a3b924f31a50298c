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

// An answer the pool already gave, waiting for the driver hook cudart calls next on this thread.
// cudart's cudaMalloc / cudaFree, where the shim serves them itself (shim/hooks_runtime_api.cpp),
// still hand a failure to cudart, so that cudart sets its own error state (cudaGetLastError): the
// pool's answer is left here, cudart's call is made, and the cuMemAlloc_v2 / cuMemFree_v2 hook
// returns it instead of asking the pool again (which would log an out-of-memory twice or count a
// foreign pointer twice). kPassThrough as the answer: the driver's own. Only the call it was left
// for (the same size or pointer) takes it; whoever armed it disarms it when cudart returns.
struct ForcedAnswer {
  bool armed = false;
  bool for_free = false;
  std::size_t bytes = 0;
  CUdeviceptr ptr = 0;
  CUresult result = 0;

  bool take_alloc(std::size_t b, CUresult* r) noexcept {
    if (!armed || for_free || b != bytes) return false;
    armed = false;
    *r = result;
    return true;
  }
  bool take_free(CUdeviceptr p, CUresult* r) noexcept {
    if (!armed || !for_free || p != ptr) return false;
    armed = false;
    *r = result;
    return true;
  }
};
extern constinit thread_local ForcedAnswer tl_forced_answer;

// The wrapper to hand out for a driver symbol, by its exact ABI name ("cuMemAlloc_v2",
// "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2", …); nullptr if the shim does not hook it.
void* wrapper_for_symbol(const char* abi_name) noexcept;

// shim/hooks_host.cpp: the context is gone, and its pinned host memory with it.
void host_forget_context(CUcontext ctx) noexcept;

}  // namespace cudapool::shim
