// The pinned host pool on a data loader's pattern (CPU only, fake upstream, fences complete at
// once): batches of changing size, a few in flight, each freed once it was copied. Reports the
// pinned bytes held at the peak of the live bytes over those live bytes, against a cache that
// rounds to powers of two and keeps every block (what PyTorch's host allocator does), and the
// host time per step.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "allocator/host_pool.h"
#include "tests/support/fake_fence.h"

namespace cudapool {
namespace {

class MallocHostUpstream : public HostUpstream {
 public:
  HostUpstreamResult allocate(std::size_t bytes, unsigned) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    return {p, p != nullptr ? 0 : 2};
  }
  void release(void* p, std::size_t, unsigned, std::uintptr_t) override { std::free(p); }
};

std::vector<std::size_t> loader_sizes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::size_t> v(n);
  for (auto& s : v) s = (16 + rng() % 49) * 3 * 224 * 224 * 4;  // 16-64 images of 3x224x224 float32
  return v;
}
constexpr std::size_t kInflight = 4;

void BM_HostPool_Loader(benchmark::State& state) {
  const auto sizes = loader_sizes(4096, 5);
  double ratio = 0, hits = 0;
  for (auto _ : state) {
    MallocHostUpstream up;
    testing::FakeFence fences(/*auto_complete=*/true);
    HostPool pool(HostPoolOptions{}, up, fences);
    std::deque<std::pair<void*, std::size_t>> inflight;
    std::size_t live = 0, peak_live = 0;
    std::int64_t held_at_peak = 0;
    for (std::size_t s : sizes) {
      void* p = pool.allocate(s, 0, 1).ptr;
      benchmark::DoNotOptimize(p);
      inflight.push_back({p, s});
      live += s;
      if (live > peak_live) peak_live = live, held_at_peak = pool.stats().reserved_bytes.current;
      if (inflight.size() > kInflight) {
        pool.free(inflight.front().first);
        live -= inflight.front().second;
        inflight.pop_front();
      }
    }
    for (auto& [p, s] : inflight) pool.free(p);
    const HostStats st = pool.stats();
    ratio = static_cast<double>(held_at_peak) / static_cast<double>(peak_live);
    hits = static_cast<double>(st.cache_hits) / static_cast<double>(st.cache_hits + st.cache_misses);
    pool.empty_cache();
  }
  state.counters["held_over_live"] = ratio;
  state.counters["hit_rate"] = hits;
  state.counters["ns_per_step"] = benchmark::Counter(static_cast<double>(sizes.size()),
                                                     benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}
BENCHMARK(BM_HostPool_Loader)->Unit(benchmark::kMillisecond);

// The same steps under power-of-two rounding, every block kept for reuse by its exact rounded
// size (no splitting, nothing given back): the memory such a cache holds.
void BM_Baseline_Pow2HostCache_Loader(benchmark::State& state) {
  const auto sizes = loader_sizes(4096, 5);
  double ratio = 0;
  for (auto _ : state) {
    std::map<std::size_t, int> free_blocks;  // rounded size -> cached count
    std::deque<std::pair<std::size_t, std::size_t>> inflight;
    std::size_t live = 0, peak_live = 0, held = 0, held_at_peak = 0;
    for (std::size_t s : sizes) {
      std::size_t r = 4096;
      while (r < s) r *= 2;
      if (free_blocks[r] > 0)
        --free_blocks[r];
      else
        held += r;
      inflight.push_back({r, s});
      live += s;
      if (live > peak_live) peak_live = live, held_at_peak = held;
      if (inflight.size() > kInflight) {
        ++free_blocks[inflight.front().first];
        live -= inflight.front().second;
        inflight.pop_front();
      }
    }
    ratio = static_cast<double>(held_at_peak) / static_cast<double>(peak_live);
    benchmark::DoNotOptimize(ratio);
  }
  state.counters["held_over_live"] = ratio;
}
BENCHMARK(BM_Baseline_Pow2HostCache_Loader)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace cudapool
