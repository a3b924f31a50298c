// cuMemCreate / cuMemRelease called by the program itself (XLA's allocator, PyTorch's own
// expandable segments): device memory the pool never sees, which would otherwise slip past a
// cap. While a cap applies (max_reserved_mb, per_process_memory_fraction, a group
// budget), such an allocation is counted against it as if the pool had reserved it: first the
// pool's limit (its own idle cache is given back to make room), then the group's ledger (the
// other members are asked for idle memory as for the pool's own growth). Refused, the program
// gets CUDA_ERROR_OUT_OF_MEMORY and nothing is created. The bytes count until cuMemRelease of the
// handle (the driver frees the memory once it is also unmapped, so this may count it a little
// early). Without a cap, both calls go to the driver untouched. The pool's own pages never come
// through here: its upstream calls the driver directly.
#include <pthread.h>

#include <mutex>
#include <new>
#include <unordered_map>

#include "shim/group/group.h"
#include "shim/hooks/hooked.h"
#include "shim/hooks/hooks.h"
#include "shim/log.h"
#include "telemetry/share.h"

namespace cudapool::shim {

namespace {

struct Counted {
  ContextPool* pool;
  std::size_t bytes;
  bool gated;  // also taken from the group's ledger
};

struct Registry {
  std::mutex mu;
  std::unordered_map<CUmemGenericAllocationHandle, Counted> handles;
  std::atomic<std::size_t> count{0};  // handles.size(), read without the lock
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: hooks may run during exit
  return *r;
}

void forget_in_child() noexcept {
  // The parent's handles are not the child's; the lock may have been held at fork.
  Registry& reg = registry();
  new (&reg.mu) std::mutex;
  reg.handles.clear();
  reg.count.store(0, std::memory_order_relaxed);
}

bool caps_apply(const Policy& p) {
  return p.pool.max_reserved != kNoLimit || p.pool.per_process_memory_fraction > 0.0 || !p.group.empty();
}

void uncount(const Counted& c) {
  c.pool->pool.unreserve_external(c.bytes);
  if (c.gated && c.pool->member != nullptr) group::gate_of(c.pool->member)->release(c.bytes);
}

CUresult refuse(const ContextPool& cp, std::size_t bytes, const char* by) {
  group::note_oom(cp.device);
  log_warn("cuMemCreate of {} bytes on device {} refused: {} (memory the program maps itself counts against it)", bytes,
           cp.device, by);
  return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult create_counted(const RealDriver& d, ContextPool& cp, CUmemGenericAllocationHandle* handle, std::size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags) {
  if (!cp.pool.reserve_external(size)) return refuse(cp, size, "it would pass the pool's cap");
  bool gated = false;
  if (cp.member != nullptr) {
    ReserveGate* gate = group::gate_of(cp.member);
    if (!gate->acquire(size)) {
      cp.pool.release_idle(size);  // this process's own idle cache first
      bool ok = gate->acquire(size);
      const std::int64_t start = share::monotonic_ns();
      for (int round = 0; !ok && group::ask_release(*cp.member, start, round, size); ++round) ok = gate->acquire(size);
      if (!ok) {
        cp.pool.unreserve_external(size);
        return refuse(cp, size, "it would pass the group's budget");
      }
    }
    gated = true;
  }
  const CUresult r = d.cuMemCreate(handle, size, prop, flags);
  const Counted c{&cp, size, gated};
  if (r != CUDA_SUCCESS) {
    uncount(c);
    return r;
  }
  Registry& reg = registry();
  // A forked child forgets the parent's handles: registered with the first one counted (before
  // it, there is nothing to forget).
  static std::once_flag fork_handler;
  std::call_once(fork_handler, [] { pthread_atfork(nullptr, nullptr, &forget_in_child); });
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.handles[*handle] = c;
  reg.count.store(reg.handles.size(), std::memory_order_relaxed);
  return r;
}

}  // namespace

}  // namespace cudapool::shim

using namespace cudapool::shim;

CUDAPOOL_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const RealDriver& d = rt->driver();
  if (d.cuMemCreate == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!rt->native() || !caps_apply(rt->policy()) || handle == nullptr || prop == nullptr || size == 0 ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || Runtime::exiting())
    return d.cuMemCreate(handle, size, prop, flags);
  ContextPool* cp = rt->current_pool();
  // Memory for another device than the current context's: that device's cap is not known here.
  if (cp == nullptr || cp->device != prop->location.id) return d.cuMemCreate(handle, size, prop, flags);
  return create_counted(d, *cp, handle, size, prop, flags);
}

CUDAPOOL_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const RealDriver& d = rt->driver();
  if (d.cuMemRelease == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = d.cuMemRelease(handle);
  Registry& reg = registry();
  if (r != CUDA_SUCCESS || reg.count.load(std::memory_order_relaxed) == 0) return r;
  Counted c{};
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    auto it = reg.handles.find(handle);
    if (it == reg.handles.end()) return r;
    c = it->second;
    reg.handles.erase(it);
    reg.count.store(reg.handles.size(), std::memory_order_relaxed);
  }
  uncount(c);
  return r;
}
