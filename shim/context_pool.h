// One CUDA context's pool and what it is built on: the context, its upstream (memory), its fences
// (stream safety) and the pool. The runtime creates one per context and never destroys it (no
// CUDA at exit); the layers below the runtime (parking, the group, warm start) are handed these.
#pragma once
#include <atomic>
#include <cstddef>

#include "allocator/pool.h"
#include "shim/fences/cuda_fences.h"
#include "shim/upstream/cuda_upstream.h"

namespace cudapool::shim {

namespace group {
class Member;
}

struct ContextPool {
  ContextPool(const RealDriver& d, CUcontext c, int dev, const PoolOptions& o, EventSink* sink)
      : ctx(c), device(dev), upstream(d, c), fences(d, c), pool(dev, o, upstream, fences, sink) {}
  const CUcontext ctx;
  const int device;
  std::size_t driver_total = 0;     // taken at creation, for the exit summary (no CUDA at exit)
  group::Member* member = nullptr;  // the device's group ledger slot (shim/group/group.h), or none
  CudaUpstream upstream;
  CudaFences fences;
  DevicePool pool;
  // The context was destroyed/reset: the pool was abandoned and is no longer found by lookups.
  std::atomic<bool> retired{false};
  // warm_start: the plan is still to be preallocated, before the pool's next allocation
  // (shim/warm_start/warm_start.h).
  std::atomic<bool> warm_pending{false};
};

}  // namespace cudapool::shim
