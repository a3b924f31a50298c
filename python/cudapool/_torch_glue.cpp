// cudapool's PyTorch glue: the allocation and free functions handed to PyTorch's pluggable
// allocator by cudapool.torch.use(). Compiled there against the installed PyTorch's headers
// and cached; see python/cudapool/torch.py.
//
// With CUDAPOOL_GLUE_PLUGGABLE (the installed PyTorch ships torch/csrc/cuda/
// CUDAPluggableAllocator.h, and the glue is linked with its libraries) the glue also registers the
// allocator itself, in C++, so that Tensor.record_stream reaches the pool
// (set_record_stream_fn, which PyTorch's Python API does not offer). Without it only
// c10/util/Exception.h is needed, and Python registers the two functions.
//
// With CUDAPOOL_GLUE_ALLOCATOR_CLASS as well, the allocator registered is a CUDAPluggableAllocator
// of the glue's own (PoolAllocator) that answers what PyTorch's class refuses: cacheInfo (cuDNN's
// benchmark mode asks it for the largest workspace it may try: PyTorch's own class throws, and
// every convolution with torch.backends.cudnn.benchmark fails), getDeviceStats and resetPeakStats
// (torch.cuda.memory_allocated(), memory_stats(), max_memory_reserved(), reset_peak_memory_stats()
// read the pool's counters), and torch.cuda.empty_cache() empties the pool. The functions come
// from cudapool_glue_init_stats. Built apart because it leans on more of PyTorch's C++ API than
// the rest: where a PyTorch version differs, the Python module builds the glue without it.
//
// PyTorch does not check what a pluggable allocator returns: a NULL would become a tensor with no
// memory. This glue turns the pool's NULL into c10::OutOfMemoryError, which PyTorch raises in
// Python as torch.OutOfMemoryError (torch.cuda.OutOfMemoryError), with the pool's diagnosis as
// its message. The functions of libcudapool.so are handed over by cudapool_glue_init (resolved
// by the Python module in the copy of the library the process uses), so this file links nothing
// of it.
#include <sys/types.h>

#include <cstddef>
#include <string>

#include <c10/util/Exception.h>

#ifdef CUDAPOOL_GLUE_PLUGGABLE
#include <exception>
#include <memory>

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#endif
#ifdef CUDAPOOL_GLUE_ALLOCATOR_CLASS
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <utility>
#endif

