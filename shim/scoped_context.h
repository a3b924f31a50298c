// A context made current for a scope (shim/scoped_context.cpp): the pool, its fences and its
// upstream may be driven from a thread whose current context is another one.
#pragma once
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

}  // namespace cudapool::shim
