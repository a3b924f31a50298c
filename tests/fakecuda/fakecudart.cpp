// A fake shared cudart (libcudart.so.13) for tests without a GPU or the CUDA toolkit: the runtime
// entry points the shim answers itself (cudaMalloc, cudaFree) and what a program needs around
// them (errors, devices, the version). It reaches the driver exactly as the real one does:
// dlopen("libcuda.so.1"), dlsym "cuGetProcAddress_v2", then every function by name at version
// 13000, so under the preloaded shim what it calls are the shim's wrappers.
// Its semantics are cudart's where the shim depends on them:
//  * each thread starts lazily: with no current context, its runtime device's primary context
//    (device 0 unless cudaSetDevice said otherwise) is retained and made current;
//  * cudaSetDevice makes the device's primary context current at once from CUDA 12 on, and only
//    at the next cudaMalloc/cudaFree before that (CUDA 11's behaviour, FAKE_CUDART_VERSION=11080);
//  * a failure is the call's answer and the thread's last error (cudaGetLastError returns and
//    clears it, cudaPeekAtLastError only returns it).
#include "tests/fakecuda/fakecudart.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "shim/cuda_abi.h"

using namespace cudaabi;

#define FAKE_RT_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kVersion = 13000;

// The driver functions this cudart uses, as cuGetProcAddress_v2 gave them.
struct Driver {
  bool ok = false;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, std::size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
};

template <typename Fn>
bool get(PFN_cuGetProcAddress_v2 proc, Fn& slot, const char* name) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult st = -1;
  if (proc(name, &p, kVersion, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS ||
      p == nullptr) {
    std::fprintf(stderr, "fakecudart: the driver has no %s\n", name);
    return false;
  }
  slot = reinterpret_cast<Fn>(p);
  return true;
}

Driver load_driver() {
  Driver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "fakecudart: dlopen libcuda.so.1: %s\n", dlerror());
    return d;
  }
  auto proc = reinterpret_cast<PFN_cuGetProcAddress_v2>(dlsym(lib, "cuGetProcAddress_v2"));
  if (proc == nullptr) {
    std::fprintf(stderr, "fakecudart: libcuda.so.1 has no cuGetProcAddress_v2\n");
    return d;
  }
  d.ok = get(proc, d.cuInit, "cuInit") && get(proc, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
         get(proc, d.cuCtxGetCurrent, "cuCtxGetCurrent") && get(proc, d.cuCtxSetCurrent, "cuCtxSetCurrent") &&
         get(proc, d.cuMemAlloc, "cuMemAlloc") && get(proc, d.cuMemFree, "cuMemFree") && d.cuInit(0) == CUDA_SUCCESS;
  return d;
}

// Loaded and initialised at the first call that needs the driver, once for the process.
const Driver& driver() {
  static const Driver d = load_driver();
  return d;
}

int version() {
  static const int v = [] {
    const char* e = std::getenv("FAKE_CUDART_VERSION");
    return e != nullptr && *e != '\0' ? std::atoi(e) : kVersion;
  }();
  return v;
}

std::atomic<long> n_malloc{0}, n_free{0};

thread_local int tl_device = 0;               // the thread's runtime device
thread_local bool tl_device_pending = false;  // CUDA 11: set, its context not yet made current
thread_local cudaError_t tl_last_error = cudaSuccess;

cudaError_t from_cu(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    default: return cudaErrorUnknown;
  }
}

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) tl_last_error = e;
  return e;
}

// Device `dev`'s primary context, retained once for the process as cudart does, made current.
cudaError_t make_current(int dev) {
  static std::mutex mu;
  static std::map<int, CUcontext> primaries;
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = primaries.find(dev);
    if (it == primaries.end()) {
      if (const CUresult r = d.cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS) return from_cu(r);
      it = primaries.emplace(dev, ctx).first;
    }
    ctx = it->second;
  }
  return from_cu(d.cuCtxSetCurrent(ctx));
}

// What every runtime call that needs a context does first.
cudaError_t init_thread() {
  if (!driver().ok) return cudaErrorUnknown;
  if (tl_device_pending) {
    tl_device_pending = false;
    return make_current(tl_device);
  }
  CUcontext cur = nullptr;
  if (const CUresult r = driver().cuCtxGetCurrent(&cur); r != CUDA_SUCCESS) return from_cu(r);
  return cur != nullptr ? cudaSuccess : make_current(tl_device);
}

}  // namespace

FAKE_RT_API cudaError_t cudaMalloc(void** dev_ptr, std::size_t size) {
  n_malloc.fetch_add(1, std::memory_order_relaxed);
  if (dev_ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = init_thread(); e != cudaSuccess) return fail(e);
  if (size == 0) {  // no memory, no error
    *dev_ptr = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  if (const CUresult r = driver().cuMemAlloc(&p, size); r != CUDA_SUCCESS) return fail(from_cu(r));
  *dev_ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  return cudaSuccess;
}

FAKE_RT_API cudaError_t cudaFree(void* dev_ptr) {
  n_free.fetch_add(1, std::memory_order_relaxed);
  if (const cudaError_t e = init_thread(); e != cudaSuccess) return fail(e);
  if (dev_ptr == nullptr) return cudaSuccess;  // the idiom that only sets the context up
  return fail(from_cu(driver().cuMemFree(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(dev_ptr)))));
}

FAKE_RT_API cudaError_t cudaGetLastError(void) {
  const cudaError_t e = tl_last_error;
  tl_last_error = cudaSuccess;
  return e;
}

FAKE_RT_API cudaError_t cudaPeekAtLastError(void) { return tl_last_error; }

FAKE_RT_API cudaError_t cudaSetDevice(int device) {
  if (device < 0) return fail(cudaErrorInvalidValue);
  tl_device = device;
  if (version() < 12000) {  // CUDA 11: applied at the next call that needs a context
    tl_device_pending = true;
    return cudaSuccess;
  }
  tl_device_pending = false;
  if (!driver().ok) return fail(cudaErrorUnknown);
  return fail(make_current(device));
}

FAKE_RT_API cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = tl_device;
  return cudaSuccess;
}

FAKE_RT_API cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v == nullptr) return fail(cudaErrorInvalidValue);
  *v = version();
  return cudaSuccess;
}

FAKE_RT_API long fakecudart_calls(const char* name) {
  if (name != nullptr && std::strcmp(name, "cudaMalloc") == 0) return n_malloc.load(std::memory_order_relaxed);
  if (name != nullptr && std::strcmp(name, "cudaFree") == 0) return n_free.load(std::memory_order_relaxed);
  return -1;
}
