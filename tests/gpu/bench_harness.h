// Allocation-latency harness shared by alloc_bench.cu (CUDA entry points, with or without the
// shim) and torch_alloc_bench.cpp (PyTorch's caching allocator from C++). Host-only C++.
//
// Patterns, per size from 256 B to 512 MiB:
//   tight  alloc+free of one block, over and over (timed in batches of 32 pairs so the clock's
//          own cost, ~20 ns, does not swamp sub-microsecond pairs; a sample is batch time / 32;
//          pairs slower than 5 us are timed one by one), so p99 is over batches;
//   burst  free 100 held blocks, then allocate 100 again; a sample is burst time / 100;
//   threads  1..16 threads each doing tight pairs of one size at once: aggregate pairs/s.
//   rounds   the size sweep runs BENCH_ROUNDS times (default 3), see run_all.
// Output: CSV on stdout, one line per measurement, parsed by report.py.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace bench {

// One thread's view of an allocator (a thread may need its own stream).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* alloc(std::size_t n) = 0;  // nullptr on failure
  virtual void release(void* p) = 0;
};
using Factory = std::function<std::unique_ptr<Allocator>()>;

using Clock = std::chrono::steady_clock;
inline double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

struct Summary {
  std::size_t samples = 0;
  double median_ns = 0, p99_ns = 0;
  bool failed = false;
};

inline Summary summarize(std::vector<double> v, bool failed) {
  Summary s;
  s.failed = failed;
  s.samples = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median_ns = v[v.size() / 2];
  s.p99_ns = v[std::min(v.size() - 1, static_cast<std::size_t>(v.size() * 0.99))];
  return s;
}

// Appends one sample per batch to *out; false if an allocation failed.
inline bool tight(Allocator& a, std::size_t size, double budget_ms, std::vector<double>* out) {
  for (int i = 0; i < 8; ++i) {  // warm-up: lets a pool build its cache, as a real program would
    void* p = a.alloc(size);
    if (!p) return false;
    a.release(p);
  }
  auto probe = Clock::now();
  void* q = a.alloc(size);
  if (!q) return false;
  a.release(q);
  const int batch = ns_since(probe) < 5000 ? 32 : 1;
  const auto start = Clock::now();
  while (ns_since(start) < budget_ms * 1e6 && out->size() < 200000) {
    const auto t0 = Clock::now();
    for (int i = 0; i < batch; ++i) {
      void* p = a.alloc(size);
      if (!p) return false;
      a.release(p);
    }
    out->push_back(ns_since(t0) / batch);
  }
  return true;
}

// Bursts hold at most 16 GiB so the largest size still fits beside the pool's own cache.
inline int burst_count(std::size_t size) {
  const std::size_t cap = (16ull << 30) / size;
  return static_cast<int>(std::max<std::size_t>(4, std::min<std::size_t>(100, cap)));
}

// Appends one sample per burst (after a warm one) to *out; false if an allocation failed.
inline bool burst(Allocator& a, std::size_t size, double budget_ms, std::vector<double>* out) {
  const int k = burst_count(size);
  std::vector<void*> held;
  bool failed = false;
  for (int i = 0; i < k && !failed; ++i) {
    void* p = a.alloc(size);
    if (p)
      held.push_back(p);
    else
      failed = true;
  }
  bool warm = false;  // the first burst fills the cache; it is not a sample
  std::size_t taken = 0;
  const auto start = Clock::now();
  while (!failed && (taken < 3 || ns_since(start) < budget_ms * 1e6) && taken < 20000) {
    const auto t0 = Clock::now();
    for (void* p : held) a.release(p);
    for (auto& p : held) {
      p = a.alloc(size);
      if (!p) failed = true;
    }
    if (warm) {
      out->push_back(ns_since(t0) / k);
      ++taken;
    }
    warm = true;
  }
  for (void* p : held)
    if (p) a.release(p);
  return !failed;
}

