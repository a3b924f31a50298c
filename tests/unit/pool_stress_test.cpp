// Randomized multi-threaded stress test with invariants checked continuously:
//  * every allocation is checked against a registry of freed ranges: memory freed with free()
//    (or on another stream) must not come back before a fence recorded after that free has
//    completed (the fake fence completes fences at random, only when the completer says so);
//  * blocks live in backed host memory and carry tags at both ends, checked at free: two live
//    blocks that overlap would clobber each other's tags;
//  * at checkpoints (all workers paused): check_consistency(), stats == recount from snapshot,
//    the union of every worker's live blocks has no overlap and each is an allocated block of
//    the snapshot;
//  * memory handed out under a GPU-side wait (FreeSync::gpu_wait) counts as safe to reuse, but
//    nothing may go back to the upstream (release, unmap, move, dropping an alias's old mapping)
//    at its address while such a fence still runs;
//  * at the end, after freeing everything and empty_cache(), the upstream holds nothing and no
//    fence is left.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "tests/unit/pool_helpers.h"

using namespace cudapool;
using namespace cudapool::testing;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr long kSlowdown = 4;
#elif defined(__SANITIZE_ADDRESS__)
constexpr long kSlowdown = 2;
#else
constexpr long kSlowdown = 1;
#endif

long total_ops() {
  if (const char* e = std::getenv("CUDAPOOL_STRESS_OPS")) return std::atol(e);
  return 3'200'000 / kSlowdown;  // over the four configurations below
}

struct Freed {
  std::uintptr_t end;
  FenceHandle since;  // FakeFence::next_handle() read before the free
  bool on_stream;     // freed on a stream (reusable there at once) vs. free()
  StreamId stream;
};

// Memory the pool handed out under a GPU-side wait before the free's fence completed ("hot"): at
// every upstream call that gives memory back (release, unmap, move) no hot range may be touched
// whose fence has not completed yet, whatever happened to the range since.
struct HotRange {
  std::uintptr_t lo, hi;
  FenceHandle since;
};
struct OrderCheckingUpstream : FakeUpstream {
  using FakeUpstream::FakeUpstream;
  FakeFence* fence = nullptr;
  std::mutex* mu = nullptr;
  std::vector<HotRange>* hot = nullptr;
  std::atomic<long> early_returns{0};
  void check(void* addr, std::size_t bytes) {
    if (hot == nullptr) return;
    const auto lo = reinterpret_cast<std::uintptr_t>(addr);
    std::lock_guard<std::mutex> lock(*mu);
    std::erase_if(*hot, [&](const HotRange& r) {
      if (fence->covered(r.since, std::nullopt)) return true;  // safe from now on
      if (r.lo < lo + bytes && lo < r.hi) early_returns.fetch_add(1);
      return false;
    });
  }
  void release(void* base, std::size_t bytes) override {
    check(base, bytes);
    FakeUpstream::release(base, bytes);
  }
  void unmap(void* addr, std::size_t bytes) override {
    check(addr, bytes);
    FakeUpstream::unmap(addr, bytes);
  }
  UpstreamStatus move(void* from, void* to, std::size_t bytes) override {
    check(from, bytes);
    return FakeUpstream::move(from, to, bytes);
  }
  // Aliasing hot pages is what lets them move; dropping the old mapping is giving them back there.
  void unalias(void* addr, std::size_t bytes) override {
    check(addr, bytes);
    FakeUpstream::unalias(addr, bytes);
  }
};

struct Live {
  std::uintptr_t p;
  std::size_t n;  // requested
  std::size_t rounded;
  StreamId stream;
  std::uint64_t tag;
};

class Stress {
 public:
  // free_ordering: the fence provider says ordering is free (FenceProvider::orders_for_free), so
  // every recorded batch is handed out under a GPU-side wait without being asked first.
  Stress(PoolOptions opt, int workers, long ops, std::size_t granularity = 0, bool free_ordering = false)
      : opt_(opt),
        up_(384 * MiB, /*backed=*/true),
        fence_(false),
        workers_(workers),
        ops_(ops),
        barrier_(workers + 1),
        live_(static_cast<std::size_t>(workers)) {
    up_.set_granularity(granularity);
    up_.fence = &fence_;
    up_.mu = &reg_mu_;
    up_.hot = &hot_;
    fence_.set_orders_for_free(free_ordering);
    free_ordering_ = free_ordering;
    pool_ = std::make_unique<DevicePool>(0, opt_, up_, fence_);
  }

