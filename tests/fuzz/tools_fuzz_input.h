// What the whole-trace fuzz targets (replay, report, tune) share: a trace read from the input
// bytes in memory, as `cudapool` loads one from a file (tools/trace_input.cpp): the strict reader,
// the policy row through pool_shaping_conf, prepare_trace. Work per input is bounded: at most
// kMaxRows rows are read, and the simulated device is at most kMaxDevice bytes (a replay's cost
// grows with the memory it maps, which a trace's sizes would otherwise choose).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "config/policy.h"
#include "telemetry/trace.h"
#include "tools/replay.h"

namespace cudapool::fuzz {

inline constexpr std::size_t kMaxRows = 512;
inline constexpr std::size_t kMaxDevice = std::size_t{64} << 30;

[[noreturn]] inline void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz check failed: %s\n%s\n", what, detail.c_str());
  std::abort();
}

struct FuzzTrace {
  std::vector<TraceRow> rows;
  tools::PreparedTrace prepared;
};

// false when the bytes are not a trace with an allocation to replay (the tools stop there too).
inline bool read_fuzz_trace(const unsigned char* data, std::size_t size, FuzzTrace* out) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  TraceReader reader(in);
  TraceRow row;
  while (out->rows.size() < kMaxRows && reader.next(&row)) out->rows.push_back(row);
  if (!reader.error().empty()) return false;
  out->prepared = tools::prepare_trace(out->rows, -1);
  if (reader.policy()) {
    UntrustedConf kept = pool_shaping_conf(*reader.policy(), "a trace");
    if (kept.error.empty()) out->prepared.facts.recorded_policy = kept.conf;
    for (char c : kept.error + describe_dropped(kept.dropped))
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("a control character in a message", kept.error);
  }
  return out->prepared.facts.allocations > 0;
}

// The replay settings every target uses: the trace's device size, bounded.
inline tools::ReplayConfig bounded_replay(const tools::TraceFacts& facts) {
  tools::ReplayConfig cfg;
  std::size_t device = facts.device_memory.value_or(kMaxDevice);
  if (device > kMaxDevice || device == 0) device = kMaxDevice;
  cfg.device_memory = device;
  return cfg;
}

}  // namespace cudapool::fuzz
