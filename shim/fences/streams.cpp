#include "shim/fences/streams.h"

#include <sched.h>

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

namespace cudapool::shim {

StreamId per_thread_stream_id() noexcept {
  static std::atomic<StreamId> next_ordinal{0};
  thread_local StreamId id = (next_ordinal.fetch_add(1, std::memory_order_relaxed) << 4) | 0x2;
  return id;
}

namespace {

struct Capture {
  StreamId stream;
  int mode;
};

// Captures are rare and short lists; a mutex and a vector are plenty. The atomics are what
// the allocation path reads.
std::mutex& capture_mutex() {
  static auto* mu = new std::mutex;  // leaked: no destructor at exit
  return *mu;
}
std::vector<Capture>& captures() {
  static auto* v = new std::vector<Capture>;
  return *v;
}
std::atomic<bool> g_ever{false};
std::atomic<int> g_context_wide{0};  // context-wide calls in flight
std::atomic<int> g_active{0};
std::atomic<int> g_global{0};
thread_local int tl_thread_local = 0;

}  // namespace

void capture_may_begin() noexcept {
  // seq_cst store: ordered before the driver call that starts the capture.
  if (!g_ever.load(std::memory_order_relaxed)) g_ever.store(true);
  // A context-wide call that began before the store would invalidate the capture: let it end
  // (one driver call). Any later one sees g_ever and is not made (context_wide_begin).
  while (g_context_wide.load() != 0) sched_yield();
}

bool context_wide_begin() noexcept {
  // Both sides store, then read the other's flag (seq_cst): either this thread sees the capture
  // coming, or capture_may_begin sees this call in flight and waits for it.
  g_context_wide.fetch_add(1);
  if (!g_ever.load()) return true;
  g_context_wide.fetch_sub(1);
  return false;
}

void context_wide_end() noexcept { g_context_wide.fetch_sub(1, std::memory_order_release); }

bool capture_ever_began() noexcept { return g_ever.load(std::memory_order_acquire); }

void capture_began(StreamId stream, int mode) noexcept {
  std::lock_guard<std::mutex> lock(capture_mutex());
  captures().push_back({stream, mode});
  g_active.fetch_add(1, std::memory_order_relaxed);
  if (mode == cudaabi::CU_STREAM_CAPTURE_MODE_GLOBAL) g_global.fetch_add(1, std::memory_order_relaxed);
  if (mode == cudaabi::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) ++tl_thread_local;
}

void capture_ended(StreamId stream) noexcept {
  std::lock_guard<std::mutex> lock(capture_mutex());
  auto& v = captures();
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it->stream != stream) continue;
    g_active.fetch_sub(1, std::memory_order_relaxed);
    if (it->mode == cudaabi::CU_STREAM_CAPTURE_MODE_GLOBAL) g_global.fetch_sub(1, std::memory_order_relaxed);
    if (it->mode == cudaabi::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && tl_thread_local > 0) --tl_thread_local;
    v.erase(it);
    return;
  }
}

bool any_capture_active() noexcept { return g_active.load(std::memory_order_relaxed) > 0; }

bool sync_alloc_forbidden_by_capture() noexcept {
  return g_global.load(std::memory_order_relaxed) > 0 || tl_thread_local > 0;
}

void reset_captures_in_child() noexcept {
  new (&capture_mutex()) std::mutex;  // a parent thread may have held it at fork
  captures().clear();
  g_active.store(0);
  g_global.store(0);
  g_context_wide.store(0);  // the calls in flight were the parent's threads'
  tl_thread_local = 0;
}

}  // namespace cudapool::shim
