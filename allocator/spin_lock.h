// Internal: the pool's lock. Its critical sections are a few hundred nanoseconds at most on the
// hot path, so a waiter is far better off spinning briefly than being parked by the kernel:
// std::mutex under heavy contention sends threads into futex sleep, and every hand-off then
// costs a wake-up (microseconds), which is what made 16 threads slower in aggregate than one.
//
// Three states (free / locked / locked with possible sleepers), the classic futex lock layout:
//  * lock(): one compare-exchange when free (the uncontended cost of a mutex);
//  * else spin a bounded number of rounds, reading only (test-and-test-and-set, so waiters do
//    not bounce the cache line while the owner works) with a pause instruction between reads;
//  * then mark the lock contended and sleep in std::atomic::wait (a futex on Linux), so an
//    oversubscribed machine (more threads than cores, or a preempted owner) does not burn CPU.
//  * unlock(): one exchange; a wake-up only when someone may be asleep.
// Everything is std::atomic with acquire/release ordering, so ThreadSanitizer sees the
// happens-before edges it needs. Meets Lockable: std::unique_lock / std::lock_guard work, but
// the pool uses SpinGuard / SpinUniqueLock / SpinUnlock below, which Clang's thread-safety
// analysis understands (thread_annotations.h).
#pragma once
#include <atomic>
#include <cstdint>

#include "allocator/thread_annotations.h"

namespace cudapool::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class CAPABILITY("mutex") SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  bool try_lock() noexcept TRY_ACQUIRE(true) {
    int expected = kFree;
    return state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire, std::memory_order_relaxed);
  }
  // The lock's own implementation is not analysed: it is what the annotations describe.
  void lock() noexcept ACQUIRE() NO_THREAD_SAFETY_ANALYSIS {
    if (try_lock()) return;
    lock_contended();
  }
  void unlock() noexcept RELEASE() {
    if (state_.exchange(kFree, std::memory_order_release) == kSleepers) state_.notify_one();
  }

 private:
  enum : int { kFree = 0, kLocked = 1, kSleepers = 2 };
  // ~ a few microseconds of pauses: longer than any hot-path critical section, far shorter
  // than a scheduler time slice.
  static constexpr int kSpinRounds = 64;

  void lock_contended() noexcept ACQUIRE() NO_THREAD_SAFETY_ANALYSIS {
    int pauses = 1;
    for (int round = 0; round < kSpinRounds; ++round) {
      // Barging is allowed: a spinner may take the lock ahead of sleepers (throughput over
      // fairness, as in glibc's mutex); the woken sleeper then simply sleeps again.
      if (state_.load(std::memory_order_relaxed) == kFree && try_lock()) return;
      for (int i = 0; i < pauses; ++i) cpu_relax();
      if (pauses < 16) pauses <<= 1;  // exponential back-off: fewer reads of a hot line
    }
    // Sleep. Whoever takes the lock from here leaves it marked kSleepers (we cannot know whether
    // other sleepers remain), so its unlock wakes the next one; a spurious wake-up only costs a
    // futex call.
    while (state_.exchange(kSleepers, std::memory_order_acquire) != kFree)
      state_.wait(kSleepers, std::memory_order_relaxed);
  }

  std::atomic<int> state_{kFree};
};

// Holds a SpinLock for its scope (std::lock_guard, annotated).
class SCOPED_CAPABILITY SpinGuard {
 public:
  explicit SpinGuard(SpinLock& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~SpinGuard() RELEASE() { mu_.unlock(); }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;

 private:
  SpinLock& mu_;
};

// Holds a SpinLock for its scope; may be dropped and taken again in between (std::unique_lock's
// subset the pool uses, annotated). Functions that drop the lock of a caller's SpinUniqueLock
// do it through SpinUnlock.
class SCOPED_CAPABILITY SpinUniqueLock {
 public:
  explicit SpinUniqueLock(SpinLock& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~SpinUniqueLock() RELEASE() NO_THREAD_SAFETY_ANALYSIS {
    if (owns_) mu_.unlock();
  }
  SpinUniqueLock(const SpinUniqueLock&) = delete;
  SpinUniqueLock& operator=(const SpinUniqueLock&) = delete;
  void lock() ACQUIRE() {
    mu_.lock();
    owns_ = true;
  }
  void unlock() RELEASE() {
    mu_.unlock();
    owns_ = false;
  }

 private:
  SpinLock& mu_;
  bool owns_ = true;
};

// Drops a held lock for its scope (an upstream call that may be slow), through the
// SpinUniqueLock that holds it, and takes it again at the end of the scope.
class SCOPED_CAPABILITY SpinUnlock {
 public:
  SpinUnlock([[maybe_unused]] SpinLock& mu, SpinUniqueLock& lk) RELEASE(mu) NO_THREAD_SAFETY_ANALYSIS : lk_(lk) {
    lk_.unlock();
  }
  // The analysis takes `mu` as held again here (a scoped capability's destructor restores it).
  ~SpinUnlock() RELEASE() NO_THREAD_SAFETY_ANALYSIS { lk_.lock(); }
  SpinUnlock(const SpinUnlock&) = delete;
  SpinUnlock& operator=(const SpinUnlock&) = delete;

 private:
  SpinUniqueLock& lk_;
};

}  // namespace cudapool::detail
