// Which wrapper replaces which driver entry point, and the cuGetProcAddress wrappers that hand
// them out. cudart (static and shared) resolves every driver function this way: by base name,
// CUDA version and stream flavour flags, through the cuGetProcAddress it got from dlsym.
#include <dlfcn.h>

#include <climits>
#include <cstring>

#include "shim/hooks/hooked.h"
#include "shim/hooks/hooks.h"

namespace cudapool::shim {
namespace {

enum Flavour : unsigned char { kAny, kLegacy, kPerThread };

struct Hook {
  const char* base;  // the name programs pass to cuGetProcAddress
  int min_version;   // [min_version, max_version) of CUDA versions that resolve to `abi`
  int max_version;
  Flavour flavour;  // which stream flavour flag resolves to `abi`
  const char* abi;  // the exported symbol
  void* wrapper;
};

// Every CUDAPOOL_HOOK row of shim/entry_points.def, in its order (the first match wins).
const Hook kHooks[] = {
#define CUDAPOOL_HOOK(base, min_version, max_version, flavour, abi, params) \
  {#base, min_version, max_version, k##flavour, #abi, reinterpret_cast<void*>(&::abi)},
#include "shim/entry_points.def"
};

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
  if (!named) {
    // Asked for by an exported variant's own name ("cuMemGetInfo_v2") where a driver resolves
    // such names: exactly that export gets exactly its wrapper.
    void* w = wrapper_for_symbol(symbol);
    return w != nullptr && sym(d.handle, symbol) == pfn ? w : nullptr;
  }
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
