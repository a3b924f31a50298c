// PyTorch's pluggable allocator entry points (torch.cuda.memory.CUDAPluggableAllocator):
// cudapool_torch_alloc / cudapool_torch_free, plus the C API pieces the Python module's PyTorch
// path needs (the last OOM diagnosis, the library's own path, the device count).
//
// PyTorch hands every allocation its device and stream and frees it with the stream it was
// allocated on, so these go to the pool as stream-ordered allocations and frees (the
// cudaMallocAsync / cudaFreeAsync path): a block freed on stream S is reused on S at once, by
// another stream only after an event on S has completed; no device-wide fence. Same pool, policy,
// caps, group budget, trace, logs and stats as the shim's hooks, whether the library was
// preloaded or loaded by the Python module alone.
//
// Never two pools for one allocation: a second copy of the library in the process (loaded from
// another path than the preloaded one) forwards these calls to the copy in the global scope, and
// a pointer of the pool freed through cudaFree (or the other way round) reaches the same pool
// through the hooks.
#include <dlfcn.h>
#include <sys/types.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "shim/cudapool.h"
#include "shim/export.h"
#include "shim/fences/streams.h"
#include "shim/hooks/hooks.h"
#include "shim/log.h"
#include "shim/oom_note.h"
#include "telemetry/logging.h"

using namespace cudapool;
using namespace cudapool::shim;

namespace {

using AllocFn = void* (*)(ssize_t, int, void*);
using FreeFn = void (*)(void*, ssize_t, int, void*);
using TextFn = size_t (*)(char*, size_t);

// The copy of these entry points in the process's global scope when it is not this one (this
// copy was loaded from another path than the preloaded library): calls go there, so that one
// pool serves the process. Resolved once.
struct Forward {
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
  FreeFn free_device = nullptr;
  TextFn last_oom = nullptr;
};

// Whether `p` lies in this copy of the library. (The address of an exported function taken in
// here is the global scope's definition, possibly another copy's: compare load addresses.)
void self_marker() {}
bool in_this_copy(void* p) {
  Dl_info mine{}, theirs{};
  return p != nullptr && dladdr(reinterpret_cast<void*>(&self_marker), &mine) != 0 && dladdr(p, &theirs) != 0 &&
         mine.dli_fbase == theirs.dli_fbase;
}

// The process's global scope (the program, what was loaded with it, RTLD_GLOBAL libraries).
// Not RTLD_DEFAULT: looked up from in here, that also searches this copy's own local scope, so a
// copy loaded RTLD_LOCAL (as Python's ctypes loads it) would find itself and take itself for the
// preloaded one.
void* global_scope() {
  static void* const h = dlopen(nullptr, RTLD_LAZY);
  return h;
}

const Forward& forward() {
  static const Forward f = [] {
    Forward out;
    DlsymFn sym = real_dlsym();
    void* global = global_scope();
    if (sym == nullptr || global == nullptr) return out;
    void* a = sym(global, "cudapool_torch_alloc");
    if (a == nullptr || in_this_copy(a)) return out;
    out.alloc = reinterpret_cast<AllocFn>(a);
    out.free = reinterpret_cast<FreeFn>(sym(global, "cudapool_torch_free"));
    out.free_device = reinterpret_cast<FreeFn>(sym(global, "cudapool_torch_free_device"));
    out.last_oom = reinterpret_cast<TextFn>(sym(global, "cudapool_last_oom_message"));
    // A preloaded copy too old for any of them: this copy serves alone rather than half forwarding.
    if (out.free == nullptr || out.free_device == nullptr || out.last_oom == nullptr) return Forward{};
    return out;
  }();
  return f;
}

// This copy interposes the driver (preloaded): its cuStreamBeginCapture_v2 is the process's. Then
// its hooks see every capture begin and every stream created; otherwise each allocation asks the
// driver whether its stream captures, and device fences cannot know the program's streams.
bool interposing() {
  static const bool yes = [] {
    DlsymFn sym = real_dlsym();
    return sym != nullptr && global_scope() != nullptr && in_this_copy(sym(global_scope(), "cuStreamBeginCapture_v2"));
  }();
  return yes;
}

size_t copy_text(const std::string& s, char* buf, size_t size) {
  if (buf != nullptr && size > 0) {
    const size_t n = s.size() < size - 1 ? s.size() : size - 1;
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return s.size();
}

// The driver's own stream-ordered allocation (its default memory pool), for what the pool does
// not serve: a capturing stream (the allocation becomes a graph node), the backend passthrough,
// a thread without a context, a process that is exiting. Freed by driver_free.
void* driver_alloc(const RealDriver& d, std::size_t bytes, CUstream s) {
  CUdeviceptr p = 0;
  const CUresult r = d.cuMemAllocAsync != nullptr ? d.cuMemAllocAsync(&p, bytes, s) : d.cuMemAlloc_v2(&p, bytes);
  if (r == CUDA_SUCCESS) return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  note_oom(
      fmt::format("CUDA out of memory. Tried to allocate {} bytes: the driver answered CUDA error {} "
                  "(the allocation was not the pool's: a graph capture, backend:passthrough, no context)",
                  bytes, static_cast<int>(r)));
  return nullptr;
}

void driver_free(const RealDriver& d, void* p, CUstream s) {
  const auto dp = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  const CUresult r = d.cuMemFreeAsync != nullptr ? d.cuMemFreeAsync(dp, s) : d.cuMemFree_v2(dp);
  if (r != CUDA_SUCCESS) log_warn("cudapool_torch_free({}): the driver answered CUDA error {}", p, static_cast<int>(r));
}

// The runtime whose pool takes a free of `p` on `s`; null when the free is done already (no
// runtime, or the backend passthrough, whose allocations are the driver's: freed there).
Runtime* runtime_to_free(void* p, CUstream s) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr) return nullptr;
  if (rt->native()) return rt;
  rt->count_pass(PassKind::backend);
  driver_free(rt->driver(), p, s);
  return nullptr;
}

