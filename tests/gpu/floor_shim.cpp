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
//
// FLOOR_SHIM_CLASSES=1: one free list per power-of-two size class instead (a request gets a block
// of its class's size), so a program of varying sizes (legacy_app) is served from the lists too:
// the floor of any interposing allocator on that program (cudart, the hooks, a list pop).
// FLOOR_SHIM_FENCE=1 (this and the two below imply CLASSES): the first allocation after any free records one event on
// the legacy stream and queries it, the driver calls a stream-safe pool makes to reuse memory
// freed by a program that relies on cudaFree's wait; the difference to CLASSES alone is what
// those two calls cost in that program. FLOOR_SHIM_RECORD=1: the record alone, no query.
// FLOOR_SHIM_MEMOP=1: cuStreamWriteValue32 of a sequence number into mapped pinned host memory
// instead of the event, and a plain load of it instead of the query.
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using AllocFn = CUresult (*)(CUdeviceptr*, std::size_t);
using FreeFn = CUresult (*)(CUdeviceptr);
using GetProcV2 = CUresult (*)(const char*, void**, int, unsigned long long, int*);
using GetProcV1 = CUresult (*)(const char*, void**, int, unsigned long long);
using DlsymFn = void* (*)(void*, const char*);
using EventCreateFn = CUresult (*)(void**, unsigned);
using EventRecordFn = CUresult (*)(void*, void*);
using EventQueryFn = CUresult (*)(void*);

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

// FLOOR_SHIM_X=1, or the token floor:x in CUDAPOOL_CONF (so scripts that run libraries under
// policies, tests/gpu/legacy_ab.sh, can run this one too: `floor_shim.so::floor:classes`).
bool mode_on(const char* env, const char* token) {
  const char* v = std::getenv(env);
  if (v != nullptr && v[0] == '1') return true;
  const char* conf = std::getenv("CUDAPOOL_CONF");
  return conf != nullptr && std::strstr(conf, token) != nullptr;
}
const bool use_fence = mode_on("FLOOR_SHIM_FENCE", "floor:fence");
const bool use_record = mode_on("FLOOR_SHIM_RECORD", "floor:record");  // the record alone
const bool use_memop = mode_on("FLOOR_SHIM_MEMOP", "floor:memop");     // a stream write + a host read
const bool use_any_fence = use_fence || use_record || use_memop;
const bool use_classes = use_any_fence || mode_on("FLOOR_SHIM_CLASSES", "floor:classes");

// ---- FLOOR_SHIM_CLASSES ----
constexpr int kClasses = 48;
std::vector<CUdeviceptr> class_free[kClasses];
std::vector<std::pair<CUdeviceptr, int>> class_out;  // lent blocks and their class
bool freed_since_fence = false;
EventCreateFn ev_create = nullptr;
EventRecordFn ev_record = nullptr;
EventQueryFn ev_query = nullptr;
void* fence_event = nullptr;
long fence_records = 0, fence_done = 0;

int class_of(std::size_t n) {
  int k = 9;  // 512 B at least
  while ((std::size_t{1} << k) < n && k + 1 < kClasses) ++k;
  return k;
}

using HostAllocFn = CUresult (*)(void**, std::size_t, unsigned);
using HostDevPtrFn = CUresult (*)(CUdeviceptr*, void*, unsigned);
using WriteValueFn = CUresult (*)(void*, CUdeviceptr, unsigned, unsigned);
WriteValueFn write_value = nullptr;
volatile unsigned* memop_word = nullptr;
CUdeviceptr memop_dev = 0;
unsigned memop_seq = 0;

// floor:memop: the fence is a 32-bit write of a sequence number by the legacy stream into mapped
// pinned host memory, and the "query" a plain load of that word: no driver call to learn that
// the fence passed.
void memop_now() {  // under mu
  if (memop_word == nullptr) {
    if (real_get_proc == nullptr) return;
    int st = 0;
    HostAllocFn host_alloc = nullptr;
    HostDevPtrFn host_dev = nullptr;
    real_get_proc("cuMemHostAlloc", reinterpret_cast<void**>(&host_alloc), 12000, 0, &st);
    real_get_proc("cuMemHostGetDevicePointer", reinterpret_cast<void**>(&host_dev), 12000, 0, &st);
    real_get_proc("cuStreamWriteValue32", reinterpret_cast<void**>(&write_value), 12000, 0, &st);
    void* h = nullptr;
    if (host_alloc == nullptr || host_dev == nullptr || write_value == nullptr ||
        host_alloc(&h, 4096, 0x02 /* CU_MEMHOSTALLOC_DEVICEMAP */) != 0 || host_dev(&memop_dev, h, 0) != 0) {
      std::fprintf(stderr, "floor_shim: memop setup failed\n");
      std::abort();
    }
    memop_word = static_cast<volatile unsigned*>(h);
  }
  if (write_value(reinterpret_cast<void*>(1), memop_dev, ++memop_seq, 0) != 0) return;
  ++fence_records;
  if (*memop_word == memop_seq) ++fence_done;
}

void fence_now() {  // under mu
  if (use_memop) return memop_now();
  if (fence_event == nullptr) {
    if (real_get_proc == nullptr) return;
    int st = 0;
    real_get_proc("cuEventCreate", reinterpret_cast<void**>(&ev_create), 12000, 0, &st);
    real_get_proc("cuEventRecord", reinterpret_cast<void**>(&ev_record), 12000, 0, &st);
    real_get_proc("cuEventQuery", reinterpret_cast<void**>(&ev_query), 12000, 0, &st);
    if (ev_create == nullptr || ev_record == nullptr || ev_query == nullptr ||
        ev_create(&fence_event, 2 /* CU_EVENT_DISABLE_TIMING */) != 0)
      return;
  }
  if (ev_record(fence_event, reinterpret_cast<void*>(1) /* CU_STREAM_LEGACY */) != 0) return;
  ++fence_records;
  if (!use_record && ev_query(fence_event) == 0) ++fence_done;
}

CUresult class_alloc(CUdeviceptr* p, std::size_t n) {
  const int k = class_of(n);
  {
    std::lock_guard<std::mutex> g(mu);
    if (use_any_fence && freed_since_fence) {
      fence_now();
      freed_since_fence = false;
    }
    if (!class_free[k].empty()) {
      *p = class_free[k].back();
      class_free[k].pop_back();
      class_out.emplace_back(*p, k);
      return 0;
    }
  }
  const CUresult r = real_alloc(p, std::size_t{1} << k);
  if (r != 0) return r;
  std::lock_guard<std::mutex> g(mu);
  class_out.emplace_back(*p, k);
  return 0;
}

CUresult class_free_ptr(CUdeviceptr p) {
  {
    std::lock_guard<std::mutex> g(mu);
    for (std::size_t i = class_out.size(); i-- > 0;) {
      if (class_out[i].first != p) continue;
      class_free[class_out[i].second].push_back(p);
      class_out[i] = class_out.back();
      class_out.pop_back();
      freed_since_fence = true;
      return 0;
    }
  }
  return real_free(p);
}

struct FenceReport {
  ~FenceReport() {
    if (use_any_fence)
      std::fprintf(stderr, "floor_shim: fences=%ld complete_at_query=%ld\n", fence_records, fence_done);
  }
} fence_report;

CUresult floor_alloc(CUdeviceptr* p, std::size_t n) {
  if (use_classes) return class_alloc(p, n);
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
  if (use_classes) return class_free_ptr(p);
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
