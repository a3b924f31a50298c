// CUDA IPC of pooled memory: what the hooks call. The exporting side (shim/ipc/ipc_export.cpp) turns
// any live block into a handle and serves it to importers; the importing side
// (shim/ipc/ipc_import.cpp) opens such handles. Handles the shim did not make, and pointers it did not
// import, go to the real driver untouched. The wire format is in shim/ipc/ipc_wire.h.
#pragma once
#include <atomic>
#include <cstddef>

#include "shim/driver.h"

namespace cudapool::shim {
class Runtime;
struct ContextPool;
}  // namespace cudapool::shim

namespace cudapool::shim::ipc {

// --- exporting process

// A handle for the live block containing `dptr` (owned by `cp`): the same handle for every call
// while the block lives. Starts the process's IPC server on first use.
CUresult export_block(ContextPool& cp, CUdeviceptr dptr, CUipcMemHandle* out) noexcept;

// What a free of pool memory must do about exports (checked before the pool sees the free).
enum class FreeVerdict {
  free,           // not exported, or no importer holds it any more: the pool frees it now
  held,           // an importer still has it open: freed later, when the last one closes
  already_freed,  // freed before and still held: a double free
};
namespace detail {
extern std::atomic<int> g_exports;       // live exports in this process
extern std::atomic<bool> g_frees_ready;  // blocks released by importers wait for the pool
}  // namespace detail
FreeVerdict on_free_slow(const void* p) noexcept;
inline FreeVerdict on_free(const void* p) noexcept {
  return detail::g_exports.load(std::memory_order_relaxed) == 0 ? FreeVerdict::free : on_free_slow(p);
}
// Frees the blocks the program freed while importers held them, once the last importer closed.
// Called from the allocation and free hooks (never from the server thread: no CUDA there).
void drain_frees_slow(Runtime& rt) noexcept;
inline void drain_frees(Runtime& rt) noexcept {
  if (detail::g_frees_ready.load(std::memory_order_relaxed)) drain_frees_slow(rt);
}
// The context of `cp` is gone: its exports end (importers' later requests find nothing).
void forget_pool(const ContextPool* cp) noexcept;

// --- importing process

// kPassThrough (hooks.h) when `h` is not a handle of this shim.
CUresult open(const RealDriver& d, CUdeviceptr* out, const CUipcMemHandle& h, unsigned flags) noexcept;
// kPassThrough when `dptr` is not a pointer this process imported through the shim.
CUresult close(const RealDriver& d, CUdeviceptr dptr) noexcept;
// The imported block containing `dptr`, for address-range and attribute queries.
namespace detail {
extern std::atomic<int> g_imports;
}
bool imported_block_slow(CUdeviceptr dptr, CUdeviceptr* base, std::size_t* size) noexcept;
inline bool imported_block(CUdeviceptr dptr, CUdeviceptr* base, std::size_t* size) noexcept {
  return detail::g_imports.load(std::memory_order_relaxed) != 0 && imported_block_slow(dptr, base, size);
}

// A forked child forgets the parent's server, exports, connections and imports (each half
// registers its own pthread_atfork handler when it first holds state).

}  // namespace cudapool::shim::ipc