inline double threads_pairs_per_s(const Factory& make, int n, std::size_t size, double budget_ms, bool* failed) {
  std::atomic<bool> go{false}, stop{false}, bad{false};
  std::atomic<int> ready{0};
  std::vector<std::uint64_t> counts(n, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t)
    ts.emplace_back([&, t] {
      auto a = make();
      void* w = a->alloc(size);  // warm this thread's path before the clock starts
      if (w)
        a->release(w);
      else
        bad = true;
      ++ready;
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::uint64_t c = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        void* p = a->alloc(size);
        if (!p) {
          bad = true;
          break;
        }
        a->release(p);
        ++c;
      }
      counts[t] = c;
    });
  while (ready.load() < n) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(budget_ms));
  stop = true;
  for (auto& t : ts) t.join();
  const double secs = ns_since(t0) / 1e9;
  std::uint64_t total = 0;
  for (auto c : counts) total += c;
  *failed = bad.load();
  return total / secs;
}

inline const std::vector<std::size_t>& sizes() {
  static const std::vector<std::size_t> s = {256, 4096, 64 << 10, 1 << 20, 16 << 20, 128 << 20, 512u << 20};
  return s;
}

// Rounds: the size sweep runs kRounds times, each round with 1/kRounds of the time budget, so a
// burst of interference from the shared machine (a neighbour VM, a compiler) lands on one round of
// a few sizes instead of on one size's whole measurement. Reported per (size, pattern): the lowest
// of the round medians (interference only adds time), the highest (the spread, column 11) and the
// p99 over the samples of every round.
inline int rounds() {
  const char* e = std::getenv("BENCH_ROUNDS");
  const int r = e != nullptr ? std::atoi(e) : 3;
  return r >= 1 ? r : 1;
}

// Runs every measurement and prints CSV:
// label,api,pattern,size,threads,samples,median_ns,p99_ns,pairs_per_s,failed,median_max_ns
inline void run_all(const char* label, const char* api, const Factory& make, double scale = 1.0) {
  std::printf("label,api,pattern,size,threads,samples,median_ns,p99_ns,pairs_per_s,failed,median_max_ns\n");
  auto a = make();
  const int R = rounds();
  const std::size_t n = sizes().size();
  std::vector<std::vector<double>> medians(2 * n), pooled(2 * n);
  std::vector<bool> failed(2 * n, false);
  for (int r = 0; r < R; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      for (int pat = 0; pat < 2; ++pat) {
        const std::size_t k = 2 * i + pat;
        if (failed[k]) continue;
        std::vector<double> samples;
        const bool ok = pat == 0 ? tight(*a, sizes()[i], 120 * scale / R, &samples)
                                 : burst(*a, sizes()[i], 150 * scale / R, &samples);
        failed[k] = !ok;
        if (!samples.empty()) medians[k].push_back(summarize(samples, false).median_ns);
        pooled[k].insert(pooled[k].end(), samples.begin(), samples.end());
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (int pat = 0; pat < 2; ++pat) {
      const std::size_t k = 2 * i + pat;
      const Summary s = summarize(pooled[k], failed[k]);
      const double best = medians[k].empty() ? 0 : *std::min_element(medians[k].begin(), medians[k].end());
      const double worst = medians[k].empty() ? 0 : *std::max_element(medians[k].begin(), medians[k].end());
      std::printf("%s,%s,%s,%zu,1,%zu,%.1f,%.1f,%.0f,%d,%.1f\n", label, api, pat == 0 ? "tight" : "burst", sizes()[i],
                  s.samples, best, s.p99_ns, best > 0 ? 1e9 / best : 0.0, s.failed, worst);
    }
  }
  std::fflush(stdout);
  a.reset();
  const std::size_t tsize = 64 << 10;
  for (int t : {1, 2, 4, 8, 16}) {
    bool bad = false;
    const double pps = threads_pairs_per_s(make, t, tsize, 150 * scale, &bad);
    std::printf("%s,%s,threads,%zu,%d,0,0,0,%.0f,%d,0\n", label, api, tsize, t, pps, bad);
    std::fflush(stdout);
  }
}

}  // namespace bench
