// PyTorch's pluggable-allocator entry points (cudapool_torch_alloc / cudapool_torch_free) called
// the way PyTorch calls them, through function pointers, on the fake libcuda.so.1. Run by
// tests/unit/shim_torch_test.cpp with the shim preloaded, or (TORCH_APP_LIB=path) with the
// library loaded by dlopen alone, as the Python module loads it for a process without
// LD_PRELOAD. Also the PyTorch glue (python/cudapool/_torch_glue.cpp, built in here against a
// stand-in c10 header): a failed allocation is a c10::OutOfMemoryError with the pool's diagnosis.
// `torch_app <scenario>` prints "FAIL file:line: expr" and exits 1 on the first failed check,
// "PASS <scenario>" when all passed.
#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <c10/util/Exception.h>

#include "shim/cudapool.h"
#include "tests/fakecuda/fakecuda.h"
#define CUDAPOOL_TEST_APP_LCUDA
#include "tests/fakecuda/test_app.h"

extern "C" {
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph*);
CUresult cuCtxGetCurrent(CUcontext*);
int cudapool_glue_init(void* alloc, void* free, void* last_oom_message);
void* cudapool_glue_alloc(ssize_t size, int device, void* stream);
void cudapool_glue_free(void* ptr, ssize_t size, int device, void* stream);
int cudapool_glue_register(void* record_stream, char* err, std::size_t err_size);
int cudapool_glue_init_stats(void* stats_json, void* reset_peak, void* mem_info, void* empty_cache);
// The stand-in torch/csrc/cuda/CUDAPluggableAllocator.h's handles on the allocator the glue made
// current (tests/support/fake_torch_cuda).
int fake_torch_has_allocator(void);
void* fake_torch_alloc(std::size_t size, int device, void* stream);
void fake_torch_free(void* ptr, std::size_t size, int device, void* stream);
int fake_torch_record_stream(void* ptr, void* stream);
void fake_torch_set_initialized(int initialized);
long long fake_torch_cache_info(int device);
long long fake_torch_stat(int device, const char* name);
int fake_torch_reset_peak(int device);
int fake_torch_empty_cache(void);
}

