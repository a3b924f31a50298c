// Queries the program makes about memory, answered so the pool stays invisible: free memory
// counts cached bytes, address ranges and IPC handles are per block, and trimming the default
// memory pool empties ours.
#include <algorithm>
#include <cstring>

#include "shim/group/group.h"
#include "shim/hooks/hooked.h"
#include "shim/hooks/hooks.h"
#include "shim/ipc/ipc.h"
#include "shim/log.h"
#include "shim/parking/parking.h"

namespace cudapool::shim {
namespace {

// The live block containing `p`, with its pool, for the query hooks; nullopt when the pool does
// not own the address (or the runtime has not started: then nothing can be ours).
struct Owned {
  ContextPool* pool = nullptr;
  std::optional<AddressInfo> info;
};

Owned lookup(Runtime* rt, CUdeviceptr dptr) {
  Owned o;
  if (rt == nullptr || dptr == 0) return o;
  const void* p = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(dptr));
  o.pool = rt->owner_of(p);
  if (o.pool != nullptr) o.info = o.pool->pool.address_info(p);
  return o;
}

// The block imported from another process (CUDA IPC) containing `dptr`, described as a live
// block of that size; nullopt for any other address.
std::optional<AddressInfo> imported_info(CUdeviceptr dptr) {
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (!ipc::imported_block(dptr, &base, &size)) return std::nullopt;
  AddressInfo a;
  a.block_base = base;
  a.block_size = size;
  return a;  // not a whole segment of this process: not legacy-IPC capable
}

// Overrides one attribute answer for a live pool block. false = leave the driver's answer.
// `imported`: the block was opened from another process (CUDA IPC), not allocated here.
bool answer_attribute(CUpointer_attribute attr, const AddressInfo& info, void* data, bool imported) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = info.block_base; return true;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<std::size_t*>(data) = info.block_size; return true;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      // Every pool block exports (shim/ipc/ipc.h); a classic segment is a cudaMalloc allocation, so
      // the driver's answer for it holds; an imported block cannot be exported again.
      if (!imported && !info.expandable) return false;
      *static_cast<int*>(data) = imported ? 0 : 1;
      return true;
    default: return false;
  }
}

// What cuMemGetInfo reports for the calling thread's current context: the driver's figures with
// the pools' cache counted as free and, under a cap, the cap as the total. The answer holds from
// the first call in a context, whatever made it (a primary context retained by the program or
// by cudart, cuCtxCreate) and before anything was allocated: the caps come from the policy and
// the group's ledger, not from a pool, so this call starts the runtime (it is a CUDA call, and
// programs size themselves from it before their first allocation) and joins the group, but
// creates no pool.
CUresult mem_info(const RealDriver& d, std::size_t* free_out, std::size_t* total_out) {
  // NULL out-pointers are legal (OptiX asks for the total only): never hand them to a pool path.
  std::size_t f = 0, t = 0;
  CUresult r = d.cuMemGetInfo_v2(&f, &t);
  if (r != CUDA_SUCCESS) return r;
  Runtime* rt = Runtime::exiting() ? Runtime::peek() : Runtime::get();
  CUcontext ctx = nullptr;
  CUdevice dev = -1;
  if (rt != nullptr && rt->native() && d.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr &&
      d.cuCtxGetDevice(&dev) == CUDA_SUCCESS) {
    // Every pool of this device holds memory the program may still get from us.
    std::size_t cached = 0, reserved = 0;
    rt->for_each_pool([&](ContextPool& cp) {
      if (cp.device != dev) return;
      cached += cp.pool.cached_bytes();
      reserved += static_cast<std::size_t>(cp.pool.stats().reserved_bytes[cudapool::kAll].current);
      reserved += cp.pool.external_bytes();  // what the program mapped itself (hooks_vmm.cpp)
    });
    f += cached;
    // A cap (max_reserved_mb, per_process_memory_fraction) is what the program may have: report
    // it as the total, and as free what it could still get under it, so that programs that size
    // themselves from this call (JAX's preallocation, vLLM, batch-size probes) fit the cap.
    const cudapool::PoolOptions& po = rt->policy().pool;
    std::size_t cap = po.max_reserved;
    if (po.per_process_memory_fraction > 0.0) {
      const auto by_fraction = static_cast<std::size_t>(po.per_process_memory_fraction * static_cast<double>(t));
      cap = std::min(cap, by_fraction);
    }
    // A group budget: the program may have what the group has not reserved, plus its own cache.
    // The member is the device's (joined here if no pool has joined yet; the same one the pools
    // are gated by), so the budget shows before the first allocation too.
    std::size_t group_room = SIZE_MAX;
    if (group::Member* m = group::member_for(rt->policy(), rt->driver(), dev, t)) {
      const std::size_t b = group::budget(*m);
      if (b != 0) {  // 0: left the group
        const std::size_t used = group::group_reserved(*m);
        cap = std::min(cap, b);
        group_room = used < b ? b - used : 0;
      }
    }
    if (cap < t) {
      t = cap;
      const std::size_t room = std::min(reserved < cap ? cap - reserved : 0, group_room);
      f = std::min(f, room + cached);
    }
    if (f > t) f = t;
  }
  if (free_out != nullptr) *free_out = f;
  if (total_out != nullptr) *total_out = t;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace cudapool::shim

using namespace cudapool::shim;

CUDAPOOL_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free_bytes, std::size_t* total_bytes) {
  const RealDriver* d = real_driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return mem_info(*d, free_bytes, total_bytes);
}