// Live blocks that Tensor.record_stream said are used on another stream than their own (PyTorch
// passes those calls to pluggable allocators only through its C++ set_record_stream_fn, which
// cudapool.torch.use() wires to cudapool_torch_record_stream). A stream-ordered free of such a
// block would let its own stream reuse it at once while the other stream still reads it: it takes
// the device-fenced free instead. The map holds the block's one recorded stream, or kSeveral. The
// atomic count keeps every free of a program that never calls record_stream off the mutex.
// Kept by the copy of the library that takes the calls: its free decides, then forwards.
void* const kSeveral = reinterpret_cast<void*>(~std::uintptr_t{0});
struct Recorded {
  std::mutex mu;
  std::unordered_map<void*, void*> streams;  // block -> the other stream it is used on, or kSeveral
  std::atomic<std::size_t> count{0};
};
Recorded& recorded() {
  static auto* r = new Recorded;  // never destroyed: frees may come during exit
  return *r;
}

// Forgets `ptr`'s record; true when it was recorded on another stream than `stream`.
bool take_recorded(void* ptr, void* stream) {
  Recorded& r = recorded();
  if (r.count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.streams.find(ptr);
  if (it == r.streams.end()) return false;
  const bool elsewhere = it->second != stream;
  r.streams.erase(it);
  r.count.store(r.streams.size(), std::memory_order_release);
  return elsewhere;
}

bool capturing(const RealDriver& d, CUstream s) {
  if (interposing() && !capture_ever_began()) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return d.cuStreamIsCapturing != nullptr && d.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS &&
         st != CU_STREAM_CAPTURE_STATUS_NONE;
}

void* torch_alloc(ssize_t size, int device, void* stream);

// PyTorch's autograd threads name the device but may have no context current: c10 skips
// cudaSetDevice when the runtime already reports that device (it reports device 0 on a fresh
// thread), and the runtime binds its context only at the thread's next runtime call. The pool
// works through the driver API and needs the context now: make the device's primary context
// current, as the runtime would. true when it did (there was none).
bool adopt_primary_context(const RealDriver& d, int device) {
  if (device < 0 || d.cuCtxGetCurrent == nullptr || d.cuDevicePrimaryCtxRetain == nullptr ||
      d.cuCtxPushCurrent_v2 == nullptr)
    return false;
  CUcontext current = nullptr;
  if (d.cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != nullptr) return false;
  CUcontext primary = nullptr;
  if (d.cuDevicePrimaryCtxRetain(&primary, static_cast<CUdevice>(device)) != CUDA_SUCCESS) return false;
  return d.cuCtxPushCurrent_v2(primary) == CUDA_SUCCESS;
}

}  // namespace

// A block handed out anew has no record yet (one left by a block freed through cudaFree is stale).
CUDAPOOL_EXPORT void* cudapool_torch_alloc(ssize_t size, int device, void* stream) {
  void* p = torch_alloc(size, device, stream);
  if (p != nullptr) take_recorded(p, nullptr);
  return p;
}