namespace {

constexpr std::size_t kMiB = 1u << 20;

void* lib() {
  static void* h = [] {
    const char* path = std::getenv("TORCH_APP_LIB");
    if (path == nullptr || *path == '\0') return RTLD_DEFAULT;
    void* l = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (l == nullptr) std::printf("dlopen: %s\n", dlerror());
    CHECK(l != nullptr);
    return l;
  }();
  return h;
}

template <typename Fn>
Fn sym(const char* name) {
  auto fn = reinterpret_cast<Fn>(dlsym(lib(), name));
  CHECK(fn != nullptr);
  return fn;
}

void* talloc(std::size_t n, int device, CUstream s) {
  return sym<void* (*)(ssize_t, int, void*)>("cudapool_torch_alloc")(static_cast<ssize_t>(n), device, s);
}
void tfree(void* p, std::size_t n, int device, CUstream s) {
  sym<void (*)(void*, ssize_t, int, void*)>("cudapool_torch_free")(p, static_cast<ssize_t>(n), device, s);
}
std::string last_oom() {
  auto fn = sym<std::size_t (*)(char*, std::size_t)>("cudapool_last_oom_message");
  std::string s(fn(nullptr, 0) + 1, '\0');
  fn(s.data(), s.size());
  s.resize(s.size() - 1);
  return s;
}
cudapool_stats stats(int dev) {
  cudapool_stats s{};
  CHECK(sym<int (*)(int, cudapool_stats*)>("cudapool_get_stats")(dev, &s) == 0);
  return s;
}
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }
CUdeviceptr dp(void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

CUstream new_stream() {
  CUstream s = nullptr;
  CHECK_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

// A block freed on S is PyTorch's to reuse on S at once (stream order), with no event recorded
// and none asked; another stream gets it only after an event on S has completed.
void stream_reuse() {
  start_primary(0);
  CUstream s = new_stream(), t = new_stream();
  constexpr std::size_t n = 4 * kMiB;
  fakecuda_hold_stream(s);  // S's work is still running from here on
  void* p = talloc(n, 0, s);
  CHECK(p != nullptr);
  const long records = fakecuda_event_records(), queries = fakecuda_event_queries();
  tfree(p, n, 0, s);
  void* q = talloc(n, 0, s);
  CHECK(q == p);
  CHECK(fakecuda_event_records() == records && fakecuda_event_queries() == queries);  // no fence
  tfree(q, n, 0, s);
  // T may not take it while S runs: a fresh block, and an event recorded on S for later.
  void* r = talloc(n, 0, t);
  CHECK(r != nullptr && r != p);
  CHECK(fakecuda_event_records() > records);
  fakecuda_release_stream(s);
  // S's event has completed: T gets S's block now.
  void* x = talloc(n, 0, t);
  CHECK(x == p);
  tfree(r, n, 0, t);
  tfree(x, n, 0, t);
  CHECK(stats(0).allocations == 0);
  CHECK_OK(cuStreamDestroy_v2(s));
  CHECK_OK(cuStreamDestroy_v2(t));
}

// The device-fenced free: under free_sync:fenced nothing freed is handed out, on any stream,
// while work issued before the free still runs; once it has finished the block comes back.
void free_device() {
  drive_pool_clock(lib());
  start_primary(0);
  CUstream s = new_stream();
  auto fdev = sym<void (*)(void*, ssize_t, int, void*)>("cudapool_torch_free_device");
  constexpr std::size_t n = 4 * kMiB;
  void* p = talloc(n, 0, s);
  void* q = nullptr;
  if (lib() != RTLD_DEFAULT) {
    // Loaded alone: the hooks saw no stream, so the free waits for the device, as cudaFree does.
    const long syncs = fakecuda_ctx_syncs();
    fdev(p, static_cast<ssize_t>(n), 0, s);
    CHECK(fakecuda_ctx_syncs() == syncs + 1);
    q = talloc(n, 0, s);
  } else {
    fakecuda_hold_stream(s);  // a side stream still reads p (PyTorch's record_stream)
    fdev(p, static_cast<ssize_t>(n), 0, s);
    q = talloc(n, 0, s);  // even its own stream may not take it now
    CHECK(q != nullptr && q != p);
    fakecuda_release_stream(s);
  }
  void* r = nullptr;
  for (int i = 0; i < 100 && q != p && r != p; ++i) {  // the fence passes, then the batch window closes
    if (r != nullptr) tfree(r, n, 0, s);
    advance_pool_clock(kPastWindowsNs);
    r = talloc(n, 0, s);
  }
  CHECK(r == p || q == p);
  tfree(q, n, 0, s);
  if (r != nullptr) tfree(r, n, 0, s);
  CHECK(stats(0).allocations == 0);
  CHECK_OK(cuStreamDestroy_v2(s));
}

// Alloc / free / record_stream as PyTorch calls them: the library's entry points, or the
// allocator the glue registered.
struct TorchCalls {
  void* (*alloc)(std::size_t, int, CUstream);
  void (*free)(void*, std::size_t, int, CUstream);
  void (*record)(void*, CUstream);
};

// A tensor allocated on A, read on B (B's work still runs) and recorded there, freed on A: A may
// not reuse its block until B's read is done. Preloaded (no host wait), the block comes back only
// with A ordered behind B's pending work, or not at all; loaded alone, the free waited for the
// device (cuCtxSynchronize). Negative control: the same without the record is reused on A at
// once with nothing ordering A behind B, which is what the record must prevent.
void check_recorded_block_waits(const TorchCalls& c) {
  CUstream a = new_stream(), b = new_stream();
  constexpr std::size_t n = 4 * kMiB;
  const bool alone = lib() != RTLD_DEFAULT;
  fakecuda_hold_stream(b);  // B's read runs from here on
  void* p = c.alloc(n, 0, a);
  CHECK(p != nullptr);
  long syncs = fakecuda_ctx_syncs();
  c.free(p, n, 0, a);  // not recorded: stream-ordered, reused on A at once
  void* q = c.alloc(n, 0, a);
  CHECK(q == p && fakecuda_would_wait(a, b) == 0 && fakecuda_ctx_syncs() == syncs);
  c.record(q, a);  // its own stream: still stream-ordered
  c.free(q, n, 0, a);
  q = c.alloc(n, 0, a);
  CHECK(q == p && fakecuda_would_wait(a, b) == 0 && fakecuda_ctx_syncs() == syncs);
  c.record(q, b);
  c.free(q, n, 0, a);
  void* r = c.alloc(n, 0, a);
  CHECK(r != nullptr);
  if (alone) {
    CHECK(fakecuda_ctx_syncs() == syncs + 1);
  } else {
    CHECK(r != p || fakecuda_would_wait(a, b) == 1);
    CHECK(fakecuda_ctx_syncs() == syncs);
  }
  fakecuda_release_stream(b);
  c.free(r, n, 0, a);
  // The record was consumed by that free: the block's next life is stream-ordered again.
  void* x = nullptr;
  for (int i = 0; i < 100 && x != p; ++i) {  // the fence passes, then the batch window closes
    if (x != nullptr) c.free(x, n, 0, a);
    advance_pool_clock(kPastWindowsNs);
    x = c.alloc(n, 0, a);
  }
  CHECK(x == p);
  syncs = fakecuda_ctx_syncs();
  c.free(x, n, 0, a);
  CHECK(c.alloc(n, 0, a) == p && fakecuda_ctx_syncs() == syncs);
  c.free(p, n, 0, a);
  c.record(reinterpret_cast<void*>(std::uintptr_t{0x1000}), b);  // not the pool's: ignored
  CHECK(stats(0).allocations == 0);
  CHECK_OK(cuStreamDestroy_v2(a));
  CHECK_OK(cuStreamDestroy_v2(b));
}

void record_stream() {
  drive_pool_clock(lib());
  start_primary(0);
  check_recorded_block_waits(
      {talloc, tfree, [](void* p, CUstream s) { sym<void (*)(void*, void*)>("cudapool_torch_record_stream")(p, s); }});
}

// The glue's C++ registration (against the stand-in CUDAPluggableAllocator.h): refused while
// PyTorch's allocator is in use, with PyTorch's message; then the allocator it made current
// passes record_stream to the library, with the same effect as above.
void glue_record_stream() {
  drive_pool_clock(lib());
  start_primary(0);
  char err[256] = "untouched";
  CHECK(cudapool_glue_register(dlsym(lib(), "cudapool_torch_record_stream"), err, sizeof err) == -1);
  CHECK(cudapool_glue_init(dlsym(lib(), "cudapool_torch_alloc"), dlsym(lib(), "cudapool_torch_free"),
                           dlsym(lib(), "cudapool_last_oom_message")) == 0);
  fake_torch_set_initialized(1);
  CHECK(cudapool_glue_register(dlsym(lib(), "cudapool_torch_record_stream"), err, sizeof err) == 1);
  CHECK(contains(err, "already initialized") && !fake_torch_has_allocator());
  fake_torch_set_initialized(0);
  CHECK(cudapool_glue_register(dlsym(lib(), "cudapool_torch_record_stream"), err, sizeof err) == 0);
  CHECK(fake_torch_has_allocator());
  check_recorded_block_waits({[](std::size_t n, int d, CUstream s) { return fake_torch_alloc(n, d, s); },
                              [](void* p, std::size_t n, int d, CUstream s) { fake_torch_free(p, n, d, s); },
                              [](void* p, CUstream s) { CHECK(fake_torch_record_stream(p, s) == 1); }});
}

// The glue's allocator class (built with CUDAPOOL_GLUE_ALLOCATOR_CLASS) answers from the pool
// what PyTorch's CUDAPluggableAllocator refuses (the stand-in refuses too: each check below fails
// against it). cacheInfo, which cuDNN's benchmark mode asks, is the pool's free memory as
// cuMemGetInfo shows it to the program (within the cap, cached bytes counted); torch.cuda's
// statistics are the pool's; reset_peak_memory_stats and empty_cache reach the pool. Run with a
// 256 MiB cap.
void glue_allocator_class() {
  start_primary(0);
  CHECK(cudapool_glue_init(dlsym(lib(), "cudapool_torch_alloc"), dlsym(lib(), "cudapool_torch_free"),
                           dlsym(lib(), "cudapool_last_oom_message")) == 0);
  void* json = dlsym(lib(), "cudapool_memory_stats_json");
  void* reset = dlsym(lib(), "cudapool_reset_peak_stats");
  void* info = dlsym(lib(), "cudapool_mem_get_info");
  void* empty = dlsym(lib(), "cudapool_empty_cache");
  CHECK(cudapool_glue_init_stats(json, reset, nullptr, empty) == -1);
  CHECK(cudapool_glue_init_stats(json, reset, info, empty) == 0);
  char err[256] = "";
  CHECK(cudapool_glue_register(dlsym(lib(), "cudapool_torch_record_stream"), err, sizeof err) == 0);
  CUstream s = new_stream();
  void* p = fake_torch_alloc(3 * kMiB, 0, s);
  void* q = fake_torch_alloc(5 * kMiB + 100, 0, s);
  CHECK(p != nullptr && q != nullptr);
  cudapool_stats st = stats(0);
  std::printf("allocated %lld, reserved %lld, cacheInfo %lld\n", static_cast<long long>(st.allocated_bytes),
              static_cast<long long>(st.reserved_bytes), fake_torch_cache_info(0));
  CHECK(fake_torch_stat(0, "allocated_bytes.current") == st.allocated_bytes);
  CHECK(st.allocated_bytes >= static_cast<int64_t>(8 * kMiB + 100));
  CHECK(fake_torch_stat(0, "reserved_bytes.current") == st.reserved_bytes);
  CHECK(fake_torch_stat(0, "requested_bytes.current") == static_cast<long long>(8 * kMiB + 100));
  CHECK(fake_torch_stat(0, "segment.current") == st.segments);
  CHECK(st.segments >= 1);
  CHECK(fake_torch_stat(0, "num_device_alloc") == st.num_device_alloc);
  CHECK(fake_torch_stat(0, "num_ooms") == 0);
  std::size_t free_bytes = 0, total = 0;
  CHECK(sym<int (*)(int, std::size_t*, std::size_t*)>("cudapool_mem_get_info")(0, &free_bytes, &total) == 0);
  CHECK(total == 256 * kMiB);  // the cap
  CHECK(fake_torch_cache_info(0) == static_cast<long long>(free_bytes));
  CHECK(free_bytes == total - static_cast<std::size_t>(st.allocated_bytes));
  // reset_peak_memory_stats: the peak comes down to the current value.
  fake_torch_free(q, 5 * kMiB + 100, 0, s);
  CHECK(fake_torch_stat(0, "allocated_bytes.peak") >= static_cast<long long>(8 * kMiB + 100));
  CHECK(fake_torch_reset_peak(0) == 0);
  CHECK(fake_torch_stat(0, "allocated_bytes.peak") == fake_torch_stat(0, "allocated_bytes.current"));
  CHECK(fake_torch_stat(0, "allocated_bytes.peak") == stats(0).allocated_bytes_peak);
  // empty_cache: the pool gives its free memory back to the driver.
  fake_torch_free(p, 3 * kMiB, 0, s);
  const int64_t before = stats(0).reserved_bytes;
  CHECK(before > 0);
  CHECK(fake_torch_empty_cache() == 0);
  CHECK(stats(0).reserved_bytes < before);
  CHECK(fake_torch_stat(0, "reserved_bytes.current") == stats(0).reserved_bytes);
  CHECK_OK(cuStreamDestroy_v2(s));
}

// The legacy default stream (PyTorch's default stream, handle 0) is a stream like any other.
void default_stream() {
  start_primary(0);
  void* p = talloc(kMiB, 0, nullptr);
  CHECK(p != nullptr);
  tfree(p, kMiB, 0, nullptr);
  CHECK(talloc(kMiB, 0, nullptr) == p);
  CHECK(talloc(0, 0, nullptr) == nullptr);  // empty tensors: no memory, no error
  tfree(nullptr, 0, 0, nullptr);
}

// PyTorch's autograd thread allocates with no context current (c10 skips cudaSetDevice when the
// runtime already reports the device): the pool serves it in the device's primary context, and
// the thread's free goes back to the same pool.
void thread_without_context() {
  start_primary(0);
  void* warm = talloc(kMiB, 0, nullptr);
  CHECK(warm != nullptr);
  const cudapool_stats before = stats(0);
  void* p = nullptr;
  CUcontext seen = nullptr;
  std::thread t([&] {
    CUcontext none = nullptr;
    CHECK(cuCtxGetCurrent(&none) == CUDA_SUCCESS && none == nullptr);
    p = talloc(2 * kMiB, 0, nullptr);
    cuCtxGetCurrent(&seen);
  });
  t.join();
  CHECK(p != nullptr);
  CHECK(seen != nullptr);
  CHECK(stats(0).allocated_bytes ==
        before.allocated_bytes + static_cast<std::int64_t>(2 * kMiB));  // the pool's, not the driver's
  std::thread u([&] { tfree(p, 2 * kMiB, 0, nullptr); });
  u.join();
  CHECK(stats(0).allocated_bytes == before.allocated_bytes);
  tfree(warm, kMiB, 0, nullptr);
}

// Out of memory (CUDAPOOL_CONF caps the pool at 64 MiB): NULL, and the pool's diagnosis.
void oom() {
  start_primary(0);
  CUstream s = new_stream();
  void* a = talloc(32 * kMiB, 0, s);
  CHECK(a != nullptr);
  CHECK(talloc(128 * kMiB, 0, s) == nullptr);
  const std::string m = last_oom();
  std::printf("%s\n", m.c_str());
  CHECK(contains(m, "CUDA out of memory. Tried to allocate 128.00 MiB"));
  CHECK(contains(m, "limit is 64.00 MiB"));
  CHECK(contains(m, "reserved"));
  CHECK(stats(0).num_ooms >= 1);
  tfree(a, 32 * kMiB, 0, s);
  void* b = talloc(48 * kMiB, 0, s);  // the pool still serves what fits
  CHECK(b != nullptr);
  tfree(b, 48 * kMiB, 0, s);
}

// The glue of the Python module's PyTorch path: the same NULL is a c10::OutOfMemoryError.
void glue_oom() {
  start_primary(0);
  CHECK(cudapool_glue_init(nullptr, nullptr, nullptr) == -1);
  CHECK(cudapool_glue_init(dlsym(lib(), "cudapool_torch_alloc"), dlsym(lib(), "cudapool_torch_free"),
                           dlsym(lib(), "cudapool_last_oom_message")) == 0);
  void* p = cudapool_glue_alloc(kMiB, 0, nullptr);
  CHECK(p != nullptr);
  CHECK(cudapool_glue_alloc(0, 0, nullptr) == nullptr);  // no exception for empty tensors
  bool raised = false;
  try {
    cudapool_glue_alloc(static_cast<ssize_t>(256 * kMiB), 0, nullptr);
  } catch (const c10::OutOfMemoryError& e) {
    raised = true;
    std::printf("OutOfMemoryError: %s\n", e.what());
    CHECK(contains(e.what(), "Tried to allocate 256.00 MiB"));
    CHECK(contains(e.what(), "limit is 64.00 MiB"));
  }
  CHECK(raised);
  cudapool_glue_free(p, kMiB, 0, nullptr);
  CHECK(stats(0).allocations == 0);
}

// One pool for both paths (shim preloaded): PyTorch's block freed with cuMemFree, cuMemAlloc's
// block freed by PyTorch's free; nothing reaches the driver's free, nothing is counted twice.
void mixed_preloaded() {
  start_primary(0);
  CUstream s = new_stream();
  const long driver_frees = fakecuda_free_calls();
  void* p = talloc(kMiB, 0, s);
  CUdeviceptr q = 0;
  CHECK_OK(cuMemAlloc_v2(&q, kMiB));
  CHECK(stats(0).allocations == 2);
  CHECK(stats(0).allocated_bytes == static_cast<int64_t>(2 * kMiB));
  CHECK_OK(cuMemFree_v2(dp(p)));
  tfree(reinterpret_cast<void*>(static_cast<std::uintptr_t>(q)), kMiB, 0, s);
  CHECK(stats(0).allocations == 0);
  CHECK(fakecuda_free_calls() == driver_frees);
  CHECK_OK(cuStreamDestroy_v2(s));
}

// The library loaded by dlopen alone (no LD_PRELOAD): the pool serves PyTorch, cuMemAlloc goes
// to the driver, and such a pointer freed by PyTorch's free goes back to the driver.
void mixed_loaded() {
  start_primary(0);
  CUstream s = new_stream();
  const long driver_allocs = fakecuda_alloc_calls();
  void* p = talloc(kMiB, 0, s);
  CHECK(p != nullptr && stats(0).allocations == 1);
  CUdeviceptr q = 0;
  CHECK_OK(cuMemAlloc_v2(&q, kMiB));  // not the pool's: nothing interposes here
  CHECK(stats(0).allocations == 1);
  CHECK(fakecuda_is_live(q));
  tfree(reinterpret_cast<void*>(static_cast<std::uintptr_t>(q)), kMiB, 0, s);
  CHECK(!fakecuda_is_live(q));
  tfree(p, kMiB, 0, s);
  CHECK(stats(0).allocations == 0);
  CHECK(fakecuda_alloc_calls() > driver_allocs);
  CHECK_OK(cuStreamDestroy_v2(s));
}

// On a capturing stream the allocation becomes a graph node (the driver's), never a pool block
// that the graph would keep using after the pool handed it out again.
void capture() {
  start_primary(0);
  CUstream s = nullptr;
  CHECK_OK(cuStreamCreate(&s, 0));
  void* pooled = talloc(kMiB, 0, s);
  const long graph = fakecuda_graph_allocs();
  CHECK_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  void* g = talloc(kMiB, 0, s);
  CHECK(g != nullptr && fakecuda_graph_allocs() == graph + 1);
  tfree(g, kMiB, 0, s);
  CUgraph out = nullptr;
  CHECK_OK(cuStreamEndCapture(s, &out));
  CHECK(stats(0).allocations == 1);  // only the block allocated before the capture
  tfree(pooled, kMiB, 0, s);
  CHECK_OK(cuStreamDestroy_v2(s));
}

// An allocation for another device than the current one is refused, and says why.
void wrong_device() {
  start_primary(0);
  CHECK(talloc(kMiB, 1, nullptr) == nullptr);
  CHECK(contains(last_oom(), "device 1"));
  CHECK(talloc(kMiB, 0, nullptr) != nullptr);
}

// backend:passthrough: the driver's stream-ordered allocator serves and frees.
void passthrough() {
  start_primary(0);
  const long allocs = fakecuda_alloc_calls(), frees = fakecuda_free_calls();
  void* p = talloc(kMiB, 0, nullptr);
  CHECK(p != nullptr && fakecuda_alloc_calls() == allocs + 1 && fakecuda_is_live(dp(p)));
  tfree(p, kMiB, 0, nullptr);
  CHECK(fakecuda_free_calls() == frees + 1 && !fakecuda_is_live(dp(p)));
}

// Preloaded, plus a second copy of the library from another path (TORCH_APP_COPY): the copy's
// entry points forward to the preloaded one, so one pool serves them all.
void second_copy() {
  start_primary(0);
  const char* path = std::getenv("TORCH_APP_COPY");
  CHECK(path != nullptr);
  void* copy = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(copy != nullptr);
  auto alloc = reinterpret_cast<void* (*)(ssize_t, int, void*)>(dlsym(copy, "cudapool_torch_alloc"));
  auto free = reinterpret_cast<void (*)(void*, ssize_t, int, void*)>(dlsym(copy, "cudapool_torch_free"));
  CHECK(alloc != nullptr && free != nullptr &&
        reinterpret_cast<void*>(alloc) != dlsym(RTLD_DEFAULT, "cudapool_torch_alloc"));
  void* p = alloc(static_cast<ssize_t>(kMiB), 0, nullptr);
  CHECK(p != nullptr && stats(0).allocations == 1);  // the preloaded copy's pool
  CHECK_OK(cuMemFree_v2(dp(p)));                     // and so its hooks take it back
  CHECK(stats(0).allocations == 0);
  void* q = alloc(static_cast<ssize_t>(kMiB), 0, nullptr);
  free(q, static_cast<ssize_t>(kMiB), 0, nullptr);
  CHECK(stats(0).allocations == 0);
}

// The C API pieces the Python module uses.
void c_api() {
  auto path = sym<std::size_t (*)(char*, std::size_t)>("cudapool_library_path");
  char buf[4096];
  CHECK(path(buf, sizeof buf) > 0 && contains(buf, "libcudapool"));
  auto count = sym<int (*)()>("cudapool_device_count");
  start_primary(0);
  CHECK(count() == 2);
  CHECK(sym<int (*)()>("cudapool_api_version")() >= 3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string s = argv[1];
  struct Scenario {
    const char* name;
    void (*fn)();
  };
  const Scenario all[] = {{"stream_reuse", stream_reuse},
                          {"free_device", free_device},
                          {"record_stream", record_stream},
                          {"glue_record_stream", glue_record_stream},
                          {"glue_allocator_class", glue_allocator_class},
                          {"default_stream", default_stream},
                          {"thread_without_context", thread_without_context},
                          {"oom", oom},
                          {"glue_oom", glue_oom},
                          {"mixed_preloaded", mixed_preloaded},
                          {"mixed_loaded", mixed_loaded},
                          {"capture", capture},
                          {"wrong_device", wrong_device},
                          {"passthrough", passthrough},
                          {"second_copy", second_copy},
                          {"c_api", c_api}};
  for (const Scenario& sc : all) {
    if (s != sc.name) continue;
    sc.fn();
    std::printf("PASS %s\n", sc.name);
    return 0;
  }
  std::printf("unknown scenario %s\n", s.c_str());
  return 2;
}
