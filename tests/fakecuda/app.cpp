// Test program run under LD_PRELOAD=libcudapool.so with the fake libcuda.so.1. It reaches the
// driver exactly as real programs do:
//  * built without CUDAPOOL_APP_LINKED (cudart's way): dlopen("libcuda.so.1"), dlsym
//    "cuGetProcAddress_v2", then every function by name + CUDA version + stream-flavour flags;
//  * built with CUDAPOOL_APP_LINKED: linked with -lcuda, calling the exported symbols.
// `app <scenario>` runs one scenario; it prints "FAIL <line>: <expr>" and exits 1 on the first
// failed check, exits 0 when all passed. tests/unit/shim_interpose_test.cpp runs them.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "shim/cudapool.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/fakecuda/test_app.h"

#ifndef CUDAPOOL_APP_LINKED
// cudart-style programs do not link libcuda: reach the fake's controls through the handle the
// program dlopened (looked up lazily, so a scenario that never starts CUDA never loads it).
#define FAKE_CONTROL(ret, name, params, args)                                                                       \
  extern "C" ret name params {                                                                                      \
    static auto fn = reinterpret_cast<ret(*) params>(dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), #name)); \
    return fn args;                                                                                                 \
  }
FAKE_CONTROL(void, fakecuda_hold_stream, (cudaabi::CUstream s), (s))
FAKE_CONTROL(void, fakecuda_release_stream, (cudaabi::CUstream s), (s))
FAKE_CONTROL(long, fakecuda_alloc_calls, (), ())
FAKE_CONTROL(long, fakecuda_vmm_create_calls, (), ())
FAKE_CONTROL(long, fakecuda_free_calls, (), ())
FAKE_CONTROL(long, fakecuda_live_allocations, (), ())
FAKE_CONTROL(std::size_t, fakecuda_live_bytes, (), ())
FAKE_CONTROL(long, fakecuda_graph_allocs, (), ())
FAKE_CONTROL(long, fakecuda_event_records, (), ())
FAKE_CONTROL(long, fakecuda_event_syncs, (), ())
FAKE_CONTROL(long, fakecuda_event_queries, (), ())
FAKE_CONTROL(long, fakecuda_stream_queries, (), ())
FAKE_CONTROL(long, fakecuda_ctx_records, (), ())
FAKE_CONTROL(long, fakecuda_ctx_waits, (), ())
FAKE_CONTROL(long, fakecuda_trim_calls, (), ())
FAKE_CONTROL(long, fakecuda_thread_driver_calls, (), ())
FAKE_CONTROL(void, fakecuda_reset_primary_unseen, (cudaabi::CUdevice dev), (dev))
FAKE_CONTROL(int, fakecuda_is_live, (cudaabi::CUdeviceptr p), (p))
FAKE_CONTROL(cudaabi::CUresult, fakecuda_create_context, (cudaabi::CUcontext * c, int d), (c, d))
FAKE_CONTROL(long, fakecuda_stream_waits, (), ())
FAKE_CONTROL(long, fakecuda_capture_waits, (), ())
FAKE_CONTROL(long, fakecuda_records_on, (cudaabi::CUstream s), (s))
FAKE_CONTROL(long, fakecuda_waits_by, (cudaabi::CUstream s), (s))
FAKE_CONTROL(long, fakecuda_ctx_syncs, (), ())
FAKE_CONTROL(int, fakecuda_would_wait, (cudaabi::CUstream s, cudaabi::CUstream h), (s, h))
FAKE_CONTROL(long, fakecuda_host_alloc_calls, (), ())
FAKE_CONTROL(long, fakecuda_host_free_calls, (), ())
FAKE_CONTROL(int, fakecuda_host_is_live, (const void* p), (p))
FAKE_CONTROL(cudaabi::CUresult, fakecuda_host_alloc_unseen, (void** p, std::size_t n), (p, n))
FAKE_CONTROL(long, fakecuda_host_register_calls, (), ())
FAKE_CONTROL(long, fakecuda_host_unregister_calls, (), ())
#undef FAKE_CONTROL
#endif

using namespace cudaabi;

namespace {

struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxReset)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxDestroy)(CUcontext);
  PFN_cuMemAlloc_v2 cuMemAlloc;
  PFN_cuMemAllocPitch_v2 cuMemAllocPitch;
  CUresult (*cuMemAllocManaged)(CUdeviceptr*, std::size_t, unsigned);
  PFN_cuMemFree_v2 cuMemFree;
  PFN_cuMemAllocAsync cuMemAllocAsync;       // legacy flavour
  PFN_cuMemAllocAsync cuMemAllocAsync_ptds;  // per-thread flavour
  PFN_cuMemFreeAsync cuMemFreeAsync;
  PFN_cuMemFreeAsync cuMemFreeAsync_ptds;
  PFN_cuMemGetInfo_v2 cuMemGetInfo;
  PFN_cuMemGetAddressRange_v2 cuMemGetAddressRange;
  PFN_cuPointerGetAttribute cuPointerGetAttribute;
  PFN_cuPointerGetAttributes cuPointerGetAttributes;
  PFN_cuIpcGetMemHandle cuIpcGetMemHandle;
  PFN_cuMemPoolTrimTo cuMemPoolTrimTo;
  PFN_cuDeviceGetDefaultMemPool cuDeviceGetDefaultMemPool;
  PFN_cuStreamCreate cuStreamCreate;
  PFN_cuStreamDestroy_v2 cuStreamDestroy;
  PFN_cuStreamBeginCapture_v2 cuStreamBeginCapture;
  PFN_cuStreamEndCapture cuStreamEndCapture;
  PFN_cuGetProcAddress_v2 cuGetProcAddress;  // as the program obtained it
  CUresult (*cuCtxCreate)(CUcontext*, unsigned, CUdevice);
  CUresult (*cuMemHostAlloc)(void**, std::size_t, unsigned);
  CUresult (*cuMemAllocHost)(void**, std::size_t);
  CUresult (*cuMemFreeHost)(void*);
};
Api api;
[[maybe_unused]] void* libcuda = nullptr;

}  // namespace

