// Shared by the pool_* tests: a pool on the fakes, and an independent recount of the stats
// from the snapshot (the pool's incremental counters must agree with it).
#pragma once
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "allocator/pool.h"
#include "tests/support/fake_fence.h"
#include "tests/support/fake_upstream.h"

namespace cudapool::testing {

inline Stats recount_from_snapshot(const Snapshot& snap) {
  Stats r;
  auto add = [](StatArray& a, bool small, std::int64_t v) {
    a[kAll].current += v;
    a[small ? kSmallPool : kLargePool].current += v;
  };
  for (const SegmentInfo& s : snap.segments) {
    add(r.segment, s.is_small, 1);
    add(r.reserved_bytes, s.is_small, static_cast<std::int64_t>(s.total_size));
    for (const BlockInfo& b : s.blocks) {
      const auto sz = static_cast<std::int64_t>(b.size);
      if (b.state == BlockState::active_allocated) {
        add(r.allocation, s.is_small, 1);
        add(r.allocated_bytes, s.is_small, sz);
      }
      if (b.state != BlockState::inactive) {
        add(r.active, s.is_small, 1);
        add(r.active_bytes, s.is_small, sz);
        add(r.requested_bytes, s.is_small, static_cast<std::int64_t>(b.requested_size));
      } else if (s.blocks.size() > 1 || s.is_expandable) {  // an expandable run always has
                                                            // unmapped neighbours: split
        add(r.inactive_split, s.is_small, 1);
        add(r.inactive_split_bytes, s.is_small, sz);
      }
    }
  }
  return r;
}

// "" if every current value of `s` equals the recount, else the first difference.
inline std::string compare_with_recount(const Stats& s, const Snapshot& snap) {
  const Stats r = recount_from_snapshot(snap);
  struct Fam {
    const char* name;
    const StatArray Stats::*member;
  };
  const Fam fams[] = {{"allocation", &Stats::allocation},
                      {"segment", &Stats::segment},
                      {"active", &Stats::active},
                      {"inactive_split", &Stats::inactive_split},
                      {"allocated_bytes", &Stats::allocated_bytes},
                      {"reserved_bytes", &Stats::reserved_bytes},
                      {"active_bytes", &Stats::active_bytes},
                      {"inactive_split_bytes", &Stats::inactive_split_bytes},
                      {"requested_bytes", &Stats::requested_bytes}};
  const char* pools[] = {"all", "small_pool", "large_pool"};
  for (const Fam& f : fams)
    for (std::size_t i = 0; i < kNumStatPools; ++i)
      if ((s.*f.member)[i].current != (r.*f.member)[i].current)
        return std::string(f.name) + "." + pools[i] + ".current = " + std::to_string((s.*f.member)[i].current) +
               ", recount " + std::to_string((r.*f.member)[i].current);
  return "";
}

// The pool's clock under test (set_pool_clock_for_testing): it moves only when a test says so,
// so the fence batch window (docs/design.md, "The batch window") never closes by itself.
inline std::atomic<std::int64_t> g_test_clock_ns{1'000'000'000};
inline std::int64_t test_clock() { return g_test_clock_ns.load(std::memory_order_relaxed); }

// The speed sweep (tests/speed_sweep.sh): TEST_POOL_CLOCK=frozen or racing replaces the
// library's own clock for every test that does not drive one (PoolRig and the tests that install
// test_clock do): frozen never moves (an infinitely fast machine), racing moves 50 ms at each
// reading (past every window and back-off by the next call). Unset or "real": the library's own.
inline std::atomic<std::int64_t> g_sweep_clock_ns{1'000'000'000};
inline std::int64_t frozen_clock() { return g_sweep_clock_ns.load(std::memory_order_relaxed); }
inline std::int64_t racing_clock() {
  constexpr std::int64_t kStepNs = 50'000'000;
  return g_sweep_clock_ns.fetch_add(kStepNs, std::memory_order_relaxed) + kStepNs;
}
inline PoolClockFn sweep_clock_from_env() {
  const char* mode = std::getenv("TEST_POOL_CLOCK");
  if (mode == nullptr || *mode == '\0' || std::strcmp(mode, "real") == 0) return nullptr;
  if (std::strcmp(mode, "frozen") == 0) return &frozen_clock;
  if (std::strcmp(mode, "racing") == 0) return &racing_clock;
  std::fprintf(stderr, "TEST_POOL_CLOCK=%s: unknown; use real, frozen or racing\n", mode);
  std::_Exit(2);
}
inline const PoolClockFn g_sweep_clock = [] {
  const PoolClockFn c = sweep_clock_from_env();
  set_pool_clock_for_testing(c);
  return c;
}();
// What a test that installed a clock of its own puts back: the sweep's, else the library's.
inline void restore_pool_clock() { set_pool_clock_for_testing(g_sweep_clock); }
// Comfortably past the pool's batch windows (20 us; 1 ms where ordering is free).
inline constexpr std::int64_t kPastBatchWindowNs = 2'000'000;

// A pool on a fake upstream and a fake fence, with helpers most tests want. It installs the
// test clock for its lifetime.
// FreeSync::fenced: pending memory is never handed out before its fence completed (the mode the
// tests of the batch window and of the host-side rules were written for; the default orders
// GPU-side waits instead, pool_gpu_wait_test.cpp).
inline PoolOptions fenced_options() {
  PoolOptions o;
  o.free_sync = FreeSync::fenced;
  return o;
}

struct PoolRig {
  FakeUpstream up;
  FakeFence fence;
  std::unique_ptr<DevicePool> pool;

  explicit PoolRig(PoolOptions opt = {}, std::size_t capacity = 80 * GiB, bool auto_fence = false, bool backed = false)
      : up(capacity, backed), fence(auto_fence) {
    set_pool_clock_for_testing(&test_clock);
    pool = std::make_unique<DevicePool>(0, opt, up, fence);
  }
  ~PoolRig() {
    pool.reset();
    restore_pool_clock();
  }
  PoolRig(const PoolRig&) = delete;
  PoolRig& operator=(const PoolRig&) = delete;
  // Move the test clock on (by default past the batch window: the next allocate() that finds
  // the open batch records its fence).
  static void advance_clock(std::int64_t ns = kPastBatchWindowNs) {
    g_test_clock_ns.fetch_add(ns, std::memory_order_relaxed);
  }
  void* alloc(std::size_t n, StreamId s = 0) {
    AllocResult r = pool->allocate(n, s);
    EXPECT_EQ(r.status, AllocStatus::ok) << "allocate(" << n << ")";
    return r.ptr;
  }
  // The pool is intact: internal check plus recount of the stats from the snapshot.
  void expect_intact() {
    EXPECT_EQ(pool->check_consistency(), "");
    EXPECT_EQ(compare_with_recount(pool->stats(), pool->snapshot()), "");
  }
  std::size_t segment_size_of(const void* p) {
    auto info = pool->address_info(p);
    return info ? info->segment_size : 0;
  }
};

inline PoolOptions immediate_options() {
  PoolOptions o;
  o.free_sync = FreeSync::immediate;
  return o;
}

inline char* at(void* p, std::size_t off) { return static_cast<char*>(p) + off; }

}  // namespace cudapool::testing
