// cudart's cudaMalloc / cudaFree under LD_PRELOAD=libcudapool.so, called the way PyTorch and
// CuPy call them: from a shared library linked against a shared cudart (the fake
// libcudart.so.13, tests/fakecuda/fakecudart.cpp) that the program loads with dlopen. Built twice:
//  * libcudart_app.so: the scenarios (cudart_app_run), DT_NEEDED libcudart.so.13, rpath $ORIGIN;
//  * cudart_app (CUDART_APP_LAUNCHER): `cudart_app <scenario> [global|local]`, which does not link
//    cudart and dlopens libcudart_app.so from its own directory with RTLD_GLOBAL (default) or
//    RTLD_LOCAL, where cudart is in no scope but the library's own.
// A scenario prints "FAIL file:line: expr" and exits 1 on the first failed check, "PASS <scenario>"
// when all passed. tests/unit/shim_runtime_api_test.cpp runs them.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "tests/fakecuda/test_app.h"

#ifdef CUDART_APP_LAUNCHER

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) return 2;
  const std::string mode = argc == 3 ? argv[2] : "global";
  if (mode != "global" && mode != "local") return 2;
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return 2;
  std::string path(exe, static_cast<std::size_t>(n));
  path = path.substr(0, path.rfind('/') + 1) + "libcudart_app.so";
  void* lib = dlopen(path.c_str(), RTLD_NOW | (mode == "local" ? RTLD_LOCAL : RTLD_GLOBAL));
  if (lib == nullptr) {
    std::printf("dlopen %s: %s\n", path.c_str(), dlerror());
    return 2;
  }
  auto run = reinterpret_cast<int (*)(const char*)>(dlsym(lib, "cudart_app_run"));
  CHECK(run != nullptr);
  return run(argv[1]);
}

#else

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "tests/fakecuda/fakecudart.h"

using namespace cudaabi;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// The fake driver's controls, through the handle cudart opened (this library does not link
// libcuda: a cudart program never does). Only after a runtime call has loaded it.
template <typename Fn>
Fn fake(const char* name) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(h != nullptr);
  auto fn = reinterpret_cast<Fn>(dlsym(h, name));
  CHECK(fn != nullptr);
  return fn;
}
long fake_count(const char* name) { return fake<long (*)()>(name)(); }
// Driver allocations of either kind: cuMemAlloc segments and cuMemCreate pages (expandable
// segments, the shim's default).
long driver_allocs() { return fake_count("fakecuda_alloc_calls") + fake_count("fakecuda_vmm_create_calls"); }

long rt_calls(const char* name) { return fakecudart_calls(name); }
CUdeviceptr dp(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

// A pool for the main thread's context: its first cudaMalloc goes through cudart (no pool yet),
// which starts the pool on the driver path.
void* warm_up() {
  void* w = nullptr;
  CHECK(cudaMalloc(&w, kMiB) == cudaSuccess && w != nullptr);
  return w;
}

// 1000 cudaMalloc/cudaFree pairs of 1 to 4 MiB: the pool answers them without cudart (its
// cudaMalloc runs once, for the context's first allocation; its cudaFree never), out of a few
// driver allocations. The fake's device memory is host memory: every block is written and read.
void served() {
  for (int i = 0; i < 1000; ++i) {
    void* p = nullptr;
    const std::size_t n = kMiB + static_cast<std::size_t>(i % 13) * (kMiB / 4);
    CHECK(cudaMalloc(&p, n) == cudaSuccess && p != nullptr);
    auto* b = static_cast<volatile unsigned char*>(p);
    b[0] = static_cast<unsigned char>(i);
    b[n - 1] = static_cast<unsigned char>(i + 1);
    CHECK(b[0] == static_cast<unsigned char>(i) && b[n - 1] == static_cast<unsigned char>(i + 1));
    CHECK(cudaFree(p) == cudaSuccess);
  }
  const long mallocs = rt_calls("cudaMalloc"), frees = rt_calls("cudaFree"), driver = driver_allocs();
  std::printf("1000 pairs: cudart's cudaMalloc ran %ld times, its cudaFree %ld; driver allocations %ld\n", mallocs,
              frees, driver);
  CHECK(mallocs >= 1 && mallocs <= 2);
  CHECK(frees == 0);
  CHECK(driver >= 1 && driver <= 8);
  CHECK(cudaGetLastError() == cudaSuccess);
}

// What cudart must answer itself, before and after the context has a pool: cudaMalloc of 0 bytes
// (success, a null pointer), cudaFree(nullptr) (the idiom that sets the context up), a null
// pointer to fill (cudaErrorInvalidValue, recorded as the last error).
void zero_and_null() {
  void* warm = nullptr;
  for (int round = 0; round < 2; ++round) {
    const long m = rt_calls("cudaMalloc"), f = rt_calls("cudaFree");
    void* p = &warm;  // anything but null: cudaMalloc must clear it
    CHECK(cudaMalloc(&p, 0) == cudaSuccess && p == nullptr);
    CHECK(cudaFree(nullptr) == cudaSuccess);
    CHECK(cudaMalloc(nullptr, kMiB) == cudaErrorInvalidValue);
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess);
    std::printf("round %d: cudart's cudaMalloc ran %ld times, its cudaFree %ld\n", round, rt_calls("cudaMalloc") - m,
                rt_calls("cudaFree") - f);
    CHECK(rt_calls("cudaMalloc") == m + 2 && rt_calls("cudaFree") == f + 1);
    if (round == 0) warm = warm_up();
  }
  CHECK(cudaFree(warm) == cudaSuccess);
}

