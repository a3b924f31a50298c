// Touching a shared mapping whose file another process may truncate at any moment (the group
// ledger, docs/design.md "The group ledger"): a load or store to a page past the file's new end
// raises SIGBUS, and no size check made before the access closes that window. guarded() runs a
// piece of code with such faults turned into a return of false:
//  * while any guard is active, a SIGBUS handler of the shim's is installed; the handler that was
//    there before is put back when the last guard ends (unless the program replaced the shim's
//    meanwhile, which is then left alone);
//  * a fault at an address inside the range a guard of the faulting thread registered jumps back
//    (siglongjmp) to that guard, which returns false; every other SIGBUS (another address,
//    another thread, one sent with kill) goes to the handler that was there before, or takes the
//    default action (the process dies of it, as without the shim);
//  * SIGBUS is unblocked in the thread for the guard's duration and its mask put back after:
//    a fault while SIGBUS is blocked (the shim's helper threads block every signal) would kill
//    the process without reaching any handler. (A SIGBUS sent to the process with kill may then
//    land on such a thread; it goes to the program's handler as above.)
//  * guards are per thread (a small table keyed by thread id, searched by the handler without a
//    lock), may not nest, and cost a few sigaction and signal-mask calls per use: they are for
//    the ledger's short critical sections and waits, not for a hot path.
// The code run must not hold anything a jump would leave behind: no object with a destructor
// that matters, no lock of this process's. A jump out of the ledger's own mutex leaves that mutex
// (in the truncated file) in the thread's robust list; glibc only walks that list for robust
// mutexes unlocked out of order, which the ledger code never does, and the kernel's walk at
// thread exit stops at the fault. The mapping is therefore never unmapped after a fault.
#pragma once
#include <cstddef>
#include <type_traits>

namespace cudapool::shim {

// Runs fn(arg); true when it returned, false when it faulted on [addr, addr + size) and was cut
// short. With no room left in the table (more than 64 threads inside guards), fn runs unguarded.
bool guarded_call(const void* addr, std::size_t size, void (*fn)(void*), void* arg) noexcept;

template <typename Fn>
bool guarded(const void* addr, std::size_t size, Fn&& fn) noexcept {
  return guarded_call(
      addr, size, [](void* f) { (*static_cast<std::remove_reference_t<Fn>*>(f))(); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

// After fork in the child: the table and the lock start empty (another thread of the parent may
// have held the lock or been inside a guard at the fork).
void guards_after_fork() noexcept;

}  // namespace cudapool::shim