namespace {

void* torch_alloc(ssize_t size, int device, void* stream) {
  if (const Forward& f = forward(); f.alloc != nullptr) return f.alloc(size, device, stream);
  if (size <= 0) return nullptr;  // PyTorch asks for 0 bytes for empty tensors: no memory
  Runtime* rt = Runtime::get();
  if (rt == nullptr) {
    note_oom("CUDA out of memory: cudapool could not load libcuda.so.1");
    return nullptr;
  }
  const RealDriver& d = rt->driver();
  const auto bytes = static_cast<std::size_t>(size);
  auto* s = static_cast<CUstream>(stream);
  if (!rt->native()) {
    rt->count_pass(PassKind::backend);
    return driver_alloc(d, bytes, s);
  }
  if (capturing(d, s)) {
    rt->count_pass(PassKind::capture);
    return driver_alloc(d, bytes, s);
  }
  CUdeviceptr p = 0;
  CUresult r = pool_allocate(*rt, &p, bytes, stream_id(s, false), device);
  if (r == kPassThrough && adopt_primary_context(d, device))
    r = pool_allocate(*rt, &p, bytes, stream_id(s, false), device);
  if (r == CUDA_SUCCESS) return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  if (r == kPassThrough) return driver_alloc(d, bytes, s);
  if (r == CUDA_ERROR_INVALID_DEVICE) {
    const std::string msg = fmt::format(
        "cudapool_torch_alloc: an allocation for device {} while another device's context is current; "
        "nothing allocated (make the device current first: torch.cuda.set_device)",
        device);
    log_warn("{}", msg);
    note_oom(msg);
  } else if (r != CUDA_ERROR_OUT_OF_MEMORY) {
    note_oom(fmt::format("CUDA out of memory. Tried to allocate {} bytes: the pool could not grow (CUDA error {})",
                         bytes, static_cast<int>(r)));
  }  // out of memory: pool_allocate logged and noted the pool's diagnosis
  return nullptr;
}

}  // namespace

CUDAPOOL_EXPORT void cudapool_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  if (take_recorded(ptr, stream)) return cudapool_torch_free_device(ptr, size, device, stream);
  if (const Forward& f = forward(); f.free != nullptr) return f.free(ptr, size, device, stream);
  if (ptr == nullptr) return;
  auto* s = static_cast<CUstream>(stream);
  Runtime* rt = runtime_to_free(ptr, s);
  if (rt == nullptr) return;
  const RealDriver& d = rt->driver();
  const StreamId id = stream_id(s, false);
  const CUresult r = pool_free(*rt, static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(ptr)), &id, s);
  if (r == kPassThrough) driver_free(d, ptr, s);  // a graph allocation, or memory the driver gave
}

// Tensor.record_stream(stream) for the block at `ptr`: its free will not be stream-ordered.
// A pointer that is not the pool's is ignored (forwarding, the preloaded copy's pool owns it).
CUDAPOOL_EXPORT void cudapool_torch_record_stream(void* ptr, void* stream) {
  if (ptr == nullptr) return;
  if (forward().alloc == nullptr) {
    Runtime* rt = Runtime::peek();
    if (rt == nullptr || rt->owner_of(ptr) == nullptr) return;
  }
  Recorded& r = recorded();
  std::lock_guard<std::mutex> lock(r.mu);
  auto [it, fresh] = r.streams.try_emplace(ptr, stream);
  if (!fresh && it->second != stream) it->second = kSeveral;
  r.count.store(r.streams.size(), std::memory_order_release);
}

// cudaFree's meaning (the policy's free_sync: reused only behind a device-wide fence), whatever
// stream PyTorch names: for a block recorded with cudapool_torch_record_stream, and for every free
// of programs whose allocator cannot pass record_stream on (cudapool.torch.use(free="device")).
// Preloaded, that fence covers every stream the program created; loaded alone, the host waits for
// the device first (cuCtxSynchronize, as CUDA's own cudaFree).
CUDAPOOL_EXPORT void cudapool_torch_free_device(void* ptr, ssize_t size, int device, void* stream) {
  if (ptr == nullptr) return;
  take_recorded(ptr, nullptr);
  if (const Forward& f = forward(); f.free_device != nullptr) return f.free_device(ptr, size, device, stream);
  auto* s = static_cast<CUstream>(stream);
  Runtime* rt = runtime_to_free(ptr, s);
  if (rt == nullptr) return;
  const RealDriver& d = rt->driver();
  // Loaded without LD_PRELOAD, the pool's device fence covers only the streams its hooks saw
  // created (none): wait for the device as CUDA's cudaFree does.
  if (!interposing() && d.cuCtxSynchronize != nullptr && !Runtime::exiting()) {
    adopt_primary_context(d, device);  // a thread with no context would synchronize nothing
    d.cuCtxSynchronize();
  }
  const CUresult r = pool_free(*rt, static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(ptr)), nullptr, nullptr);
  if (r == kPassThrough) driver_free(d, ptr, s);
}

CUDAPOOL_EXPORT size_t cudapool_last_oom_message(char* buf, size_t size) {
  if (const Forward& f = forward(); f.last_oom != nullptr) return f.last_oom(buf, size);
  return copy_text(last_oom(), buf, size);
}

CUDAPOOL_EXPORT size_t cudapool_library_path(char* buf, size_t size) {
  Dl_info info{};
  std::string path;
  if (dladdr(reinterpret_cast<void*>(&cudapool_library_path), &info) != 0 && info.dli_fname != nullptr)
    path = info.dli_fname;
  return copy_text(path, buf, size);
}

CUDAPOOL_EXPORT int cudapool_device_count(void) {
  const RealDriver* d = real_driver();
  int n = 0;
  if (d == nullptr || d->cuDeviceGetCount == nullptr || d->cuDeviceGetCount(&n) != CUDA_SUCCESS) return -1;
  return n;
}
