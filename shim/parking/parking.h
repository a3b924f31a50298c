// Parking: a process's device memory taken away while it idles and given back, at the same
// addresses, at its next call that can make the GPU touch memory (docs/design.md, "Parking").
//
// The doors: every hooked entry point that can make the GPU read or write memory (launches, graph
// launches, copies, sets, prefetch, stream memory operations; shim/hooks/hooks_doors.cpp) and the
// allocation hooks pass door_enter()/door_leave(). Nothing parked: a relaxed store of the
// thread's own "inside" word and a relaxed load of the global "closed" word. A park closes the
// doors, makes every thread's store visible (membarrier, else seq_cst on the fast path), waits for
// the threads inside to leave, then drains, copies out and unmaps. A thread that meets a closed
// door waits while a park is under way and restores first when the process is parked.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "shim/upstream/park_store.h"

namespace cudapool::shim {
struct ContextPool;
struct RealDriver;
}  // namespace cudapool::shim

namespace cudapool::shim::park {

// What parking needs of the process: its driver and its pools. Parking sits below the runtime
// (the upstream includes this file), so the runtime hands it this view when it starts running the
// pool; until then nothing can be parked.
class Pools {
 public:
  virtual const RealDriver& driver() const noexcept = 0;
  // fn(pool) for every live pool of the process.
  virtual void for_each(const std::function<void(ContextPool&)>& fn) = 0;

 protected:
  ~Pools() = default;
};
// Called once by the runtime (`pools` lives as long as the process).
void set_pools(Pools* pools) noexcept;

enum class Mode { copy, discard };  // discard: bytes not kept (a KV cache the program rebuilds)

// Why this process cannot be parked now, "" when it can: an IPC export or exported handle, peer
// access enabled, a graph capture in progress, no VMM memory (classic segments only), parking
// already in progress or the process already parked.
std::string why_not_parkable();
// Parks every device of the process: closes the doors, waits for threads inside a door to leave,
// drains the contexts, gives idle cached pages back, copies (Mode::copy) the bytes of each mapped
// unit to host memory (pinned when possible), unmaps and releases the physical memory; the
// ranges stay reserved; the group charge drops through the upstream's gate. Callable from any
// thread but one inside a door (the group responder thread, the C API). false with *why when
// refused or failed (the process is then left resident and working). `reason` goes to the log.
bool park(Mode mode, const char* reason, std::string* why) noexcept;
// Restores now (the C API's cudapool_unpark); the doors call the same path themselves. true
// when nothing is parked afterwards (also when nothing was).
bool unpark(std::string* why) noexcept;
bool parked() noexcept;
// monotonic_ns() when the last restore finished; 0 when the process was never restored (it has
// been resident since it started). The group's turns park the member resident longest first.
std::int64_t resident_since_ns() noexcept;
// A restore keeps its pinned host buffer for the next park (pinning costs far more than the
// copy); frees those kept longer than kSpareKeepNs. The publisher thread calls it every round.
inline constexpr std::int64_t kSpareKeepNs = 10'000'000'000;
void release_spares() noexcept;
// Bytes the last park gave back to the device and not restored yet (held in host memory, or
// discarded with Mode::discard).
std::uint64_t parked_bytes() noexcept;
// Changes whenever a door was entered since the last read (approximate; the group publisher
// samples it to know how long the member has been idle).
std::uint64_t activity() noexcept;
struct Counters {
  std::uint64_t parks, unparks, bytes_out, bytes_in, park_ns, unpark_ns;
};
Counters counters() noexcept;
// Set by the group layer (RestoreWait: shim/upstream/park_store.h): called by the restore path
// when the gate refuses the bytes it needs back.
void set_restore_wait(RestoreWait fn) noexcept;

// ---- The door (used by the hooks) ---------------------------------------------------------------

namespace detail {
// Non-zero while a park is under way or the process is parked (written under the park lock).
extern std::atomic<unsigned> g_closed;
// true where the parker cannot make the threads' stores visible itself (no membarrier): the fast
// path then fences. Only ever goes from true to false, once, before the first slot exists.
extern std::atomic<bool> g_fence_on_enter;
// One per thread that ever passed a door, in a list the parker scans; reused after its thread
// ended. Written only by its thread (the parker reads it).
struct alignas(64) Slot {
  std::atomic<unsigned> inside{0};        // depth of doors the thread is in (a hook may nest)
  std::atomic<std::uint64_t> entries{0};  // doors entered, for activity()
  std::atomic<bool> owned{false};
  Slot* next = nullptr;
};
extern constinit thread_local Slot* tl_slot;
Slot& my_slot() noexcept;  // registers the calling thread's slot
// The slow path of door_enter (the doors are closed): waits out a park, restores a parked
// process. Returns the CUresult the call must fail with, else 0 (then the thread is inside).
int enter_slow(Slot& s) noexcept;
}  // namespace detail

// A call that can make the GPU touch memory begins: 0 to go on (then door_leave() after the call),
// else the CUresult the call must return (a restore that could not get its memory back; the
// thread is not inside then). Re-entrant per thread.
inline int door_enter() noexcept {
  detail::Slot* s = detail::tl_slot;
  if (s == nullptr) [[unlikely]]
    s = &detail::my_slot();
  const unsigned depth = s->inside.load(std::memory_order_relaxed);
  s->inside.store(depth + 1, std::memory_order_relaxed);
  if (depth != 0) return 0;  // the outer call already passed
  s->entries.store(s->entries.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // The store above must be visible before the load below: the parker's membarrier makes it so
  // (a compiler barrier is all this side needs), else a full fence.
  if (detail::g_fence_on_enter.load(std::memory_order_relaxed)) [[unlikely]]
    std::atomic_thread_fence(std::memory_order_seq_cst);
  else
    std::atomic_signal_fence(std::memory_order_seq_cst);
  if (detail::g_closed.load(std::memory_order_relaxed) == 0) [[likely]]
    return 0;
  return detail::enter_slow(*s);
}
inline void door_leave() noexcept {
  detail::Slot* s = detail::tl_slot;
  s->inside.store(s->inside.load(std::memory_order_relaxed) - 1, std::memory_order_release);
}

// Enters on construction, leaves on destruction; result() != 0: fail the call with it.
class Door {
 public:
  Door() noexcept : r_(door_enter()) {}
  ~Door() {
    if (r_ == 0) door_leave();
  }
  Door(const Door&) = delete;
  Door& operator=(const Door&) = delete;
  int result() const noexcept { return r_; }

 private:
  int r_;
};

// The program handed pool pages to something the shim cannot follow: it enabled peer access
// (cuCtxEnablePeerAccess), exported a range as a dma-buf (cuMemGetHandleForAddressRange) or took
// the allocation handle behind a pooled address (cuMemRetainAllocationHandle). A restore maps new
// pages, which that holder would not see: the process is never parked from then on. `why` is a
// string literal, the reason a park is refused with.
void note_never_park(const char* why) noexcept;
inline void note_peer_access() noexcept { note_never_park("peer access is enabled"); }

}  // namespace cudapool::shim::park