#ifdef CUDAPOOL_APP_LINKED
extern "C" {
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr*, std::size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr*, std::size_t*, std::size_t, std::size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr*, std::size_t, unsigned);
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
CUresult cuMemPoolTrimTo(CUmemoryPool, std::size_t);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool*, CUdevice);
CUresult cuStreamCreate(CUstream*, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph*);
CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
CUresult cuCtxCreate_v2(CUcontext*, unsigned, CUdevice);
CUresult cuMemHostAlloc(void**, std::size_t, unsigned);
CUresult cuMemAllocHost_v2(void**, std::size_t);
CUresult cuMemFreeHost(void*);
}
static void resolve_api() {
  api = Api{cuInit,
            cuDevicePrimaryCtxRetain,
            cuDevicePrimaryCtxReset_v2,
            cuCtxSetCurrent,
            cuCtxDestroy_v2,
            cuMemAlloc_v2,
            cuMemAllocPitch_v2,
            cuMemAllocManaged,
            cuMemFree_v2,
            cuMemAllocAsync,
            cuMemAllocAsync_ptsz,
            cuMemFreeAsync,
            cuMemFreeAsync_ptsz,
            cuMemGetInfo_v2,
            cuMemGetAddressRange_v2,
            cuPointerGetAttribute,
            cuPointerGetAttributes,
            cuIpcGetMemHandle,
            cuMemPoolTrimTo,
            cuDeviceGetDefaultMemPool,
            cuStreamCreate,
            cuStreamDestroy_v2,
            cuStreamBeginCapture_v2,
            cuStreamEndCapture,
            cuGetProcAddress_v2,
            cuCtxCreate_v2,
            cuMemHostAlloc,
            cuMemAllocHost_v2,
            cuMemFreeHost};
}
#else
template <typename Fn>
static void get(Fn& slot, const char* name, int version, cuuint64_t flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult st = -1;
  CHECK_OK(api.cuGetProcAddress(name, &p, version, flags, &st));
  CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && p != nullptr);
  slot = reinterpret_cast<Fn>(p);
}
static void resolve_api() {
  // What cudart does (CUDA 13.0 on the H200: cuMemAlloc v3020, cuMemAllocAsync v11020 twice, …).
  libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(libcuda != nullptr);
  api.cuGetProcAddress = reinterpret_cast<PFN_cuGetProcAddress_v2>(dlsym(libcuda, "cuGetProcAddress_v2"));
  CHECK(api.cuGetProcAddress != nullptr);
  void* self = nullptr;
  get(self, "cuGetProcAddress", 12000);  // cudart asks for it again through itself
  api.cuGetProcAddress = reinterpret_cast<PFN_cuGetProcAddress_v2>(self);
  get(api.cuInit, "cuInit", 2000);
  get(api.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000);
  get(api.cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000);  // cudart 13.0 asks for 7000 (v1)
  get(api.cuCtxSetCurrent, "cuCtxSetCurrent", 4000);
  get(api.cuCtxDestroy, "cuCtxDestroy", 4000);
  get(api.cuMemAlloc, "cuMemAlloc", 3020);
  get(api.cuMemAllocPitch, "cuMemAllocPitch", 3020);
  get(api.cuMemAllocManaged, "cuMemAllocManaged", 6000);
  get(api.cuMemFree, "cuMemFree", 3020);
  get(api.cuMemAllocAsync, "cuMemAllocAsync", 11020);
  get(api.cuMemAllocAsync_ptds, "cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  get(api.cuMemFreeAsync, "cuMemFreeAsync", 11020);
  get(api.cuMemFreeAsync_ptds, "cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  get(api.cuMemGetInfo, "cuMemGetInfo", 3020);
  get(api.cuMemGetAddressRange, "cuMemGetAddressRange", 3020);
  get(api.cuPointerGetAttribute, "cuPointerGetAttribute", 4000);
  get(api.cuPointerGetAttributes, "cuPointerGetAttributes", 7000);
  get(api.cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010);
  get(api.cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020);
  get(api.cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020);
  get(api.cuStreamCreate, "cuStreamCreate", 2000);
  get(api.cuStreamDestroy, "cuStreamDestroy", 4000);
  get(api.cuStreamBeginCapture, "cuStreamBeginCapture", 10010);
  get(api.cuStreamEndCapture, "cuStreamEndCapture", 10000);
  get(api.cuCtxCreate, "cuCtxCreate", 3020);
  get(api.cuMemHostAlloc, "cuMemHostAlloc", 3020);
  get(api.cuMemAllocHost, "cuMemAllocHost", 3020);
  get(api.cuMemFreeHost, "cuMemFreeHost", 3020);
}
#endif

namespace {

// The shim's C API, found the way a program that may run without the shim finds it.
template <typename Fn>
Fn c_api(const char* name) {
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  CHECK(fn != nullptr);
  return fn;
}
cudapool_stats stats(int dev = 0) {
  cudapool_stats s{};
  CHECK(c_api<int (*)(int, cudapool_stats*)>("cudapool_get_stats")(dev, &s) == 0);
  return s;
}

CUcontext start_cuda(int dev = 0) {
  resolve_api();
  CHECK_OK(api.cuInit(0));
  CUcontext ctx = nullptr;
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_OK(api.cuCtxSetCurrent(ctx));
  return ctx;
}

bool overlaps(CUdeviceptr a, std::size_t an, CUdeviceptr b, std::size_t bn) { return a < b + bn && b < a + an; }

void* shim_object() {
  Dl_info info{};
  CHECK(dladdr(reinterpret_cast<void*>(c_api<int (*)()>("cudapool_api_version")), &info) != 0);
  return info.dli_fbase;
}
bool from_shim(void* fn) {
  Dl_info info{};
  return dladdr(fn, &info) != 0 && info.dli_fbase == shim_object();
}

// Driver allocations of either kind: cuMemAlloc segments (classic) and cuMemCreate pages
// (expandable segments, the default).
long driver_allocs() { return fakecuda_alloc_calls() + fakecuda_vmm_create_calls(); }

// ---- scenarios ------------------------------------------------------------------------------

void pooling() {
  start_cuda();
  const long before = driver_allocs(), before_segments = fakecuda_alloc_calls();
  for (int i = 0; i < 1000; ++i) {
    CUdeviceptr p = 0;
    CHECK_OK(api.cuMemAlloc(&p, static_cast<std::size_t>(1000 + (i % 7) * 4096)));
    CHECK_OK(api.cuMemFree(p));
  }
  const long real = driver_allocs() - before;
  std::printf("real allocations for 1000 pairs: %ld\n", real);
  CHECK(real >= 1 && real <= 5);
  const cudapool_stats s = stats();
  CHECK(s.num_device_alloc == fakecuda_alloc_calls() - before_segments);  // classic segments (cuMemAlloc)
  CHECK(s.cache_hits >= 990);
}

void resolution() {
  start_cuda();
  // Every hooked entry point the program got is the shim's wrapper, in both stream flavours,
  // including cuMemFree, which the fake driver hands out through an internal address.
  CHECK(from_shim(reinterpret_cast<void*>(api.cuMemAlloc)));
  CHECK(from_shim(reinterpret_cast<void*>(api.cuMemFree)));
  CHECK(from_shim(reinterpret_cast<void*>(api.cuMemAllocAsync)));
  CHECK(from_shim(reinterpret_cast<void*>(api.cuMemAllocAsync_ptds)));
  CHECK(api.cuMemAllocAsync != api.cuMemAllocAsync_ptds);
  CHECK(from_shim(reinterpret_cast<void*>(api.cuMemFreeAsync_ptds)));
  CHECK(from_shim(reinterpret_cast<void*>(api.cuGetProcAddress)));
  CHECK(!from_shim(reinterpret_cast<void*>(api.cuInit)));  // not hooked: the driver's own
#ifndef CUDAPOOL_APP_LINKED
  // Every version cudart may ask for maps to a wrapper of the matching ABI.
  struct {
    const char* name;
    int version;
    cuuint64_t flags;
    const char* abi;
  } versions[] = {
      {"cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset"},
      {"cuDevicePrimaryCtxReset", 11000, 0, "cuDevicePrimaryCtxReset_v2"},
      {"cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"},
      {"cuDevicePrimaryCtxRelease", 13000, 0, "cuDevicePrimaryCtxRelease_v2"},
      {"cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture"},
      {"cuStreamBeginCapture", 10000, 2, "cuStreamBeginCapture_ptsz"},
      {"cuStreamBeginCapture", 12000, 2, "cuStreamBeginCapture_v2_ptsz"},
      {"cuStreamBeginCaptureToGraph", 12030, 0, "cuStreamBeginCaptureToGraph"},
      {"cuStreamBeginCaptureToGraph", 12080, 2, "cuStreamBeginCaptureToGraph_ptsz"},
      {"cuStreamEndCapture", 10000, 2, "cuStreamEndCapture_ptsz"},
      {"cuStreamDestroy", 2000, 0, "cuStreamDestroy"},
      {"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
      {"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"},
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
  };
  for (auto& v : versions) {
    void* fn = nullptr;
    CHECK_OK(api.cuGetProcAddress(v.name, &fn, v.version, v.flags, nullptr));
    CHECK(fn == dlsym(RTLD_DEFAULT, v.abi));  // the shim's export of exactly that ABI name
    CHECK(from_shim(fn));
  }
#endif
  void* p = nullptr;
  CUdriverProcAddressQueryResult st = -1;
  // Too old a version: the driver's answer, untouched.
  CHECK(api.cuGetProcAddress("cuMemAllocAsync", &p, 11000, 0, &st) == CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && p == nullptr);
  CHECK(api.cuGetProcAddress("cuNoSuchFunction", &p, 13000, 0, &st) == CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  // dlsym: exact names only; other names and other handles keep their answers.
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(h != nullptr);
  CHECK(from_shim(dlsym(h, "cuMemAlloc_v2")));
  CHECK(from_shim(dlsym(h, "cuMemAllocAsync_ptsz")));
  CHECK(!from_shim(dlsym(h, "cuMemAllocManaged")));
  CHECK(!from_shim(dlsym(h, "cuEventRecord")));
  CHECK(dlsym(h, "cudnnCreate") == nullptr);
  // RTLD_NEXT stays relative to the caller (this program): the next object defining
  // cudapool_api_version after the executable is the shim itself.
  CHECK(dlsym(RTLD_NEXT, "cudapool_api_version") != nullptr);
  CHECK(dlsym(RTLD_NEXT, "malloc") == dlsym(RTLD_DEFAULT, "malloc"));
}

void fenced_reuse() {
  drive_pool_clock();
  start_cuda();
  CUstream nb = nullptr, blocking = nullptr;
  CHECK_OK(api.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CHECK_OK(api.cuStreamCreate(&blocking, 0));
  constexpr std::size_t n = 3 << 20;
  // Work pending on each kind of stream when the host frees: the block must not come back
  // until that work is done, unless every stream is made to wait for it on the GPU (the default,
  // free_sync:gpu_wait, orders each recorded batch where a context-wide wait is cheaper than
  // asking its fence; gpu_wait_reuse tests that ordering in full).
  const CUstream all[] = {nb, blocking, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
  for (CUstream busy : all) {
    CUdeviceptr p = 0, q = 0, r = 0;
    // The previous round's frees come back first (their batch window passes, and the sweep gap
    // of the non-blocking stream, 4 ms), so each round starts from the same free segment.
    advance_pool_clock(kPastWindowsNs);
    CHECK_OK(api.cuMemAlloc(&p, n));
    fakecuda_hold_stream(busy);
    CHECK_OK(api.cuMemFree(p));
    CHECK_OK(api.cuMemAlloc(&q, n));
    // Reused early with no stream ordered after the work = a data race on a real GPU.
    const bool early = overlaps(p, n, q, n);
    if (early) {
      CHECK(q == p);
      for (CUstream s : all) CHECK(s == busy || fakecuda_would_wait(s, busy) == 1);
    }
    fakecuda_release_stream(busy);
    // q came from the segment's rest while the free's batch was open; once the batch window
    // (20 us, docs/design.md) and the sweep gap (4 ms, shim/fences/cuda_fences.h) have passed, the next
    // allocation records the fence and queries it, and a sweep asks the non-blocking stream.
    advance_pool_clock(kPastWindowsNs);
    CHECK_OK(api.cuMemAlloc(&r, n));
    CHECK(early || r == p);  // the fence completed: best fit takes the freed block again
    CHECK_OK(api.cuMemFree(q));
    CHECK_OK(api.cuMemFree(r));
  }
  CHECK_OK(api.cuStreamDestroy(nb));
  CHECK_OK(api.cuStreamDestroy(blocking));
}

void async_streams() {
  start_cuda();
  CUstream s = nullptr, t = nullptr;
  CHECK_OK(api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK_OK(api.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
  constexpr std::size_t n = 1 << 20;
  CUdeviceptr p = 0, q = 0, r = 0;
  fakecuda_hold_stream(s);
  CHECK_OK(api.cuMemAllocAsync(&p, n, s));
  CHECK_OK(api.cuMemFreeAsync(p, s));
  // Stream order: the same stream may reuse at once, even with its work still pending.
  CHECK_OK(api.cuMemAllocAsync(&q, n, s));
  CHECK(q == p);
  CHECK_OK(api.cuMemFreeAsync(q, s));
  // Another stream may not while that work is pending.
  CHECK_OK(api.cuMemAllocAsync(&r, n, t));
  CHECK(!overlaps(p, n, r, n));
  CHECK_OK(api.cuMemFreeAsync(r, t));
  fakecuda_release_stream(s);
  // Per-thread flavour: stream 0 is this thread's per-thread stream, not the legacy stream.
  CUdeviceptr a = 0, b = 0;
  fakecuda_hold_stream(CU_STREAM_PER_THREAD);
  CHECK_OK(api.cuMemAllocAsync_ptds(&a, n, nullptr));
  CHECK_OK(api.cuMemFreeAsync_ptds(a, nullptr));
  CHECK_OK(api.cuMemAllocAsync(&b, n, nullptr));  // legacy stream: must not take `a` yet
  CHECK(!overlaps(a, n, b, n));
  CHECK_OK(api.cuMemFreeAsync(b, nullptr));
  fakecuda_release_stream(CU_STREAM_PER_THREAD);
  CHECK_OK(api.cuStreamDestroy(s));
  CHECK_OK(api.cuStreamDestroy(t));
}

void foreign_pointers() {
  start_cuda();
  CUdeviceptr m = 0;
  CHECK_OK(api.cuMemAllocManaged(&m, 4096, 1));  // not hooked: real driver memory
  const long frees = fakecuda_free_calls();
  CHECK_OK(api.cuMemFree(m));  // passed to the driver, which frees it
  CHECK(fakecuda_free_calls() == frees + 1);
  CHECK(!fakecuda_is_live(m));
  CHECK(api.cuMemFree(0x12345000) == CUDA_ERROR_INVALID_VALUE);  // the driver's own answer
  CHECK(c_api<int64_t (*)(const char*)>("cudapool_passthrough_count")("foreign_pointer") >= 2);
}

void capture() {
  drive_pool_clock();
  start_cuda();
  CUstream s = nullptr;
  CHECK_OK(api.cuStreamCreate(&s, 0));
  CUdeviceptr pooled = 0;
  CHECK_OK(api.cuMemAlloc(&pooled, 4096));
  CHECK_OK(api.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  // An async allocation on the capturing stream becomes a graph node: the driver's.
  CUdeviceptr g = 0;
  const long graph_before = fakecuda_graph_allocs();
  CHECK_OK(api.cuMemAllocAsync(&g, 1 << 20, s));
  CHECK(fakecuda_graph_allocs() == graph_before + 1);
  CHECK_OK(api.cuMemFreeAsync(g, s));
  // A pooled block freed during the capture: the fence must not touch the legacy stream (that
  // would break the capture of a blocking stream); it is recorded after the capture ends.
  CHECK_OK(api.cuMemFree(pooled));
  CUgraph graph = nullptr;
  CHECK_OK(api.cuStreamEndCapture(s, &graph));
  // cuMemAlloc during a global-mode capture is illegal in CUDA; the program gets CUDA's answer.
  CHECK_OK(api.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr x = 0;
  CHECK(api.cuMemAlloc(&x, 4096) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  api.cuStreamEndCapture(s, &graph);
  CHECK(c_api<int64_t (*)(const char*)>("cudapool_passthrough_count")("capture") >= 2);
  // CUDA 12.3's capture into an existing graph (cudaStreamBeginCaptureToGraph) is a capture too.
  using ToGraphFn = CUresult (*)(CUstream, CUgraph, const void*, const void*, std::size_t, CUstreamCaptureMode);
  void* to_graph_fn = nullptr;
  CHECK_OK(api.cuGetProcAddress("cuStreamBeginCaptureToGraph", &to_graph_fn, 12030, 0, nullptr));
  CHECK(from_shim(to_graph_fn));
  auto to_graph = reinterpret_cast<ToGraphFn>(to_graph_fn);
  CHECK_OK(to_graph(s, graph, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr node = 0;
  const long graph_before2 = fakecuda_graph_allocs();
  CHECK_OK(api.cuMemAllocAsync(&node, 1 << 20, s));
  CHECK(fakecuda_graph_allocs() == graph_before2 + 1);  // a graph node, not a pool block
  CHECK_OK(api.cuMemFreeAsync(node, s));
  CHECK(api.cuMemAlloc(&x, 4096) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);  // it invalidates the capture
  CHECK(api.cuStreamEndCapture(s, &graph) == 901);                           // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
  // After the capture the deferred fence is recorded (once the batch window has passed) and the
  // block comes back.
  advance_pool_clock(kPastWindowsNs);
  CUdeviceptr again = 0;
  CHECK_OK(api.cuMemAlloc(&again, 4096));
  CHECK(again == pooled);
  CHECK_OK(api.cuStreamDestroy(s));
}

void bad_frees() {
  start_cuda();
  CUdeviceptr p = 0, q = 0;
  CHECK_OK(api.cuMemAlloc(&p, 8192));
  CHECK_OK(api.cuMemAlloc(&q, 8192));
  CHECK(api.cuMemFree(p + 512) == CUDA_ERROR_INVALID_VALUE);  // interior pointer
  CHECK_OK(api.cuMemFree(p));
  CHECK(api.cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);  // double free
  // A pointer of another context (device 1) freed on a stream of this one.
  CUstream s0 = nullptr;
  CHECK_OK(api.cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  CUcontext other = nullptr;
  CHECK_OK(fakecuda_create_context(&other, 1));
  CUdeviceptr on1 = 0;
  CHECK_OK(api.cuMemAlloc(&on1, 8192));
  CHECK(api.cuMemFreeAsync(on1, s0) == CUDA_ERROR_INVALID_VALUE);
  CHECK_OK(api.cuMemFree(on1));  // its owner pool takes it back, whatever context is current
  CHECK(stats(1).allocations == 0);
  // The pool is intact: q is still live and usable, everything else works.
  CHECK(stats(0).allocations == 1);
  CHECK_OK(api.cuMemFree(q));
  CUdeviceptr r = 0;
  CHECK_OK(api.cuMemAlloc(&r, 8192));
  CHECK_OK(api.cuMemFree(r));
}

void queries() {
  start_cuda();
  CUdeviceptr big = 0, small = 0;
  CHECK_OK(api.cuMemAlloc(&big, 64 << 20));  // a whole 64 MiB segment
  CHECK_OK(api.cuMemAlloc(&small, 1000));    // a block of a 2 MiB segment
  // Address ranges are per block, not per segment.
  CUdeviceptr base = 0;
  std::size_t size = 0;
  CHECK_OK(api.cuMemGetAddressRange(&base, &size, small + 100));
  CHECK(base == small && size == 1000);
  CHECK_OK(api.cuMemGetAddressRange(nullptr, &size, big + 4096));
  CHECK(size == (64u << 20));
  CUdeviceptr start = 0;
  CHECK_OK(api.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, small + 8));
  CHECK(start == small);
  CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  std::size_t rsize = 0;
  int ordinal = -1;
  void* data[2] = {&rsize, &ordinal};
  CHECK_OK(api.cuPointerGetAttributes(2, attrs, data, small));
  CHECK(rsize == 1000 && ordinal == 0);
  // IPC: every block exports the shim's own handle (tests/fakecuda/ipc_app.cpp opens them), one
  // per block, whatever address inside it is asked for.
  CUipcMemHandle h{}, hs{}, hi{};
  CHECK_OK(api.cuIpcGetMemHandle(&h, big));
  CHECK_OK(api.cuIpcGetMemHandle(&hs, small));
  CHECK_OK(api.cuIpcGetMemHandle(&hi, big + 4096));
  CHECK(std::memcmp(h.reserved, "CPOOLIPC", 8) == 0 && std::memcmp(hs.reserved, "CPOOLIPC", 8) == 0);
  CHECK(std::memcmp(h.reserved, hi.reserved, sizeof h.reserved) == 0);
  CHECK(std::memcmp(h.reserved, hs.reserved, sizeof h.reserved) != 0);
  // cuMemGetInfo: cached bytes count as free; NULL out-pointers are legal.
  CHECK_OK(api.cuMemFree(big));
  std::size_t f = 0, t = 0, t_only = 0;
  CHECK_OK(api.cuMemGetInfo(&f, &t));
  CHECK_OK(api.cuMemGetInfo(nullptr, &t_only));
  CHECK_OK(api.cuMemGetInfo(nullptr, nullptr));
  CHECK(t_only == t);
  const std::size_t driver_free = t - fakecuda_live_bytes();
  const cudapool_stats s = stats();
  CHECK(f == driver_free + static_cast<std::size_t>(s.reserved_bytes - s.allocated_bytes));
  CHECK(f >= driver_free + (64u << 20));
  // Trimming the default memory pool empties ours.
  CUmemoryPool def = nullptr;
  CHECK_OK(api.cuDeviceGetDefaultMemPool(&def, 0));
  const long frees = fakecuda_free_calls();
  CHECK_OK(api.cuMemPoolTrimTo(def, 0));
  CHECK(fakecuda_trim_calls() == 1);
  CHECK(fakecuda_free_calls() > frees);
  CHECK(stats().reserved_bytes < (64 << 20));
  CHECK_OK(api.cuMemFree(small));
  // Pitched allocations come from the pool too, with aligned rows.
  CUdeviceptr pitched = 0;
  std::size_t pitch = 0;
  CHECK_OK(api.cuMemAllocPitch(&pitched, &pitch, 1000, 10, 4));
  CHECK(pitch >= 1000 && pitch % 512 == 0);
  CHECK(stats().allocations == 1);
  CHECK_OK(api.cuMemFree(pitched));
}

void oom() {
  // Run with FAKECUDA_TOTAL_MB=64.
  start_cuda();
  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK_OK(api.cuMemAlloc(&a, 40 << 20));
  CHECK_OK(api.cuMemFree(a));                                       // cached: the driver still counts it as used
  CHECK_OK(api.cuMemAlloc(&b, 50 << 20));                           // the pool gives the cache back and retries
  CHECK(api.cuMemAlloc(&c, 40 << 20) == CUDA_ERROR_OUT_OF_MEMORY);  // really full
  CHECK(api.cuMemAlloc(&c, std::size_t{1} << 62) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(stats().num_ooms >= 1);
  CHECK_OK(api.cuMemFree(b));
  CHECK_OK(api.cuMemAlloc(&c, 40 << 20));
}

void c_api_calls() {
  start_cuda();
  CHECK(c_api<int (*)()>("cudapool_api_version")() == CUDAPOOL_API_VERSION);
  CUdeviceptr a = 0, b = 0;
  CHECK_OK(api.cuMemAlloc(&a, 1000));
  CHECK_OK(api.cuMemAlloc(&b, 30 << 20));
  auto snapshot = c_api<size_t (*)(char*, size_t)>("cudapool_snapshot_json");
  const size_t n = snapshot(nullptr, 0);
  std::string json(n + 1, '\0');
  CHECK(snapshot(json.data(), json.size()) == n);
  json.resize(n);
  CHECK(json.rfind("{\"segments\": [", 0) == 0 && json.back() == '}');
  CHECK(json.find("\"segment_type\": \"small\"") != std::string::npos);
  CHECK(json.find("\"segment_type\": \"large\"") != std::string::npos);
  CHECK(json.find("\"address\": " + std::to_string(a) +
                  ", \"size\": 1024, \"requested_size\": 1000, "
                  "\"state\": \"active_allocated\"") != std::string::npos);
  char tiny[8];
  CHECK(snapshot(tiny, sizeof tiny) == n && std::strlen(tiny) == 7);  // truncated, terminated
  // Every counter under torch.cuda.memory_stats()'s names, summed over the device's pools.
  auto stats_json = c_api<size_t (*)(int, char*, size_t)>("cudapool_memory_stats_json");
  std::string sj(stats_json(0, nullptr, 0) + 1, '\0');
  sj.resize(stats_json(0, sj.data(), sj.size()));
  CHECK(sj.front() == '{' && sj.back() == '}');
  CHECK(sj.find("\"allocated_bytes.all.current\": " + std::to_string(1024 + (30 << 20)) + ",") != std::string::npos);
  CHECK(sj.find("\"allocation.all.current\": 2,") != std::string::npos);
  CHECK(sj.find("\"num_ooms\": 0") != std::string::npos);
  std::string none_json(8, '\0');
  CHECK(stats_json(1, none_json.data(), none_json.size()) == 2 && none_json.rfind("{}", 0) == 0);  // no pool on 1
  CHECK_OK(api.cuMemFree(b));
  const std::int64_t reserved = stats().reserved_bytes;
  const size_t released = c_api<size_t (*)()>("cudapool_empty_cache")();
  std::printf("empty_cache released %zu of %lld reserved bytes\n", released, static_cast<long long>(reserved));
  CHECK(released >= (30u << 20));  // b's memory, and nothing of a's
  CHECK(stats().reserved_bytes == reserved - static_cast<std::int64_t>(released));
  CHECK(stats().reserved_bytes == (2 << 20));
  auto set_level = c_api<int (*)(const char*)>("cudapool_set_log_level");
  CHECK(set_level("debug") == 0);
  CHECK(set_level("loud") == -1);
  auto passes = c_api<int64_t (*)(const char*)>("cudapool_passthrough_count");
  CHECK(passes("capture") == 0);
  CHECK(passes("no_such_kind") == -1);
  cudapool_stats none{};
  CHECK(c_api<int (*)(int, cudapool_stats*)>("cudapool_get_stats")(1, &none) == -1);
  CHECK_OK(api.cuMemFree(a));
}

void reset() {
  CUcontext ctx = start_cuda();
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 1 << 20));
  CHECK_OK(api.cuMemFree(p));                // cached in the pool
  CHECK_OK(api.cuDevicePrimaryCtxReset(0));  // the driver frees every allocation
  CHECK(!fakecuda_is_live(p));
  CUcontext again = nullptr;
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&again, 0));
  CHECK(again == ctx);  // the fake, like the real driver, reuses the handle
  CHECK_OK(api.cuCtxSetCurrent(again));
  const long before = driver_allocs();
  CUdeviceptr q = 0;
  CHECK_OK(api.cuMemAlloc(&q, 1 << 20));
  CHECK(driver_allocs() == before + 1);  // fresh memory, not the stale cached block
  CHECK(fakecuda_is_live(q));
  CHECK_OK(api.cuMemFree(q));
  // A reset the shim never saw: the next retain of the (inactive) primary context retires the
  // pool kept under the reused handle, so the cached block of the dead context is not handed out.
  fakecuda_reset_primary_unseen(0);
  CHECK(!fakecuda_is_live(q));
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&again, 0));
  CHECK(again == ctx);
  CHECK_OK(api.cuCtxSetCurrent(again));
  const long before2 = driver_allocs();
  CHECK_OK(api.cuMemAlloc(&q, 1 << 20));
  CHECK(driver_allocs() == before2 + 1);
  CHECK(fakecuda_is_live(q));
  CHECK_OK(api.cuMemFree(q));
  // A non-primary context destroyed: same story.
  CUcontext mine = nullptr;
  CHECK_OK(fakecuda_create_context(&mine, 1));
  CUdeviceptr r = 0;
  CHECK_OK(api.cuMemAlloc(&r, 4096));
  CHECK_OK(api.cuMemFree(r));
  CHECK_OK(api.cuCtxDestroy(mine));
  cudapool_stats s{};
  CHECK(c_api<int (*)(int, cudapool_stats*)>("cudapool_get_stats")(1, &s) == -1);  // pool dropped
}

struct FreeAtExit {
  CUdeviceptr p = 0;
  ~FreeAtExit() {
    if (p == 0) return;
    const long records = fakecuda_event_records();
    const CUresult r = api.cuMemFree(p);
    std::printf("exit free: result %d, event records %ld -> %ld\n", r, records, fakecuda_event_records());
    std::fflush(stdout);
  }
};
FreeAtExit free_at_exit;

void exit_path() {
  start_cuda();
  CHECK_OK(api.cuMemAlloc(&free_at_exit.p, 4096));
  CUdeviceptr q = 0;
  CHECK_OK(api.cuMemAlloc(&q, 4096));  // never freed: leaked at exit, no CUDA call for it
  std::exit(0);
}

// An allocation from a static destructor, which runs after the shim's exit handler: the driver
// serves it (no pool work once exiting), so a later free of it goes to the driver too.
struct AllocAtExit {
  bool armed = false;
  ~AllocAtExit() {
    if (!armed) return;
    const long allocs = driver_allocs(), frees = fakecuda_free_calls();
    CUdeviceptr p = 0;
    const CUresult r = api.cuMemAlloc(&p, 4096);  // a size the pool has cached
    const long allocs_after = driver_allocs();
    const CUresult f = p != 0 ? api.cuMemFree(p) : CUDA_ERROR_INVALID_VALUE;
    std::printf("exit alloc: result %d, driver allocations %ld -> %ld, free result %d, driver frees %ld -> %ld\n", r,
                allocs, allocs_after, f, frees, fakecuda_free_calls());
    std::fflush(stdout);
  }
};
AllocAtExit alloc_at_exit_check;

void alloc_at_exit() {
  start_cuda();
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 4096));
  CHECK_OK(api.cuMemFree(p));  // cached: a pool allocation of this size needs no driver call
  const long before = driver_allocs();
  CHECK_OK(api.cuMemAlloc(&p, 4096));
  CHECK(driver_allocs() == before);
  CHECK_OK(api.cuMemFree(p));
  alloc_at_exit_check.armed = true;
  std::printf("PASS alloc_at_exit\n");
  std::fflush(stdout);
  std::exit(0);
}

// cuMemAllocPitch with sizes that do not fit in size_t once rows are rounded up (or multiplied
// by the height): out of memory, never success with a short allocation.
void pitch_overflow() {
  start_cuda();
  CUdeviceptr ok = 0;
  std::size_t pitch = 0;
  CHECK_OK(api.cuMemAllocPitch(&ok, &pitch, 1000, 2, 4));
  CHECK(pitch == 1024);
  const cudapool_stats s0 = stats();
  CUdeviceptr p = 0;
  pitch = 7;
  CHECK(api.cuMemAllocPitch(&p, &pitch, SIZE_MAX - 100, 1, 4) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(p == 0 && pitch == 7);
  CHECK(api.cuMemAllocPitch(&p, &pitch, std::size_t{1} << 40, std::size_t{1} << 40, 4) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(p == 0 && pitch == 7);
  CHECK(api.cuMemAllocPitch(&p, &pitch, SIZE_MAX / 512 * 512, 2, 8) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(p == 0 && pitch == 7);
  CHECK(stats().allocations == s0.allocations);
  CHECK_OK(api.cuMemFree(ok));
}

// The parent's block, freed before the fork, comes back to the parent: the pool's clock is driven
// past the free's batch window (1 ms where ordering is free), however long the fork and the wait
// took. Within the window the next allocation is served from the segment's rest instead.
void fork_child() {
  drive_pool_clock();
  start_cuda();
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 1 << 20));
  CHECK_OK(api.cuMemFree(p));  // cached in the parent's pool
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    // The child never uses the parent's pool: no pool is visible, and a new allocation is a new
    // driver allocation (the fake, being host memory, keeps working after fork).
    cudapool_stats s{};
    if (c_api<int (*)(int, cudapool_stats*)>("cudapool_get_stats")(0, &s) != -1) std::_Exit(2);
    const long before = driver_allocs();
    CUdeviceptr q = 0;
    if (api.cuMemAlloc(&q, 1 << 20) != CUDA_SUCCESS) std::_Exit(3);
    if (driver_allocs() != before + 1) std::_Exit(4);
    std::_Exit(0);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The parent's pool is untouched.
  advance_pool_clock(kPastWindowsNs);
  const long before = driver_allocs();
  CUdeviceptr r = 0;
  CHECK_OK(api.cuMemAlloc(&r, 1 << 20));
  CHECK(r == p && driver_allocs() == before);
}

// Waits up to `seconds` for child `pid`; a child still running then is killed. Its exit status,
// or -1 when it had to be killed (a hang) or died of a signal.
int wait_child(pid_t pid, int seconds) {
  for (int ms = 0; ms < seconds * 1000; ++ms) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    usleep(1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// A thread logs without pause (a warning per interior-pointer free) while the main thread forks
// again and again; every child logs a warning of its own and ends with exit(), so the exit
// handlers run (summary, log flush). No child may hang on a logging lock that the logging thread
// held at the moment of the fork.
void fork_while_logging() {
  start_cuda();
  // The warnings go nowhere: a flood of them would fill the test's pipe (CHECK prints to stdout).
  const int devnull = open("/dev/null", O_WRONLY);
  CHECK(devnull >= 0 && dup2(devnull, 2) == 2);
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 8192));
  std::atomic<bool> stop{false};
  std::atomic<long> logged{0};
  std::thread logger([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      (void)api.cuMemFree(p + 512);  // an interior pointer: refused with a warning
      logged.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (logged.load() < 100) std::this_thread::yield();
  int hung = 0, failed = 0;
  constexpr int kForks = 200;
  for (int i = 0; i < kForks; ++i) {
    const pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      CUdeviceptr q = 0;
      if (api.cuMemAlloc(&q, 4096) != CUDA_SUCCESS) std::_Exit(3);
      if (api.cuMemFree(q) != CUDA_SUCCESS) std::_Exit(4);
      if (api.cuMemFree(q) != CUDA_ERROR_INVALID_VALUE) std::_Exit(5);  // a double free: a warning
      std::exit(0);
    }
    const int status = wait_child(pid, 10);
    hung += status == -1;
    failed += status > 0;
    if (hung > 0) break;  // one hang is the finding; the rest would each cost the timeout
  }
  stop.store(true);
  logger.join();
  std::printf("fork while logging: %d forks, %d hung, %d failed, %ld warnings logged\n", kForks, hung, failed,
              logged.load());
  CHECK(hung == 0);
  CHECK(failed == 0);
  CHECK_OK(api.cuMemFree(p));
}

// The summary (CUDAPOOL_STATS) after fork: a child that never uses CUDA writes none, one that
// does writes its own file beside the parent's; neither touches the parent's path, which the
// parent writes at its own exit. Prints the second child's pid for the test.
void fork_summary() {
  start_cuda();
  const char* path = std::getenv("CUDAPOOL_STATS");
  CHECK(path != nullptr);
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 1 << 20));
  CHECK_OK(api.cuMemFree(p));
  const pid_t quiet = fork();
  CHECK(quiet >= 0);
  if (quiet == 0) std::exit(0);  // exit handlers run; no CUDA used in this child
  CHECK(wait_child(quiet, 20) == 0);
  CHECK(access(path, F_OK) != 0);
  const pid_t busy = fork();
  CHECK(busy >= 0);
  if (busy == 0) {
    CUdeviceptr q = 0;
    if (api.cuMemAlloc(&q, 4096) != CUDA_SUCCESS || api.cuMemFree(q) != CUDA_SUCCESS) std::_Exit(3);
    std::exit(0);
  }
  CHECK(wait_child(busy, 20) == 0);
  CHECK(access(path, F_OK) != 0);
  std::printf("child with CUDA: pid %d\n", static_cast<int>(busy));
}

void threads() {
  start_cuda();
  CUcontext ctx = nullptr;
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&ctx, 0));
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::mt19937::result_type>(t));
      if (api.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++failures;
      std::vector<std::pair<CUdeviceptr, std::size_t>> live;
      for (int i = 0; i < 2000; ++i) {
        if (live.size() < 16 && rng() % 2 == 0) {
          const std::size_t n = 512 + rng() % (256 << 10);
          CUdeviceptr p = 0;
          const bool ptds = rng() % 2 == 0;
          CUresult r = ptds ? api.cuMemAllocAsync_ptds(&p, n, nullptr) : api.cuMemAlloc(&p, n);
          if (r != CUDA_SUCCESS) {
            ++failures;
            continue;
          }
          std::memset(reinterpret_cast<void*>(p), t + 1, n);  // host memory in the fake
          live.push_back({p, n});
        } else if (!live.empty()) {
          auto [p, n] = live.back();
          live.pop_back();
          const auto* b = reinterpret_cast<const unsigned char*>(p);
          for (std::size_t k = 0; k < n; k += 4093)
            if (b[k] != t + 1) ++failures;  // nobody else wrote
          if (b[n - 1] != t + 1) ++failures;
          if (api.cuMemFree(p) != CUDA_SUCCESS) ++failures;
        }
      }
      for (auto [p, n] : live)
        if (api.cuMemFree(p) != CUDA_SUCCESS) ++failures;
    });
  }
  for (auto& th : ts) th.join();
  CHECK(failures.load() == 0);
  CHECK(stats().allocations == 0);
  // A thread with no current context gets the driver's answer, not a crash.
  std::thread([] {
    CUdeviceptr p = 0;
    CHECK(api.cuMemAlloc(&p, 4096) == CUDA_ERROR_INVALID_CONTEXT);
  }).join();
}

void no_cuda() {
  // Never touches CUDA: libcuda must not even be loaded by the shim.
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  CHECK(maps != nullptr);
  char line[4096];
  while (std::fgets(line, sizeof line, maps) != nullptr) CHECK(std::strstr(line, "libcuda.so") == nullptr);
  std::fclose(maps);
  CHECK(c_api<int (*)()>("cudapool_active")() == 0);
  std::printf("hello without CUDA\n");
}

void alloc_once() {
  // For policy tests: the first allocation loads the policy.
  start_cuda();
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 4096));
  CHECK_OK(api.cuMemFree(p));
  std::printf("active=%d backend_passes=%lld\n", c_api<int (*)()>("cudapool_active")(),
              static_cast<long long>(c_api<int64_t (*)(const char*)>("cudapool_passthrough_count")("backend")));
}

