// A stand-in for PyTorch's torch/csrc/cuda/CUDAPluggableAllocator.h, just what
// python/cudapool/_torch_glue.cpp uses with CUDAPOOL_GLUE_PLUGGABLE (createCustomAllocator,
// CUDAPluggableAllocator::set_record_stream_fn, changeCurrentAllocator, with PyTorch's names and
// argument shapes), so the glue's C++ registration is compiled and checked without PyTorch
// (tests/fakecuda/torch_app.cpp, tests/python/torch_scenarios.py). Header-only, for the one file
// that includes it. The allocator made current is reachable through the fake_torch_* functions,
// which call its functions the way PyTorch's allocator does (allocate, recordStream, raw delete).
// fake_torch_set_initialized(1), or FAKE_TORCH_ALLOCATOR_IN_USE set in the environment, makes
// changeCurrentAllocator refuse, as PyTorch does once its allocator is in use.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <memory>
#include <utility>

#include <c10/util/Exception.h>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace c10::cuda::CUDACachingAllocator {
class CUDAAllocator {
 public:
  virtual ~CUDAAllocator() = default;
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

  // The stand-in's own: what PyTorch's allocator keeps privately.
  std::function<void*(std::size_t, int, cudaStream_t)> alloc_fn_;
  std::function<void(void*, std::size_t, int, cudaStream_t)> free_fn_;
  std::function<void(void*, cudaStream_t)> record_stream_fn_;
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
}
