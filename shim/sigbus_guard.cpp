// SIGBUS faults on a truncated shared mapping turned into a return (shim/sigbus_guard.h).
#include "shim/sigbus_guard.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>

namespace cudapool::shim {

namespace {

constexpr int kSlots = 64;

// One active guard. `claimed` is taken first (compare-exchange), the fields filled, then `tid`
// published; the handler reads `tid` first, so it never sees a half-filled entry.
struct Slot {
  std::atomic<bool> claimed{false};
  std::atomic<pid_t> tid{0};
  std::uintptr_t lo = 0, hi = 0;
  sigjmp_buf* env = nullptr;
};

Slot g_slots[kSlots];

// Whether the shim's handler is installed, and the one it replaced. `previous` is written only
// while the shim's handler is not installed (under `mu`), and read by the handler.
struct Handler {
  std::mutex mu;
  int active = 0;
  struct sigaction previous {};
};

Handler& handler_state() {
  static Handler* h = new Handler;  // never destroyed: guards may run while the process exits
  return *h;
}

pid_t own_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

void on_sigbus(int sig, siginfo_t* info, void* uctx);

bool is_ours(const struct sigaction& a) { return (a.sa_flags & SA_SIGINFO) != 0 && a.sa_sigaction == &on_sigbus; }

// A SIGBUS that is not a guarded fault: what the program had before, or the default action.
void chain(int sig, siginfo_t* info, void* uctx) {
  const struct sigaction prev = handler_state().previous;
  const bool sent = info == nullptr || info->si_code <= 0;  // by kill/raise/sigqueue, not by a fault
  if ((prev.sa_flags & SA_SIGINFO) != 0) {
    if (prev.sa_sigaction != nullptr && prev.sa_sigaction != &on_sigbus) {
      prev.sa_sigaction(sig, info, uctx);
      return;
    }
  } else if (prev.sa_handler == SIG_IGN) {
    if (sent) return;  // a fault cannot be ignored: the access would fault for ever
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
    return;
  }
  // The default action: put it back; a fault then happens again when this returns and ends the
  // process as it would have without the shim, a sent signal is sent again.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
  if (sent) ::raise(SIGBUS);
}

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  if (info != nullptr && info->si_code > 0) {
    const pid_t self = own_tid();
    const auto at = reinterpret_cast<std::uintptr_t>(info->si_addr);
    for (Slot& s : g_slots)
      if (s.tid.load(std::memory_order_acquire) == self && at >= s.lo && at < s.hi) siglongjmp(*s.env, 1);
  }
  chain(sig, info, uctx);
}

void install() {
  Handler& h = handler_state();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.active++ != 0) return;
  struct sigaction cur {};
  if (::sigaction(SIGBUS, nullptr, &cur) != 0 || is_ours(cur)) return;  // already there (a fork kept it)
  h.previous = cur;
  struct sigaction sa {};
  sa.sa_sigaction = &on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
}

void uninstall() {
  Handler& h = handler_state();
  std::lock_guard<std::mutex> lock(h.mu);
  if (--h.active != 0) return;
  struct sigaction cur {};
  // A handler the program installed meanwhile stays; the shim's goes.
  if (::sigaction(SIGBUS, nullptr, &cur) == 0 && is_ours(cur)) ::sigaction(SIGBUS, &h.previous, nullptr);
}

Slot* claim() {
  for (Slot& s : g_slots) {
    bool expected = false;
    if (!s.claimed.load(std::memory_order_relaxed) &&
        s.claimed.compare_exchange_strong(expected, true, std::memory_order_acquire))
      return &s;
  }
  return nullptr;
}

void release(Slot& s) {
  s.tid.store(0, std::memory_order_release);
  s.claimed.store(false, std::memory_order_release);
}

// The guard's entry goes, the thread's signal mask is as before the guard, and the handler goes
// when no other guard is active.
void end_guard(Slot& s, bool unblocked, const sigset_t& before) {
  release(s);
  if (unblocked) pthread_sigmask(SIG_SETMASK, &before, nullptr);
  uninstall();
}

}  // namespace

bool guarded_call(const void* addr, std::size_t size, void (*fn)(void*), void* arg) noexcept {
  Slot* const s = claim();
  if (s == nullptr) {
    fn(arg);
    return true;
  }
  install();
  // A fault raised while SIGBUS is blocked (the shim's helper threads block every signal) is not
  // delivered to a handler: the kernel kills the process. So SIGBUS is unblocked in the guard and
  // the thread's mask put back after it (the mask saved by sigsetjmp is the unblocked one).
  sigset_t bus, before;
  sigemptyset(&bus);
  sigaddset(&bus, SIGBUS);
  const bool unblocked = pthread_sigmask(SIG_UNBLOCK, &bus, &before) == 0 && sigismember(&before, SIGBUS) == 1;
  sigjmp_buf env;
  s->lo = reinterpret_cast<std::uintptr_t>(addr);
  s->hi = s->lo + size;
  s->env = &env;
  s->tid.store(own_tid(), std::memory_order_release);
  // Nothing of this frame changes between here and a jump back: `s`, `unblocked` and `before`
  // are set above.
  if (sigsetjmp(env, 1) != 0) {
    end_guard(*s, unblocked, before);
    return false;
  }
  fn(arg);
  end_guard(*s, unblocked, before);
  return true;
}

void guards_after_fork() noexcept {
  for (Slot& s : g_slots) {
    s.tid.store(0, std::memory_order_relaxed);
    s.claimed.store(false, std::memory_order_relaxed);
  }
  Handler& h = handler_state();
  new (&h.mu) std::mutex;
  h.active = 0;  // the shim's handler, if installed, stays until the next guard ends
}

}  // namespace cudapool::shim
