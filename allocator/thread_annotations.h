// Internal: Clang's thread-safety annotations (-Wthread-safety), so the compiler checks which
// lock guards which data and which functions must be called with it held. They expand to
// nothing on other compilers. `make thread-safety` runs the check over allocator/.
#pragma once

#if defined(__clang__)
#define CP_THREAD_ATTR(x) __attribute__((x))
#else
#define CP_THREAD_ATTR(x)
#endif

#define CAPABILITY(x) CP_THREAD_ATTR(capability(x))
#define SCOPED_CAPABILITY CP_THREAD_ATTR(scoped_lockable)
#define GUARDED_BY(x) CP_THREAD_ATTR(guarded_by(x))
#define PT_GUARDED_BY(x) CP_THREAD_ATTR(pt_guarded_by(x))
#define REQUIRES(...) CP_THREAD_ATTR(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) CP_THREAD_ATTR(acquire_capability(__VA_ARGS__))
#define RELEASE(...) CP_THREAD_ATTR(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) CP_THREAD_ATTR(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) CP_THREAD_ATTR(locks_excluded(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS CP_THREAD_ATTR(no_thread_safety_analysis)