// One "training step" of a program whose pool grows on its first step: small, medium and large
// tensors held together, then freed. Prints the driver allocations (cuMemAlloc and cuMemCreate,
// the calls that grow the pool) each step made: with warm_start, the first step makes none.
void warm_steps() {
  start_cuda();
  // The program's first allocation (its parameters, say) starts the pool, and a warm start with it.
  CUdeviceptr first = 0;
  CHECK_OK(api.cuMemAlloc(&first, 4096));
  constexpr std::size_t sizes[] = {256 << 10, 256 << 10, 512 << 10, 1 << 20,   768 << 10, 5 << 20,
                                   7 << 20,   40 << 20,  64 << 20,  100 << 20, 3 << 20,   1 << 20};
  for (int step = 1; step <= 3; ++step) {
    const long before = driver_allocs();
    std::vector<CUdeviceptr> held;
    for (int rep = 0; rep < 3; ++rep) {
      for (std::size_t n : sizes) {
        CUdeviceptr p = 0;
        CHECK_OK(api.cuMemAlloc(&p, n));
        held.push_back(p);
      }
    }
    for (CUdeviceptr p : held) CHECK_OK(api.cuMemFree(p));
    std::printf("step %d driver_allocs=%ld\n", step, driver_allocs() - before);
  }
  CHECK_OK(api.cuMemFree(first));
}

