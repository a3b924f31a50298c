// Names of the pool's enums, for logs, traces and error messages.
#include "allocator/events.h"
#include "allocator/stats.h"
#include "allocator/types.h"

namespace cudapool {

const char* to_string(AllocStatus s) noexcept {
  switch (s) {
    case AllocStatus::ok: return "ok";
    case AllocStatus::out_of_memory: return "out_of_memory";
    case AllocStatus::upstream_error: return "upstream_error";
    case AllocStatus::invalid_size: return "invalid_size";
  }
  return "unknown";
}

const char* to_string(Refusal r) noexcept {
  switch (r) {
    case Refusal::none: return "none";
    case Refusal::device: return "device";
    case Refusal::limit: return "limit";
    case Refusal::budget: return "budget";
  }
  return "unknown";
}

const char* to_string(BlockState s) noexcept {
  switch (s) {
    case BlockState::active_allocated: return "active_allocated";
    case BlockState::active_pending_free: return "active_pending_free";
    case BlockState::inactive: return "inactive";
  }
  return "inactive";
}

const char* to_string(FreeStatus s) noexcept {
  switch (s) {
    case FreeStatus::ok: return "ok";
    case FreeStatus::not_owned: return "not_owned";
    case FreeStatus::double_free: return "double_free";
    case FreeStatus::interior_pointer: return "interior_pointer";
  }
  return "unknown";
}

const char* to_string(EventKind k) noexcept {
  switch (k) {
    case EventKind::allocate: return "allocate";
    case EventKind::free: return "free";
    case EventKind::allocate_failure: return "allocate_failure";
    case EventKind::segment_alloc: return "segment_alloc";
    case EventKind::segment_free: return "segment_free";
    case EventKind::segment_map: return "segment_map";
    case EventKind::segment_unmap: return "segment_unmap";
    case EventKind::oom: return "oom";
    case EventKind::gc: return "gc";
    case EventKind::empty_cache: return "empty_cache";
    case EventKind::fence_wait: return "fence_wait";
    case EventKind::gpu_wait: return "gpu_wait";
  }
  return "unknown";
}

}  // namespace cudapool
