// A stand-in for PyTorch's torch/csrc/cuda/CUDAPluggableAllocator.h, just what
// python/cudapool/_torch_glue.cpp uses with CUDAPOOL_GLUE_PLUGGABLE (createCustomAllocator,
// CUDAPluggableAllocator::set_record_stream_fn, changeCurrentAllocator, with PyTorch's names and
// argument shapes) and CUDAPOOL_GLUE_ALLOCATOR_CLASS (the class's constructor, init,
// set_reset_fn, and the virtual functions the glue's subclass overrides: cacheInfo,
// getDeviceStats, resetPeakStats, emptyCache, with DeviceStats' fields), so the glue's C++
// registration is compiled and checked without PyTorch (tests/fakecuda/torch_app.cpp,
// tests/python/torch_scenarios.py). PyTorch's class refuses cacheInfo, getDeviceStats and
// resetPeakStats with an error, and so does this one. Header-only, for the one file that includes
// it. The allocator made current is reachable through the fake_torch_* functions, which call its
// functions the way PyTorch does (allocate, recordStream, raw delete, the statistics).
// fake_torch_set_initialized(1), or FAKE_TORCH_ALLOCATOR_IN_USE set in the environment, makes
// changeCurrentAllocator refuse, as PyTorch does once its allocator is in use.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <utility>

#include <c10/util/Exception.h>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace c10 {
using DeviceIndex = std::int8_t;
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;
namespace CachingDeviceAllocator {
struct Stat {
  std::int64_t current = 0, peak = 0, allocated = 0, freed = 0;
};
using StatArray = std::array<Stat, 3>;  // aggregate, small pool, large pool
struct DeviceStats {
  StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes, active_bytes,
      inactive_split_bytes, requested_bytes;
  std::int64_t num_alloc_retries = 0, num_ooms = 0;
  Stat oversize_allocations, oversize_segments;
  std::int64_t num_sync_all_streams = 0, num_device_alloc = 0, num_device_free = 0, max_split_size = 0;
};
}  // namespace CachingDeviceAllocator
}  // namespace c10

namespace c10::cuda::CUDACachingAllocator {
class CUDAAllocator {
 public:
  virtual ~CUDAAllocator() = default;
  virtual void init(int device_count) = 0;
  virtual bool initialized() = 0;
  virtual void emptyCache(MempoolId_t mempool_id = {0, 0}) = 0;
  virtual void cacheInfo(c10::DeviceIndex device, std::size_t* largestBlock) = 0;
  virtual c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) = 0;
  virtual void resetPeakStats(c10::DeviceIndex device) = 0;
};
}  // namespace c10::cuda::CUDACachingAllocator

namespace torch::cuda::CUDAPluggableAllocator {

class CUDAPluggableAllocator : public c10::cuda::CUDACachingAllocator::CUDAAllocator {
 public:
  CUDAPluggableAllocator(std::function<void*(std::size_t, int, cudaStream_t)> alloc_fn,
                         std::function<void(void*, std::size_t, int, cudaStream_t)> free_fn)
      : alloc_fn_(std::move(alloc_fn)), free_fn_(std::move(free_fn)) {}
  void set_record_stream_fn(std::function<void(void* ptr, cudaStream_t stream)> record_stream_fn) {
    record_stream_fn_ = std::move(record_stream_fn);
  }
  void set_reset_fn(std::function<void()> reset_fn) { reset_fn_ = std::move(reset_fn); }

