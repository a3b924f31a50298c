// Which wrapper replaces which driver entry point, and the cuGetProcAddress wrappers that hand
// them out. cudart (static and shared) resolves every driver function this way: by base name,
// CUDA version and stream flavour flags, through the cuGetProcAddress it got from dlsym.
#include <dlfcn.h>

#include <climits>
#include <cstring>

#include "shim/export.h"
#include "shim/hooks.h"

// The wrappers (defined in the hooks_*.cpp files).
extern "C" {
using namespace cudaabi;
CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t);
CUresult cuMemAlloc_v2(CUdeviceptr*, std::size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr*, std::size_t*, std::size_t, std::size_t, unsigned);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocAsync(CUdeviceptr*, std::size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr*, std::size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemGetInfo_v2(std::size_t*, std::size_t*);
CUresult cuMemGetAddressRange_v2(CUdeviceptr*, std::size_t*, CUdeviceptr);
CUresult cuPointerGetAttribute(void*, CUpointer_attribute, CUdeviceptr);
CUresult cuPointerGetAttributes(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
CUresult cuIpcGetMemHandle(CUipcMemHandle*, CUdeviceptr);
CUresult cuIpcOpenMemHandle(CUdeviceptr*, CUipcMemHandle, unsigned);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr*, CUipcMemHandle, unsigned);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
CUresult cuMemPoolTrimTo(CUmemoryPool, std::size_t);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxDestroy(CUcontext);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuCtxEnablePeerAccess(CUcontext, unsigned);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuDevicePrimaryCtxReset(CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDevicePrimaryCtxRelease(CUdevice);
CUresult cuStreamCreate(CUstream*, unsigned);
CUresult cuStreamCreateWithPriority(CUstream*, unsigned, int);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamDestroy(CUstream);
CUresult cuStreamBeginCapture(CUstream);
CUresult cuStreamBeginCapture_ptsz(CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
CUresult cuStreamBeginCaptureToGraph(CUstream, CUgraph, const void*, const void*, std::size_t, CUstreamCaptureMode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream, CUgraph, const void*, const void*, std::size_t,
                                          CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph*);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph*);
}

namespace cudapool::shim {
namespace {

enum Flavour : unsigned char { kAny, kLegacy, kPerThread };

struct Hook {
  const char* base;  // the name programs pass to cuGetProcAddress
  int min_version;   // [min_version, max_version) of CUDA versions that resolve to `abi`
  int max_version;
  Flavour flavour;   // which stream flavour flag resolves to `abi`
  const char* abi;   // the exported symbol
  void* wrapper;
};

#define W(fn) reinterpret_cast<void*>(&::fn)
const Hook kHooks[] = {
    {"cuGetProcAddress", 11030, 12000, kAny, "cuGetProcAddress", W(cuGetProcAddress)},
    {"cuGetProcAddress", 12000, INT_MAX, kAny, "cuGetProcAddress_v2", W(cuGetProcAddress_v2)},
    {"cuMemAlloc", 3020, INT_MAX, kAny, "cuMemAlloc_v2", W(cuMemAlloc_v2)},
    {"cuMemAllocPitch", 3020, INT_MAX, kAny, "cuMemAllocPitch_v2", W(cuMemAllocPitch_v2)},
    {"cuMemFree", 3020, INT_MAX, kAny, "cuMemFree_v2", W(cuMemFree_v2)},
    {"cuMemAllocAsync", 11020, INT_MAX, kLegacy, "cuMemAllocAsync", W(cuMemAllocAsync)},
    {"cuMemAllocAsync", 11020, INT_MAX, kPerThread, "cuMemAllocAsync_ptsz", W(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, INT_MAX, kLegacy, "cuMemFreeAsync", W(cuMemFreeAsync)},
    {"cuMemFreeAsync", 11020, INT_MAX, kPerThread, "cuMemFreeAsync_ptsz", W(cuMemFreeAsync_ptsz)},
    {"cuMemGetInfo", 3020, INT_MAX, kAny, "cuMemGetInfo_v2", W(cuMemGetInfo_v2)},
    {"cuMemGetAddressRange", 3020, INT_MAX, kAny, "cuMemGetAddressRange_v2", W(cuMemGetAddressRange_v2)},
    {"cuPointerGetAttribute", 4000, INT_MAX, kAny, "cuPointerGetAttribute", W(cuPointerGetAttribute)},
    {"cuPointerGetAttributes", 7000, INT_MAX, kAny, "cuPointerGetAttributes", W(cuPointerGetAttributes)},
    {"cuIpcGetMemHandle", 4010, INT_MAX, kAny, "cuIpcGetMemHandle", W(cuIpcGetMemHandle)},
    {"cuIpcOpenMemHandle", 4010, 11000, kAny, "cuIpcOpenMemHandle", W(cuIpcOpenMemHandle)},
    {"cuIpcOpenMemHandle", 11000, INT_MAX, kAny, "cuIpcOpenMemHandle_v2", W(cuIpcOpenMemHandle_v2)},
    {"cuIpcCloseMemHandle", 4010, INT_MAX, kAny, "cuIpcCloseMemHandle", W(cuIpcCloseMemHandle)},
    {"cuMemPoolTrimTo", 11020, INT_MAX, kAny, "cuMemPoolTrimTo", W(cuMemPoolTrimTo)},
    {"cuCtxDestroy", 2000, 4000, kAny, "cuCtxDestroy", W(cuCtxDestroy)},
    {"cuCtxDestroy", 4000, INT_MAX, kAny, "cuCtxDestroy_v2", W(cuCtxDestroy_v2)},
    {"cuDevicePrimaryCtxRetain", 7000, INT_MAX, kAny, "cuDevicePrimaryCtxRetain", W(cuDevicePrimaryCtxRetain)},
    {"cuCtxEnablePeerAccess", 4000, INT_MAX, kAny, "cuCtxEnablePeerAccess", W(cuCtxEnablePeerAccess)},
    {"cuDevicePrimaryCtxReset", 7000, 11000, kAny, "cuDevicePrimaryCtxReset", W(cuDevicePrimaryCtxReset)},
    {"cuDevicePrimaryCtxReset", 11000, INT_MAX, kAny, "cuDevicePrimaryCtxReset_v2", W(cuDevicePrimaryCtxReset_v2)},
    {"cuDevicePrimaryCtxRelease", 7000, 11000, kAny, "cuDevicePrimaryCtxRelease", W(cuDevicePrimaryCtxRelease)},
    {"cuDevicePrimaryCtxRelease", 11000, INT_MAX, kAny, "cuDevicePrimaryCtxRelease_v2", W(cuDevicePrimaryCtxRelease_v2)},
    {"cuStreamCreate", 2000, INT_MAX, kAny, "cuStreamCreate", W(cuStreamCreate)},
    {"cuStreamCreateWithPriority", 5050, INT_MAX, kAny, "cuStreamCreateWithPriority", W(cuStreamCreateWithPriority)},
    {"cuStreamDestroy", 2000, 4000, kAny, "cuStreamDestroy", W(cuStreamDestroy)},
    {"cuStreamDestroy", 4000, INT_MAX, kAny, "cuStreamDestroy_v2", W(cuStreamDestroy_v2)},
    {"cuStreamBeginCapture", 10000, 10010, kLegacy, "cuStreamBeginCapture", W(cuStreamBeginCapture)},
    {"cuStreamBeginCapture", 10000, 10010, kPerThread, "cuStreamBeginCapture_ptsz", W(cuStreamBeginCapture_ptsz)},
    {"cuStreamBeginCapture", 10010, INT_MAX, kLegacy, "cuStreamBeginCapture_v2", W(cuStreamBeginCapture_v2)},
    {"cuStreamBeginCapture", 10010, INT_MAX, kPerThread, "cuStreamBeginCapture_v2_ptsz", W(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamBeginCaptureToGraph", 12030, INT_MAX, kLegacy, "cuStreamBeginCaptureToGraph",
     W(cuStreamBeginCaptureToGraph)},
    {"cuStreamBeginCaptureToGraph", 12030, INT_MAX, kPerThread, "cuStreamBeginCaptureToGraph_ptsz",
     W(cuStreamBeginCaptureToGraph_ptsz)},
    {"cuStreamEndCapture", 10000, INT_MAX, kLegacy, "cuStreamEndCapture", W(cuStreamEndCapture)},
    {"cuStreamEndCapture", 10000, INT_MAX, kPerThread, "cuStreamEndCapture_ptsz", W(cuStreamEndCapture_ptsz)},
};
#undef W

bool same_object(const void* a, const void* b) {
  Dl_info ia{}, ib{};
  return dladdr(a, &ia) != 0 && dladdr(b, &ib) != 0 && ia.dli_fbase == ib.dli_fbase;
}

// The wrapper for what the real resolver returned, or nullptr to keep its answer.
void* substitute(const RealDriver& d, const char* symbol, void* pfn, int version, cuuint64_t flags) {
  DlsymFn sym = real_dlsym();
  bool named = false;
  // First choice: the resolver returned exactly one of libcuda's exported variants.
  for (const Hook& h : kHooks) {
    if (std::strcmp(h.base, symbol) != 0) continue;
    named = true;
    if (sym(d.handle, h.abi) == pfn) return h.wrapper;
  }
  if (!named) return nullptr;
  // Otherwise (a driver that hands out internal entry points): decide by version and flavour,
  // but only for an answer from libcuda itself; another interposer's answer is left alone.
  if (!same_object(pfn, reinterpret_cast<const void*>(d.cuMemAlloc_v2))) return nullptr;
  const Flavour want = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ? kPerThread : kLegacy;
  for (const Hook& h : kHooks) {
    if (std::strcmp(h.base, symbol) != 0) continue;
    if (version < h.min_version || version >= h.max_version) continue;
    if (h.flavour == kAny || h.flavour == want) return h.wrapper;
  }
  return nullptr;
}

}  // namespace

void* wrapper_for_symbol(const char* abi_name) noexcept {
  for (const Hook& h : kHooks) {
    if (std::strcmp(h.abi, abi_name) == 0) return h.wrapper;
  }
  return nullptr;
}

}  // namespace cudapool::shim

using namespace cudapool::shim;

CUDAPOOL_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* status) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuGetProcAddress_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuGetProcAddress_v2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && symbol != nullptr && pfn != nullptr && *pfn != nullptr) {
    if (void* w = substitute(*d, symbol, *pfn, version, flags)) *pfn = w;
  }
  return r;
}

CUDAPOOL_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuGetProcAddress == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuGetProcAddress(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && symbol != nullptr && pfn != nullptr && *pfn != nullptr) {
    if (void* w = substitute(*d, symbol, *pfn, version, flags)) *pfn = w;
  }
  return r;
}
