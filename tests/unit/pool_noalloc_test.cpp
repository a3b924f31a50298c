// The hot path must not allocate: after warm-up, allocate + free of cached sizes (and the
// split/merge they cause) runs without a single operator new. Counted by replacing the global
// operator new for this test binary; only the calling thread, only while armed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "tests/unit/pool_helpers.h"

namespace {
thread_local bool g_armed = false;
thread_local long g_news = 0;
}  // namespace

void* operator new(std::size_t n) {
  if (g_armed) ++g_news;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (g_armed) ++g_news;
  return std::malloc(n == 0 ? 1 : n);
}
// Every other unaligned form too: a sanitizer runtime replaces the ones left out with its own,
// whose memory must not reach the free() below (std::stable_sort's buffer uses the nothrow form).
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace cudapool;
using namespace cudapool::testing;

TEST(PoolNoAlloc, CounterWorks) {
  g_news = 0;
  g_armed = true;
  int* volatile q = new int(3);
  g_armed = false;
  delete q;
  EXPECT_EQ(g_news, 1);
  g_news = 0;
}

// Both hit paths: free() under FreeSync::immediate and free_on_stream(). (free() under
// fenced/device records fences: the fake fence itself allocates, so it is not measured here.)
TEST(PoolNoAlloc, HitPathDoesNotAllocate) {
  for (bool plain_free : {true, false}) {
    PoolOptions o;
    o.free_sync = FreeSync::immediate;
    PoolRig rig(o, 80 * GiB, /*auto_fence=*/true);
    // Warm-up: segments, stream state, slabs, the pointer map.
    const std::size_t sizes[] = {512, 4 * KiB, 100 * KiB, 1 * MiB, 3 * MiB, 12 * MiB};
    std::vector<void*> held;
    for (int round = 0; round < 2; ++round) {
      for (std::size_t s : sizes)
        for (int i = 0; i < 8; ++i) held.push_back(rig.alloc(s, 7));
      for (void* p : held) rig.pool->free_on_stream(p, 7);
      held.clear();
    }
    held.reserve(64);
    const std::size_t calls = rig.up.allocate_calls();
    g_armed = true;
    for (int i = 0; i < 1000; ++i) {
      for (std::size_t s : sizes) held.push_back(rig.pool->allocate(s, 7).ptr);
      for (void* p : held) {
        if (plain_free)
          rig.pool->free(p);
        else
          rig.pool->free_on_stream(p, 7);
      }
      held.clear();
    }
    g_armed = false;
    EXPECT_EQ(g_news, 0) << "operator new called on the hit path";
    EXPECT_EQ(rig.up.allocate_calls(), calls);
    g_news = 0;
    rig.expect_intact();
  }
}