  void run() {
    std::atomic<bool> stop{false};
    std::thread completer([&] {
      std::mt19937_64 rng(7);
      while (!stop.load(std::memory_order_relaxed)) {
        fence_.complete_some(rng, 0.3);
        std::this_thread::yield();
      }
    });
    std::vector<std::thread> threads;
    for (int w = 0; w < workers_; ++w) threads.emplace_back([this, w] { worker(w); });
    const long rounds = ops_ / workers_ / kOpsPerRound;
    for (long r = 0; r < rounds; ++r) {
      barrier_.arrive_and_wait();  // workers paused
      checkpoint();
      barrier_.arrive_and_wait();  // resume
    }
    for (auto& t : threads) t.join();
    stop = true;
    completer.join();
    finish();
  }

 private:
  static constexpr long kOpsPerRound = 20'000;

  void worker(int w) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(1000 + w));
    std::vector<Live>& mine = live_[static_cast<std::size_t>(w)];
    StreamId streams[2] = {static_cast<StreamId>(100 * (w + 1) + 1), static_cast<StreamId>(100 * (w + 1) + 2)};
    StreamId next_stream = static_cast<StreamId>(1'000'000 * (w + 1));
    const long rounds = ops_ / workers_ / kOpsPerRound;
    for (long r = 0; r < rounds; ++r) {
      for (long i = 0; i < kOpsPerRound; ++i) {
        const std::uint64_t roll = rng() % 10000;
        if (roll < 10) {
          pool_->empty_cache();
        } else if (roll < 15) {
          pool_->retire_stream(streams[0]);  // "destroyed": never used again
          streams[0] = next_stream++;
        } else if (mine.size() < 48 && (mine.empty() || roll < 5500)) {
          StreamId s = (rng() % 8 == 0) ? StreamId{0} : streams[rng() % 2];
          allocate(mine, s, rng);
        } else if (!mine.empty()) {
          const std::size_t k = rng() % mine.size();
          Live l = mine[k];
          mine[k] = mine.back();
          mine.pop_back();
          release(l, rng() % 2 == 0, streams[rng() % 2]);
        }
      }
      barrier_.arrive_and_wait();
      barrier_.arrive_and_wait();
    }
    for (const Live& l : mine) release(l, true, 0);
    mine.clear();
  }

  std::size_t pick_size(std::mt19937_64& rng) {
    const std::uint64_t c = rng() % 100;
    if (c < 70) return 16 + rng() % (64 * KiB);
    if (c < 96) return 1 * MiB + rng() % (5 * MiB);
    return 10 * MiB + rng() % (14 * MiB);
  }

  void allocate(std::vector<Live>& mine, StreamId s, std::mt19937_64& rng) {
    const std::size_t n = pick_size(rng);
    AllocResult r = pool_->allocate(n, s);
    if (r.status != AllocStatus::ok) {
      if (r.status != AllocStatus::out_of_memory) bad_.fetch_add(1);
      ooms_.fetch_add(1);
      return;
    }
    const auto p = reinterpret_cast<std::uintptr_t>(r.ptr);
    const std::size_t rounded = round_size(n, opt_);
    check_reuse(p, rounded, s);
    const std::uint64_t tag = next_tag_.fetch_add(1) * 2654435761u + 1;
    std::memcpy(r.ptr, &tag, 8);
    std::memcpy(reinterpret_cast<void*>(p + n - 8), &tag, 8);
    mine.push_back(Live{p, n, rounded, s, tag});
  }

  void release(const Live& l, bool plain_free, StreamId s) {
    std::uint64_t a = 0, b = 0;
    std::memcpy(&a, reinterpret_cast<void*>(l.p), 8);
    std::memcpy(&b, reinterpret_cast<void*>(l.p + l.n - 8), 8);
    if (a != l.tag || b != l.tag) clobbered_.fetch_add(1);
    const bool immediate = opt_.free_sync == FreeSync::immediate;
    {
      std::lock_guard<std::mutex> lock(reg_mu_);
      Freed f;
      f.end = l.p + l.rounded;
      f.since = fence_.next_handle();
      f.on_stream = !plain_free || immediate;
      f.stream = plain_free ? l.stream : s;
      freed_[l.p] = f;
    }
    FreeStatus st = plain_free ? pool_->free(reinterpret_cast<void*>(l.p))
                               : pool_->free_on_stream(reinterpret_cast<void*>(l.p), s);
    if (st != FreeStatus::ok) bad_.fetch_add(1);
  }

  // Memory handed to stream t must not overlap a freed range that is not yet safe for t.
  void check_reuse(std::uintptr_t p, std::size_t n, StreamId t) {
    std::lock_guard<std::mutex> lock(reg_mu_);
    auto it = freed_.lower_bound(p + n);
    while (it != freed_.begin()) {
      --it;
      if (it->second.end <= p) break;  // ranges never overlap each other, so none further left
      const Freed& f = it->second;
      const std::optional<StreamId> on = f.on_stream ? std::optional<StreamId>(f.stream) : std::nullopt;
      const bool own = f.on_stream && f.stream == t;
      const bool safe = own || fence_.covered_or_ordered(f.since, on);
      if (!safe) early_.fetch_add(1);
      if (safe && !own && !fence_.covered(f.since, on)) {
        hot_.push_back({std::max(p, it->first), std::min(p + n, f.end), f.since});
        ++hot_reuses_;
      }
      it = freed_.erase(it);
    }
  }

  void checkpoint() {
    ++checkpoints_;
    const std::string why = pool_->check_consistency();
    if (!why.empty()) {
      ADD_FAILURE() << "inconsistent: " << why;
      return;
    }
    const Snapshot snap = pool_->snapshot();
    const std::string diff = compare_with_recount(pool_->stats(), snap);
    if (!diff.empty()) ADD_FAILURE() << "stats differ from recount: " << diff;
    std::map<std::uintptr_t, std::size_t> allocated;  // from the snapshot
    for (const SegmentInfo& s : snap.segments)
      for (const BlockInfo& b : s.blocks)
        if (b.state == BlockState::active_allocated) allocated[b.address] = b.size;
    std::vector<Live> all;
    for (auto& v : live_) all.insert(all.end(), v.begin(), v.end());
    std::sort(all.begin(), all.end(), [](const Live& a, const Live& b) { return a.p < b.p; });
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (i + 1 < all.size() && all[i].p + all[i].rounded > all[i + 1].p) overlaps_.fetch_add(1);
      auto it = allocated.find(all[i].p);
      if (it == allocated.end() || it->second < all[i].rounded) not_in_segment_.fetch_add(1);
    }
    if (all.size() != allocated.size()) ADD_FAILURE() << "live " << all.size() << " vs allocated " << allocated.size();
  }

  void finish() {
    EXPECT_EQ(up_.early_returns.load(), 0) << "memory went back to the upstream under a running GPU-side wait";
    if (opt_.free_sync == FreeSync::gpu_wait) {
      EXPECT_GT(fence_.ordered_running(), 0u) << "no GPU-side wait had anything to wait for: not exercised";
      EXPECT_GT(hot_reuses_, 0) << "no memory was reused under a running GPU-side wait: not exercised";
    } else {
      EXPECT_EQ(fence_.order_calls(), 0u);
    }
    // Each ask is made with recorded batches waiting, and answered yes: a batch ordered at record.
    if (free_ordering_) {
      EXPECT_GT(fence_.free_asks(), 100u) << "free ordering was not exercised";
    }
    fence_.complete_all();
    pool_->empty_cache();
    EXPECT_EQ(pool_->check_consistency(), "");
    EXPECT_EQ(up_.bytes_held(), 0u);
    EXPECT_EQ(up_.bytes_mapped(), 0u);
    EXPECT_EQ(up_.segments_held(), 0u);
    EXPECT_EQ(up_.bad_calls(), 0u);
    EXPECT_EQ(fence_.outstanding(), 0u);
    EXPECT_EQ(fence_.bad_calls(), 0u);
    EXPECT_EQ(early_.load(), 0) << "pending memory handed out before its fence completed";
    EXPECT_EQ(clobbered_.load(), 0) << "tags overwritten: live blocks overlapped";
    EXPECT_EQ(overlaps_.load(), 0);
    EXPECT_EQ(not_in_segment_.load(), 0);
    EXPECT_EQ(bad_.load(), 0);
    EXPECT_GT(checkpoints_, 0);
    const Stats st = pool_->stats();
    EXPECT_EQ(st.allocated_bytes[kAll].current, 0);
    EXPECT_GT(st.cache_hits, 0);
    std::printf(
        "  stress: %ld ops, %d checkpoints, maps %zu unmaps %zu aliases %zu, hits %lld misses %lld ooms %ld retries "
        "%lld fences %lld waits %lld gpu_waits %lld\n",
        ops_, checkpoints_, up_.map_calls(), up_.unmap_calls(), up_.alias_calls(),
        static_cast<long long>(st.cache_hits), static_cast<long long>(st.cache_misses), static_cast<long>(ooms_.load()),
        static_cast<long long>(st.num_alloc_retries), static_cast<long long>(st.fences_recorded),
        static_cast<long long>(st.fence_waits), static_cast<long long>(st.gpu_waits));
  }

  PoolOptions opt_;
  bool free_ordering_ = false;
  OrderCheckingUpstream up_;
  FakeFence fence_;
  std::unique_ptr<DevicePool> pool_;
  int workers_;
  long ops_;
  std::barrier<> barrier_;
  std::vector<std::vector<Live>> live_;
  std::mutex reg_mu_;
  std::map<std::uintptr_t, Freed> freed_;
  std::vector<HotRange> hot_;  // under reg_mu_
  long hot_reuses_ = 0;        // under reg_mu_
  std::atomic<std::uint64_t> next_tag_{1};
  std::atomic<long> early_{0}, clobbered_{0}, overlaps_{0}, not_in_segment_{0}, bad_{0}, ooms_{0};
  int checkpoints_ = 0;
};

}  // namespace