// CUDA 3.1's form, 32-bit figures (cuGetProcAddress hands it out below version 3020): the
// driver's own answer (its errors, its treatment of devices above 4 GiB), lowered to the capped
// figures where those are smaller.
CUDAPOOL_EXPORT CUresult cuMemGetInfo(unsigned* free_bytes, unsigned* total_bytes) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuMemGetInfo == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  unsigned f32 = 0, t32 = 0;
  const CUresult r = d->cuMemGetInfo(&f32, &t32);
  if (r != CUDA_SUCCESS) return r;
  std::size_t f = 0, t = 0;
  if (mem_info(*d, &f, &t) == CUDA_SUCCESS) {
    f32 = static_cast<unsigned>(std::min<std::size_t>(f32, f));
    t32 = static_cast<unsigned>(std::min<std::size_t>(t32, t));
  }
  if (free_bytes != nullptr) *free_bytes = f32;
  if (total_bytes != nullptr) *total_bytes = t32;
  return CUDA_SUCCESS;
}

CUDAPOOL_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, std::size_t* psize, CUdeviceptr dptr) {
  const RealDriver* d = real_driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  Owned o = lookup(Runtime::peek(), dptr);
  if (o.pool == nullptr) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    if (!ipc::imported_block(dptr, &base, &size)) return d->cuMemGetAddressRange_v2(pbase, psize, dptr);
    if (pbase != nullptr) *pbase = base;  // a block imported from another process: its own range
    if (psize != nullptr) *psize = size;
    return CUDA_SUCCESS;
  }
  // Inside a segment but in no live block: as for memory that was freed.
  if (!o.info) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = o.info->block_base;
  if (psize != nullptr) *psize = o.info->block_size;
  return CUDA_SUCCESS;
}

CUDAPOOL_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr dptr) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuPointerGetAttribute == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (data != nullptr) {
    Owned o = lookup(Runtime::peek(), dptr);
    if (o.pool == nullptr) o.info = imported_info(dptr);
    if (o.info && answer_attribute(attr, *o.info, data, o.pool == nullptr)) return CUDA_SUCCESS;
  }
  return d->cuPointerGetAttribute(data, attr, dptr);
}

