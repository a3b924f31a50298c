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
// cudaFree meaning (stream == nullptr) or cudaFreeAsync meaning. kPassThrough for memory the
// pool does not own.
CUresult pool_free(Runtime& rt, CUdeviceptr dptr, const StreamId* stream, CUstream raw_stream);

// The wrapper to hand out for a driver symbol, by its exact ABI name ("cuMemAlloc_v2",
// "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2", …); nullptr if the shim does not hook it.
void* wrapper_for_symbol(const char* abi_name) noexcept;

// shim/hooks_host.cpp: the context is gone, and its pinned host memory with it.
void host_forget_context(CUcontext ctx) noexcept;

}  // namespace cudapool::shim
