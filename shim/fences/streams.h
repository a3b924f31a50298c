// Streams as the pool sees them (StreamId) versus CUDA stream handles, and which graph captures
// are in progress.
//
// Stream 0 means the legacy default stream in ordinary entry points and the calling thread's
// per-thread default stream in _ptsz/_ptds ones. Each thread's per-thread stream is a different
// stream, so it gets its own StreamId: (thread ordinal << 4) | 2. Real handles are aligned
// pointers and never have bit 1 set, so the two never collide; the main thread's id is 2, the
// value RMM logs use for "per-thread".
#pragma once
#include "allocator/types.h"
#include "shim/cuda_abi.h"

namespace cudapool::shim {

using cudaabi::CUstream;

inline constexpr StreamId kLegacyStream = 0;

StreamId per_thread_stream_id() noexcept;
inline bool is_per_thread_id(StreamId id) noexcept { return (id & 0xF) == 0x2; }

// `per_thread_flavour`: the entry point was a _ptsz/_ptds one.
inline StreamId stream_id(CUstream s, bool per_thread_flavour) noexcept {
  const auto v = reinterpret_cast<std::uintptr_t>(s);
  if (v == 0) return per_thread_flavour ? per_thread_stream_id() : kLegacyStream;
  if (v == 0x1) return kLegacyStream;
  if (v == 0x2) return per_thread_stream_id();
  return static_cast<StreamId>(v);
}

// The handle to record on for `id`, from the thread that owns it (per-thread ids are only ever
// used on their own thread: nobody else can name another thread's per-thread stream).
inline CUstream stream_handle(StreamId id) noexcept {
  if (id == kLegacyStream) return cudaabi::CU_STREAM_LEGACY;
  if (is_per_thread_id(id)) return cudaabi::CU_STREAM_PER_THREAD;
  return reinterpret_cast<CUstream>(id);
}

// Graph capture bookkeeping, fed by the cuStreamBeginCapture/cuStreamEndCapture hooks.
//
// A process that never began a capture (most of them) needs no cuStreamIsCapturing query per
// stream-ordered allocation: the hooks call capture_may_begin() BEFORE the driver's
// cuStreamBeginCapture*, so a capture can never be live while capture_ever_began() is false.
// Sticky: after the first capture every cuMemAllocAsync asks the driver again.
void capture_may_begin() noexcept;
bool capture_ever_began() noexcept;
void capture_began(StreamId stream, int mode) noexcept;
void capture_ended(StreamId stream) noexcept;
// Some capture is in progress somewhere: recording on the legacy stream could break it.
bool any_capture_active() noexcept;
// cuMemAlloc would be illegal now (a global-mode capture anywhere, or a thread-local one on
// this thread): the call goes to the driver untouched so the program sees CUDA's own answer.
bool sync_alloc_forbidden_by_capture() noexcept;
// Context-wide calls (cuCtxRecordEvent, cuCtxWaitEvent) act on every stream of the context: on
// one that is capturing the driver refuses them and invalidates the capture. The shim makes them
// only between context_wide_begin() returning true (no capture ever began in the process, and
// none can begin before context_wide_end(): capture_may_begin() waits for the call in flight)
// and context_wide_end(). After the first capture, fences use per-stream events only.
bool context_wide_begin() noexcept;
void context_wide_end() noexcept;
// After fork: the child has no captures.
void reset_captures_in_child() noexcept;

}  // namespace cudapool::shim
