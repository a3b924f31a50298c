// The pool's Upstream on the CUDA driver: segments come from the REAL cuMemAlloc_v2 of one
// context and go back through the REAL cuMemFree_v2, never through the shim's own hooks.
#pragma once
#include "allocator/upstream.h"
#include "shim/driver.h"

namespace cudapool::shim {

// Makes `ctx` current for the scope when it is not already (the pool may be driven from a thread
// whose current context is another one: a free finds its owner across pools, the C API empties
// every pool). One cuCtxGetCurrent when nothing needs changing.
class ScopedContext {
 public:
  ScopedContext(const RealDriver& d, CUcontext ctx) noexcept;
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const RealDriver& d_;
  bool pushed_ = false;
};

class CudaUpstream final : public Upstream {
 public:
  CudaUpstream(const RealDriver& d, CUcontext ctx) : d_(d), ctx_(ctx) {}
  UpstreamStatus allocate(std::size_t bytes, void** out) override;
  void release(void* base, std::size_t bytes) override;
  void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) override;

  // The driver's answer to the last failed allocate() on this thread, so the hook returns the
  // same CUresult the program would have got without the pool.
  static CUresult last_error() noexcept;

 private:
  const RealDriver& d_;
  CUcontext ctx_;
};

}  // namespace cudapool::shim
