// Parking (shim/parking/parking.h): the door protocol and the park/restore of every pool of the process.
//
// Why no launch can slip between the drain and the unmap: a thread entering a door first stores
// its slot's "inside" word, then reads the global "closed" word; the parker first stores "closed",
// then reads every slot's "inside". With a full barrier between each side's store and load (the
// thread's own fence, or on Linux the parker's membarrier, which runs one on every thread of the
// process that is running at that moment, so the threads need only a compiler barrier), at least
// one side sees the other's store: either the parker sees the thread inside and waits for it to
// leave, or the thread sees the doors closed and takes the slow path, which leaves again (inside =
// 0) before it waits. Once the parker has seen every slot at 0, every later entry sees "closed",
// so nothing enters until the parker reopens. The drain (cuCtxSynchronize) and the unmap happen
// after that point.
#include "shim/parking/parking.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "shim/context_pool.h"
#include "shim/fences/streams.h"
#include "shim/ipc/ipc.h"
#include "shim/log.h"
#include "telemetry/share.h"

namespace cudapool::shim::park {

namespace detail {
std::atomic<unsigned> g_closed{0};
std::atomic<bool> g_fence_on_enter{true};
constinit thread_local Slot* tl_slot = nullptr;
}  // namespace detail

namespace {

using detail::Slot;

std::atomic<Slot*> g_slots{nullptr};
std::atomic<bool> g_membarrier{false};
std::atomic<const char*> g_never_park{nullptr};  // note_never_park: the first reason given
std::atomic<RestoreWait> g_restore_wait{nullptr};
std::atomic<Pools*> g_pools{nullptr};  // the runtime's view, once it runs the pool

enum class State { open, parking, parked, restoring };
std::mutex g_mu;  // written under it; also serialises park() and unpark()
std::condition_variable g_cv;
std::atomic<State> g_state{State::open};

// Counters (written under g_mu, read anywhere).
std::atomic<std::uint64_t> g_parks{0}, g_unparks{0}, g_bytes_out{0}, g_bytes_in{0}, g_park_ns{0}, g_unpark_ns{0};
std::atomic<std::uint64_t> g_parked_bytes{0};
std::atomic<std::int64_t> g_resident_ns{0};  // when the last restore finished

// How long a park waits for the threads inside a door to leave before it gives up (a call that
// blocks for long, such as a synchronous copy behind a long kernel, keeps the process working).
constexpr std::int64_t kInsideWaitNs = 5'000'000'000;

// Registers for private expedited membarrier once; the fast path drops its fence when it worked.
// A ThreadSanitizer build keeps the fence: the sanitizer does not model membarrier.
void setup_barrier() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
#if !defined(__SANITIZE_THREAD__)
    const long r = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0);
    if (r == 0) {
      g_membarrier.store(true, std::memory_order_seq_cst);
      detail::g_fence_on_enter.store(false, std::memory_order_seq_cst);
    }
#endif
  });
}

// The parker's half of the fence pair (after storing g_closed).
void heavy_barrier() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (g_membarrier.load(std::memory_order_relaxed)) {
    // Cannot fail once registered (the kernel's documented errors are for unregistered use).
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
      log_warn("parking: membarrier failed after registration");
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

struct SlotRelease {
  ~SlotRelease() {
    if (Slot* s = detail::tl_slot) {
      s->inside.store(0, std::memory_order_release);
      s->owned.store(false, std::memory_order_release);
      detail::tl_slot = nullptr;
    }
  }
};

// Waits until no thread is inside a door; false when one stays past the deadline.
bool wait_outside() noexcept {
  const std::int64_t deadline = share::monotonic_ns() + kInsideWaitNs;
  for (int spin = 0;; ++spin) {
    bool any = false;
    for (Slot* s = g_slots.load(std::memory_order_acquire); s != nullptr && !any; s = s->next)
      any = s->inside.load(std::memory_order_acquire) != 0;
    if (!any) return true;
    if (share::monotonic_ns() > deadline) return false;
    if (spin < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 1024 ? 50 : 1000));
  }
}