// Out of memory (CUDAPOOL_CONF caps the pool at 64 MiB) with the pool in place: cudart's own
// answer and error state (its cudaMalloc runs once, to report it), and the pool serves what
// fits afterwards.
void oom() {
  void* warm = warm_up();
  const long m = rt_calls("cudaMalloc");
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::size_t{1} << 30);
  std::printf("cudaMalloc(1 GiB) = %d; cudart's cudaMalloc ran %ld times\n", e, rt_calls("cudaMalloc") - m);
  CHECK(e == cudaErrorMemoryAllocation);
  CHECK(rt_calls("cudaMalloc") == m + 1);
  CHECK(cudaPeekAtLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaSuccess);
  void* q = nullptr;
  CHECK(cudaMalloc(&q, kMiB) == cudaSuccess && q != nullptr);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaFree(q) == cudaSuccess);
  CHECK(cudaFree(warm) == cudaSuccess);
}

// A pointer no pool owns goes to cudart's cudaFree, which gets the driver's answer for it
// (the fake driver: CUDA_ERROR_INVALID_VALUE for memory it never gave out).
void foreign_free() {
  CHECK(cudaFree(warm_up()) == cudaSuccess);  // a pool exists
  const long f = rt_calls("cudaFree");
  const cudaError_t e = cudaFree(reinterpret_cast<void*>(std::uintptr_t{0x1000}));
  std::printf("cudaFree(0x1000) = %d; cudart's cudaFree ran %ld times\n", e, rt_calls("cudaFree") - f);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(rt_calls("cudaFree") == f + 1);
  CHECK(cudaGetLastError() == e);
  CHECK(cudaGetLastError() == cudaSuccess);
}

// A pooled block freed twice: the first free is the pool's (cudart not called), the second is
// refused as cudart refuses it, through cudart so that its last error says so.
void double_free() {
  void* warm = warm_up();
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kMiB) == cudaSuccess && p != nullptr);
  const long f = rt_calls("cudaFree");
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(rt_calls("cudaFree") == f);
  CHECK(cudaFree(p) == cudaErrorInvalidValue);
  CHECK(rt_calls("cudaFree") == f + 1);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaFree(warm) == cudaSuccess);
}

// cudart 11 (FAKE_CUDART_VERSION=11080) applies cudaSetDevice at its next call, so the current
// context is not the one it allocates in: every cudaMalloc goes through it (and still reaches the
// pool, through the driver hook). With a second device: after cudaSetDevice(1) the next
// cudaMalloc must give device 1's memory although device 0's context is still current.
void cudart11() {
  int v = 0;
  CHECK(cudaRuntimeGetVersion(&v) == cudaSuccess && v == 11080);
  const long m = rt_calls("cudaMalloc");
  for (int i = 0; i < 200; ++i) {
    void* p = nullptr;
    const std::size_t n = kMiB + static_cast<std::size_t>(i % 4) * (kMiB / 2);
    CHECK(cudaMalloc(&p, n) == cudaSuccess && p != nullptr);
    static_cast<volatile unsigned char*>(p)[0] = static_cast<unsigned char>(i);
    CHECK(cudaFree(p) == cudaSuccess);
  }
  const long mallocs = rt_calls("cudaMalloc") - m, driver = driver_allocs();
  std::printf("200 pairs: cudart's cudaMalloc ran %ld times; driver allocations %ld\n", mallocs, driver);
  CHECK(mallocs == 200);
  CHECK(driver >= 1 && driver <= 8);  // pooled all the same

  int devices = 0;
  CHECK_OK(fake<CUresult (*)(int*)>("cuDeviceGetCount")(&devices));
  if (devices < 2) {
    std::printf("one device: no cudaSetDevice check\n");
    return;
  }
  auto attribute = fake<PFN_cuPointerGetAttribute>("cuPointerGetAttribute");
  CHECK(cudaSetDevice(0) == cudaSuccess);
  void* a = nullptr;
  CHECK(cudaMalloc(&a, kMiB) == cudaSuccess);
  CHECK(cudaSetDevice(1) == cudaSuccess);  // device 0's context stays current until the next call
  void* b = nullptr;
  CHECK(cudaMalloc(&b, kMiB) == cudaSuccess);
  int da = -1, db = -1;
  CHECK_OK(attribute(&da, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp(a)));
  CHECK_OK(attribute(&db, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp(b)));
  std::printf("after cudaSetDevice(1): device %d's memory (before: device %d's)\n", db, da);
  CHECK(da == 0 && db == 1);
  CHECK(rt_calls("cudaMalloc") == m + 202);
  CHECK(cudaFree(b) == cudaSuccess);
  CHECK(cudaSetDevice(0) == cudaSuccess);
  CHECK(cudaFree(a) == cudaSuccess);
}

