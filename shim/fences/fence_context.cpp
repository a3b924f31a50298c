#include "shim/fences/fence_context.h"

namespace cudapool::shim {

namespace {
// The context the calling thread's hook has verified as current (FenceContext::Guard), or nullptr.
thread_local CUcontext tl_known_current = nullptr;
}  // namespace

FenceContext::Guard::Guard(CUcontext ctx) noexcept : prev_(tl_known_current) { tl_known_current = ctx; }
FenceContext::Guard::~Guard() { tl_known_current = prev_; }

bool FenceContext::known_current() const noexcept { return tl_known_current == ctx_; }

}  // namespace cudapool::shim
