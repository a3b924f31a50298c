// Looking up the real driver. Everything here goes through libc's own dlsym, never through the
// dlsym we export, so a lookup can never come back into the shim.
#include "shim/driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

namespace cudapool::shim {

DlsymFn real_dlsym() noexcept {
  static std::atomic<DlsymFn> cached{nullptr};
  DlsymFn fn = cached.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  // glibc 2.34 moved dlsym into libc under a new version; older systems only have 2.2.5.
  void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  fn = reinterpret_cast<DlsymFn>(p);
  cached.store(fn, std::memory_order_release);
  return fn;
}

namespace {

template <typename Fn>
void bind(void* handle, DlsymFn sym, Fn& slot, const char* name) {
  slot = reinterpret_cast<Fn>(sym(handle, name));
}

bool fill(RealDriver& d) {
  DlsymFn sym = real_dlsym();
  if (sym == nullptr) return false;
  // A copy already loaded by the program (by any path) is the one it talks to; load it ourselves
  // only when the program reaches a hook without having loaded it (a -lcuda program always has).
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen("libcuda.so.1", RTLD_LAZY);
  if (h == nullptr) return false;
  d.handle = h;
#define CUDAPOOL_BIND(name) bind(h, sym, d.name, #name)
  CUDAPOOL_BIND(cuGetProcAddress_v2);
  CUDAPOOL_BIND(cuGetProcAddress);
  CUDAPOOL_BIND(cuMemAlloc_v2);
  CUDAPOOL_BIND(cuMemAllocPitch_v2);
  CUDAPOOL_BIND(cuMemFree_v2);
  CUDAPOOL_BIND(cuMemAllocAsync);
  CUDAPOOL_BIND(cuMemAllocAsync_ptsz);
  CUDAPOOL_BIND(cuMemFreeAsync);
  CUDAPOOL_BIND(cuMemFreeAsync_ptsz);
  CUDAPOOL_BIND(cuMemGetInfo_v2);
  CUDAPOOL_BIND(cuMemGetInfo);
  CUDAPOOL_BIND(cuMemHostAlloc);
  CUDAPOOL_BIND(cuMemAllocHost_v2);
  CUDAPOOL_BIND(cuMemAllocHost);
  CUDAPOOL_BIND(cuMemFreeHost);
  CUDAPOOL_BIND(cuMemHostRegister_v2);
  CUDAPOOL_BIND(cuMemHostUnregister);
  CUDAPOOL_BIND(cuMemGetAddressRange_v2);
  CUDAPOOL_BIND(cuPointerGetAttribute);
  CUDAPOOL_BIND(cuPointerGetAttributes);
  CUDAPOOL_BIND(cuIpcGetMemHandle);
  CUDAPOOL_BIND(cuMemPoolTrimTo);
  CUDAPOOL_BIND(cuDeviceGetDefaultMemPool);
  CUDAPOOL_BIND(cuCtxGetCurrent);
  CUDAPOOL_BIND(cuCtxGetDevice);
  CUDAPOOL_BIND(cuDeviceGetCount);
  CUDAPOOL_BIND(cuDeviceCanAccessPeer);
  // The _v2 form (CUDA 11.4+) reports MIG instances' own UUIDs; the first form the GPU's.
  CUDAPOOL_BIND(cuDeviceGetUuid);
  if (void* v2 = sym(h, "cuDeviceGetUuid_v2")) d.cuDeviceGetUuid = reinterpret_cast<PFN_cuDeviceGetUuid>(v2);
  CUDAPOOL_BIND(cuCtxPushCurrent_v2);
  CUDAPOOL_BIND(cuCtxPopCurrent_v2);
  CUDAPOOL_BIND(cuCtxDestroy_v2);
  CUDAPOOL_BIND(cuCtxDestroy);
  CUDAPOOL_BIND(cuCtxEnablePeerAccess);
  CUDAPOOL_BIND(cuDevicePrimaryCtxReset_v2);
  CUDAPOOL_BIND(cuDevicePrimaryCtxReset);
  CUDAPOOL_BIND(cuDevicePrimaryCtxRetain);
  CUDAPOOL_BIND(cuDevicePrimaryCtxRelease_v2);
  CUDAPOOL_BIND(cuDevicePrimaryCtxRelease);
  CUDAPOOL_BIND(cuDevicePrimaryCtxGetState);
  CUDAPOOL_BIND(cuStreamCreate);
  CUDAPOOL_BIND(cuStreamCreateWithPriority);
  CUDAPOOL_BIND(cuStreamDestroy_v2);
  CUDAPOOL_BIND(cuStreamDestroy);
  CUDAPOOL_BIND(cuStreamIsCapturing);
  CUDAPOOL_BIND(cuStreamIsCapturing_ptsz);
  CUDAPOOL_BIND(cuStreamBeginCapture_v2);
  CUDAPOOL_BIND(cuStreamBeginCapture_v2_ptsz);
  CUDAPOOL_BIND(cuStreamBeginCapture);
  CUDAPOOL_BIND(cuStreamBeginCapture_ptsz);
  CUDAPOOL_BIND(cuStreamBeginCaptureToGraph);
  CUDAPOOL_BIND(cuStreamBeginCaptureToGraph_ptsz);
  CUDAPOOL_BIND(cuStreamEndCapture);
  CUDAPOOL_BIND(cuStreamEndCapture_ptsz);
  CUDAPOOL_BIND(cuEventCreate);
  CUDAPOOL_BIND(cuEventRecord);
  CUDAPOOL_BIND(cuEventQuery);
  CUDAPOOL_BIND(cuStreamQuery);
  CUDAPOOL_BIND(cuEventSynchronize);
  CUDAPOOL_BIND(cuEventDestroy_v2);
  CUDAPOOL_BIND(cuMemGetAllocationGranularity);
  CUDAPOOL_BIND(cuMemAddressReserve);
  CUDAPOOL_BIND(cuMemAddressFree);
  CUDAPOOL_BIND(cuMemCreate);
  CUDAPOOL_BIND(cuMemRelease);
  CUDAPOOL_BIND(cuMemMap);
  CUDAPOOL_BIND(cuMemUnmap);
  CUDAPOOL_BIND(cuMemSetAccess);
  CUDAPOOL_BIND(cuCtxSynchronize);
  CUDAPOOL_BIND(cuStreamWaitEvent);
  CUDAPOOL_BIND(cuIpcOpenMemHandle_v2);
  if (d.cuIpcOpenMemHandle_v2 == nullptr) bind(h, sym, d.cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle");  // same ABI
  CUDAPOOL_BIND(cuIpcCloseMemHandle);
  CUDAPOOL_BIND(cuMemExportToShareableHandle);
  CUDAPOOL_BIND(cuMemImportFromShareableHandle);
#undef CUDAPOOL_BIND
  // Without these the pool cannot work at all; the hooks then pass everything through.
  return d.cuMemAlloc_v2 && d.cuMemFree_v2 && d.cuCtxGetCurrent && d.cuCtxGetDevice && d.cuEventCreate &&
         d.cuEventRecord && d.cuEventQuery && d.cuEventSynchronize && d.cuMemGetInfo_v2;
}

}  // namespace

const RealDriver* real_driver() noexcept {
  static std::atomic<const RealDriver*> ready{nullptr};
  static std::mutex mu;
  const RealDriver* d = ready.load(std::memory_order_acquire);
  if (d != nullptr) return d;
  std::lock_guard<std::mutex> lock(mu);
  d = ready.load(std::memory_order_relaxed);
  if (d != nullptr) return d;
  static RealDriver table;  // never destroyed before exit: a trivially destructible aggregate
  if (!fill(table)) return nullptr;
  ready.store(&table, std::memory_order_release);
  return &table;
}

}  // namespace cudapool::shim
