// The REAL driver: function pointers looked up once in libcuda.so.1 itself (never through our own
// exported wrappers), so the pool's upstream and fences can never re-enter the shim.
#pragma once
#include "shim/cuda_abi.h"

namespace cudapool::shim {

using namespace cudaabi;

struct RealDriver {
  void* handle = nullptr;  // libcuda.so.1
  PFN_cuGetProcAddress_v2 cuGetProcAddress_v2 = nullptr;
  PFN_cuGetProcAddress_v1 cuGetProcAddress = nullptr;
  PFN_cuMemAlloc_v2 cuMemAlloc_v2 = nullptr;
  PFN_cuMemAllocPitch_v2 cuMemAllocPitch_v2 = nullptr;
  PFN_cuMemFree_v2 cuMemFree_v2 = nullptr;
  PFN_cuMemAllocAsync cuMemAllocAsync = nullptr;
  PFN_cuMemAllocAsync cuMemAllocAsync_ptsz = nullptr;
  PFN_cuMemFreeAsync cuMemFreeAsync = nullptr;
  PFN_cuMemFreeAsync cuMemFreeAsync_ptsz = nullptr;
  PFN_cuMemGetInfo_v2 cuMemGetInfo_v2 = nullptr;
  PFN_cuMemGetInfo_v1 cuMemGetInfo = nullptr;  // v1 (CUDA < 3.2): 32-bit figures
  // Pinned host memory (shim/hooks_host.cpp); absent: the hooks answer "not initialized".
  PFN_cuMemHostAlloc cuMemHostAlloc = nullptr;
  PFN_cuMemAllocHost_v2 cuMemAllocHost_v2 = nullptr;
  PFN_cuMemAllocHost_v1 cuMemAllocHost = nullptr;  // v1 (CUDA < 3.2): 32-bit size
  PFN_cuMemFreeHost cuMemFreeHost = nullptr;
  PFN_cuMemHostRegister_v2 cuMemHostRegister_v2 = nullptr;  // pinned_use_cuda_host_register
  PFN_cuMemHostUnregister cuMemHostUnregister = nullptr;
  PFN_cuMemGetAddressRange_v2 cuMemGetAddressRange_v2 = nullptr;
  PFN_cuPointerGetAttribute cuPointerGetAttribute = nullptr;
  PFN_cuPointerGetAttributes cuPointerGetAttributes = nullptr;
  PFN_cuIpcGetMemHandle cuIpcGetMemHandle = nullptr;
  PFN_cuIpcOpenMemHandle_v2 cuIpcOpenMemHandle_v2 = nullptr;  // "cuIpcOpenMemHandle" on drivers before 11.0
  PFN_cuIpcCloseMemHandle cuIpcCloseMemHandle = nullptr;
  // Pages of expandable segments shared with other processes (shim/ipc_*.cpp); absent: no sharing.
  PFN_cuMemExportToShareableHandle cuMemExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle cuMemImportFromShareableHandle = nullptr;
  PFN_cuMemPoolTrimTo cuMemPoolTrimTo = nullptr;
  PFN_cuDeviceGetDefaultMemPool cuDeviceGetDefaultMemPool = nullptr;
  PFN_cuCtxGetCurrent cuCtxGetCurrent = nullptr;
  PFN_cuCtxGetDevice cuCtxGetDevice = nullptr;
  PFN_cuDeviceGetCount cuDeviceGetCount = nullptr;  // expandable_peer_access
  PFN_cuDeviceCanAccessPeer cuDeviceCanAccessPeer = nullptr;
  PFN_cuDeviceGetUuid cuDeviceGetUuid = nullptr;  // names the group ledger's GPU; absent: the ordinal
  PFN_cuCtxPushCurrent_v2 cuCtxPushCurrent_v2 = nullptr;
  PFN_cuCtxPopCurrent_v2 cuCtxPopCurrent_v2 = nullptr;
  PFN_cuCtxDestroy_v2 cuCtxDestroy_v2 = nullptr;
  PFN_cuCtxDestroy_v2 cuCtxDestroy = nullptr;  // v1 (CUDA < 4.0), same signature
  PFN_cuCtxEnablePeerAccess cuCtxEnablePeerAccess = nullptr;
  PFN_cuDevicePrimaryCtxReset_v2 cuDevicePrimaryCtxReset_v2 = nullptr;
  PFN_cuDevicePrimaryCtxReset_v2 cuDevicePrimaryCtxReset = nullptr;  // v1: cudart 13 still asks for 7000
  PFN_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v2 cuDevicePrimaryCtxRelease_v2 = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v2 cuDevicePrimaryCtxRelease = nullptr;  // v1, same signature
  PFN_cuDevicePrimaryCtxGetState cuDevicePrimaryCtxGetState = nullptr;
  PFN_cuStreamCreate cuStreamCreate = nullptr;
  PFN_cuStreamCreateWithPriority cuStreamCreateWithPriority = nullptr;
  PFN_cuStreamDestroy_v2 cuStreamDestroy_v2 = nullptr;
  PFN_cuStreamDestroy_v2 cuStreamDestroy = nullptr;  // v1, same signature
  PFN_cuStreamIsCapturing cuStreamIsCapturing = nullptr;
  PFN_cuStreamIsCapturing cuStreamIsCapturing_ptsz = nullptr;
  PFN_cuStreamBeginCapture_v2 cuStreamBeginCapture_v2 = nullptr;
  PFN_cuStreamBeginCapture_v2 cuStreamBeginCapture_v2_ptsz = nullptr;
  PFN_cuStreamBeginCapture_v1 cuStreamBeginCapture = nullptr;  // CUDA 10.0: no mode (global)
  PFN_cuStreamBeginCapture_v1 cuStreamBeginCapture_ptsz = nullptr;
  PFN_cuStreamBeginCaptureToGraph cuStreamBeginCaptureToGraph = nullptr;  // CUDA 12.3+
  PFN_cuStreamBeginCaptureToGraph cuStreamBeginCaptureToGraph_ptsz = nullptr;
  PFN_cuStreamEndCapture cuStreamEndCapture = nullptr;
  PFN_cuStreamEndCapture cuStreamEndCapture_ptsz = nullptr;
  PFN_cuEventCreate cuEventCreate = nullptr;
  PFN_cuEventRecord cuEventRecord = nullptr;
  PFN_cuEventQuery cuEventQuery = nullptr;
  // Lazy fence coverage of non-blocking streams (cuda_fences.h); absent: an event on each instead.
  PFN_cuStreamQuery cuStreamQuery = nullptr;
  PFN_cuEventSynchronize cuEventSynchronize = nullptr;
  PFN_cuEventDestroy_v2 cuEventDestroy_v2 = nullptr;
  PFN_cuStreamWaitEvent cuStreamWaitEvent = nullptr;  // GPU-side waits (free_sync:gpu_wait); absent: none
  // Virtual memory management, for expandable segments (shim/cuda_upstream_vmm.cpp). Any of them
  // missing (driver older than CUDA 10.2) turns expandable segments off.
  PFN_cuMemGetAllocationGranularity cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemAddressReserve cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree cuMemAddressFree = nullptr;
  PFN_cuMemCreate cuMemCreate = nullptr;
  PFN_cuMemRelease cuMemRelease = nullptr;
  PFN_cuMemMap cuMemMap = nullptr;
  PFN_cuMemUnmap cuMemUnmap = nullptr;
  PFN_cuMemSetAccess cuMemSetAccess = nullptr;
  PFN_cuCtxSynchronize cuCtxSynchronize = nullptr;  // before pages of a dying context go back

  bool has_vmm() const noexcept {
    return cuMemGetAllocationGranularity && cuMemAddressReserve && cuMemAddressFree && cuMemCreate && cuMemRelease &&
           cuMemMap && cuMemUnmap && cuMemSetAccess;
  }
};

// The table, filled on first use (dlopen of libcuda.so.1, preferring an already loaded copy).
// Returns nullptr while libcuda cannot be loaded. Cheap after the first call (one atomic load).
const RealDriver* real_driver() noexcept;

// The real dlsym of libc (dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"), else "GLIBC_2.2.5").
using DlsymFn = void* (*)(void*, const char*);
DlsymFn real_dlsym() noexcept;

}  // namespace cudapool::shim
