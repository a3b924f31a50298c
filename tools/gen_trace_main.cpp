// cudapool-gen-trace: writes the sample traces of tests/traces/ (see tests/traces/README.md and
// tools/synth.h for what the workloads model).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "config/policy.h"
#include "config/version.h"
#include "tools/cli_io.h"
#include "tools/policies.h"
#include "tools/sim_device.h"
#include "tools/synth.h"
#include "tools/units.h"

using namespace cudapool;
using namespace cudapool::tools;

int main(int argc, char** argv) {
  CLI::App app{"cudapool-gen-trace: write a synthetic transformer trace recorded by the real pool"};
  app.set_version_flag("-V,--version", std::string("cudapool-gen-trace ") + kVersion);
  app.option_defaults()->always_capture_default();
  SynthOptions o;
  std::string out, conf, device_memory = "16GiB";
  app.add_option("--pattern", o.pattern, "train or serve")->check(CLI::IsMember({"train", "serve"}));
  app.add_option("-o,--output", out, "trace file to write")->required();
  app.add_option("--steps", o.steps, "training steps / serving steps")->check(CLI::Range(1, 100000));
  app.add_option("--layers", o.layers, "transformer layers")->check(CLI::Range(1, 1000));
  app.add_option("--hidden", o.hidden, "hidden size")->check(CLI::Range(64, 65536));
  app.add_option("--seed", o.seed, "random seed (sequence lengths, request sizes)");
  app.add_option("--conf", conf, "policy the pool records under (default: the defaults)");
  app.add_option("--device-memory", device_memory, "simulated device size");
  CLI11_PARSE(app, argc, argv);

  Policy policy;
  std::string err;
  if (!policy_from_conf(conf, &policy, &err)) {
    std::fprintf(stderr, "cudapool-gen-trace: %s\n", err.c_str());
    return 2;
  }
  const PoolOptions& options = policy.pool;
  std::optional<std::size_t> total;
  if (!device_memory_option(device_memory, &total, "cudapool-gen-trace") || !total) return 2;
  o.device_memory = *total;
  SynthResult r;
  if (!synthesize_trace(o, options, &r, &err)) {
    std::fprintf(stderr, "cudapool-gen-trace: %s\n", err.c_str());
    return 2;
  }
  std::string f = std::string(trace_header()) + "\n";
  // The policy row, as the library writes it: a replay of this file defaults to that policy.
  TraceRow policy_row;
  policy_row.thread = 1;
  policy_row.time_ns = r.rows.empty() ? 0 : r.rows.front().time_ns;
  policy_row.action = TraceAction::policy;
  policy_row.detail = TraceDetail::policy;
  f += format_trace_row(policy_row, to_conf_string(policy)) + "\n";
  // The device row says what a replay needs to map pages as this device did: the simulated
  // device's page size and the pool's allocation units.
  for (const auto& row : r.rows)
    f += format_trace_row(row, row.detail == TraceDetail::device_facts ? device_facts_text(kSimGranularity) : "") +
         "\n";
  if (!write_text_file(out, f, "cudapool-gen-trace")) return 1;
  std::fprintf(stderr, "cudapool-gen-trace: %zu rows to %s (%d failed allocations)\n", r.rows.size(), out.c_str(),
               r.failed_allocations);
  return 0;
}
