// The latency floor, measured in the same run as libcudapool.so: a trivial one-size
// free list behind the same hooks. Preloaded in front of alloc_bench (run.sh, label `floor`), it
// takes the path libcudapool.so takes — cudart's dlsym(libcuda, "cuGetProcAddress_v2"), then
// cuGetProcAddress_v2("cuMemAlloc" / "cuMemFree") — and answers from one free list of one size
// under one mutex. It does nothing a real allocator must (no stream safety, no contexts, no
// splitting, no stats), so it is a floor, not a competitor; benchmark use only.
//
// Pointers it hands out are remembered in a short list (the benchmark holds at most 100 at a
// time), so a pointer it did not hand out goes to the real cuMemFree, and a size change returns
// the cached blocks to the driver.
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using AllocFn = CUresult (*)(CUdeviceptr*, std::size_t);
using FreeFn = CUresult (*)(CUdeviceptr);
using GetProcV2 = CUresult (*)(const char*, void**, int, unsigned long long, int*);
using GetProcV1 = CUresult (*)(const char*, void**, int, unsigned long long);
using DlsymFn = void* (*)(void*, const char*);

DlsymFn real_dlsym() {
  static DlsymFn fn = [] {
    void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return reinterpret_cast<DlsymFn>(p);
  }();
  return fn;
}

AllocFn real_alloc = nullptr;
FreeFn real_free = nullptr;
GetProcV2 real_get_proc = nullptr;

std::mutex mu;
std::size_t list_size = 0;            // the one size the free list holds
std::vector<CUdeviceptr> free_list;   // blocks of list_size
std::vector<CUdeviceptr> handed_out;  // of list_size, lent to the program

CUresult floor_alloc(CUdeviceptr* p, std::size_t n) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (n == list_size && !free_list.empty()) {
      *p = free_list.back();
      free_list.pop_back();
      handed_out.push_back(*p);
      return 0;
    }
  }
  const CUresult r = real_alloc(p, n);
  if (r != 0) return r;
  std::lock_guard<std::mutex> g(mu);
  if (n != list_size) {  // a new size: the list starts over (its blocks go back)
    for (CUdeviceptr q : free_list) real_free(q);
    free_list.clear();
    list_size = n;
  }
  handed_out.push_back(*p);
  return 0;
}

CUresult floor_free(CUdeviceptr p) {
  {
    std::lock_guard<std::mutex> g(mu);
    for (std::size_t i = handed_out.size(); i-- > 0;) {  // newest first: a tight loop hits at once
      if (handed_out[i] != p) continue;
      handed_out[i] = handed_out.back();
      handed_out.pop_back();
      free_list.push_back(p);
      return 0;
    }
  }
  return real_free(p);  // not ours, or of an older size
}

CUresult floor_get_proc(const char* name, void** fn, int version, unsigned long long flags, int* status);

// CUDA 11.3's cuGetProcAddress (no status argument), handed out for lookups of itself.
CUresult floor_get_proc_v1(const char* name, void** fn, int version, unsigned long long flags) {
  return floor_get_proc(name, fn, version, flags, nullptr);
}

CUresult floor_get_proc(const char* name, void** fn, int version, unsigned long long flags, int* status) {
  const CUresult r = real_get_proc(name, fn, version, flags, status);
  if (r != 0 || fn == nullptr || *fn == nullptr || version < 3020) return r;
  // cudart asks for cuGetProcAddress through cuGetProcAddress and uses what it gets from then
  // on: hand out this wrapper again (the _v2 ABI from CUDA 12.0, the 11.3 one before).
  if (std::strcmp(name, "cuGetProcAddress") == 0) {
    *fn = version >= 12000 ? reinterpret_cast<void*>(&floor_get_proc) : reinterpret_cast<void*>(&floor_get_proc_v1);
  } else if (std::strcmp(name, "cuMemAlloc") == 0) {
    real_alloc = reinterpret_cast<AllocFn>(*fn);
    *fn = reinterpret_cast<void*>(&floor_alloc);
  } else if (std::strcmp(name, "cuMemFree") == 0) {
    real_free = reinterpret_cast<FreeFn>(*fn);
    *fn = reinterpret_cast<void*>(&floor_free);
  }
  return r;
}

}  // namespace

// RTLD_NEXT lookups are answered relative to this library (alloc_bench and cudart make none).
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  void* found = real_dlsym()(handle, name);
  if (found != nullptr && std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    real_get_proc = reinterpret_cast<GetProcV2>(found);
    return reinterpret_cast<void*>(&floor_get_proc);
  }
  return found;
}