void reopen_locked() {
  g_state = State::open;
  detail::g_closed.store(0, std::memory_order_seq_cst);
  g_cv.notify_all();
}

std::string why_locked(Pools* rt) {
  if (rt == nullptr) return "the pool is not in use in this process";
  if (ipc::detail::g_exports.load(std::memory_order_acquire) != 0)
    return "a block is exported over CUDA IPC (another process may be using it)";
  if (const char* never = g_never_park.load(std::memory_order_acquire)) return never;
  if (any_capture_active()) return "a graph capture is in progress";
  std::string why;
  std::size_t mapped = 0;
  rt->for_each([&](ContextPool& cp) {
    if (!why.empty()) return;
    why = cp.upstream.why_not_parkable();
    mapped += cp.upstream.mapped_bytes();
  });
  if (!why.empty()) return why;
  if (mapped == 0) return "no memory that can move (no expandable-segment pages; classic segments stay)";
  return {};
}

// Restores every pool; 0 or the CUresult to fail the door's call with. Called by the one thread
// that set State::restoring (or by park() undoing itself), without g_mu.
int restore_all(std::string* why) noexcept {
  Pools* rt = g_pools.load(std::memory_order_acquire);
  if (rt == nullptr) return 0;
  const std::int64_t t0 = share::monotonic_ns();
  const RestoreWait wait = g_restore_wait.load(std::memory_order_acquire);
  int result = 0;
  std::uint64_t in = 0;
  rt->for_each([&](ContextPool& cp) {
    if (result != 0) return;
    const std::size_t n = cp.upstream.parked_bytes();
    const CUresult r = cp.upstream.restore_units(wait, why);
    if (r != CUDA_SUCCESS)
      result = r;
    else
      in += n;
  });
  if (result == 0) {
    const auto dt = static_cast<std::uint64_t>(share::monotonic_ns() - t0);
    g_unparks.fetch_add(1, std::memory_order_relaxed);
    g_bytes_in.fetch_add(in, std::memory_order_relaxed);
    g_unpark_ns.fetch_add(dt, std::memory_order_relaxed);
    g_parked_bytes.store(0, std::memory_order_relaxed);
    g_resident_ns.store(share::monotonic_ns(), std::memory_order_relaxed);
    log_info("parking: restored {} bytes in {:.1f} ms", in, static_cast<double>(dt) / 1e6);
  }
  return result;
}

// Restores under the protocol (the caller holds `lk` and saw State::parked).
int restore_locked(std::unique_lock<std::mutex>& lk, std::string* why) {
  g_state = State::restoring;
  lk.unlock();
  const int r = restore_all(why);
  lk.lock();
  if (r != 0) {
    g_state = State::parked;
    g_cv.notify_all();
    log_warn("parking: restore failed ({}); the call that needed it fails with CUDA error {}", *why, r);
    return r;
  }
  reopen_locked();
  return 0;
}

}  // namespace

namespace detail {

Slot& my_slot() noexcept {
  setup_barrier();
  static thread_local SlotRelease release_at_exit;
  (void)&release_at_exit;
  for (Slot* s = g_slots.load(std::memory_order_acquire); s != nullptr; s = s->next) {
    bool free_slot = false;
    if (s->owned.compare_exchange_strong(free_slot, true, std::memory_order_acq_rel)) {
      tl_slot = s;
      return *s;
    }
  }
  Slot* s = new Slot;  // never freed: the parker may be reading it; reused by later threads
  s->owned.store(true, std::memory_order_relaxed);
  Slot* head = g_slots.load(std::memory_order_relaxed);
  do {
    s->next = head;
  } while (!g_slots.compare_exchange_weak(head, s, std::memory_order_release, std::memory_order_relaxed));
  tl_slot = s;
  return *s;
}

int enter_slow(Slot& s) noexcept {
  for (;;) {
    s.inside.store(0, std::memory_order_seq_cst);  // out again, so that a parker does not wait for us
    {
      std::unique_lock<std::mutex> lk(g_mu);
      while (g_state == State::parking || g_state == State::restoring) g_cv.wait(lk);
      if (g_state == State::parked) {
        std::string why;
        if (const int r = restore_locked(lk, &why); r != 0) return r;
      }
    }
    s.inside.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (g_closed.load(std::memory_order_relaxed) == 0) return 0;
  }
}

}  // namespace detail

