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
  // Every row of the list, by its own name.
#define CUDAPOOL_HOOK(base, min_version, max_version, flavour, abi, params) bind(h, sym, d.abi, #abi);
#define CUDAPOOL_CALLED(abi, params) bind(h, sym, d.abi, #abi);
#include "shim/entry_points.def"
  // Without these the pool cannot work at all; the hooks then pass everything through.
  return d.cuMemAlloc_v2 && d.cuMemFree_v2 && d.cuCtxGetCurrent && d.cuCtxGetDevice && d.cuEventCreate &&
         d.cuEventRecord && d.cuEventQuery && d.cuEventSynchronize && d.cuMemGetInfo_v2;
}

}  // namespace

namespace detail {
std::atomic<const RealDriver*> g_real_driver{nullptr};
}

const RealDriver* real_driver() noexcept {
  std::atomic<const RealDriver*>& ready = detail::g_real_driver;
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