void immediate_reuse() {
  // Under free_sync:immediate a freed block is reused at once on its stream even though the
  // legacy stream is still busy: the policy the GPU race test shows to be unsafe.
  start_cuda();
  CUdeviceptr p = 0, q = 0;
  CHECK_OK(api.cuMemAlloc(&p, 1 << 20));
  fakecuda_hold_stream(CU_STREAM_LEGACY);
  CHECK_OK(api.cuMemFree(p));
  CHECK_OK(api.cuMemAlloc(&q, 1 << 20));
  CHECK(q == p);
  fakecuda_release_stream(CU_STREAM_LEGACY);
}

void device_sync() {
  // free_sync:device: a pending block that is needed is waited for (one host sync) instead of
  // taking new memory from the driver.
  start_cuda();
  CUdeviceptr p = 0, q = 0;
  constexpr std::size_t n = 12 << 20;  // fills its 12 MiB segment: no remainder to serve from
  CHECK_OK(api.cuMemAlloc(&p, n));
  fakecuda_hold_stream(CU_STREAM_LEGACY);
  CHECK_OK(api.cuMemFree(p));
  const long syncs = fakecuda_event_syncs();
  const long allocs = fakecuda_alloc_calls();
  CHECK_OK(api.cuMemAlloc(&q, n));
  CHECK(q == p);
  CHECK(fakecuda_alloc_calls() == allocs);
  CHECK(fakecuda_event_syncs() > syncs);
}

