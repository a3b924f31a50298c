// cudart's cudaMalloc and cudaFree, for programs that link cudart dynamically (PyTorch, CuPy and
// most Python packages reach it as libcudart.so). Every allocation reaches the pool through the
// driver entry points anyway: cudart's own cudaMalloc calls cuMemAlloc_v2, which it looked up
// with cuGetProcAddress and so gets the shim's hook. Answering here as well skips cudart's wrapper
// around each call (its context checks, locks and error bookkeeping): 19-29 % of the host time of
// an allocation and free on the shim's path (docs/shim.md, "cudart's entry points";
// docs/benchmarks.md).
//
// Answered here only where cudart would do nothing but call the driver:
//  - cudaMalloc: a plain request (a pointer to fill, a size) on a thread whose current context
//    already has a pool, no capture that forbids it, and a caller whose cudart is 12.0 or later.
//    cudart 11 applies cudaSetDevice at its next call, so there the current context is not yet
//    the one cudart would allocate in. A context without a pool goes through cudart once: its
//    first allocation starts the pool on the driver path, as before.
//  - cudaFree: a pointer some pool owns, with free_host_sync off.
// Everything else goes to the caller's cudart untouched: cudaFree(nullptr) (the idiom that makes
// cudart set up its context), a thread with no current context, foreign pointers, odd arguments.
// A failure of the pool's goes there too, with the pool's answer handed to the driver hook cudart
// calls (CudartCall, shim/hooks/hooks.h): cudart returns it and records it for cudaGetLastError, and
// the pool is not asked twice.
//
// The caller's cudart: the definition found in the dependency scope of the library the call came
// from (its return address names the object), else the next one after the shim in the global
// scope. A process may hold several cudarts (two packages built for CUDA 12 and 13); each caller
// reaches its own, and each is asked its version once per call site and thread.
#include <dlfcn.h>
#include <link.h>

#include <cstddef>
#include <cstdint>

#include "shim/export.h"
#include "shim/fences/streams.h"
#include "shim/hooks/hooks.h"
#include "shim/log.h"

namespace cudapool::shim {

constinit thread_local CudartCall* tl_cudart_call = nullptr;

namespace {

using cudaError_t = int;  // cudart's enum; only these values are used here
constexpr cudaError_t kCudaSuccess = 0;
constexpr cudaError_t kCudaErrorInitialization = 3;
constexpr int kFirstVersionWithEagerSetDevice = 12000;

using MallocFn = cudaError_t (*)(void**, std::size_t);
using FreeFn = cudaError_t (*)(void*);
using VersionFn = cudaError_t (*)(int*);

// What one call site (a return address, on this thread) needs: its cudart's entry points and
// whether a cudaMalloc from it may be answered here.
struct CallerCudart {
  const void* ra = nullptr;
  MallocFn malloc = nullptr;
  FreeFn free = nullptr;
  const void* cudart_start = nullptr;  // where the object holding `malloc`/`free` was mapped
  bool served = false;                 // cudart 12.0 or later
};

// A few call sites per thread (PyTorch: one for cudaMalloc, one for cudaFree).
struct CallerCache {
  static constexpr int kSlots = 4;
  CallerCudart slot[kSlots];
  unsigned next = 0;
};
constinit thread_local CallerCache tl_callers;

int shim_anchor = 0;  // an address inside the shim, to tell its own definitions apart

bool in_shim(const void* p) {
  dl_find_object self{}, o{};
  return p != nullptr && _dl_find_object(&shim_anchor, &self) == 0 && _dl_find_object(const_cast<void*>(p), &o) == 0 &&
         o.dlfo_map_start == self.dlfo_map_start;
}

const void* object_start(const void* p) {
  dl_find_object o{};
  return p != nullptr && _dl_find_object(const_cast<void*>(p), &o) == 0 ? o.dlfo_map_start : nullptr;
}

// Looks `name` up where the caller at `ra` would find it: its own object's dependency scope,
// then after the shim. Never one of the shim's definitions.
struct CallerScope {
  void* handle = nullptr;
  explicit CallerScope(const void* ra) {
    Dl_info info{};
    link_map* lm = nullptr;
    if (dladdr1(ra, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) != 0 && lm != nullptr &&
        lm->l_name != nullptr && lm->l_name[0] != '\0')
      handle = dlopen(lm->l_name, RTLD_LAZY | RTLD_NOLOAD);  // the main program has no name: global scope
  }
  ~CallerScope() {
    if (handle != nullptr) dlclose(handle);
  }
  CallerScope(const CallerScope&) = delete;
  CallerScope& operator=(const CallerScope&) = delete;
  void* find(const char* name) const {
    void* f = handle != nullptr ? dlsym(handle, name) : nullptr;
    if (f == nullptr || in_shim(f)) f = dlsym(RTLD_NEXT, name);
    return in_shim(f) ? nullptr : f;
  }
};

CallerCudart resolve(const void* ra) {
  CallerCudart c;
  c.ra = ra;
  const CallerScope scope(ra);
  c.malloc = reinterpret_cast<MallocFn>(scope.find("cudaMalloc"));
  c.free = reinterpret_cast<FreeFn>(scope.find("cudaFree"));
  c.cudart_start = object_start(reinterpret_cast<const void*>(c.malloc));
  // Its version says nothing unless it comes from the same object as its cudaMalloc.
  auto version = reinterpret_cast<VersionFn>(scope.find("cudaRuntimeGetVersion"));
  int v = 0;
  c.served = c.malloc != nullptr && c.free != nullptr && version != nullptr &&
             object_start(reinterpret_cast<const void*>(version)) == c.cudart_start && version(&v) == kCudaSuccess &&
             v >= kFirstVersionWithEagerSetDevice;
  if (c.malloc == nullptr || c.free == nullptr)
    log_warn(
        "cudaMalloc/cudaFree called from {} but no cudart defines them there: answering cudaErrorInitializationError",
        ra);
  return c;
}

// The call site's entry, resolved on first use. `checked`: its cudart is still mapped where it
// was (a library unloaded since is looked up again); the served path skips that check.
CallerCudart& caller(const void* ra, bool checked) {
  CallerCache& cache = tl_callers;
  for (CallerCudart& c : cache.slot) {
    if (c.ra != ra) continue;
    if (!checked || object_start(reinterpret_cast<const void*>(c.malloc)) == c.cudart_start) return c;
    c = resolve(ra);
    return c;
  }
  CallerCudart& c = cache.slot[cache.next++ % CallerCache::kSlots];
  c = resolve(ra);
  return c;
}

// cudart's call with the pool's answer in hand: the driver hook cudart calls on this thread is
// handed `call` (tl_cudart_call) while it runs.
template <class Call>
cudaError_t with_answer(CudartCall call, Call&& cudart) {
  CudartCall* const outer = tl_cudart_call;
  tl_cudart_call = &call;
  const cudaError_t e = cudart();
  tl_cudart_call = outer;
  return e;
}

cudaError_t cudart_malloc(const void* ra, void** dev_ptr, std::size_t size) {
  const CallerCudart& c = caller(ra, /*checked=*/true);
  return c.malloc != nullptr ? c.malloc(dev_ptr, size) : kCudaErrorInitialization;
}

cudaError_t cudart_free(const void* ra, void* p) {
  const CallerCudart& c = caller(ra, /*checked=*/true);
  return c.free != nullptr ? c.free(p) : kCudaErrorInitialization;
}

}  // namespace

}  // namespace cudapool::shim

