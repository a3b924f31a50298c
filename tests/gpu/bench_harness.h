// Allocation-latency harness shared by alloc_bench.cu (CUDA entry points, with or without the
// shim) and torch_alloc_bench.cpp (PyTorch's caching allocator from C++). Host-only C++.
//
// Patterns, per size from 256 B to 512 MiB:
//   tight  alloc+free of one block, over and over (timed in batches of 32 pairs so the clock's
//          own cost, ~20 ns, does not swamp sub-microsecond pairs; a sample is batch time / 32;
//          pairs slower than 5 us are timed one by one), so p99 is over batches;
//   burst  free 100 held blocks, then allocate 100 again; a sample is burst time / 100;
//   threads  1..16 threads each doing tight pairs of one size at once: aggregate pairs/s.
// Output: CSV on stdout, one line per measurement, parsed by report.py.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
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

inline Summary tight(Allocator& a, std::size_t size, double budget_ms) {
  for (int i = 0; i < 8; ++i) {  // warm-up: lets a pool build its cache, as a real program would
    void* p = a.alloc(size);
    if (!p) return summarize({}, true);
    a.release(p);
  }
  auto probe = Clock::now();
  a.release(a.alloc(size));
  const int batch = ns_since(probe) < 5000 ? 32 : 1;
  std::vector<double> samples;
  const auto start = Clock::now();
  while (ns_since(start) < budget_ms * 1e6 && samples.size() < 200000) {
    const auto t0 = Clock::now();
    for (int i = 0; i < batch; ++i) {
      void* p = a.alloc(size);
      if (!p) return summarize(samples, true);
      a.release(p);
    }
    samples.push_back(ns_since(t0) / batch);
  }
  return summarize(samples, false);
}

// Bursts hold at most 16 GiB so the largest size still fits beside the pool's own cache.
inline int burst_count(std::size_t size) {
  const std::size_t cap = (16ull << 30) / size;
  return static_cast<int>(std::max<std::size_t>(4, std::min<std::size_t>(100, cap)));
}

inline Summary burst(Allocator& a, std::size_t size, double budget_ms) {
  const int k = burst_count(size);
  std::vector<void*> held;
  bool failed = false;
  for (int i = 0; i < k && !failed; ++i) {
    void* p = a.alloc(size);
    if (p) held.push_back(p); else failed = true;
  }
  std::vector<double> samples;
  bool warm = false;  // the first burst fills the cache; it is not a sample
  const auto start = Clock::now();
  while (!failed && (samples.size() < 3 || ns_since(start) < budget_ms * 1e6) && samples.size() < 20000) {
    const auto t0 = Clock::now();
    for (void* p : held) a.release(p);
    for (auto& p : held) {
      p = a.alloc(size);
      if (!p) failed = true;
    }
    if (warm) samples.push_back(ns_since(t0) / k);
    warm = true;
  }
  for (void* p : held)
    if (p) a.release(p);
  return summarize(samples, failed);
}

inline double threads_pairs_per_s(const Factory& make, int n, std::size_t size, double budget_ms,
                                  bool* failed) {
  std::atomic<bool> go{false}, stop{false}, bad{false};
  std::atomic<int> ready{0};
  std::vector<std::uint64_t> counts(n, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t)
    ts.emplace_back([&, t] {
      auto a = make();
      void* w = a->alloc(size);  // warm this thread's path before the clock starts
      if (w) a->release(w); else bad = true;
      ++ready;
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::uint64_t c = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        void* p = a->alloc(size);
        if (!p) { bad = true; break; }
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
  static const std::vector<std::size_t> s = {256, 4096, 64 << 10, 1 << 20, 16 << 20, 128 << 20,
                                             512u << 20};
  return s;
}

// Runs every measurement and prints CSV: label,api,pattern,size,threads,samples,median_ns,p99_ns,pairs_per_s,failed
inline void run_all(const char* label, const char* api, const Factory& make, double scale = 1.0) {
  std::printf("label,api,pattern,size,threads,samples,median_ns,p99_ns,pairs_per_s,failed\n");
  auto a = make();
  for (std::size_t size : sizes()) {
    for (int pat = 0; pat < 2; ++pat) {
      const Summary s = pat == 0 ? tight(*a, size, 120 * scale) : burst(*a, size, 150 * scale);
      std::printf("%s,%s,%s,%zu,1,%zu,%.1f,%.1f,%.0f,%d\n", label, api, pat == 0 ? "tight" : "burst",
                  size, s.samples, s.median_ns, s.p99_ns, s.median_ns > 0 ? 1e9 / s.median_ns : 0.0,
                  s.failed);
      std::fflush(stdout);
    }
  }
  a.reset();
  const std::size_t tsize = 64 << 10;
  for (int n : {1, 2, 4, 8, 16}) {
    bool failed = false;
    const double pps = threads_pairs_per_s(make, n, tsize, 150 * scale, &failed);
    std::printf("%s,%s,threads,%zu,%d,0,0,0,%.0f,%d\n", label, api, tsize, n, pps, failed);
    std::fflush(stdout);
  }
}

}  // namespace bench