// The default policy (free_sync:gpu_wait): a block freed while work that may use it is pending
// on any kind of stream is reused at once when the pool would otherwise grow, without a host
// wait, and every stream is made to wait on the GPU for that work: the legacy, blocking and
// per-thread streams, every non-blocking stream, non-blocking streams created afterwards, and
// the case where the busy stream was destroyed after the free.
void gpu_wait_reuse() {
  drive_pool_clock();
  start_cuda();
  CUstream nb = nullptr, nb2 = nullptr, blocking = nullptr, doomed = nullptr;
  CHECK_OK(api.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CHECK_OK(api.cuStreamCreate(&nb2, CU_STREAM_NON_BLOCKING));
  CHECK_OK(api.cuStreamCreate(&blocking, 0));
  CHECK_OK(api.cuStreamCreate(&doomed, CU_STREAM_NON_BLOCKING));
  // Beyond expandable segments' growth slack (16 MiB), so the pool reuses rather than maps more;
  // a segment of its own under classic segments.
  constexpr std::size_t n = 24 << 20;
  const CUstream all[] = {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, nb, nb2, blocking};
  for (CUstream busy : {nb, blocking, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, doomed}) {
    CUdeviceptr p = 0, q = 0;
    CHECK_OK(api.cuMemAlloc(&p, n));
    fakecuda_hold_stream(busy);
    CHECK_OK(api.cuMemFree(p));
    if (busy == doomed) CHECK_OK(api.cuStreamDestroy(doomed));  // its work still runs
    const long allocs = driver_allocs(), syncs = fakecuda_event_syncs();
    const long waits = fakecuda_stream_waits();
    CHECK_OK(api.cuMemAlloc(&q, n));
    CHECK(q == p);                                                    // reused at once…
    CHECK(driver_allocs() == allocs);                                 // …instead of new memory…
    CHECK(fakecuda_event_syncs() == syncs);                           // …and without a host wait
    for (CUstream s : all) CHECK(fakecuda_would_wait(s, busy) == 1);  // the GPU waits instead
    CUstream later = nullptr;
    CHECK_OK(api.cuStreamCreate(&later, CU_STREAM_NON_BLOCKING));
    CHECK(fakecuda_would_wait(later, busy) == 1);
    CHECK_OK(api.cuStreamDestroy(later));
    // Joined before fanning out: about two waits per non-blocking stream, never one per pair.
    CHECK(fakecuda_stream_waits() - waits <= 2 * 4 + 1);
    fakecuda_release_stream(busy);
    CHECK_OK(api.cuMemFree(q));
    advance_pool_clock(kPastWindowsNs);  // the fence window passes
  }
  // Nothing pending: no stream of the program is made to wait (a sweep's waits are on the
  // shim's own stream); with context-wide fences, at most one context-wide wait on the fence,
  // unasked (it has completed: the wait orders nothing, and costs less than the query).
  CUdeviceptr p = 0, q = 0;
  CHECK_OK(api.cuMemAlloc(&p, n));
  CHECK_OK(api.cuMemFree(p));
  std::vector<long> waits;
  for (CUstream s : all) waits.push_back(fakecuda_waits_by(s));
  const long ctx_waits = fakecuda_ctx_waits();
  CHECK_OK(api.cuMemAlloc(&q, n));
  CHECK(q == p);
  for (std::size_t i = 0; i < std::size(all); ++i) CHECK(fakecuda_waits_by(all[i]) == waits[i]);
  CHECK(fakecuda_ctx_waits() - ctx_waits <= 1);
  CHECK_OK(api.cuMemFree(q));
  for (CUstream s : {nb, nb2, blocking}) CHECK_OK(api.cuStreamDestroy(s));
}

// A context with no non-blocking stream: a block freed while work that may use it is pending on
// the legacy, a per-thread or a blocking stream is reused with no driver call beyond its fence's
// record (every such stream follows the legacy stream, which runs the fence first: no query, no
// wait, no join event), and still every stream is ordered after that work, a non-blocking stream
// created afterwards included (it waits at creation). Once such a stream exists, reuse goes back
// to waits on the GPU.
void gpu_wait_legacy_only() {
  drive_pool_clock();
  start_cuda();
  CUstream blocking = nullptr;
  CHECK_OK(api.cuStreamCreate(&blocking, 0));
  constexpr std::size_t n = 24 << 20;  // beyond the growth slack, as in gpu_wait_reuse
  for (CUstream busy : {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, blocking}) {
    CUdeviceptr p = 0, q = 0;
    CHECK_OK(api.cuMemAlloc(&p, n));
    fakecuda_hold_stream(busy);
    CHECK_OK(api.cuMemFree(p));
    const long allocs = driver_allocs(), syncs = fakecuda_event_syncs();
    const long waits = fakecuda_stream_waits(), records = fakecuda_event_records();
    CHECK_OK(api.cuMemAlloc(&q, n));
    CHECK(q == p);
    CHECK(driver_allocs() == allocs);
    CHECK(fakecuda_event_syncs() == syncs);
    CHECK(fakecuda_stream_waits() == waits);         // nothing waited on…
    CHECK(fakecuda_event_records() - records <= 1);  // …beyond the fence of the free
    for (CUstream s : {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, blocking}) CHECK(fakecuda_would_wait(s, busy) == 1);
    CUstream later = nullptr;
    CHECK_OK(api.cuStreamCreate(&later, CU_STREAM_NON_BLOCKING));
    CHECK(fakecuda_would_wait(later, busy) == 1);
    // With a non-blocking stream alive, the next reuse must make it wait.
    fakecuda_release_stream(busy);
    CUdeviceptr r = 0;
    CHECK_OK(api.cuMemFree(q));
    advance_pool_clock(kPastWindowsNs);
    CHECK_OK(api.cuMemAlloc(&r, n));
    fakecuda_hold_stream(busy);
    CHECK_OK(api.cuMemFree(r));
    CHECK_OK(api.cuMemAlloc(&q, n));
    CHECK(q == r);
    CHECK(fakecuda_would_wait(later, busy) == 1);
    fakecuda_release_stream(busy);
    CHECK_OK(api.cuMemFree(q));
    CHECK_OK(api.cuStreamDestroy(later));
    advance_pool_clock(kPastWindowsNs);
  }
  CHECK_OK(api.cuStreamDestroy(blocking));
}

// `us` microseconds pass: on the pool's clock where the scenario drives it, else a busy wait (a
// sleep would overshoot the pool's 20 us window by far).
void spin_us(int us) {
  if (pool_clock_driven()) {
    advance_pool_clock(std::int64_t{us} * 1000);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(us)) {
  }
}

// Milliseconds on the pool's clock as the scenario drives it, since `t0` (pool_clock_now()).
long pool_ms_since(std::int64_t t0) { return static_cast<long>((pool_clock_now() - t0) / 1'000'000); }

// The legacy churn loop: three buffers allocated and freed per iteration, 30 us apart (longer than
// the pool's short batch window); with `hold`, the legacy stream is held busy after the
// allocations (the iteration's kernels, still running when the host frees). Two of the buffers
// are large, and the pool holds about what one iteration needs, so each iteration's first
// allocation misses and closes the previous iteration's batch: a fence per iteration, whichever
// window applies.
void legacy_churn(int iters, bool hold) {
  for (int it = 0; it < iters; ++it) {
    const std::size_t n = (2u << 20) << (it % 2);
    CUdeviceptr x = 0, y = 0, out = 0;
    CHECK_OK(api.cuMemAlloc(&x, n));
    CHECK_OK(api.cuMemAlloc(&y, n));
    CHECK_OK(api.cuMemAlloc(&out, 8));
    if (hold) fakecuda_hold_stream(CU_STREAM_LEGACY);
    CHECK_OK(api.cuMemFree(out));
    CHECK_OK(api.cuMemFree(y));
    CHECK_OK(api.cuMemFree(x));
    spin_us(30);
  }
}

// The legacy churn pattern (three buffers allocated and freed per iteration, the fence window
// passing in between) in a context whose streams all follow the legacy stream: each batch is
// reused as soon as its fence is recorded, with no cuEventQuery for it (one per millisecond at
// most, for the pool's bookkeeping), while the legacy stream is held busy so that no fence ever
// completes on its own; every stream still runs behind the held work, a non-blocking stream
// created afterwards too. With a non-blocking stream alive the same holds with context-wide
// fences (one context-wide wait a batch); without them, the loop asks its fences and the stream
// again (the negative control: ordering is not free there).
void gpu_wait_without_queries() {
  drive_pool_clock();  // the loops' 30 us pass on the pool's clock, however fast the machine
  start_cuda();
  CUstream blocking = nullptr;
  CHECK_OK(api.cuStreamCreate(&blocking, 0));
  auto churn = [](int iters, bool hold) { legacy_churn(iters, hold); };
  churn(8, false);  // warm: the pool holds what one iteration needs
  constexpr int kIters = 400;
  const long queries = fakecuda_event_queries(), allocs = driver_allocs(), syncs = fakecuda_event_syncs();
  const long records = fakecuda_event_records();
  const std::int64_t t0 = pool_clock_now();
  churn(kIters, true);
  const long ms = pool_ms_since(t0);
  // A fence per iteration's batch, but no query for each: the fences of the GPU-side waits are
  // asked once a millisecond or once 8 more are outstanding (two queries while the newest runs),
  // plus once those the warm loop left.
  const long bound = 2 * (ms + kIters / 8) + 20;
  CHECK(bound < kIters);
  CHECK(fakecuda_event_records() - records >= kIters - 1);
  CHECK(fakecuda_event_queries() - queries <= bound);
  CHECK(driver_allocs() == allocs);        // reused, not grown
  CHECK(fakecuda_event_syncs() == syncs);  // and no host wait
  for (CUstream s : {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, blocking})
    CHECK(fakecuda_would_wait(s, CU_STREAM_LEGACY) == 1);
  // Frees that no allocation needs soon (each 64 KiB block is served from the rest of its
  // segment) wait in the open batch for the long window (1 ms where ordering is free), not 20 us:
  // about one fence per millisecond, plus one per miss when the segment's rest runs out, not one
  // per iteration.
  {
    constexpr int kPairs = 200;
    const long rec0 = fakecuda_event_records();
    const std::int64_t t2 = pool_clock_now();
    for (int i = 0; i < kPairs; ++i) {
      CUdeviceptr p = 0;
      CHECK_OK(api.cuMemAlloc(&p, 64 << 10));
      CHECK_OK(api.cuMemFree(p));
      spin_us(30);
    }
    const long ms3 = pool_ms_since(t2);
    const long fences = fakecuda_event_records() - rec0;
    std::printf("frees 30 us apart, served from the rest: %ld fences in %d pairs (%ld ms)\n", fences, kPairs, ms3);
    const long bound3 = ms3 + kPairs / 16 + 2;
    CHECK(bound3 < kPairs / 2);  // the bound tells the two apart
    CHECK(fences <= bound3);
  }
  CUstream later = nullptr;
  CHECK_OK(api.cuStreamCreate(&later, CU_STREAM_NON_BLOCKING));
  CHECK(fakecuda_would_wait(later, CU_STREAM_LEGACY) == 1);
  fakecuda_release_stream(CU_STREAM_LEGACY);
  // A non-blocking stream is alive now. With context-wide fences, ordering stays cheap: one
  // context-wide wait a batch, still no query each, and every stream, the non-blocking one
  // included, runs behind the held work. Without them (a driver before CUDA 12.5; the negative
  // control), ordering would take a join and a wait per stream: fences are asked again, and cover
  // the non-blocking stream by sweeps.
  const bool context_wide = std::getenv("FAKECUDA_NO_CONTEXT_EVENTS") == nullptr;
  const long q2 = fakecuda_event_queries(), allocs2 = driver_allocs(), syncs2 = fakecuda_event_syncs();
  const long rec2 = fakecuda_records_on(later), ctx2 = fakecuda_ctx_records(), cw2 = fakecuda_ctx_waits();
  const std::int64_t t1 = pool_clock_now();
  churn(kIters, context_wide);
  const long ms2 = pool_ms_since(t1);
  std::printf("with a non-blocking stream: %ld event queries, %ld events on it, %ld context-wide\n",
              fakecuda_event_queries() - q2, fakecuda_records_on(later) - rec2, fakecuda_ctx_records() - ctx2);
  if (context_wide) {
    const long bound2 = 2 * (ms2 + kIters / 8) + 20;
    CHECK(bound2 < kIters);
    CHECK(fakecuda_ctx_records() - ctx2 >= kIters - 1);
    CHECK(fakecuda_ctx_waits() - cw2 >= kIters / 2);  // ordered: about one wait a batch
    CHECK(fakecuda_event_queries() - q2 <= bound2);
    CHECK(driver_allocs() == allocs2);
    CHECK(fakecuda_event_syncs() == syncs2);
    for (CUstream s : {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, blocking, later})
      CHECK(fakecuda_would_wait(s, CU_STREAM_LEGACY) == 1);
    fakecuda_release_stream(CU_STREAM_LEGACY);
  } else {
    CHECK(fakecuda_event_queries() - q2 >= 1);
    CHECK(fakecuda_records_on(later) - rec2 >= 1);
  }
  CHECK_OK(api.cuStreamDestroy(later));
  CHECK_OK(api.cuStreamDestroy(blocking));
}

// The fences of GPU-side waits are polled by bisection: with 200 of them completed since the last
// poll and the newest still running, one poll costs about log2(200) queries, not one or two per
// completed fence (context-wide fences, ordered for free; run under the default policy).
void ordered_poll_bisection() {
  drive_pool_clock();
  start_cuda();
  CUstream nb = nullptr;
  CHECK_OK(api.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  legacy_churn(8, false);
  constexpr int kFences = 200;
  const long ctx0 = fakecuda_ctx_records();
  legacy_churn(kFences, true);  // ordered behind the held legacy stream: none completes
  CHECK(fakecuda_ctx_records() - ctx0 >= kFences - 1);
  // One more fence, behind a held non-blocking stream too.
  fakecuda_hold_stream(nb);
  CUdeviceptr p = 0, q = 0;
  CHECK_OK(api.cuMemAlloc(&p, 64 << 10));
  CHECK_OK(api.cuMemFree(p));
  advance_pool_clock(100'000);             // the batch window passes
  CHECK_OK(api.cuMemAlloc(&p, 64 << 10));  // records it, orders it
  CHECK_OK(api.cuMemFree(p));
  fakecuda_release_stream(CU_STREAM_LEGACY);  // all but the newest complete now
  advance_pool_clock(2'000'000);              // the poll gap passes
  const long queries = fakecuda_event_queries();
  CHECK_OK(api.cuMemAlloc(&q, 64 << 10));  // polls
  const long asked = fakecuda_event_queries() - queries;
  std::printf("a poll after %d completed fences: %ld event queries\n", kFences, asked);
  CHECK(asked >= 1);
  CHECK(asked <= 16);
  fakecuda_release_stream(nb);
  CHECK_OK(api.cuMemFree(q));
  CHECK_OK(api.cuStreamDestroy(nb));
}

// Libraries create non-blocking streams by the dozen and rarely use them (PyTorch's cuDNN and
// cuBLAS handles: 16 per thread). A device fence must still cover them, but not with an event on
// each per fence: the legacy churn loop with 16 idle non-blocking streams alive records about one
// event per batch, context-wide (cuCtxRecordEvent: no event on the streams at all), or, where the
// driver refuses those (FAKECUDA_NO_CONTEXT_EVENTS), its legacy fence, and the streams are covered
// in sweeps (an event on each, gathered on the shim's own stream), at most one per few
// milliseconds or per miss, not once per fence. Safety: with one of those streams busy (its work may use
// the freed block), the block is not reused until that work has finished; the negative control,
// free_sync:immediate, reuses it at once. Run under the default policy.
void gpu_wait_idle_streams() {
  drive_pool_clock();
  start_cuda();
  constexpr int kStreams = 16;
  std::vector<CUstream> idle(kStreams);
  for (CUstream& s : idle) CHECK_OK(api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  auto churn = [](int iters) { legacy_churn(iters, false); };
  churn(8);
  constexpr int kIters = 400;
  const long records = fakecuda_event_records(), squeries = fakecuda_stream_queries();
  const long on_idle = fakecuda_records_on(idle[0]);
  const long ctx_records = fakecuda_ctx_records();
  const long allocs = driver_allocs();
  const std::int64_t t0 = pool_clock_now();
  churn(kIters);
  const long ms = pool_ms_since(t0);
  // One sweep asks 16 streams; at most one sweep begins per millisecond, plus those the pool's
  // misses force (memory wanted now: classic segments, which have no growth slack, ask on about
  // one iteration in four).
  const long sweeps_bound = ms + 2 + kIters / 3;
  // A sweep records an event on each stream and one on the gather stream.
  const long records_bound = 2 * kIters + (kStreams + 1) * sweeps_bound;
  CHECK(records_bound < kStreams * kIters);  // the bounds tell the two apart
  std::printf(
      "idle streams: %ld event records, %ld stream queries, %ld driver allocations in %d iterations (%ld ms); "
      "%ld context-wide records, %ld events on the first stream\n",
      fakecuda_event_records() - records, fakecuda_stream_queries() - squeries, driver_allocs() - allocs, kIters, ms,
      fakecuda_ctx_records() - ctx_records, fakecuda_records_on(idle[0]) - on_idle);
  CHECK(fakecuda_event_records() - records <= records_bound);  // not one per stream per fence
  CHECK(fakecuda_records_on(idle[0]) - on_idle <= sweeps_bound);
  CHECK(fakecuda_stream_queries() - squeries <= kStreams * sweeps_bound);
  // The memory came back: reused, not grown past a few pages within the growth slack (blocks wait
  // up to a sweep gap for their streams to be asked).
  CHECK(driver_allocs() - allocs <= 4);
  // Safety: work pending on one of the streams when the host frees. The block may come back
  // while that work runs only with every stream ordered after it on the GPU (gpu_wait); a block
  // handed out with some stream free to run ahead is reused early.
  const bool immediate = std::getenv("CUDAPOOL_CONF") != nullptr &&
                         std::string(std::getenv("CUDAPOOL_CONF")).find("immediate") != std::string::npos;
  constexpr std::size_t n = 3 << 20;
  int early = 0, reused = 0;
  for (int round = 0; round < 4; ++round) {
    CUstream busy = idle[static_cast<std::size_t>(round * 5 % kStreams)];
    advance_pool_clock(kPastWindowsNs);  // earlier frees come back, a sweep is due
    CUdeviceptr p = 0;
    CHECK_OK(api.cuMemAlloc(&p, n));
    fakecuda_hold_stream(busy);
    CHECK_OK(api.cuMemFree(p));
    advance_pool_clock(kPastWindowsNs);  // the batch window and the sweep gap pass
    std::vector<CUdeviceptr> got;
    for (int i = 0; i < 32; ++i) {  // until the freed block comes back
      CUdeviceptr q = 0;
      CHECK_OK(api.cuMemAlloc(&q, n));
      got.push_back(q);
      if (!overlaps(p, n, q, n)) continue;
      ++reused;
      bool ordered = fakecuda_would_wait(CU_STREAM_LEGACY, busy) == 1;
      for (CUstream s : idle) ordered = ordered && fakecuda_would_wait(s, busy) == 1;
      early += !ordered;
      break;
    }
    fakecuda_release_stream(busy);
    for (CUdeviceptr q : got) CHECK_OK(api.cuMemFree(q));
  }
  std::printf("busy stream: freed block reused in %d of 4 rounds, %d of them before its work was ordered\n", reused,
              early);
  if (immediate) {
    CHECK(early > 0);  // the negative control: without cudaFree's meaning the block comes back early
  } else {
    CHECK(early == 0);
  }
  for (CUstream s : idle) CHECK_OK(api.cuStreamDestroy(s));
}

// GPU-side waits across threads and contexts: a block freed by another thread while its stream is
// busy is reused by this one with the waits in place; each context's pool orders its own streams
// (a context's memory is used by its own streams: cudaFree's wait is per context too); a reset
// while a join event runs leaves nothing stale behind.
void gpu_wait_threads_contexts() {
  CUcontext ctx = start_cuda();
  // Beyond expandable segments' growth slack (16 MiB), so the pool reuses rather than maps more;
  // a segment of its own under classic segments.
  constexpr std::size_t n = 24 << 20;
  CUstream mine = nullptr;
  CHECK_OK(api.cuStreamCreate(&mine, CU_STREAM_NON_BLOCKING));
  CUstream theirs = nullptr;
  CUdeviceptr p = 0;
  std::thread t([&] {
    CHECK_OK(api.cuCtxSetCurrent(ctx));
    CHECK_OK(api.cuStreamCreate(&theirs, CU_STREAM_NON_BLOCKING));
    CHECK_OK(api.cuMemAlloc(&p, n));
    fakecuda_hold_stream(theirs);
    CHECK_OK(api.cuMemFree(p));
  });
  t.join();
  CUdeviceptr q = 0;
  CHECK_OK(api.cuMemAlloc(&q, n));
  CHECK(q == p);
  for (CUstream s : {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, mine}) CHECK(fakecuda_would_wait(s, theirs) == 1);
  fakecuda_release_stream(theirs);
  CHECK_OK(api.cuMemFree(q));

  // A second context (device 1) with a busy non-blocking stream of its own.
  CUcontext other = nullptr;
  CHECK_OK(fakecuda_create_context(&other, 1));
  CUstream b_busy = nullptr, b_idle = nullptr;
  CHECK_OK(api.cuStreamCreate(&b_busy, CU_STREAM_NON_BLOCKING));
  CHECK_OK(api.cuStreamCreate(&b_idle, CU_STREAM_NON_BLOCKING));
  CUdeviceptr r = 0, r2 = 0;
  CHECK_OK(api.cuMemAlloc(&r, n));
  fakecuda_hold_stream(b_busy);
  CHECK_OK(api.cuMemFree(r));
  CHECK_OK(api.cuMemAlloc(&r2, n));
  CHECK(r2 == r);
  CHECK(fakecuda_would_wait(b_idle, b_busy) == 1);  // context B's pool ordered B's streams
  CHECK(fakecuda_would_wait(mine, b_busy) == 0);    // and left context A's alone
  fakecuda_release_stream(b_busy);
  CHECK_OK(api.cuMemFree(r2));
  CHECK_OK(api.cuCtxDestroy(other));

  // A reset while a join event still runs: the context's fences are forgotten with it.
  CHECK_OK(api.cuCtxSetCurrent(ctx));
  CUdeviceptr x = 0, y = 0;
  CHECK_OK(api.cuMemAlloc(&x, n));
  fakecuda_hold_stream(mine);
  CHECK_OK(api.cuMemFree(x));
  CHECK_OK(api.cuMemAlloc(&y, n));
  CHECK(y == x);
  CHECK_OK(api.cuDevicePrimaryCtxReset(0));
  fakecuda_release_stream(mine);
  CUcontext again = nullptr;
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&again, 0));
  CHECK_OK(api.cuCtxSetCurrent(again));
  const long waits = fakecuda_stream_waits();
  CUstream fresh = nullptr;
  CHECK_OK(api.cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING));
  CHECK(fakecuda_stream_waits() == waits);  // no wait on a dead context's join event
  CUdeviceptr z = 0;
  CHECK_OK(api.cuMemAlloc(&z, n));
  CHECK(fakecuda_is_live(z));
  CHECK_OK(api.cuMemFree(z));
}

// cuMemGetInfo as the program sees it: before any allocation, with 20 MiB allocated, after the
// free (cached). The test runs it under caps and without.
void mem_info() {
  start_cuda();
  auto show = [](const char* when) {
    std::size_t f = 0, t = 0;
    CHECK_OK(api.cuMemGetInfo(&f, &t));
    std::printf("%s total_mib=%zu free_mib=%zu\n", when, t >> 20, f >> 20);
  };
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 4096));  // the pool exists (a 2 MiB small segment)
  CHECK_OK(api.cuMemFree(p));
  show("start");
  CHECK_OK(api.cuMemAlloc(&p, 20 << 20));
  show("allocated");
  CHECK_OK(api.cuMemFree(p));
  show("freed");
}