using namespace cudapool::shim;

CUDAPOOL_EXPORT cudaError_t cudaMalloc(void** dev_ptr, std::size_t size) {
  const void* ra = __builtin_return_address(0);
  Runtime* rt = Runtime::peek();  // not started here: cudart's first call reaches the hooks that start it
  if (rt == nullptr || dev_ptr == nullptr || size == 0 || !rt->native() || Runtime::exiting() ||
      sync_alloc_forbidden_by_capture() || !caller(ra, /*checked=*/false).served)
    return cudart_malloc(ra, dev_ptr, size);
  ContextPool* cp = rt->current_pool(/*create=*/false);
  if (cp == nullptr) return cudart_malloc(ra, dev_ptr, size);
  CUdeviceptr p = 0;
  const CUresult r = pool_allocate_in(*rt, *cp, &p, size, kLegacyStream);
  if (r == CUDA_SUCCESS) {
    *dev_ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
    rt->count_served(Runtime::RuntimeApiCall::cuda_malloc);
    return kCudaSuccess;
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY)  // diagnosed and logged already: cudart only reports it
    return with_answer(CudartCall::for_alloc(size, r), [&] { return cudart_malloc(ra, dev_ptr, size); });
  return cudart_malloc(ra, dev_ptr, size);  // the driver's error: cudart's whole path decides again
}

CUDAPOOL_EXPORT cudaError_t cudaFree(void* p) {
  const void* ra = __builtin_return_address(0);
  Runtime* rt = Runtime::peek();
  if (p == nullptr || rt == nullptr || !rt->native() || Runtime::exiting() || rt->policy().free_host_sync)
    return cudart_free(ra, p);
  const auto dptr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  const CUresult r = pool_free(*rt, dptr, nullptr, nullptr);
  if (r == CUDA_SUCCESS) {
    rt->count_served(Runtime::RuntimeApiCall::cuda_free);
    return kCudaSuccess;
  }
  // Not the pool's (counted as a foreign pointer already: the driver answers without asking the
  // pool again), or a bad free the pool refused and logged.
  return with_answer(CudartCall::for_free(dptr, r), [&] { return cudart_free(ra, p); });
}
