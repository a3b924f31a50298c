// What reading a run summary costs (telemetry/json_reader.h on nlohmann-json's SAX parser, then
// telemetry/summary_reader.h): a summary as the library writes it, with `range` devices whose
// every stat is set, counts of driver calls and pass-throughs, and a long command line.
// BM_JsonParse is the generic reader alone; BM_SummaryFromJson adds building the Summary.
//
//   make build/release/bench/telemetry_bench && build/release/bench/telemetry_bench --benchmark_filter=Json
#include <benchmark/benchmark.h>

#include <string>

#include "telemetry/json_reader.h"
#include "telemetry/summary.h"
#include "telemetry/summary_reader.h"

namespace cudapool {
namespace {

std::string summary_text(int devices) {
  Summary s;
  s.pid = 4242;
  s.command = "python3 train.py --config configs/large_model.yaml --lr 0.0001 --épochs 30 " + std::string(2000, 'x');
  s.policy = "max_split_size_mb:64,expandable_segments:True,garbage_collection_threshold:0.8";
  s.backend = "native";
  s.start_unix_ns = 1'765'000'000'000'000'000;
  s.wall_time_s = 3600.25;
  s.exit_status = 0;
  for (const char* kind : {"foreign_pointer", "capture", "managed", "ipc_import", "over_cap"}) s.passthrough[kind] = 17;
  s.runtime_api = {{"cudaMalloc", 123456789}, {"cudaFree", 123456700}};
  std::int64_t v = 1;
  for (int d = 0; d < devices; ++d) {
    DeviceSummary ds;
    ds.device = d;
    ds.driver_total_bytes = 85'899'345'920ull;
    for (const auto& [name, unused] : flatten_stats(ds.stats)) set_stat(&ds.stats, name, (v += 1'000'003) << 20);
    ds.driver_calls = {{"event_record", 1 << 20}, {"event_query", 1 << 22}, {"stream_wait_event", 5}};
    s.devices.push_back(ds);
  }
  return to_json(s);
}

void BM_JsonParse(benchmark::State& state) {
  const std::string text = summary_text(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    json::Value v;
    std::string err;
    if (!json::parse(text, &v, &err)) state.SkipWithError(err.c_str());
    benchmark::DoNotOptimize(v.members.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(text.size()));
  state.counters["file_bytes"] = static_cast<double>(text.size());
}
BENCHMARK(BM_JsonParse)->Arg(1)->Arg(8)->Arg(256);

void BM_SummaryFromJson(benchmark::State& state) {
  const std::string text = summary_text(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    Summary s;
    std::string err;
    if (!from_json(text, &s, &err)) state.SkipWithError(err.c_str());
    benchmark::DoNotOptimize(s.devices.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(text.size()));
}
BENCHMARK(BM_SummaryFromJson)->Arg(8)->Arg(256);

}  // namespace
}  // namespace cudapool