// cuMemGetInfo as the first call in a fresh context, then after an allocation and its free, by
// every way a program reaches it: the entry point it linked or resolved (api), cuGetProcAddress
// at every version and flavour (cudart's cudaGetDriverEntryPoint and ...ByVersion are that call
// with cudart's version or the caller's), the 11.x four-argument cuGetProcAddress, the 32-bit
// form CUDA 3.1 had, dlsym on libcuda's handle and on the global scope, and an exported
// variant's own name (where the driver resolves it: FAKECUDA_PROC_EXACT_NAMES). Every one must
// be the shim's wrapper. Prints "info PHASE WAY total_mib=T free_mib=F" per way; the test
// checks them against the cap. `create`: the context comes from cuCtxCreate, else the primary
// context is retained and made current (through cudart's table in the cudart build: the
// runtime's implicit context).
void info_first(bool create) {
  resolve_api();
  CHECK_OK(api.cuInit(0));
  CUcontext ctx = nullptr;
  if (create) {
    CHECK_OK(api.cuCtxCreate(&ctx, 0, 0));
  } else {
    CHECK_OK(api.cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK_OK(api.cuCtxSetCurrent(ctx));
  }
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(h != nullptr);
  using V1 = CUresult (*)(unsigned*, unsigned*);
  auto proc = [](const char* name, int version, cuuint64_t flags) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st = -1;
    CHECK_OK(api.cuGetProcAddress(name, &fn, version, flags, &st));
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && fn != nullptr);
    CHECK(from_shim(fn));
    return fn;
  };
  auto proc_v1 = reinterpret_cast<PFN_cuGetProcAddress_v1>(dlsym(h, "cuGetProcAddress"));
  CHECK(proc_v1 != nullptr && from_shim(reinterpret_cast<void*>(proc_v1)));
  const bool exact = std::getenv("FAKECUDA_PROC_EXACT_NAMES") != nullptr;
  auto show = [&](const char* phase) {
    struct Way {
      const char* name;
      void* fn;
      bool v1;
    };
    void* fn_v1 = nullptr;
    CHECK_OK(proc_v1("cuMemGetInfo", &fn_v1, 11030, 0));
    CHECK(from_shim(fn_v1));
    std::vector<Way> ways = {
        {"api", reinterpret_cast<void*>(api.cuMemGetInfo), false},
        {"proc_3020", proc("cuMemGetInfo", 3020, 0), false},
        {"proc_12000", proc("cuMemGetInfo", 12000, 0), false},
        {"proc_13000_ptds", proc("cuMemGetInfo", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), false},
        {"entry_point", proc("cuMemGetInfo", 13000, 0), false},
        {"entry_point_by_version_11080", proc("cuMemGetInfo", 11080, 0), false},
        {"proc_v1_11030", fn_v1, false},
        {"proc_2000_32bit", proc("cuMemGetInfo", 2000, 0), true},
        {"dlsym_libcuda_v2", dlsym(h, "cuMemGetInfo_v2"), false},
        {"dlsym_libcuda_v1_32bit", dlsym(h, "cuMemGetInfo"), true},
        {"dlsym_default_v2", dlsym(RTLD_DEFAULT, "cuMemGetInfo_v2"), false},
    };
    if (exact) ways.push_back({"proc_exact_name_v2", proc("cuMemGetInfo_v2", 3020, 0), false});
    for (const Way& w : ways) {
      CHECK(w.fn != nullptr && from_shim(w.fn));
      std::size_t f = 0, t = 0;
      if (w.v1) {
        unsigned f32 = 0, t32 = 0;
        CHECK_OK(reinterpret_cast<V1>(w.fn)(&f32, &t32));
        f = f32, t = t32;
      } else {
        CHECK_OK(reinterpret_cast<PFN_cuMemGetInfo_v2>(w.fn)(&f, &t));
      }
      std::printf("info %s %s total_mib=%zu free_mib=%zu\n", phase, w.name, t >> 20, f >> 20);
    }
  };
  show("first");
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 64 << 20));
  show("allocated");
  CHECK_OK(api.cuMemFree(p));
  show("freed");
}
void info_first_primary() { info_first(false); }
void info_first_ctx_create() { info_first(true); }

