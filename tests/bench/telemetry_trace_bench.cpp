// What tracing costs on the pool's hit path. Same DevicePool, same alloc+free pair, with no sink
// and with a TraceWriter attached. Target: traced ≤ 2 × untraced on the hit path
// (BM_PoolPair_Traced vs BM_PoolPair_NoSink, CPU column). The sustained benchmarks show the
// all-in cost when events arrive faster than CSV can be written.
//
//   make build/release/bench/telemetry_bench && build/release/bench/telemetry_bench
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "allocator/pool.h"
#include "telemetry/trace.h"
#include "tests/support/fake_fence.h"
#include "tests/support/fake_upstream.h"

namespace cudapool {
namespace {

std::string bench_trace_path() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/cudapool_bench_trace_" +
         std::to_string(::getpid()) + ".csv";
}

// One alloc+free pair of `size` bytes on one stream: after the first round, always a cache hit.
void run_pairs(benchmark::State& state, EventSink* sink) {
  testing::FakeUpstream upstream;
  testing::FakeFence fences(/*auto_complete=*/true);
  PoolOptions opt;
  opt.free_sync = FreeSync::immediate;  // the hit path without fence traffic
  DevicePool pool(0, opt, upstream, fences, sink);
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    AllocResult r = pool.allocate(size, 0);
    benchmark::DoNotOptimize(r.ptr);
    pool.free(r.ptr);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["upstream_calls"] = static_cast<double>(pool.stats().num_device_alloc);
}

void BM_PoolPair_NoSink(benchmark::State& state) { run_pairs(state, nullptr); }

// Hit-path cost with the writer keeping up: the formatter's work is excluded by draining the
// buffers with the timer paused every `kBurst` pairs (a burst fits in one buffer). This is the
// cost the pool's caller pays when the program allocates at any realistic rate.
void BM_PoolPair_Traced(benchmark::State& state) {
  const std::string path = bench_trace_path();
  std::string err;
  auto w = TraceWriter::open(path, &err);
  if (!w) {
    state.SkipWithError(err.c_str());
    return;
  }
  testing::FakeUpstream upstream;
  testing::FakeFence fences(/*auto_complete=*/true);
  PoolOptions opt;
  opt.free_sync = FreeSync::immediate;
  DevicePool pool(0, opt, upstream, fences, w.get());
  const auto size = static_cast<std::size_t>(state.range(0));
  constexpr int kBurst = 2048;  // 4096 rows: half of one buffer
  int n = 0;
  for (auto _ : state) {
    AllocResult r = pool.allocate(size, 0);
    benchmark::DoNotOptimize(r.ptr);
    pool.free(r.ptr);
    if (++n == kBurst) {
      state.PauseTiming();
      w->flush();
      n = 0;
      state.ResumeTiming();
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["rows"] = static_cast<double>(w->rows());
  w.reset();
  std::remove(path.c_str());
}

// Saturation: a tight loop that never pauses. Two rows per pair arrive faster than any CSV
// formatter writes them, so once the spare buffers are used the caller formats too
// (back-pressure, nothing dropped). This is the all-in cost per pair: hot path + formatting +
// write(2), spread over the caller and the formatter thread (process CPU time).
void BM_PoolPair_TracedSustained(benchmark::State& state) {
  const std::string path = bench_trace_path();
  std::string err;
  auto w = TraceWriter::open(path, &err);
  if (!w) {
    state.SkipWithError(err.c_str());
    return;
  }
  run_pairs(state, w.get());
  w->flush();
  state.counters["rows"] = static_cast<double>(w->rows());
  w.reset();
  std::remove(path.c_str());
}

// The writer alone, sustained: one event per iteration, all-in (process CPU time).
void BM_TraceWriter_OnEvent(benchmark::State& state) {
  const std::string path = bench_trace_path();
  std::string err;
  auto w = TraceWriter::open(path, &err);
  if (!w) {
    state.SkipWithError(err.c_str());
    return;
  }
  Event e{EventKind::allocate, 0, 0x7f0000000000, 1024, 1000, 0, 0};
  for (auto _ : state) {
    e.ptr += 512;
    w->on_event(e);
  }
  state.SetItemsProcessed(state.iterations());
  w.reset();
  std::remove(path.c_str());
}

// The writer's hot path alone (formatting excluded as in BM_PoolPair_Traced).
void BM_TraceWriter_OnEventBurst(benchmark::State& state) {
  const std::string path = bench_trace_path();
  std::string err;
  auto w = TraceWriter::open(path, &err);
  if (!w) {
    state.SkipWithError(err.c_str());
    return;
  }
  Event e{EventKind::allocate, 0, 0x7f0000000000, 1024, 1000, 0, 0};
  int n = 0;
  for (auto _ : state) {
    e.ptr += 512;
    w->on_event(e);
    if (++n == 4096) {
      state.PauseTiming();
      w->flush();
      n = 0;
      state.ResumeTiming();
    }
  }
  state.SetItemsProcessed(state.iterations());
  w.reset();
  std::remove(path.c_str());
}

BENCHMARK(BM_PoolPair_NoSink)->Arg(1000)->Arg(4 << 20);
BENCHMARK(BM_PoolPair_Traced)->Arg(1000)->Arg(4 << 20);
BENCHMARK(BM_PoolPair_TracedSustained)->Arg(1000)->MeasureProcessCPUTime();
BENCHMARK(BM_TraceWriter_OnEvent)->MeasureProcessCPUTime();
BENCHMARK(BM_TraceWriter_OnEventBurst);

}  // namespace
}  // namespace cudapool

BENCHMARK_MAIN();