namespace {

using AllocFn = void* (*)(ssize_t, int, void*);
using FreeFn = void (*)(void*, ssize_t, int, void*);
using TextFn = std::size_t (*)(char*, std::size_t);
AllocFn g_alloc = nullptr;
FreeFn g_free = nullptr;
TextFn g_last_oom = nullptr;

std::string last_oom(ssize_t size) {
  std::string msg;
  if (g_last_oom != nullptr) {
    const std::size_t n = g_last_oom(nullptr, 0);
    msg.assign(n + 1, '\0');
    g_last_oom(msg.data(), n + 1);
    msg.resize(n);
  }
  if (msg.empty()) msg = "CUDA out of memory. Tried to allocate " + std::to_string(size) + " bytes (cudapool)";
  return msg;
}

#ifdef CUDAPOOL_GLUE_ALLOCATOR_CLASS
using StatsJsonFn = std::size_t (*)(int, char*, std::size_t);
using DeviceFn = int (*)(int);
using MemInfoFn = int (*)(int, std::size_t*, std::size_t*);
using EmptyFn = std::size_t (*)();
StatsJsonFn g_stats_json = nullptr;
DeviceFn g_reset_peak = nullptr;
MemInfoFn g_mem_info = nullptr;
EmptyFn g_empty_cache = nullptr;

namespace pa = torch::cuda::CUDAPluggableAllocator;
// PyTorch's statistics type: c10::CachingDeviceAllocator::DeviceStats in recent versions,
// c10::cuda::CUDACachingAllocator::DeviceStats before. Same field names in both.
using TorchStats = decltype(std::declval<pa::CUDAPluggableAllocator&>().getDeviceStats(c10::DeviceIndex{}));

// Counters some PyTorch versions lack.
#define CUDAPOOL_GLUE_HAS(field)           \
  template <typename S, typename = void>   \
  struct has_##field : std::false_type {}; \
  template <typename S>                    \
  struct has_##field<S, std::void_t<decltype(&S::field)>> : std::true_type {};
CUDAPOOL_GLUE_HAS(requested_bytes)
CUDAPOOL_GLUE_HAS(num_sync_all_streams)
CUDAPOOL_GLUE_HAS(num_device_alloc)
CUDAPOOL_GLUE_HAS(num_device_free)
CUDAPOOL_GLUE_HAS(max_split_size)
#undef CUDAPOOL_GLUE_HAS

// Calls f(name, value) for each "name": value pair of the library's flat JSON object of integers
// (cudapool_memory_stats_json).
template <typename F>
void each_counter(const std::string& json, F&& f) {
  std::size_t i = 0;
  while ((i = json.find('"', i)) != std::string::npos) {
    const std::size_t end = json.find('"', i + 1);
    if (end == std::string::npos) return;
    const std::size_t colon = json.find(':', end);
    if (colon == std::string::npos) return;
    const char* start = json.c_str() + colon + 1;
    char* stop = nullptr;
    const long long v = std::strtoll(start, &stop, 10);
    if (stop != start) f(std::string_view(json.data() + i + 1, end - i - 1), static_cast<std::int64_t>(v));
    i = static_cast<std::size_t>(stop - json.c_str());
    if (stop == start) i = colon + 1;
  }
}

// One counter of the library's JSON, by torch.cuda.memory_stats()'s names (which the library
// uses): "<family>.<all|small_pool|large_pool>.<field>", "<family>.<field>" or a plain count.
template <typename S>
void set_counter(S& s, std::string_view name, std::int64_t v) {
  using Stat = decltype(S::oversize_allocations);
  using StatArray = decltype(S::allocation);
  const std::pair<std::string_view, std::int64_t Stat::*> fields[] = {{"current", &Stat::current},
                                                                      {"peak", &Stat::peak},
                                                                      {"allocated", &Stat::allocated},
                                                                      {"freed", &Stat::freed}};
  const std::pair<std::string_view, StatArray S::*> families[] = {{"allocation", &S::allocation},
                                                                  {"segment", &S::segment},
                                                                  {"active", &S::active},
                                                                  {"inactive_split", &S::inactive_split},
                                                                  {"allocated_bytes", &S::allocated_bytes},
                                                                  {"reserved_bytes", &S::reserved_bytes},
                                                                  {"active_bytes", &S::active_bytes},
                                                                  {"inactive_split_bytes", &S::inactive_split_bytes}};
  const std::string_view pools[] = {"all", "small_pool", "large_pool"};  // PyTorch's StatType order
  auto put = [&](Stat& st, std::string_view field) {
    for (const auto& [n, member] : fields)
      if (field == n) st.*member = v;
  };
  auto put_array = [&](StatArray& array, std::string_view rest) {
    const std::size_t dot = rest.find('.');
    for (std::size_t k = 0; dot != std::string_view::npos && k < 3 && k < array.size(); ++k)
      if (rest.substr(0, dot) == pools[k]) put(array[k], rest.substr(dot + 1));
  };
  const std::size_t dot = name.find('.');
  if (dot == std::string_view::npos) {
    if (name == "num_alloc_retries") s.num_alloc_retries = v;
    if (name == "num_ooms") s.num_ooms = v;
    if constexpr (has_num_sync_all_streams<S>::value)
      if (name == "num_sync_all_streams") s.num_sync_all_streams = v;
    if constexpr (has_num_device_alloc<S>::value)
      if (name == "num_device_alloc") s.num_device_alloc = v;
    if constexpr (has_num_device_free<S>::value)
      if (name == "num_device_free") s.num_device_free = v;
    if constexpr (has_max_split_size<S>::value)
      if (name == "max_split_size") s.max_split_size = v;
    return;
  }
  const std::string_view family = name.substr(0, dot), rest = name.substr(dot + 1);
  if (family == "oversize_allocations") put(s.oversize_allocations, rest);
  if (family == "oversize_segments") put(s.oversize_segments, rest);
  for (const auto& [n, member] : families)
    if (family == n) put_array(s.*member, rest);
  if constexpr (has_requested_bytes<S>::value)
    if (family == "requested_bytes") put_array(s.requested_bytes, rest);
}

// PyTorch's CUDAPluggableAllocator, answering from the pool what that class refuses.
class PoolAllocator final : public pa::CUDAPluggableAllocator {
 public:
  using pa::CUDAPluggableAllocator::CUDAPluggableAllocator;

  // cuDNN's benchmark mode tries workspaces up to this. PyTorch's own allocator answers the larger
  // of its largest cached free block and the device's free memory; the pool answers its view of
  // free memory: the device's within the cap, with its cached bytes counted as free (what
  // cuMemGetInfo reports to the program). A workspace that then does not fit raises
  // OutOfMemoryError, which PyTorch's cuDNN code catches and tries smaller.
  void cacheInfo(c10::DeviceIndex device, std::size_t* largest) override {
    std::size_t free_bytes = 0, total = 0;
    if (largest != nullptr && g_mem_info != nullptr && g_mem_info(static_cast<int>(device), &free_bytes, &total) == 0 &&
        free_bytes > *largest)
      *largest = free_bytes;
  }