// Pinned host memory (cudaHostAlloc / cudaMallocHost / cudaFreeHost reach these entry points).
// PINNED=pool (policy pinned_cache:True): a freed block stays cached and comes back only once
// the device is done with it (work held on the legacy stream stands for an async copy still
// reading it); a foreign pointer and pinned memory the shim never saw go to the driver; a
// double free is refused without the driver; past the held-memory bound the pool waits for a
// fitting block's fence rather than pinning more; the memory of a reset context is never reused.
// PINNED=driver: every call reaches the driver. HOST_SYNC=1: a pooled free synchronizes.
void pinned() {
  start_cuda();
  const bool pool = std::string(std::getenv("PINNED") != nullptr ? std::getenv("PINNED") : "") == "pool";
  const long syncs_per_free = std::getenv("HOST_SYNC") != nullptr ? 1 : 0;
  // REGISTER=1 (pinned_use_cuda_host_register): the pool maps pages itself and registers them.
  const bool reg = std::getenv("REGISTER") != nullptr;
  auto driver_allocs = [&] { return reg ? fakecuda_host_register_calls() : fakecuda_host_alloc_calls(); };
  auto pinned_live = [&](void* p) { return reg || fakecuda_host_is_live(p) != 0; };
  const long allocs0 = driver_allocs(), frees0 = fakecuda_host_free_calls();
  const long unregs0 = fakecuda_host_unregister_calls();
  constexpr std::size_t n = 1 << 20;
  void* a = nullptr;
  CHECK_OK(api.cuMemHostAlloc(&a, n, 0));
  CHECK(a != nullptr && pinned_live(a));
  static_cast<char*>(a)[n - 1] = 1;
  CHECK(driver_allocs() == allocs0 + 1);
  if (!pool) {
    CHECK_OK(api.cuMemFreeHost(a));
    CHECK(fakecuda_host_free_calls() == frees0 + 1);  // the driver's, at once
    CHECK_OK(api.cuMemAllocHost(&a, n));
    CHECK(fakecuda_host_alloc_calls() == allocs0 + 2);
    CHECK_OK(api.cuMemFreeHost(a));
    cudapool_host_stats none{};
    CHECK(c_api<int (*)(cudapool_host_stats*)>("cudapool_get_host_stats")(&none) == -1);  // never started
    return;
  }
  // Live pinned memory beside it, so that new memory for one more block stays within the pool's
  // held-memory bound (1.25x the live bytes): the pool may then pass a running block over.
  void* keep = nullptr;
  CHECK_OK(api.cuMemHostAlloc(&keep, 4 * n, 0));
  CHECK(driver_allocs() == allocs0 + 2);
  // An async copy from `a` is still running when the program frees it.
  fakecuda_hold_stream(CU_STREAM_LEGACY);
  const long syncs0 = fakecuda_ctx_syncs();
  CHECK_OK(api.cuMemFreeHost(a));
  CHECK(fakecuda_ctx_syncs() == syncs0 + syncs_per_free);
  CHECK(fakecuda_host_free_calls() == frees0 && pinned_live(a));  // cached, not given back
  void* b = nullptr;
  CHECK_OK(api.cuMemHostAlloc(&b, n, 0));
  CHECK(b != a);  // the copy may still read `a`: never handed out before the fence completes
  CHECK(driver_allocs() == allocs0 + 3);
  fakecuda_release_stream(CU_STREAM_LEGACY);
  void* c = nullptr;
  CHECK_OK(api.cuMemAllocHost(&c, n - 4096));  // cudaMallocHost: the same kind of memory
  CHECK(c == a);                               // the device is done with it: reused
  CHECK(driver_allocs() == allocs0 + 3);
  cudapool_host_stats hs{};
  CHECK(c_api<int (*)(cudapool_host_stats*)>("cudapool_get_host_stats")(&hs) == 0);
  CHECK(hs.cache_hits == 1 && hs.fence_skips >= 1 && hs.blocks == 3 && hs.num_host_alloc == 3);
  CHECK(hs.requested_bytes == static_cast<int64_t>(6 * n - 4096) && hs.reserved_bytes == static_cast<int64_t>(6 * n));
  // Past the bound the pool does not pin more memory while a fitting block only waits for its
  // fence: the host waits for that fence (in the fake, the copy then finishes) and the block
  // comes back. (With free_host_sync every free waited already: no wait is left to make.)
  fakecuda_hold_stream(CU_STREAM_LEGACY);
  CHECK_OK(api.cuMemFreeHost(keep));
  CHECK_OK(api.cuMemFreeHost(b));
  const long waits0 = fakecuda_event_syncs();
  void* e = nullptr;
  CHECK_OK(api.cuMemHostAlloc(&e, n, 0));
  CHECK(e == b);
  CHECK(driver_allocs() == allocs0 + 3);
  if (syncs_per_free == 0) CHECK(fakecuda_event_syncs() == waits0 + 1);
  fakecuda_release_stream(CU_STREAM_LEGACY);
  // Foreign pointers go to the driver untouched: its answer for memory it never pinned, and its
  // free of pinned memory the shim never saw made.
  int local = 0;
  CHECK(api.cuMemFreeHost(&local) == CUDA_ERROR_INVALID_VALUE);
  void* unseen = nullptr;
  CHECK_OK(fakecuda_host_alloc_unseen(&unseen, n));
  CHECK_OK(api.cuMemFreeHost(unseen));
  CHECK(fakecuda_host_free_calls() == frees0 + 1 && !fakecuda_host_is_live(unseen));
  // A double free is refused, and the cached block stays the pool's (never the driver's to free).
  CHECK_OK(api.cuMemFreeHost(c));
  CHECK(api.cuMemFreeHost(c) == CUDA_ERROR_INVALID_VALUE);
  CHECK(fakecuda_host_free_calls() == frees0 + 1 && pinned_live(c));
  CHECK(fakecuda_host_unregister_calls() == unregs0);
  CHECK_OK(api.cuMemFreeHost(b));
  // A reset context takes its pinned memory along: nothing of it comes back.
  CHECK_OK(api.cuDevicePrimaryCtxReset(0));
  CHECK(reg || !fakecuda_host_is_live(c));
  CUcontext ctx = nullptr;
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK_OK(api.cuCtxSetCurrent(ctx));
  void* d = nullptr;
  CHECK_OK(api.cuMemHostAlloc(&d, n, 0));
  CHECK(pinned_live(d));
  CHECK(driver_allocs() == allocs0 + (reg ? 4 : 5));  // a, keep, b, (the unseen one,) d
  CHECK_OK(api.cuMemFreeHost(d));
}

