// Optional observer of what the pool does (trace file, logs). The pool checks one pointer on the
// hot path; with no sink attached it costs nothing else. Sinks must be fast and must not call
// back into the pool. Time and thread are added by the sink.
#pragma once
#include <cstddef>
#include <cstdint>

#include "allocator/types.h"

namespace cudapool {

enum class EventKind : std::uint8_t {
  allocate,          // ptr, size (rounded), requested, stream
  free,              // ptr, size, requested, stream (the free's stream, or the block's), on_stream
  allocate_failure,  // size = requested, after release-and-retry failed
  segment_alloc,     // ptr = segment base, size = segment size (an upstream call)
  segment_free,      // ptr = segment base, size
  segment_map,       // expandable: pages mapped at ptr, size bytes
  segment_unmap,     // expandable: pages unmapped
  oom,               // the upstream refused; size = segment size asked
  gc,                // size = bytes released by one GC pass
  empty_cache,       // size = bytes released
  fence_wait,        // the host blocked on a fence: stream = whose, duration_ns = how long
  gpu_wait,          // pending memory reused at once, the GPU made to wait for its fences; size = bytes
};

struct Event {
  EventKind kind;
  int device;
  std::uintptr_t ptr;
  std::size_t size;
  std::size_t requested;
  StreamId stream;
  std::int64_t duration_ns;  // upstream events: time the upstream took; else 0
  // free: true for free_on_stream (cudaFreeAsync and its driver forms), false for free
  // (cudaFree / cuMemFree). Lets a trace say which call the program made.
  bool on_stream = false;
};

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void on_event(const Event& e) = 0;
};

const char* to_string(EventKind k) noexcept;

namespace detail {

// Where a pool's events go: its sink (nullptr = none) and its device. Guarded by the pool lock.
struct EventLog {
  int device = 0;
  EventSink* sink = nullptr;
  void emit(EventKind kind, std::uintptr_t ptr, std::size_t size, std::size_t requested, StreamId stream,
            std::int64_t ns = 0, bool on_stream = false) const {
    if (sink != nullptr) sink->on_event(Event{kind, device, ptr, size, requested, stream, ns, on_stream});
  }
};

}  // namespace detail
}  // namespace cudapool