  TorchStats getDeviceStats(c10::DeviceIndex device) override {
    TorchStats s{};
    if (g_stats_json == nullptr) return s;
    const int d = static_cast<int>(device);
    std::string json(g_stats_json(d, nullptr, 0) + 1, '\0');
    json.resize(g_stats_json(d, json.data(), json.size()));
    each_counter(json, [&](std::string_view name, std::int64_t v) { set_counter(s, name, v); });
    return s;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    if (g_reset_peak != nullptr) g_reset_peak(static_cast<int>(device));
  }
};
#endif

}  // namespace

extern "C" {

// 0 when all three functions are given, -1 otherwise (nothing changed then).
int cudapool_glue_init(void* alloc, void* free, void* last_oom_message) {
  if (alloc == nullptr || free == nullptr || last_oom_message == nullptr) return -1;
  g_alloc = reinterpret_cast<AllocFn>(alloc);
  g_free = reinterpret_cast<FreeFn>(free);
  g_last_oom = reinterpret_cast<TextFn>(last_oom_message);
  return 0;
}

void* cudapool_glue_alloc(ssize_t size, int device, void* stream) {
  void* p = g_alloc(size, device, stream);
  if (p == nullptr && size > 0) C10_THROW_ERROR(OutOfMemoryError, last_oom(size));
  return p;
}

void cudapool_glue_free(void* ptr, ssize_t size, int device, void* stream) { g_free(ptr, size, device, stream); }

#ifdef CUDAPOOL_GLUE_ALLOCATOR_CLASS
// The library's functions PoolAllocator answers from (cudapool_memory_stats_json,
// cudapool_reset_peak_stats, cudapool_mem_get_info, cudapool_empty_cache). Before
// cudapool_glue_register; 0 when all are given, -1 otherwise (nothing changed then).
int cudapool_glue_init_stats(void* stats_json, void* reset_peak, void* mem_info, void* empty_cache) {
  if (stats_json == nullptr || reset_peak == nullptr || mem_info == nullptr || empty_cache == nullptr) return -1;
  g_stats_json = reinterpret_cast<StatsJsonFn>(stats_json);
  g_reset_peak = reinterpret_cast<DeviceFn>(reset_peak);
  g_mem_info = reinterpret_cast<MemInfoFn>(mem_info);
  g_empty_cache = reinterpret_cast<EmptyFn>(empty_cache);
  return 0;
}
#endif

#ifdef CUDAPOOL_GLUE_PLUGGABLE
// Makes a CUDAPluggableAllocator of cudapool_glue_alloc / cudapool_glue_free whose record_stream
// calls `record_stream` (the library's cudapool_torch_record_stream), and makes it PyTorch's
// current CUDA allocator. 0 when done; 1 when PyTorch refused the change (its allocator is already
// in use), -1 for anything else, with PyTorch's message in `err` (snprintf-style).
int cudapool_glue_register(void* record_stream, char* err, std::size_t err_size) {
  namespace pa = torch::cuda::CUDAPluggableAllocator;
  const auto put = [&](int rc, const char* what) {
    if (err != nullptr && err_size > 0) {
      const std::string m(what);
      const std::size_t n = m.size() < err_size - 1 ? m.size() : err_size - 1;
      m.copy(err, n);
      err[n] = '\0';
    }
    return rc;
  };
  if (record_stream == nullptr || g_alloc == nullptr) return put(-1, "cudapool_glue_init was not called");
  using RecordFn = void (*)(void*, void*);
  const auto record = reinterpret_cast<RecordFn>(record_stream);
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator;
  auto alloc = [](std::size_t size, int device, cudaStream_t stream) {
    return cudapool_glue_alloc(static_cast<ssize_t>(size), device, stream);
  };
  auto release = [](void* ptr, std::size_t size, int device, cudaStream_t stream) {
    cudapool_glue_free(ptr, static_cast<ssize_t>(size), device, stream);
  };
  try {
#ifdef CUDAPOOL_GLUE_ALLOCATOR_CLASS
    // What createCustomAllocator does, with the glue's class.
    auto own = std::make_shared<PoolAllocator>(alloc, release);
    own->init(0);
    if (g_empty_cache != nullptr) own->set_reset_fn([] { g_empty_cache(); });
    allocator = own;
#else
    allocator = pa::createCustomAllocator(alloc, release);
#endif
    if (allocator == nullptr) return put(-1, "createCustomAllocator made no allocator");
    // createCustomAllocator makes a CUDAPluggableAllocator (its declared type is the base class).
    // Not dynamic_cast: PyTorch's libraries need not export that class's type information.
    static_cast<pa::CUDAPluggableAllocator*>(allocator.get())
        ->set_record_stream_fn([record](void* ptr, cudaStream_t stream) { record(ptr, stream); });
  } catch (const std::exception& e) {
    return put(-1, e.what());
  }
  try {
    pa::changeCurrentAllocator(allocator);
  } catch (const std::exception& e) {
    return put(1, e.what());
  }
  // Held for the process's lifetime (never destroyed at exit); PyTorch holds it as well.
  new std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>(allocator);
  return put(0, "");
}
#endif

}  // extern "C"