// While a graph capture is open, no wait may be inserted anywhere (a wait on the capturing
// stream would join its graph; legacy-stream work breaks the capture of a blocking stream): the
// pending block is not reused, the capture stays valid.
void gpu_wait_capture() {
  start_cuda();
  CUstream cap = nullptr, nb = nullptr;
  CHECK_OK(api.cuStreamCreate(&cap, 0));  // blocking: legacy-stream work would break it
  CHECK_OK(api.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  // Beyond expandable segments' growth slack (16 MiB), so the pool reuses rather than maps more;
  // a segment of its own under classic segments.
  constexpr std::size_t n = 24 << 20;
  CUdeviceptr p = 0, q = 0;
  CHECK_OK(api.cuMemAlloc(&p, n));
  fakecuda_hold_stream(nb);
  CHECK_OK(api.cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_OK(api.cuMemFree(p));
  const long waits = fakecuda_stream_waits();
  CHECK_OK(api.cuMemAlloc(&q, n));
  CHECK(!overlaps(p, n, q, n));
  CHECK(fakecuda_stream_waits() == waits);
  CHECK(fakecuda_capture_waits() == 0);
  CUgraph graph = nullptr;
  CHECK_OK(api.cuStreamEndCapture(cap, &graph));  // not invalidated
  fakecuda_release_stream(nb);
  CHECK_OK(api.cuMemFree(q));
  CHECK_OK(api.cuStreamDestroy(cap));
  CHECK_OK(api.cuStreamDestroy(nb));
}

// Context-wide fences (cuCtxRecordEvent) and a capture begun from another thread while one is
// being recorded: the capture survives (a context-wide call on a context with a capturing stream
// invalidates the capture), and once a capture began no context-wide call is made again. Run
// with FAKECUDA_CALL_COST_NS=cuCtxRecordEvent=2000000, so that each such call takes 2 ms and the
// capture nearly always begins during one: the shim must hold the capture back until it ends.
void context_fence_capture() {
  start_cuda();
  CUstream nb = nullptr, cap = nullptr;
  CHECK_OK(api.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));  // device fences become context-wide
  CHECK_OK(api.cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
  std::atomic<bool> begun{false};
  CUresult began = CUDA_SUCCESS, ended = CUDA_SUCCESS;
  const long before = fakecuda_ctx_records();
  std::thread capturer([&] {
    // The capture begins once the churn has recorded a context-wide fence (waited for, bounded,
    // however slow the machine), most likely while it records the next one.
    for (int i = 0; i < 10'000 && fakecuda_ctx_records() == before; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    began = api.cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED);
    begun.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CUgraph graph = nullptr;
    ended = api.cuStreamEndCapture(cap, &graph);
  });
  long during = 0;
  while (!begun.load()) legacy_churn(1, false);
  during = fakecuda_ctx_records() - before;
  capturer.join();
  const long after_capture = fakecuda_ctx_records();
  legacy_churn(20, false);
  std::printf("context-wide fences: %ld before the capture, %ld after it\n", during,
              fakecuda_ctx_records() - after_capture);
  CHECK(during >= 1);  // the churn did record context-wide fences
  CHECK_OK(began);
  CHECK_OK(ended);  // not invalidated
  CHECK(fakecuda_ctx_records() == after_capture);
  CHECK_OK(api.cuStreamDestroy(cap));
  CHECK_OK(api.cuStreamDestroy(nb));
}

// A legacy-stream fence newer than a context-wide one says nothing about the non-blocking streams
// the older one covers: a block freed while such a stream is busy (context-wide fence), then a
// capture (context-wide calls stop), then a newer fence on the legacy stream that completes at
// once: the block may come back only after that stream's work, or with the program's streams
// ordered after it.
void context_fence_kinds() {
  drive_pool_clock();
  start_cuda();
  CUstream nb = nullptr, cap = nullptr;
  CHECK_OK(api.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CHECK_OK(api.cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
  constexpr std::size_t n = 24 << 20;  // beyond the growth slack, as in gpu_wait_reuse
  auto window = [] { advance_pool_clock(kPastWindowsNs); };
  CUdeviceptr p = 0, x = 0, y = 0, q = 0;
  CHECK_OK(api.cuMemAlloc(&p, n));
  const long ctx_records = fakecuda_ctx_records();
  fakecuda_hold_stream(nb);  // its work may still use p
  CHECK_OK(api.cuMemFree(p));
  window();
  CHECK_OK(api.cuMemAlloc(&x, 4096));  // records p's batch fence: context-wide
  CHECK(fakecuda_ctx_records() > ctx_records);
  CHECK_OK(api.cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUgraph graph = nullptr;
  CHECK_OK(api.cuStreamEndCapture(cap, &graph));
  const long records = fakecuda_event_records();
  CHECK_OK(api.cuMemFree(x));
  window();
  CHECK_OK(api.cuMemAlloc(&y, 4096));  // x's batch fence: a legacy-stream event, complete at once
  CHECK(fakecuda_event_records() > records);
  CHECK_OK(api.cuMemAlloc(&q, n));
  // Reused only with nothing left running on nb (the pool waited for it) or every stream after it.
  const bool reused = overlaps(p, n, q, n);
  const int order = fakecuda_would_wait(CU_STREAM_LEGACY, nb);
  std::printf("reused %d, legacy stream after nb's work %d (-1: none left)\n", reused, order);
  if (reused) CHECK(order != 0);
  fakecuda_release_stream(nb);
  CHECK_OK(api.cuMemFree(q));
  CHECK_OK(api.cuMemFree(y));
  CHECK_OK(api.cuStreamDestroy(cap));
  CHECK_OK(api.cuStreamDestroy(nb));
}

// free_host_sync:True: cudaFree of a pooled block also waits for the device, as CUDA's does.
void free_host_sync() {
  start_cuda();
  CUdeviceptr p = 0;
  CHECK_OK(api.cuMemAlloc(&p, 4096));
  const long syncs = fakecuda_ctx_syncs();
  CHECK_OK(api.cuMemFree(p));
  CHECK(fakecuda_ctx_syncs() == syncs + 1);
}

// Driver calls per pool hit (run with CUDAPOOL_CONF=free_sync:immediate): the allocation hook
// reads the current context (1 call) and nothing else; the free hook makes none. Stream-ordered
// pairs skip cuStreamIsCapturing until the process begins its first capture.
void hot_calls_immediate() {
  start_cuda();
  constexpr long kPairs = 1000;
  CUdeviceptr p = 0;
  for (int i = 0; i < 10; ++i) {
    CHECK_OK(api.cuMemAlloc(&p, 4096));
    CHECK_OK(api.cuMemFree(p));
  }
  long before = fakecuda_thread_driver_calls();
  const long allocs = fakecuda_alloc_calls();
  for (long i = 0; i < kPairs; ++i) {
    CHECK_OK(api.cuMemAlloc(&p, 4096));
    CHECK_OK(api.cuMemFree(p));
  }
  const long sync_calls = fakecuda_thread_driver_calls() - before;
  std::printf("cuMemAlloc+cuMemFree hit pair: %.2f driver calls\n", double(sync_calls) / kPairs);
  CHECK(sync_calls == kPairs);  // exactly the cuCtxGetCurrent of each allocation
  CHECK(fakecuda_alloc_calls() == allocs);

  CUstream s = nullptr;
  CHECK_OK(api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 10; ++i) {
    CHECK_OK(api.cuMemAllocAsync(&p, 4096, s));
    CHECK_OK(api.cuMemFreeAsync(p, s));
  }
  before = fakecuda_thread_driver_calls();
  for (long i = 0; i < kPairs; ++i) {
    CHECK_OK(api.cuMemAllocAsync(&p, 4096, s));
    CHECK_OK(api.cuMemFreeAsync(p, s));
  }
  const long async_calls = fakecuda_thread_driver_calls() - before;
  std::printf("cuMemAllocAsync+cuMemFreeAsync hit pair: %.2f driver calls\n", double(async_calls) / kPairs);
  CHECK(async_calls == kPairs);  // no capture ever began: no cuStreamIsCapturing

  // After a capture the check is back (the stream could be capturing): one more call per alloc.
  CUstream c = nullptr;
  CHECK_OK(api.cuStreamCreate(&c, 0));
  CUgraph g = nullptr;
  CHECK_OK(api.cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CHECK_OK(api.cuStreamEndCapture(c, &g));
  before = fakecuda_thread_driver_calls();
  for (long i = 0; i < kPairs; ++i) {
    CHECK_OK(api.cuMemAllocAsync(&p, 4096, s));
    CHECK_OK(api.cuMemFreeAsync(p, s));
  }
  CHECK(fakecuda_thread_driver_calls() - before == 2 * kPairs);
}

// Driver calls of the default (fenced) policy: a tight pair costs the context read, one
// cuEventRecord (no context check: the hook knows the context) and one cuEventQuery; a burst of
// 100 frees then 100 allocations costs one record and one query on top of the context reads.
void hot_calls_fenced() {
  start_cuda();
  constexpr long kPairs = 1000;
  CUdeviceptr p = 0;
  for (int i = 0; i < 10; ++i) {
    CHECK_OK(api.cuMemAlloc(&p, 4096));
    CHECK_OK(api.cuMemFree(p));
  }
  long before = fakecuda_thread_driver_calls();
  long records = fakecuda_event_records();
  for (long i = 0; i < kPairs; ++i) {
    CHECK_OK(api.cuMemAlloc(&p, 4096));
    CHECK_OK(api.cuMemFree(p));
  }
  const long tight = fakecuda_thread_driver_calls() - before;
  std::printf("fenced tight pair: %.2f driver calls, %.2f records\n", double(tight) / kPairs,
              double(fakecuda_event_records() - records) / kPairs);
  CHECK(tight <= 3 * kPairs);
  CHECK(fakecuda_event_records() - records <= kPairs);

  constexpr int kBurst = 100, kBursts = 20;
  CUdeviceptr ps[kBurst];
  for (auto& q : ps) CHECK_OK(api.cuMemAlloc(&q, 4096));
  for (auto& q : ps) CHECK_OK(api.cuMemFree(q));
  for (auto& q : ps) CHECK_OK(api.cuMemAlloc(&q, 4096));
  before = fakecuda_thread_driver_calls();
  records = fakecuda_event_records();
  for (int r = 0; r < kBursts; ++r) {
    for (auto& q : ps) CHECK_OK(api.cuMemFree(q));
    for (auto& q : ps) CHECK_OK(api.cuMemAlloc(&q, 4096));
  }
  const long burst = fakecuda_thread_driver_calls() - before;
  std::printf("fenced burst of %d: %.2f driver calls beyond the context reads\n", kBurst,
              double(burst - kBursts * kBurst) / kBursts);
  CHECK(burst <= kBursts * (kBurst + 4));
  CHECK(fakecuda_event_records() - records <= kBursts);
  for (auto& q : ps) CHECK_OK(api.cuMemFree(q));
}

double ns_per(std::chrono::steady_clock::time_point t0, long n) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(n);
}

void bench() {
  // Not a test: the CPU cost of the hooks + pool + fake driver per operation (see docs/shim.md).
  // Its PASS says only that every timed call succeeded and the pool served them.
  start_cuda();
  constexpr long kPairs = 1000000;
  long bad = 0;
  std::int64_t hits_before = -1;  // after the first warm-up (the pool starts with it)
  for (std::size_t size : {std::size_t{256}, std::size_t{1} << 20, std::size_t{64} << 20}) {
    CUdeviceptr p = 0;
    for (int i = 0; i < 1000; ++i) {
      CHECK_OK(api.cuMemAlloc(&p, size));
      CHECK_OK(api.cuMemFree(p));
    }
    if (hits_before < 0) hits_before = stats().cache_hits;
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kPairs; ++i) {
      bad += api.cuMemAlloc(&p, size) != CUDA_SUCCESS;
      bad += api.cuMemFree(p) != CUDA_SUCCESS;
    }
    std::printf("cuMemAlloc+cuMemFree %9zu B: %7.1f ns/pair\n", size, ns_per(t0, kPairs));
  }
  CUdeviceptr ps[100];
  auto t0 = std::chrono::steady_clock::now();
  for (long r = 0; r < kPairs / 100; ++r) {
    for (auto& p : ps) bad += api.cuMemAlloc(&p, 4096) != CUDA_SUCCESS;
    for (auto& p : ps) bad += api.cuMemFree(p) != CUDA_SUCCESS;
  }
  std::printf("bursts of 100 allocs then 100 frees, 4 KiB: %7.1f ns/pair\n", ns_per(t0, kPairs));
  CUstream s = nullptr;
  CHECK_OK(api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kPairs; ++i) {
    CUdeviceptr p = 0;
    bad += api.cuMemAllocAsync(&p, 4096, s) != CUDA_SUCCESS;
    bad += api.cuMemFreeAsync(p, s) != CUDA_SUCCESS;
  }
  std::printf("cuMemAllocAsync+cuMemFreeAsync 4 KiB: %7.1f ns/pair\n", ns_per(t0, kPairs));
  CHECK(bad == 0);
  CHECK(stats().cache_hits - hits_before >= 5 * kPairs - 100);  // the pool served (nearly) every timed pair
}

// Not a test: the legacy churn program's allocation pattern (tests/gpu/legacy_app.cu: three
// buffers per iteration, 4 KiB to ~24 MiB, freed at its end), its CPU cost per call without
// kernels in between: where the per-call time of that program goes, under perf.
void bench_legacy() {
  start_cuda();
  constexpr int kIters = 200000;
  std::uint64_t rng = 2024;
  auto below = [&rng](std::uint64_t n) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (rng * 2685821657736338717ull) % n;
  };
  long bad = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < kIters; ++it) {
    const std::uint64_t n = 1024 + below(it % 10 == 0 ? (6u << 20) : (256u << 10));
    CUdeviceptr x = 0, y = 0, out = 0;
    bad += api.cuMemAlloc(&x, n * 4) != CUDA_SUCCESS;
    bad += api.cuMemAlloc(&y, n * 4) != CUDA_SUCCESS;
    bad += api.cuMemAlloc(&out, 8) != CUDA_SUCCESS;
    bad += api.cuMemFree(out) != CUDA_SUCCESS;
    bad += api.cuMemFree(y) != CUDA_SUCCESS;
    bad += api.cuMemFree(x) != CUDA_SUCCESS;
  }
  std::printf("legacy pattern: %7.1f ns per call\n", ns_per(t0, 6L * kIters));
  CHECK(bad == 0);
}

// Not a test: aggregate pairs/s with 1..16 threads (64 KiB, as the GPU benchmark), each thread on
// its own non-blocking stream (async) or through cuMemAlloc/cuMemFree (sync). On a 2-core machine
// more than 2 threads only time-share, so flat aggregate = no contention added, falling = some.
void bench_threads() {
  start_cuda();
  CUcontext ctx = nullptr;
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&ctx, 0));
  constexpr long kPairs = 200000;
  for (bool async : {false, true}) {
    for (int n : {1, 2, 4, 8, 16}) {
      std::vector<std::thread> ts;
      const auto t0 = std::chrono::steady_clock::now();
      for (int t = 0; t < n; ++t) {
        ts.emplace_back([&] {
          api.cuCtxSetCurrent(ctx);
          CUstream s = nullptr;
          if (async) api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
          for (long i = 0; i < kPairs / n; ++i) {
            CUdeviceptr p = 0;
            if (async) {
              api.cuMemAllocAsync(&p, 64 << 10, s);
              api.cuMemFreeAsync(p, s);
            } else {
              api.cuMemAlloc(&p, 64 << 10);
              api.cuMemFree(p);
            }
          }
          if (async) api.cuStreamDestroy(s);
        });
      }
      for (auto& t : ts) t.join();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%s 64 KiB, %2d threads: %.3g pairs/s\n", async ? "async" : "sync ", n, kPairs / secs);
    }
  }
}

// Not a test: a PyTorch-like step on the host, for perf: 32 idle non-blocking streams alive (as
// cuDNN and cuBLAS handles create them), a main thread allocating a forward pass's tensors (sizes
// drawn from a fixed pseudo-random mix, 512 B to 64 MiB) and freeing some at once, a second
// thread (PyTorch's autograd thread) freeing the rest, as backward does. Prints ns per pair.
void bench_torchlike() {
  CUcontext ctx = start_cuda();
  std::vector<CUstream> streams(32);
  for (CUstream& s : streams) CHECK_OK(api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::uint64_t rng = 7;
  auto below = [&rng](std::uint64_t n) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (rng * 2685821657736338717ull) % n;
  };
  auto size_of = [&]() -> std::size_t {
    const std::uint64_t r = below(100);
    if (r < 50) return 512 + below(64 << 10);
    if (r < 80) return (64 << 10) + below(1 << 20);
    if (r < 98) return (1 << 20) + below(8 << 20);
    return (8 << 20) + below(24 << 20);
  };
  constexpr int kSteps = 300, kTensors = 200;
  std::vector<CUdeviceptr> handoff;
  std::mutex m;
  std::atomic<bool> done{false};
  long bad = 0;
  std::thread autograd([&] {
    api.cuCtxSetCurrent(ctx);
    while (!done.load()) {
      std::vector<CUdeviceptr> mine;
      {
        std::lock_guard<std::mutex> g(m);
        mine.swap(handoff);
      }
      for (CUdeviceptr p : mine) bad += api.cuMemFree(p) != CUDA_SUCCESS;
      if (mine.empty()) std::this_thread::yield();
    }
  });
  long pairs = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<CUdeviceptr> live;
    for (int i = 0; i < kTensors; ++i) {
      CUdeviceptr p = 0;
      bad += api.cuMemAlloc(&p, size_of()) != CUDA_SUCCESS;
      ++pairs;
      if (below(3) == 0) {
        bad += api.cuMemFree(p) != CUDA_SUCCESS;  // a temporary of the forward pass
      } else {
        live.push_back(p);
      }
    }
    {
      std::lock_guard<std::mutex> g(m);
      handoff.insert(handoff.end(), live.begin(), live.end());  // backward frees the saved ones
    }
    while (true) {  // the next step starts once backward has freed them
      {
        std::lock_guard<std::mutex> g(m);
        if (handoff.empty()) break;
      }
      std::this_thread::yield();
    }
  }
  const double ns = ns_per(t0, pairs);
  done.store(true);
  autograd.join();
  std::printf("torch-like steps: %7.1f ns per pair\n", ns);
  CHECK(bad == 0);
  for (CUstream s : streams) CHECK_OK(api.cuStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scenario>\n", argv[0]);
    return 2;
  }
  const std::string s = argv[1];
  struct {
    const char* name;
    void (*fn)();
  } scenarios[] = {
      {"pooling", pooling},
      {"resolution", resolution},
      {"fenced_reuse", fenced_reuse},
      {"async_streams", async_streams},
      {"foreign_pointers", foreign_pointers},
      {"capture", capture},
      {"bad_frees", bad_frees},
      {"queries", queries},
      {"reset", reset},
      {"exit_path", exit_path},
      {"alloc_at_exit", alloc_at_exit},
      {"pitch_overflow", pitch_overflow},
      {"fork_child", fork_child},
      {"fork_while_logging", fork_while_logging},
      {"fork_summary", fork_summary},
      {"threads", threads},
      {"no_cuda", no_cuda},
      {"alloc_once", alloc_once},
      {"immediate_reuse", immediate_reuse},
      {"warm_steps", warm_steps},
      {"device_sync", device_sync},
      {"c_api_calls", c_api_calls},
      {"oom", oom},
      {"bench", bench},
      {"bench_legacy", bench_legacy},
      {"bench_threads", bench_threads},
      {"bench_torchlike", bench_torchlike},
      {"hot_calls_immediate", hot_calls_immediate},
      {"hot_calls_fenced", hot_calls_fenced},
      {"gpu_wait_reuse", gpu_wait_reuse},
      {"gpu_wait_legacy_only", gpu_wait_legacy_only},
      {"gpu_wait_without_queries", gpu_wait_without_queries},
      {"gpu_wait_idle_streams", gpu_wait_idle_streams},
      {"ordered_poll_bisection", ordered_poll_bisection},
      {"gpu_wait_capture", gpu_wait_capture},
      {"context_fence_capture", context_fence_capture},
      {"context_fence_kinds", context_fence_kinds},
      {"gpu_wait_threads_contexts", gpu_wait_threads_contexts},
      {"mem_info", mem_info},
      {"info_first_primary", info_first_primary},
      {"info_first_ctx_create", info_first_ctx_create},
      {"pinned", pinned},
      {"free_host_sync", free_host_sync},
  };
  for (auto& sc : scenarios) {
    if (s == sc.name) {
      sc.fn();
      std::printf("PASS %s\n", sc.name);
      return 0;
    }
  }
  std::fprintf(stderr, "unknown scenario %s\n", argv[1]);
  return 2;
}
