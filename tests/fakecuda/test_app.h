// What the fake-driver test programs share: the check that ends a scenario on the first failure
// ("FAIL file:line: expr", exit status 1), the pool's clock under test (below) and, for the
// programs linked with -lcuda (vmm_app, ipc_app), the driver entry points they call and the usual
// start on a primary context.
#pragma once
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

// The pool's clock under test. The batch window, the query back-offs and the shim's sweep gap
// (docs/design.md, "Tests and the pool's clock") time themselves by the pool's clock, which a
// program can replace (cudapool_set_clock_for_testing). A scenario whose checks need one of them
// to have passed, or not, drives that clock: drive_pool_clock() before its first allocation, then
// advance_pool_clock(ns) where time should pass. It never waits for wall time. Every other
// scenario runs on the library's own clock, unless TEST_POOL_CLOCK names another for the speed
// sweep (tests/speed_sweep.sh):
//   frozen  moves only when a scenario advances it: the machine is infinitely fast;
//   racing  every reading is kRacingStepNs past the one before: every window and back-off has
//           passed by the next call, as on a machine that is very slow.
namespace test_clock {

// Past every window, gap and back-off the pool and the shim time (the longest: 4 ms).
inline constexpr std::int64_t kRacingStepNs = 50'000'000;
inline std::atomic<std::int64_t> now_ns{0};
inline std::atomic<std::int64_t> step_ns{0};
inline std::atomic<bool> driven{false};  // by the scenario (drive_pool_clock)

inline std::int64_t read() {
  const std::int64_t step = step_ns.load(std::memory_order_relaxed);
  if (step == 0) return now_ns.load(std::memory_order_relaxed);
  return now_ns.fetch_add(step, std::memory_order_relaxed) + step;
}

// Installs read() with `step` ns per reading in the library found through `handle` (dlsym's). The
// first installation starts the clock a second past CLOCK_MONOTONIC, the library's own clock, so
// that no time the pool noted before lies ahead. False when the library is not loaded (the
// program runs without the shim).
inline bool install(std::int64_t step, void* handle = RTLD_DEFAULT) {
  using SetClock = void (*)(std::int64_t(*)());
  const auto set = reinterpret_cast<SetClock>(dlsym(handle, "cudapool_set_clock_for_testing"));
  if (set == nullptr) return false;
  std::int64_t zero = 0;
  const std::int64_t start = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count() +
                             1'000'000'000;
  now_ns.compare_exchange_strong(zero, start, std::memory_order_relaxed);
  step_ns.store(step, std::memory_order_relaxed);
  set(&read);
  return true;
}

// TEST_POOL_CLOCK, read once as the program starts.
inline bool install_from_env() {
  const char* mode = std::getenv("TEST_POOL_CLOCK");
  if (mode == nullptr || *mode == '\0' || std::strcmp(mode, "real") == 0) return false;
  if (std::strcmp(mode, "frozen") == 0) return install(0);
  if (std::strcmp(mode, "racing") == 0) return install(kRacingStepNs);
  std::fprintf(stderr, "TEST_POOL_CLOCK=%s: unknown; use real, frozen or racing\n", mode);
  std::_Exit(2);
}
inline const bool installed_from_env = install_from_env();

}  // namespace test_clock

// The scenario drives the pool's clock from here on (it moves only by advance_pool_clock); the
// library is found through `handle` (dlsym's).
inline void drive_pool_clock(void* handle = RTLD_DEFAULT) {
  CHECK(test_clock::install(0, handle));
  test_clock::driven.store(true, std::memory_order_relaxed);
}
inline void advance_pool_clock(std::int64_t ns) { test_clock::now_ns.fetch_add(ns, std::memory_order_relaxed); }
// The pool's clock as the scenario drives it (drive_pool_clock).
inline std::int64_t pool_clock_now() { return test_clock::now_ns.load(std::memory_order_relaxed); }
inline bool pool_clock_driven() { return test_clock::driven.load(std::memory_order_relaxed); }
// Past the pool's longest batch window (1 ms where ordering is free) and the shim's sweep gap (4 ms).
inline constexpr std::int64_t kPastWindowsNs = 5'000'000;

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
