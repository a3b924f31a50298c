// Pool core CPU benchmarks (`make bench`). Baselines are measured in the same run: the host's
// malloc/free for the same sizes and the same trace. The fake upstream hands out address
// ranges only (nothing is touched), the fake fence completes fences at once.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "allocator/pool.h"
#include "tests/support/fake_fence.h"
#include "tests/support/fake_upstream.h"

using namespace cudapool;
using cudapool::testing::FakeFence;
using cudapool::testing::FakeUpstream;

namespace {

struct Rig {
  FakeUpstream up{1024 * GiB};
  FakeFence fence{true};
  DevicePool pool;
  explicit Rig(PoolOptions o = {}) : pool(0, o, up, fence) {}
};

PoolOptions with_sync(FreeSync s) {
  PoolOptions o;
  o.free_sync = s;
  return o;
}

// ---- hit path: malloc + free of a cached size, single thread --------------------------------
void BM_Baseline_MallocFree(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_Baseline_MallocFree)->Arg(4096)->Arg(5 << 20);

void BM_Pool_Hit_FreeOnStream(benchmark::State& state) {
  Rig rig;
  const auto n = static_cast<std::size_t>(state.range(0));
  rig.pool.free_on_stream(rig.pool.allocate(n, 7).ptr, 7);  // warm: the segment is cached
  for (auto _ : state) {
    void* p = rig.pool.allocate(n, 7).ptr;
    benchmark::DoNotOptimize(p);
    rig.pool.free_on_stream(p, 7);
  }
  if (rig.up.allocate_calls() != 1) state.SkipWithError("hit path reached the upstream");
}
BENCHMARK(BM_Pool_Hit_FreeOnStream)->Arg(4096)->Arg(5 << 20);

void BM_Pool_Hit_FreeImmediate(benchmark::State& state) {
  Rig rig(with_sync(FreeSync::immediate));
  const auto n = static_cast<std::size_t>(state.range(0));
  rig.pool.free(rig.pool.allocate(n, 7).ptr);
  for (auto _ : state) {
    void* p = rig.pool.allocate(n, 7).ptr;
    benchmark::DoNotOptimize(p);
    rig.pool.free(p);
  }
  if (rig.up.allocate_calls() != 1) state.SkipWithError("hit path reached the upstream");
}
BENCHMARK(BM_Pool_Hit_FreeImmediate)->Arg(4096);

// cudaFree meaning: every pair records, queries and releases one (fake) device fence.
void BM_Pool_Hit_FreeFenced(benchmark::State& state) {
  Rig rig(with_sync(FreeSync::fenced));
  const auto n = static_cast<std::size_t>(state.range(0));
  rig.pool.free(rig.pool.allocate(n, 7).ptr);
  for (auto _ : state) {
    void* p = rig.pool.allocate(n, 7).ptr;
    benchmark::DoNotOptimize(p);
    rig.pool.free(p);
  }
}
BENCHMARK(BM_Pool_Hit_FreeFenced)->Arg(4096);

// Bursts, as the GPU suite's: free 100 held blocks, then allocate 100 again; per pair. Fenced
// frees wait for a batch fence (the fake completes it at once); immediate ones are local at once.
void BM_Pool_Burst(benchmark::State& state) {
  Rig rig(with_sync(state.range(0) == 0 ? FreeSync::immediate : FreeSync::fenced));
  const auto n = static_cast<std::size_t>(state.range(1));
  std::vector<void*> held(100);
  for (auto& p : held) p = rig.pool.allocate(n, 0).ptr;
  for (auto _ : state) {
    for (void* p : held) rig.pool.free(p);
    for (auto& p : held) p = rig.pool.allocate(n, 0).ptr;
    benchmark::DoNotOptimize(held.data());
  }
  state.SetItemsProcessed(state.iterations() * 100);
  for (void* p : held) rig.pool.free(p);
}
BENCHMARK(BM_Pool_Burst)
    ->ArgNames({"fenced", "size"})
    ->Args({0, 4096})
    ->Args({1, 4096})
    ->Args({0, 16 << 20})
    ->Args({1, 16 << 20});

// ---- mixed-size trace: 1000 live blocks, sizes 512 B .. 8 MiB, random frees -------------------
struct TraceOp {
  bool alloc;
  std::size_t size;
  std::size_t slot;
};
const std::vector<TraceOp>& trace() {
  static const std::vector<TraceOp> ops = [] {
    std::vector<TraceOp> v;
    std::mt19937_64 rng(42);
    std::vector<bool> used(1000, false);
    std::size_t live = 0;
    for (int i = 0; i < 200000; ++i) {
      const std::size_t slot = rng() % used.size();
      if (!used[slot]) {
        const std::uint64_t c = rng() % 100;
        std::size_t size = c < 80   ? 512 + rng() % (64 * KiB)
                           : c < 98 ? 1 * MiB + rng() % (3 * MiB)
                                    : 4 * MiB + rng() % (4 * MiB);
        v.push_back({true, size, slot});
        used[slot] = true;
        ++live;
      } else {
        v.push_back({false, 0, slot});
        used[slot] = false;
        --live;
      }
    }
    for (std::size_t s = 0; s < used.size(); ++s)
      if (used[s]) v.push_back({false, 0, s});
    return v;
  }();
  return ops;
}

void BM_Baseline_MallocTrace(benchmark::State& state) {
  const auto& ops = trace();
  std::vector<void*> slots(1000, nullptr);
  for (auto _ : state) {
    for (const TraceOp& op : ops) {
      if (op.alloc) {
        slots[op.slot] = std::malloc(op.size);
        benchmark::DoNotOptimize(slots[op.slot]);
      } else {
        std::free(slots[op.slot]);
      }
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(static_cast<std::size_t>(state.iterations()) * ops.size()));
}
BENCHMARK(BM_Baseline_MallocTrace)->Unit(benchmark::kMillisecond);

// Arg 0: classic segments; 1: expandable segments (2 MiB pages).
void BM_Pool_Trace(benchmark::State& state) {
  PoolOptions o = with_sync(FreeSync::immediate);
  o.expandable_segments = state.range(0) != 0;
  Rig rig(o);
  rig.up.set_granularity(2 * MiB);
  const auto& ops = trace();
  std::vector<void*> slots(1000, nullptr);
  for (auto _ : state) {
    for (const TraceOp& op : ops) {
      if (op.alloc) {
        slots[op.slot] = rig.pool.allocate(op.size, 7).ptr;
        benchmark::DoNotOptimize(slots[op.slot]);
      } else {
        rig.pool.free(slots[op.slot]);
      }
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(static_cast<std::size_t>(state.iterations()) * ops.size()));
  state.counters["segments"] = static_cast<double>(rig.pool.stats().segment[kAll].peak);
  state.counters["peak_reserved_MiB"] = static_cast<double>(rig.pool.stats().reserved_bytes[kAll].peak) / MiB;
  state.counters["peak_allocated_MiB"] = static_cast<double>(rig.pool.stats().allocated_bytes[kAll].peak) / MiB;
  state.counters["hit_rate"] = static_cast<double>(rig.pool.stats().cache_hits) /
                               static_cast<double>(rig.pool.stats().cache_hits + rig.pool.stats().cache_misses);
}
BENCHMARK(BM_Pool_Trace)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// ---- contention: every thread allocates and frees on its own stream, one shared pool ---------
// items_per_second is the AGGREGATE pairs/s over all threads (Google Benchmark sums the rate
// counters of the threads); compare threads:N against threads:1 for the scaling ratio.
// Arg = bytes per allocation (4 KiB small pool, 64 KiB as in the GPU host measurement).
// Thread caches engage once a second thread has used a pool; touch it from two threads first so
// that threads:1 and threads:N run the same code.
Rig* engaged(Rig* rig) {
  auto touch = [rig] { rig->pool.free_on_stream(rig->pool.allocate(512, 1).ptr, 1); };
  touch();
  std::thread(touch).join();
  return rig;
}

Rig& shared_rig(FreeSync s) {
  // Leaked on purpose: outlive every benchmark thread (and their thread caches).
  static Rig* fenced = engaged(new Rig(with_sync(FreeSync::fenced)));
  static Rig* immediate = engaged(new Rig(with_sync(FreeSync::immediate)));
  return s == FreeSync::immediate ? *immediate : *fenced;
}

// Hit path through this thread's cache (a pool used by several threads), single thread.
void BM_Pool_Hit_ThreadCache(benchmark::State& state) {
  Rig& rig = shared_rig(FreeSync::immediate);
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = rig.pool.allocate(n, 5).ptr;
    benchmark::DoNotOptimize(p);
    rig.pool.free(p);
  }
}
BENCHMARK(BM_Pool_Hit_ThreadCache)->Arg(4096)->Arg(64 << 10);

void BM_Baseline_MallocFree_Threads(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Baseline_MallocFree_Threads)->Arg(64 << 10)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// cudaMallocAsync / cudaFreeAsync pattern (default fenced pool).
void BM_Pool_Contention(benchmark::State& state) {
  Rig& rig = shared_rig(FreeSync::fenced);
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto stream = static_cast<StreamId>(100 + state.thread_index());
  for (auto _ : state) {
    void* p = rig.pool.allocate(n, stream).ptr;
    benchmark::DoNotOptimize(p);
    rig.pool.free_on_stream(p, stream);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pool_Contention)->Arg(4096)->Arg(64 << 10)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// cudaMalloc / cudaFree pattern under FreeSync::immediate (stream-local reuse).
void BM_Pool_Contention_Immediate(benchmark::State& state) {
  Rig& rig = shared_rig(FreeSync::immediate);
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto stream = static_cast<StreamId>(100 + state.thread_index());
  for (auto _ : state) {
    void* p = rig.pool.allocate(n, stream).ptr;
    benchmark::DoNotOptimize(p);
    rig.pool.free(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pool_Contention_Immediate)->Arg(64 << 10)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// cudaMalloc / cudaFree pattern, default fenced: every pair goes through a device fence batch
// and the shared free sets, so threads really share structures (no thread-local shortcut).
void BM_Pool_Contention_Fenced(benchmark::State& state) {
  static Rig* rig = engaged(new Rig(with_sync(FreeSync::fenced)));
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto stream = static_cast<StreamId>(100 + state.thread_index());
  for (auto _ : state) {
    void* p = rig->pool.allocate(n, stream).ptr;
    benchmark::DoNotOptimize(p);
    rig->pool.free(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pool_Contention_Fenced)->Arg(64 << 10)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// ---- GPU-side waits under cudaFree churn, with fences that take time ---------------------------
// A fence completes kFenceLatencyNs after it was recorded (an idle GPU is not instant), and
// order_after (a GPU-side wait: on CUDA a cuStreamWaitEvent on every live stream) is counted.
// What matters on a GPU is the `gpu_waits_per_kpair` counter, not the CPU time here: each wait
// costs driver calls there.
class TimedFence final : public FenceProvider {
 public:
  static constexpr std::int64_t kFenceLatencyNs = 5000;
  FenceHandle record_device() override { return record(); }
  FenceHandle record_stream(StreamId) override { return record(); }
  bool query(FenceHandle f) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = due_.find(f);
    return it == due_.end() || now() >= it->second;
  }
  void wait(FenceHandle f) override {
    std::int64_t due = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = due_.find(f);
      if (it != due_.end()) due = it->second;
    }
    while (now() < due) {
    }
  }
  void release(FenceHandle f) override {
    std::lock_guard<std::mutex> lock(mu_);
    due_.erase(f);
  }
  bool order_after(const FenceHandle*, std::size_t) override {
    orders_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  std::int64_t orders() const { return orders_.load(std::memory_order_relaxed); }

 private:
  static std::int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  FenceHandle record() {
    std::lock_guard<std::mutex> lock(mu_);
    due_[next_] = now() + kFenceLatencyNs;
    return next_++;
  }
  std::mutex mu_;
  std::map<FenceHandle, std::int64_t> due_;
  FenceHandle next_ = 1;
  std::atomic<std::int64_t> orders_{0};
};

// Arg: 0 classic segments, 1 expandable segments (default slack), 2 expandable without slack.
// cudaFree pattern (default gpu_wait), 64 KiB, each thread on its own stream.
void BM_Pool_GpuWaits_FreeChurn(benchmark::State& state) {
  struct Shared {
    FakeUpstream up{1024 * GiB};
    TimedFence fence;
    std::unique_ptr<DevicePool> pool;
  };
  static std::mutex mu;
  static std::unique_ptr<Shared> sh;
  if (state.thread_index() == 0) {
    std::lock_guard<std::mutex> lock(mu);
    sh = std::make_unique<Shared>();
    sh->up.set_granularity(2 * MiB);
    PoolOptions o;
    o.expandable_segments = state.range(0) != 0;
    if (state.range(0) == 2) o.expandable_slack = 0;
    sh->pool = std::make_unique<DevicePool>(0, o, sh->up, sh->fence);
  }
  const auto stream = static_cast<StreamId>(100 + state.thread_index());
  for (auto _ : state) {
    void* p = sh->pool->allocate(64 << 10, stream).ptr;
    benchmark::DoNotOptimize(p);
    sh->pool->free(p);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    state.counters["gpu_waits_per_kpair"] = benchmark::Counter(
        static_cast<double>(sh->fence.orders()) * 1000.0 / static_cast<double>(state.iterations() * state.threads()));
    state.counters["peak_reserved_MiB"] = static_cast<double>(sh->pool->stats().reserved_bytes[kAll].peak) /
                                          static_cast<double>(MiB);
  }
}
BENCHMARK(BM_Pool_GpuWaits_FreeChurn)->Arg(0)->Arg(1)->Arg(2)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
