#include "tools/trace_input.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "config/policy.h"
#include "tools/commands.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

// A trace is untrusted input: its policy row may name files, signals, groups. Only the keys that
// shape the pool pass (config/, pool_shaping_conf); what is dropped is said on stderr, in one line.
std::optional<std::string> recorded_policy(const std::optional<std::string>& row, const char* who) {
  if (!row) return std::nullopt;
  UntrustedConf kept = pool_shaping_conf(*row, "a trace");
  if (!kept.error.empty()) {
    std::fprintf(stderr,
                 "%s: trace policy: ignored, it is not a valid policy (%s); the trace counts as recording none\n", who,
                 kept.error.c_str());
    return std::nullopt;
  }
  if (!kept.dropped.empty())
    std::fprintf(stderr, "%s: trace policy: ignored %s\n", who, describe_dropped(kept.dropped).c_str());
  return kept.conf;
}

}  // namespace

int load_trace(const std::string& path, int device, LoadedTrace* out, const char* who) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    std::fprintf(stderr, "%s: cannot open trace '%s': %s\n", who, path.c_str(),
                 std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
    return kExitNoInput;
  }
  auto start = std::chrono::steady_clock::now();
  std::string error;
  TraceMeta meta;
  if (!read_trace_file(path, &out->rows, &error, &meta)) {
    std::fprintf(stderr, "%s: %s\n", who, error.c_str());
    return kExitBadInput;
  }
  auto parsed = std::chrono::steady_clock::now();
  out->parse_seconds = std::chrono::duration<double>(parsed - start).count();
  out->prepared = prepare_trace(out->rows, device);
  out->prepared.facts.recorded_policy = recorded_policy(meta.policy, who);
  out->columns = meta.columns;
  out->prepare_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - parsed).count();
  if (out->prepared.facts.allocations == 0) {
    std::fprintf(stderr, "%s: %s: no allocation to replay%s\n", who, path.c_str(),
                 device >= 0 ? " on that device" : "");
    return kExitBadInput;
  }
  return 0;
}

void print_trace_facts(const std::string& path, const LoadedTrace& t) {
  const TraceFacts& f = t.prepared.facts;
  std::printf("trace %s: %zu rows%s, %zu allocations, %zu frees, %zu streams, %.3f s of program time\n", path.c_str(),
              f.rows, f.rmm_only ? " (plain allocation log)" : "", f.allocations, f.frees, f.streams,
              static_cast<double>(f.end_ns - f.start_ns) * 1e-9);
  std::printf("recorded: device memory %s, peak allocated %s, peak reserved %s\n",
              f.device_memory ? format_bytes(static_cast<double>(*f.device_memory)).c_str() : "unknown",
              format_bytes(static_cast<double>(f.recorded_peak_allocated)).c_str(),
              f.recorded_peak_reserved ? format_bytes(static_cast<double>(*f.recorded_peak_reserved)).c_str()
                                       : "not recorded");
  if (!f.other_devices.empty())
    std::printf("note: the trace has rows for %zu other device(s); replaying device %d (choose with --device)\n",
                f.other_devices.size(), f.device);
  if (f.blocking_streams + f.non_blocking_streams > 0)
    std::printf("streams the program created: %zu blocking, %zu non-blocking\n", f.blocking_streams,
                f.non_blocking_streams);
  if (f.unmatched_frees)
    std::printf("note: %zu frees of pointers the trace never allocated were skipped\n", f.unmatched_frees);
}

}  // namespace cudapool::tools