TEST(PoolStress, GpuWaitFrees) {
  Stress(PoolOptions{}, 3, total_ops() / 4).run();  // the default: FreeSync::gpu_wait
}

// Where ordering is free, every batch becomes hot memory when its fence is recorded: the same
// checks (no reuse before the fence completed or was ordered, nothing back to the upstream under a
// running GPU-side wait), with classic and with expandable segments.
TEST(PoolStress, GpuWaitFreesWithFreeOrdering) {
  Stress(PoolOptions{}, 3, total_ops() / 4, /*granularity=*/0, /*free_ordering=*/true).run();
}

TEST(PoolStress, ExpandableSegmentsWithFreeOrdering) {
  PoolOptions o;
  o.expandable_segments = true;
  o.max_reserved = 200 * MiB;  // growth past it recycles pages, which hot blocks must not give
  Stress(o, 3, total_ops() / 4, /*granularity=*/2 * MiB, /*free_ordering=*/true).run();
}

TEST(PoolStress, FencedFrees) {
  PoolOptions o;
  o.free_sync = FreeSync::fenced;
  Stress(o, 3, total_ops() / 4).run();
}

TEST(PoolStress, DeviceSyncReleaseLockMaxSplit) {
  PoolOptions o;
  o.free_sync = FreeSync::device;
  o.release_lock_on_cudamalloc = true;
  o.max_split_size = 20 * MiB;
  o.roundup_power2_divisions.fill(4);
  Stress(o, 3, total_ops() / 4).run();
}

