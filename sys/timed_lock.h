// Locking a std::timed_mutex with a bound on the wait, in a form ThreadSanitizer follows.
//
// libstdc++ implements the timed waits with pthread_mutex_clocklock, which the ThreadSanitizer
// runtime of GCC 12 does not intercept: it would see the unlock of a lock it never saw taken and
// stop the process. In a ThreadSanitizer build the successful wait is reported to it by hand; in
// any other build these are the plain member functions.
#pragma once

#include <chrono>
#include <mutex>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace cudapool {

template <class Clock, class Duration>
bool lock_until(std::timed_mutex& m, const std::chrono::time_point<Clock, Duration>& deadline) {
#if defined(__SANITIZE_THREAD__)
  __tsan_mutex_pre_lock(&m, __tsan_mutex_try_lock);
  const bool locked = m.try_lock_until(deadline);
  __tsan_mutex_post_lock(&m, locked ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed, 0);
  return locked;
#else
  return m.try_lock_until(deadline);
#endif
}

template <class Rep, class Period>
bool lock_within(std::timed_mutex& m, const std::chrono::duration<Rep, Period>& wait) {
  return lock_until(m, std::chrono::steady_clock::now() + wait);
}

}  // namespace cudapool