  void init(int) override { initialized_ = true; }
  bool initialized() override { return initialized_; }
  void emptyCache(c10::MempoolId_t = {0, 0}) override {
    if (reset_fn_) reset_fn_();
  }
  void cacheInfo(c10::DeviceIndex, std::size_t*) override {
    C10_THROW_ERROR(Error, "CUDAPluggableAllocator does not yet support cacheInfo.");
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override {
    C10_THROW_ERROR(Error, "CUDAPluggableAllocator does not yet support getDeviceStats.");
  }
  void resetPeakStats(c10::DeviceIndex) override {
    C10_THROW_ERROR(Error, "CUDAPluggableAllocator does not yet support resetPeakStats.");
  }

  // The stand-in's own: what PyTorch's allocator keeps privately.
  std::function<void*(std::size_t, int, cudaStream_t)> alloc_fn_;
  std::function<void(void*, std::size_t, int, cudaStream_t)> free_fn_;
  std::function<void(void*, cudaStream_t)> record_stream_fn_;
  std::function<void()> reset_fn_;
  bool initialized_ = false;
};

inline std::shared_ptr<CUDAPluggableAllocator>& fake_current() {
  static std::shared_ptr<CUDAPluggableAllocator> current;
  return current;
}
inline bool& fake_initialized() {
  static bool initialized = std::getenv("FAKE_TORCH_ALLOCATOR_IN_USE") != nullptr;
  return initialized;
}

inline std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> createCustomAllocator(
    std::function<void*(std::size_t, int, cudaStream_t)> alloc_fn,
    std::function<void(void*, std::size_t, int, cudaStream_t)> free_fn) {
  return std::make_shared<CUDAPluggableAllocator>(std::move(alloc_fn), std::move(free_fn));
}

inline void changeCurrentAllocator(const std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>& allocator) {
  if (fake_initialized()) C10_THROW_ERROR(Error, "Can't swap an already initialized allocator");
  fake_current() = std::dynamic_pointer_cast<CUDAPluggableAllocator>(allocator);
}

}  // namespace torch::cuda::CUDAPluggableAllocator

// The test's handles on the current allocator (0 / NULL when there is none, or it has no
// record_stream function).
extern "C" {
__attribute__((visibility("default"))) int fake_torch_has_allocator(void);
__attribute__((visibility("default"))) void* fake_torch_alloc(std::size_t size, int device, void* stream);
__attribute__((visibility("default"))) void fake_torch_free(void* ptr, std::size_t size, int device, void* stream);
__attribute__((visibility("default"))) int fake_torch_record_stream(void* ptr, void* stream);
__attribute__((visibility("default"))) void fake_torch_set_initialized(int initialized);
// torch.cuda's statistics calls on the current allocator: -1 where it throws (PyTorch's class
// refuses them) or there is none. cacheInfo starts from 0, as PyTorch's cuDNN code does.
__attribute__((visibility("default"))) long long fake_torch_cache_info(int device);
__attribute__((visibility("default"))) long long fake_torch_stat(int device, const char* name);
__attribute__((visibility("default"))) int fake_torch_reset_peak(int device);
__attribute__((visibility("default"))) int fake_torch_empty_cache(void);

int fake_torch_has_allocator(void) { return torch::cuda::CUDAPluggableAllocator::fake_current() != nullptr; }
void* fake_torch_alloc(std::size_t size, int device, void* stream) {
  auto& a = torch::cuda::CUDAPluggableAllocator::fake_current();
  return a ? a->alloc_fn_(size, device, static_cast<cudaStream_t>(stream)) : nullptr;
}
void fake_torch_free(void* ptr, std::size_t size, int device, void* stream) {
  if (auto& a = torch::cuda::CUDAPluggableAllocator::fake_current())
    a->free_fn_(ptr, size, device, static_cast<cudaStream_t>(stream));
}
int fake_torch_record_stream(void* ptr, void* stream) {
  auto& a = torch::cuda::CUDAPluggableAllocator::fake_current();
  if (!a || !a->record_stream_fn_) return 0;
  a->record_stream_fn_(ptr, static_cast<cudaStream_t>(stream));
  return 1;
}
void fake_torch_set_initialized(int initialized) {
  torch::cuda::CUDAPluggableAllocator::fake_initialized() = initialized != 0;
}
long long fake_torch_cache_info(int device) {
  auto& a = torch::cuda::CUDAPluggableAllocator::fake_current();
  std::size_t largest = 0;
  try {
    if (!a) return -1;
    a->cacheInfo(static_cast<c10::DeviceIndex>(device), &largest);
  } catch (const c10::Error&) {
    return -1;
  }
  return static_cast<long long>(largest);
}
// name: "allocated_bytes.current", "allocated_bytes.peak", "reserved_bytes.current",
// "reserved_bytes.peak", "requested_bytes.current", "active_bytes.current", "segment.current"
// (the aggregate), "num_device_alloc", "num_ooms".
long long fake_torch_stat(int device, const char* name) {
  auto& a = torch::cuda::CUDAPluggableAllocator::fake_current();
  if (!a) return -1;
  c10::CachingDeviceAllocator::DeviceStats s;
  try {
    s = a->getDeviceStats(static_cast<c10::DeviceIndex>(device));
  } catch (const c10::Error&) {
    return -1;
  }
  const std::string n(name);
  if (n == "allocated_bytes.current") return s.allocated_bytes[0].current;
  if (n == "allocated_bytes.peak") return s.allocated_bytes[0].peak;
  if (n == "reserved_bytes.current") return s.reserved_bytes[0].current;
  if (n == "reserved_bytes.peak") return s.reserved_bytes[0].peak;
  if (n == "requested_bytes.current") return s.requested_bytes[0].current;
  if (n == "active_bytes.current") return s.active_bytes[0].current;
  if (n == "segment.current") return s.segment[0].current;
  if (n == "num_device_alloc") return s.num_device_alloc;
  if (n == "num_ooms") return s.num_ooms;
  return -1;
}
int fake_torch_reset_peak(int device) {
  auto& a = torch::cuda::CUDAPluggableAllocator::fake_current();
  try {
    if (!a) return -1;
    a->resetPeakStats(static_cast<c10::DeviceIndex>(device));
  } catch (const c10::Error&) {
    return -1;
  }
  return 0;
}
int fake_torch_empty_cache(void) {
  auto& a = torch::cuda::CUDAPluggableAllocator::fake_current();
  if (!a) return -1;
  a->emptyCache();
  return 0;
}
}
