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
  try {
    allocator = pa::createCustomAllocator(
        [](std::size_t size, int device, cudaStream_t stream) {
          return cudapool_glue_alloc(static_cast<ssize_t>(size), device, stream);
        },
        [](void* ptr, std::size_t size, int device, cudaStream_t stream) {
          cudapool_glue_free(ptr, static_cast<ssize_t>(size), device, stream);
        });
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
