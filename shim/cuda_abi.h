// The few CUDA driver types, enum values and signatures the shim needs, declared here so the
// shim builds without a CUDA toolkit (CI has none). Values are CUDA 13's cuda.h values; the test
// tests/unit/shim_abi_test.cpp compares every one of them with /usr/local/cuda/include/cuda.h
// whenever that header exists.
//
// Only declarations: this header defines no function, so the fake driver (tests/fakecuda/) and
// the shim share it without clashing.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cudaabi {

using CUresult = int;
using CUdeviceptr = unsigned long long;  // CUdeviceptr_v2 on 64-bit hosts
using CUdevice = int;
using cuuint64_t = std::uint64_t;
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUmemPoolHandle_st;
struct CUgraph_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUmemoryPool = CUmemPoolHandle_st*;
using CUgraph = CUgraph_st*;
// Only passed on by the door wrappers (shim/hooks/hooks_doors.cpp): opaque here, by pointer or handle.
struct CUfunc_st;
struct CUgraphExec_st;
struct CUarray_st;
using CUfunction = CUfunc_st*;
using CUgraphExec = CUgraphExec_st*;
using CUarray = CUarray_st*;
using CUdeviceptr_v1 = unsigned int;  // the 32-bit pointers of the legacy (before CUDA 3.2) forms
using cuuint32_t = std::uint32_t;
struct CUDA_MEMCPY2D;
struct CUDA_MEMCPY2D_v1;
struct CUDA_MEMCPY3D;
struct CUDA_MEMCPY3D_v1;
struct CUDA_MEMCPY3D_PEER;
struct CUDA_MEMCPY3D_BATCH_OP;
struct CUDA_LAUNCH_PARAMS;
struct CUlaunchConfig;
struct CUmemcpyAttributes;
union CUstreamBatchMemOpParams;

inline constexpr std::size_t kIpcHandleSize = 64;  // CU_IPC_HANDLE_SIZE
struct CUipcMemHandle {
  char reserved[kIpcHandleSize];
};

// CUresult values.
inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;
inline constexpr CUresult CUDA_ERROR_CONTEXT_IS_DESTROYED = 709;
inline constexpr CUresult CUDA_ERROR_NOT_PERMITTED = 800;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
inline constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900;

// Special stream handles.
inline const CUstream CU_STREAM_LEGACY = reinterpret_cast<CUstream>(0x1);
inline const CUstream CU_STREAM_PER_THREAD = reinterpret_cast<CUstream>(0x2);
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;

// cuGetProcAddress flags and results.
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_DEFAULT = 0;
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0;
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1;
using CUdriverProcAddressQueryResult = int;
inline constexpr int CU_GET_PROC_ADDRESS_SUCCESS = 0;
inline constexpr int CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1;
inline constexpr int CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2;

// Stream capture.
using CUstreamCaptureStatus = int;
inline constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
inline constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
inline constexpr int CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;
using CUstreamCaptureMode = int;
inline constexpr int CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
inline constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
inline constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;

// Pointer attributes.
using CUpointer_attribute = int;
inline constexpr int CU_POINTER_ATTRIBUTE_CONTEXT = 1;
inline constexpr int CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;
inline constexpr int CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3;
inline constexpr int CU_POINTER_ATTRIBUTE_IS_MANAGED = 8;
inline constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
inline constexpr int CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10;
inline constexpr int CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11;
inline constexpr int CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12;
inline constexpr int CU_POINTER_ATTRIBUTE_MAPPED = 13;
inline constexpr int CU_MEMORYTYPE_DEVICE = 0x2;

// Virtual memory management (expandable segments). Layouts are cuda.h's CUmemLocation,
// CUmemAllocationProp and CUmemAccessDesc (checked field by field in shim_abi_test.cpp).
using CUmemGenericAllocationHandle = unsigned long long;
inline constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 0x1;
inline constexpr int CU_MEM_HANDLE_TYPE_NONE = 0x0;
inline constexpr int CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1;
inline constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 0x1;
inline constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3;
inline constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0;
inline constexpr int CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1;
using CUmemRangeHandleType = int;  // cuMemGetHandleForAddressRange's handle kind
inline constexpr int CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1;
struct CUmemLocation {
  int type;  // CUmemLocationType
  int id;    // device ordinal for CU_MEM_LOCATION_TYPE_DEVICE
};
struct CUmemAllocationProp {
  int type;                  // CUmemAllocationType
  int requestedHandleTypes;  // CUmemAllocationHandleType
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;  // CUmemAccess_flags
};

