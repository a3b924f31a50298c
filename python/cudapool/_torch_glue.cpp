// cudapool's PyTorch glue: the allocation and free functions handed to PyTorch's pluggable
// allocator by cudapool.torch.use(). Compiled there against the installed PyTorch's headers
// (only c10/util/Exception.h) and cached; see python/cudapool/torch.py.
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

}  // extern "C"
