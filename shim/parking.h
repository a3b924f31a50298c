// Parking: a process's device memory taken away while it idles and given back, at the same
// addresses, at its next call that can make the GPU touch memory (docs/design.md, "Parking").
//
// The doors: every hooked entry point that can make the GPU read or write memory (launches, graph
// launches, copies, sets, prefetch, stream memory operations; shim/hooks_doors.cpp) and the
// allocation hooks pass door_enter()/door_leave(). Nothing parked: a relaxed store of the
// thread's own "inside" word and a relaxed load of the global "closed" word. A park closes the
// doors, makes every thread's store visible (membarrier, else seq_cst on the fast path), waits for
// the threads inside to leave, then drains, copies out and unmaps. A thread that meets a closed
// door waits while a park is under way and restores first when the process is parked.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cudapool::shim::park {

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
std::uint64_t parked_bytes() noexcept;  // bytes held in host memory for this process
// Changes whenever a door was entered since the last read (approximate; the group publisher
// samples it to know how long the member has been idle).
std::uint64_t activity() noexcept;
struct Counters {
  std::uint64_t parks, unparks, bytes_out, bytes_in, park_ns, unpark_ns;
};
Counters counters() noexcept;
// Set by the group layer: called by the restore path when the gate refuses the bytes it needs
// back; returns when memory may have come free (true: try again) or the wait is over (false).
using RestoreWait = bool (*)(int device, std::size_t bytes, std::int64_t start_ns, int round);
void set_restore_wait(RestoreWait fn) noexcept;

// ---- The door (used by the hooks) ---------------------------------------------------------------

namespace detail {
// Non-zero while a park is under way or the process is parked.
extern std::atomic<unsigned> g_closed;
// true when the fast path needs a full fence (no membarrier on this kernel).
extern std::atomic<bool> g_fence_on_enter;
struct Slot;
// The calling thread's registered slot (created on first use).
Slot& my_slot() noexcept;
// The slot's "inside" depth word.
std::atomic<unsigned>& inside_word(Slot& s) noexcept;
// The slow path of door_enter: waits out a park, restores a parked process. Returns the CUDA
// error the call must fail with (0: go on).
int enter_slow(Slot& s) noexcept;
extern thread_local Slot* tl_slot;
}  // namespace detail

// A call that can make the GPU touch memory begins; returns 0 to go on, else the CUresult the
// call must return (a restore that could not get its memory back). Re-entrant per thread.
int door_enter() noexcept;
void door_leave() noexcept;

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

}  // namespace cudapool::shim::park