std::string why_not_parkable() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_state == State::parked) return "already parked";
  if (g_state != State::open) return "a park or restore is in progress";
  return why_locked(g_pools.load(std::memory_order_acquire));
}

namespace {

// With the doors closed and every thread outside: work already queued finishes before its memory
// goes (every context drained). false with *why when a drain failed.
bool drain_all(Pools* rt, std::string* why) {
  const RealDriver& d = rt->driver();
  bool ok = true;
  rt->for_each([&](ContextPool& cp) {
    if (!ok) return;
    ScopedContext scope(d, cp.ctx);
    const CUresult r = d.cuCtxSynchronize != nullptr ? d.cuCtxSynchronize() : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS) {
      ok = false;
      *why = "draining device " + std::to_string(cp.device) + " failed: CUDA error " + std::to_string(r);
    }
  });
  return ok;
}

// Drained: gives cached free pages back (*idle) and moves every pool's mapped units out (*out
// bytes). A failure undoes what it can and returns false with *why.
bool move_out(Pools* rt, Mode mode, std::uint64_t* out, std::size_t* idle, std::string* why) {
  rt->for_each([&](ContextPool& cp) { *idle += cp.pool.empty_cache(); });
  bool ok = true;
  rt->for_each([&](ContextPool& cp) {
    if (!ok) return;
    std::size_t n = 0;
    ok = cp.upstream.park_units(mode == Mode::copy, &n, why);
    *out += n;
  });
  if (!ok) {
    std::string again;
    if (restore_all(&again) != 0)
      log_warn("parking: undoing a failed park failed too ({}); the next call restores", again);
  }
  return ok;
}

// Closes the doors and waits for every thread inside one to leave; then the process can neither
// start GPU work nor change what may be parked. Called with `lk` held, returns with it released.
// false with *why when a thread stayed inside or the process became unparkable meanwhile.
bool close_doors(std::unique_lock<std::mutex>& lk, Pools* rt, std::string* why) {
  setup_barrier();
  g_state = State::parking;
  detail::g_closed.store(1, std::memory_order_seq_cst);
  lk.unlock();
  heavy_barrier();
  if (!wait_outside()) {
    *why = "a thread stayed inside a CUDA call for more than 5 s";
    return false;
  }
  // The hooks that export, capture or enable peer access pass the door too: asked again now,
  // the answer is final.
  *why = why_locked(rt);
  return why->empty();
}

// Under g_mu, after a park that failed (or found nothing to move): whatever an undo could not
// restore stays parked behind closed doors; else the doors open again.
void settle_failed_park(Pools* rt) {
  std::size_t left = 0;
  rt->for_each([&](ContextPool& cp) { left += cp.upstream.parked_bytes(); });
  if (left != 0) {
    g_state = State::parked;
    g_cv.notify_all();
  } else {
    reopen_locked();
  }
}

// Under g_mu, after a park that moved `out` bytes out in `dt` ns.
void note_parked(std::uint64_t out, std::uint64_t dt) {
  g_state = State::parked;
  g_parks.fetch_add(1, std::memory_order_relaxed);
  g_bytes_out.fetch_add(out, std::memory_order_relaxed);
  g_park_ns.fetch_add(dt, std::memory_order_relaxed);
  g_parked_bytes.store(out, std::memory_order_relaxed);
  g_cv.notify_all();
}

}  // namespace