// free_host_sync:True (cudaFree returns only once the device is idle, as CUDA's does): cudaFree
// goes through cudart, whose cuMemFree_v2 reaches the hook that waits; the block stays the pool's.
void free_host_sync() {
  void* warm = warm_up();
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kMiB) == cudaSuccess && p != nullptr);
  const long f = rt_calls("cudaFree"), syncs = fake_count("fakecuda_ctx_syncs");
  const long driver_frees = fake_count("fakecuda_free_calls");
  CHECK(cudaFree(p) == cudaSuccess);
  std::printf("cudaFree: cudart's ran %ld times, %ld context syncs\n", rt_calls("cudaFree") - f,
              fake_count("fakecuda_ctx_syncs") - syncs);
  CHECK(rt_calls("cudaFree") == f + 1);
  CHECK(fake_count("fakecuda_ctx_syncs") == syncs + 1);
  CHECK(fake_count("fakecuda_free_calls") == driver_frees);  // freed into the pool, not to the driver
  CHECK(cudaFree(warm) == cudaSuccess);
}

// 4 threads, 500 pairs each, up to 4 blocks live per thread, each block checked to hold what its
// thread wrote. A thread's first cudaMalloc has no context and goes through cudart; the rest,
// and every free, are the pool's.
void threads() {
  CHECK(cudaFree(warm_up()) == cudaSuccess);
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&failures, t] {
      const auto tag = static_cast<unsigned char>(t + 1);
      void* live[4] = {};
      for (int i = 0; i < 500; ++i) {
        void*& slot = live[i % 4];
        if (slot != nullptr) {
          if (*static_cast<volatile unsigned char*>(slot) != tag) ++failures;  // nobody else wrote
          if (cudaFree(slot) != cudaSuccess) ++failures;
        }
        slot = nullptr;
        const std::size_t n = kMiB / 4 + static_cast<std::size_t>(i % 7) * (kMiB / 2);
        if (cudaMalloc(&slot, n) != cudaSuccess || slot == nullptr) {
          ++failures;
          slot = nullptr;
          continue;
        }
        *static_cast<volatile unsigned char*>(slot) = tag;
      }
      for (void* p : live)
        if (p != nullptr && cudaFree(p) != cudaSuccess) ++failures;
      if (cudaGetLastError() != cudaSuccess) ++failures;
    });
  }
  for (auto& th : ts) th.join();
  const long mallocs = rt_calls("cudaMalloc"), frees = rt_calls("cudaFree");
  std::printf("4 threads x 500 pairs: %d failures; cudart's cudaMalloc ran %ld times, its cudaFree %ld\n",
              failures.load(), mallocs, frees);
  CHECK(failures.load() == 0);
  CHECK(mallocs >= 1 && mallocs <= 4 + 1);
  CHECK(frees == 0);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int cudart_app_run(const char* scenario) {
  struct Scenario {
    const char* name;
    void (*fn)();
  };
  const Scenario all[] = {{"served", served},
                          {"zero_and_null", zero_and_null},
                          {"oom", oom},
                          {"foreign_free", foreign_free},
                          {"double_free", double_free},
                          {"cudart11", cudart11},
                          {"free_host_sync", free_host_sync},
                          {"threads", threads}};
  for (const Scenario& sc : all) {
    if (std::strcmp(scenario, sc.name) != 0) continue;
    sc.fn();
    std::printf("PASS %s\n", sc.name);
    std::fflush(stdout);
    return 0;
  }
  std::printf("unknown scenario %s\n", scenario);
  return 2;
}

#endif
