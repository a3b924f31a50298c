// What the fake-driver test programs share: the check that ends a scenario on the first failure
// ("FAIL file:line: expr", exit status 1) and, for the programs linked with -lcuda (vmm_app,
// ipc_app), the driver entry points they call and the usual start on a primary context.
#pragma once
#include <cstdio>
#include <cstdlib>

#include "shim/cuda_abi.h"

#define CHECK(expr)                                               \
  do {                                                            \
    if (!(expr)) {                                                \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #expr); \
      std::fflush(stdout);                                        \
      std::_Exit(1);                                              \
    }                                                             \
  } while (0)
#define CHECK_OK(call) CHECK((call) == cudaabi::CUDA_SUCCESS)

#ifdef CUDAPOOL_TEST_APP_LCUDA
using namespace cudaabi;  // what every such program does anyway: the ABI's names, unqualified
extern "C" {
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxEnablePeerAccess(CUcontext, unsigned);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr*, std::size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocAsync(CUdeviceptr*, std::size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemGetInfo_v2(std::size_t*, std::size_t*);
CUresult cuMemGetAddressRange_v2(CUdeviceptr*, std::size_t*, CUdeviceptr);
CUresult cuPointerGetAttribute(void*, CUpointer_attribute, CUdeviceptr);
CUresult cuIpcGetMemHandle(CUipcMemHandle*, CUdeviceptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr*, CUipcMemHandle, unsigned);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
CUresult cuMemPoolTrimTo(CUmemoryPool, std::size_t);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool*, CUdevice);
CUresult cuStreamCreate(CUstream*, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle*, std::size_t, const CUmemAllocationProp*, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
}

// cuInit, then device `dev`'s primary context made current.
inline void start_primary(cudaabi::CUdevice dev) {
  CHECK_OK(cuInit(0));
  cudaabi::CUcontext ctx = nullptr;
  CHECK_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_OK(cuCtxSetCurrent(ctx));
}
#endif