TEST(PoolStress, ImmediateFreesWithGcAndCap) {
  PoolOptions o;
  o.free_sync = FreeSync::immediate;
  o.garbage_collection_threshold = 0.7;
  o.max_reserved = 300 * MiB;
  Stress(o, 3, total_ops() / 4).run();
}

TEST(PoolStress, ExpandableSegments) {
  PoolOptions o;
  o.expandable_segments = true;
  o.garbage_collection_threshold = 0.8;
  Stress(o, 3, total_ops() / 4, /*granularity=*/2 * MiB).run();
}

// Growth by recycling under concurrency: a cap well below what the workers could hold makes
// every growth past it recycle pages (and wait for fences), with stream-ordered frees.
// The same with the driver's granularity as the large range's page (more, smaller pages).
TEST(PoolStress, ExpandableSegmentsSmallPages) {
  PoolOptions o;
  o.expandable_segments = true;
  o.expandable_large_page = 0;
  o.garbage_collection_threshold = 0.8;
  Stress(o, 3, total_ops() / 4, /*granularity=*/2 * MiB).run();
}

TEST(PoolStress, ExpandableRecyclingUnderACap) {
  PoolOptions o;
  o.expandable_segments = true;
  o.free_sync = FreeSync::immediate;
  o.max_reserved = 160 * MiB;
  Stress(o, 3, total_ops() / 4, /*granularity=*/2 * MiB).run();
}
