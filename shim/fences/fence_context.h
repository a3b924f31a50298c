// The context a fence layer works in, made current only where the calling thread's hook has not
// already verified it: the allocation hook reads the current context (cuCtxGetCurrent) and marks
// it known for the thread (ContextGuard), so recording a fence needs no context check; anywhere
// else the context is pushed around the work (ScopedContext), counted as a context switch.
#pragma once
#include "shim/driver.h"
#include "shim/fences/fence_calls.h"
#include "shim/scoped_context.h"

namespace cudapool::shim {

class FenceContext {
 public:
  // While alive, the calling thread's current context is known to be `ctx`. Nests.
  class Guard {
   public:
    explicit Guard(CUcontext ctx) noexcept;
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    CUcontext prev_;
  };

  FenceContext(const RealDriver& d, CUcontext ctx, FenceCalls& calls) : d_(d), ctx_(ctx), calls_(calls) {}

  CUcontext context() const noexcept { return ctx_; }
  // The calling thread's hook verified this context as current (a Guard is alive).
  bool known_current() const noexcept;
  // Runs f with the context current.
  template <class F>
  auto run(F&& f) {
    if (known_current()) return f();
    calls_.add(FenceCall::context_switch);
    ScopedContext scope(d_, ctx_);
    return f();
  }

 private:
  const RealDriver& d_;
  const CUcontext ctx_;
  FenceCalls& calls_;
};

}  // namespace cudapool::shim