bool park(Mode mode, const char* reason, std::string* why) noexcept {
  std::string local;
  std::string& w = why != nullptr ? *why : local;
  if (detail::tl_slot != nullptr && detail::tl_slot->inside.load(std::memory_order_relaxed) != 0) {
    w = "park() called from inside a CUDA call";
    return false;
  }
  const char* what = reason != nullptr ? reason : "asked";
  try {
    Pools* rt = g_pools.load(std::memory_order_acquire);
    std::unique_lock<std::mutex> lk(g_mu);
    if (g_state != State::open) {
      w = g_state == State::parked ? "already parked" : "a park or restore is in progress";
      return false;
    }
    w = why_locked(rt);
    if (!w.empty()) {
      log_info("parking: not parked ({}): {}", what, w);
      return false;
    }
    const std::int64_t t0 = share::monotonic_ns();
    std::uint64_t out = 0;
    std::size_t idle = 0;
    const bool ok = close_doors(lk, rt, &w) && drain_all(rt, &w) && move_out(rt, mode, &out, &idle, &w);
    lk.lock();
    if (!ok || out == 0) {
      if (ok) w = "no memory that can move once idle pages were given back";
      settle_failed_park(rt);
      log_info("parking: not parked ({}): {}", what, w);
      return false;
    }
    const auto dt = static_cast<std::uint64_t>(share::monotonic_ns() - t0);
    note_parked(out, dt);
    log_info("parking: parked {} bytes ({}, {} idle bytes given back first) in {:.1f} ms ({})", out,
             mode == Mode::copy ? "copied to host memory" : "discarded", idle, static_cast<double>(dt) / 1e6, what);
    return true;
  } catch (...) {
    w = "out of host memory";
    return false;
  }
}

bool unpark(std::string* why) noexcept {
  std::string local;
  std::string& w = why != nullptr ? *why : local;
  if (detail::tl_slot != nullptr && detail::tl_slot->inside.load(std::memory_order_relaxed) != 0) {
    w = "unpark() called from inside a CUDA call";
    return false;
  }
  try {
    std::unique_lock<std::mutex> lk(g_mu);
    while (g_state == State::parking || g_state == State::restoring) g_cv.wait(lk);
    if (g_state != State::parked) return true;
    return restore_locked(lk, &w) == 0;
  } catch (...) {
    w = "out of host memory";
    return false;
  }
}

bool parked() noexcept { return g_state.load(std::memory_order_acquire) == State::parked; }
std::int64_t resident_since_ns() noexcept { return g_resident_ns.load(std::memory_order_relaxed); }
std::uint64_t parked_bytes() noexcept { return g_parked_bytes.load(std::memory_order_relaxed); }

std::uint64_t activity() noexcept {
  std::uint64_t n = 0;
  for (Slot* s = g_slots.load(std::memory_order_acquire); s != nullptr; s = s->next)
    n += s->entries.load(std::memory_order_relaxed);
  return n;
}

Counters counters() noexcept {
  return Counters{g_parks.load(std::memory_order_relaxed),     g_unparks.load(std::memory_order_relaxed),
                  g_bytes_out.load(std::memory_order_relaxed), g_bytes_in.load(std::memory_order_relaxed),
                  g_park_ns.load(std::memory_order_relaxed),   g_unpark_ns.load(std::memory_order_relaxed)};
}

void release_spares() noexcept {
  Pools* pools = g_pools.load(std::memory_order_acquire);
  if (pools == nullptr) return;
  std::size_t freed = 0;
  try {
    pools->for_each([&](ContextPool& cp) { freed += cp.upstream.release_spare(kSpareKeepNs); });
  } catch (...) {
    return;
  }
  if (freed != 0) log_debug("parking: freed the {} bytes of pinned host memory kept since the last restore", freed);
}

void set_pools(Pools* pools) noexcept { g_pools.store(pools, std::memory_order_release); }

void set_restore_wait(RestoreWait fn) noexcept { g_restore_wait.store(fn, std::memory_order_release); }

void note_never_park(const char* why) noexcept {
  const char* none = nullptr;
  g_never_park.compare_exchange_strong(none, why, std::memory_order_acq_rel);
}

}  // namespace cudapool::shim::park