CUDAPOOL_EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute* attrs, void** data, CUdeviceptr dptr) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuPointerGetAttributes == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuPointerGetAttributes(n, attrs, data, dptr);
  if (r != CUDA_SUCCESS || attrs == nullptr || data == nullptr) return r;
  Owned o = lookup(Runtime::peek(), dptr);
  if (o.pool == nullptr) o.info = imported_info(dptr);
  if (!o.info) return r;
  for (unsigned i = 0; i < n; ++i) {
    if (data[i] != nullptr) answer_attribute(attrs[i], *o.info, data[i], o.pool == nullptr);
  }
  return r;
}

// CUDA IPC (shim/ipc/ipc.h): any live pool block exports a handle of the shim's, which another
// process running the shim opens to exactly that block; everything else is the driver's.
CUDAPOOL_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuIpcGetMemHandle == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  park::Door door;  // a park sees the export, or the export waits for the restore
  if (door.result() != 0) return door.result();
  Owned o = lookup(Runtime::peek(), dptr);
  if (o.pool == nullptr) return d->cuIpcGetMemHandle(handle, dptr);
  return ipc::export_block(*o.pool, dptr, handle);
}

// A dma-buf of a range, or the allocation handle behind an address: for pool memory, the pages go
// to a holder that would not see a restore's new pages, so the process is never parked from then
// on (the door first: an export of a parked range restores it, and a park in progress sees it).
CUDAPOOL_EXPORT CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, std::size_t size,
                                                       CUmemRangeHandleType type, unsigned long long flags) {
  const RealDriver* d = real_driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (d->cuMemGetHandleForAddressRange == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  park::Door door;
  if (door.result() != 0) return door.result();
  const CUresult r = d->cuMemGetHandleForAddressRange(handle, dptr, size, type, flags);
  if (r == CUDA_SUCCESS && lookup(Runtime::peek(), dptr).pool != nullptr)
    park::note_never_park("a range of pool memory was exported as a dma-buf (cuMemGetHandleForAddressRange)");
  return r;
}

CUDAPOOL_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  const RealDriver* d = real_driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (d->cuMemRetainAllocationHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  park::Door door;
  if (door.result() != 0) return door.result();
  const CUresult r = d->cuMemRetainAllocationHandle(handle, addr);
  if (r == CUDA_SUCCESS && lookup(Runtime::peek(), reinterpret_cast<CUdeviceptr>(addr)).pool != nullptr)
    park::note_never_park("the allocation handle of pool memory was taken (cuMemRetainAllocationHandle)");
  return r;
}

namespace {
CUresult ipc_open(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned flags) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->ipc_open_mem_handle() == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = ipc::open(*d, pdptr, handle, flags);
  return r == kPassThrough ? d->ipc_open_mem_handle()(pdptr, handle, flags) : r;
}
}  // namespace

CUDAPOOL_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned flags) {
  return ipc_open(pdptr, handle, flags);
}
// The pre-11.0 symbol: same arguments and meaning.
CUDAPOOL_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned flags) {
  return ipc_open(pdptr, handle, flags);
}

CUDAPOOL_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuIpcCloseMemHandle == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = ipc::close(*d, dptr);
  return r == kPassThrough ? d->cuIpcCloseMemHandle(dptr) : r;
}

CUDAPOOL_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool mem_pool, std::size_t min_bytes_to_keep) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuMemPoolTrimTo == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuMemPoolTrimTo(mem_pool, min_bytes_to_keep);
  Runtime* rt = Runtime::peek();
  if (r != CUDA_SUCCESS || rt == nullptr || !rt->native() || d->cuDeviceGetDefaultMemPool == nullptr) return r;
  // Trimming a device's default pool is how cudart-level code says "give memory back": do the
  // same for ours on that device.
  rt->for_each_pool([&](ContextPool& cp) {
    CUmemoryPool def = nullptr;
    if (d->cuDeviceGetDefaultMemPool(&def, cp.device) == CUDA_SUCCESS && def == mem_pool) {
      std::size_t freed = cp.pool.empty_cache();
      log_info("cuMemPoolTrimTo on device {}'s default pool: released {} cached bytes", cp.device, freed);
    }
  });
  return r;
}