// Driver entry points the shim calls or replaces (the _v2 / _ptsz names are the ABI symbols).
using PFN_cuGetProcAddress_v2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using PFN_cuGetProcAddress_v1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using PFN_cuMemAlloc_v2 = CUresult (*)(CUdeviceptr*, std::size_t);
using PFN_cuMemAllocPitch_v2 = CUresult (*)(CUdeviceptr*, std::size_t*, std::size_t, std::size_t, unsigned);
using PFN_cuMemFree_v2 = CUresult (*)(CUdeviceptr);
using PFN_cuMemAllocAsync = CUresult (*)(CUdeviceptr*, std::size_t, CUstream);
using PFN_cuMemFreeAsync = CUresult (*)(CUdeviceptr, CUstream);
using PFN_cuMemGetInfo_v2 = CUresult (*)(std::size_t*, std::size_t*);
// CUDA before 3.2 (cuGetProcAddress below version 3020 still hands it out): 32-bit figures.
using PFN_cuMemGetInfo_v1 = CUresult (*)(unsigned*, unsigned*);
// Page-locked host memory (cudaHostAlloc, cudaMallocHost, cudaFreeHost; cudaHostRegister).
using PFN_cuMemHostAlloc = CUresult (*)(void**, std::size_t, unsigned);
using PFN_cuMemAllocHost_v2 = CUresult (*)(void**, std::size_t);
using PFN_cuMemAllocHost_v1 = CUresult (*)(void**, unsigned);
using PFN_cuMemFreeHost = CUresult (*)(void*);
using PFN_cuMemHostRegister_v2 = CUresult (*)(void*, std::size_t, unsigned);
using PFN_cuMemHostUnregister = CUresult (*)(void*);
using PFN_cuMemGetAddressRange_v2 = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
using PFN_cuPointerGetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
using PFN_cuPointerGetAttributes = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
using PFN_cuIpcGetMemHandle = CUresult (*)(CUipcMemHandle*, CUdeviceptr);
using PFN_cuMemPoolTrimTo = CUresult (*)(CUmemoryPool, std::size_t);
using PFN_cuDeviceGetDefaultMemPool = CUresult (*)(CUmemoryPool*, CUdevice);
using PFN_cuCtxGetCurrent = CUresult (*)(CUcontext*);
using PFN_cuCtxGetDevice = CUresult (*)(CUdevice*);
using PFN_cuDeviceGetCount = CUresult (*)(int*);
struct CUuuid {
  char bytes[16];
};
using PFN_cuDeviceGetUuid = CUresult (*)(CUuuid*, CUdevice);
using PFN_cuDeviceCanAccessPeer = CUresult (*)(int*, CUdevice, CUdevice);
using PFN_cuCtxPushCurrent_v2 = CUresult (*)(CUcontext);
using PFN_cuCtxPopCurrent_v2 = CUresult (*)(CUcontext*);
using PFN_cuCtxDestroy_v2 = CUresult (*)(CUcontext);
using PFN_cuCtxEnablePeerAccess = CUresult (*)(CUcontext, unsigned);
using PFN_cuDevicePrimaryCtxReset_v2 = CUresult (*)(CUdevice);
using PFN_cuDevicePrimaryCtxRetain = CUresult (*)(CUcontext*, CUdevice);
using PFN_cuDevicePrimaryCtxRelease_v2 = CUresult (*)(CUdevice);
using PFN_cuDevicePrimaryCtxGetState = CUresult (*)(CUdevice, unsigned*, int*);
using PFN_cuStreamCreate = CUresult (*)(CUstream*, unsigned);
using PFN_cuStreamCreateWithPriority = CUresult (*)(CUstream*, unsigned, int);
using PFN_cuStreamDestroy_v2 = CUresult (*)(CUstream);
using PFN_cuStreamIsCapturing = CUresult (*)(CUstream, CUstreamCaptureStatus*);
using PFN_cuStreamBeginCapture_v2 = CUresult (*)(CUstream, CUstreamCaptureMode);
using PFN_cuStreamBeginCapture_v1 = CUresult (*)(CUstream);
using PFN_cuStreamEndCapture = CUresult (*)(CUstream, CUgraph*);
// CUDA 12.3: capture into an existing graph. Node and edge arrays are only passed on.
using PFN_cuStreamBeginCaptureToGraph = CUresult (*)(CUstream, CUgraph, const void* /*CUgraphNode**/,
                                                     const void* /*CUgraphEdgeData**/, std::size_t,
                                                     CUstreamCaptureMode);
using PFN_cuEventCreate = CUresult (*)(CUevent*, unsigned);
using PFN_cuEventRecord = CUresult (*)(CUevent, CUstream);
using PFN_cuEventQuery = CUresult (*)(CUevent);
using PFN_cuStreamQuery = CUresult (*)(CUstream);
using PFN_cuEventSynchronize = CUresult (*)(CUevent);
using PFN_cuEventDestroy_v2 = CUresult (*)(CUevent);
using PFN_cuCtxSynchronize = CUresult (*)();
using PFN_cuStreamWaitEvent = CUresult (*)(CUstream, CUevent, unsigned);
using PFN_cuMemGetAllocationGranularity = CUresult (*)(std::size_t*, const CUmemAllocationProp*, int);
using PFN_cuMemAddressReserve = CUresult (*)(CUdeviceptr*, std::size_t, std::size_t, CUdeviceptr, unsigned long long);
using PFN_cuMemAddressFree = CUresult (*)(CUdeviceptr, std::size_t);
using PFN_cuMemCreate = CUresult (*)(CUmemGenericAllocationHandle*, std::size_t, const CUmemAllocationProp*,
                                     unsigned long long);
using PFN_cuMemRelease = CUresult (*)(CUmemGenericAllocationHandle);
using PFN_cuMemMap = CUresult (*)(CUdeviceptr, std::size_t, std::size_t, CUmemGenericAllocationHandle,
                                  unsigned long long);
using PFN_cuMemUnmap = CUresult (*)(CUdeviceptr, std::size_t);
using PFN_cuMemSetAccess = CUresult (*)(CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t);
// CUDA IPC: legacy handles, and the shareable handles of VMM pages (a file descriptor on Linux,
// passed as a pointer-sized value through void*).
using PFN_cuIpcOpenMemHandle_v2 = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned);
using PFN_cuIpcCloseMemHandle = CUresult (*)(CUdeviceptr);
using PFN_cuMemExportToShareableHandle = CUresult (*)(void*, CUmemGenericAllocationHandle, int, unsigned long long);
using PFN_cuMemImportFromShareableHandle = CUresult (*)(CUmemGenericAllocationHandle*, void*, int);

}  // namespace cudaabi
