// The REAL driver: function pointers looked up once in libcuda.so.1 itself (never through our own
// exported wrappers), so the pool's upstream and fences can never re-enter the shim. The table is
// made from the one list of entry points, shim/entry_points.def.
#pragma once
#include <atomic>

#include "shim/cuda_abi.h"

namespace cudapool::shim {

using namespace cudaabi;

// One field per row of shim/entry_points.def, named as the row's entry point and typed by its
// parameters; null where the driver lacks the name.
struct RealDriver {
  void* handle = nullptr;  // libcuda.so.1
#define CUDAPOOL_HOOK(base, min_version, max_version, flavour, abi, params) CUresult(*abi) params = nullptr;
#define CUDAPOOL_CALLED(abi, params) CUresult(*abi) params = nullptr;
#include "shim/entry_points.def"

  // cuIpcOpenMemHandle_v2, or on drivers before CUDA 11.0 its first form (the same ABI).
  auto ipc_open_mem_handle() const noexcept {
    return cuIpcOpenMemHandle_v2 != nullptr ? cuIpcOpenMemHandle_v2 : cuIpcOpenMemHandle;
  }
  // cuDeviceGetUuid_v2 (MIG instances' own UUIDs), else the first form.
  auto device_get_uuid() const noexcept { return cuDeviceGetUuid_v2 != nullptr ? cuDeviceGetUuid_v2 : cuDeviceGetUuid; }

  bool has_vmm() const noexcept {
    return cuMemGetAllocationGranularity && cuMemAddressReserve && cuMemAddressFree && cuMemCreate && cuMemRelease &&
           cuMemMap && cuMemUnmap && cuMemSetAccess;
  }
};

// The table, filled on first use (dlopen of libcuda.so.1, preferring an already loaded copy).
// Returns nullptr while libcuda cannot be loaded. Cheap after the first call (one atomic load).
const RealDriver* real_driver() noexcept;
namespace detail {
extern std::atomic<const RealDriver*> g_real_driver;  // set once by real_driver()
}
// real_driver() with its fast path inlined (the door wrappers: one load per call).
inline const RealDriver* real_driver_inline() noexcept {
  const RealDriver* d = detail::g_real_driver.load(std::memory_order_acquire);
  return d != nullptr ? d : real_driver();
}

// The real dlsym of libc (dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"), else "GLIBC_2.2.5").
using DlsymFn = void* (*)(void*, const char*);
DlsymFn real_dlsym() noexcept;

}  // namespace cudapool::shim
