// `cudapool plan TRACE -o PLAN [--conf S] [--device-memory SIZE]`: the warm-start plan of a
// recorded run (telemetry/warm_plan.h). Each device of the trace is replayed on the pool core
// under the recorded policy; the segments the replay holds at its peak reserved, with the blocks
// they are split into there, are the plan. The policy key warm_start preallocates them.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "config/policy.h"
#include "telemetry/warm_plan.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/fidelity.h"
#include "tools/policies.h"
#include "tools/replay.h"
#include "tools/trace_input.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

struct PlanCliOptions {
  std::string trace;
  std::string output;
  std::string conf;
  bool conf_given = false;
  std::string device_memory;
  bool quiet = false;
  std::uint64_t max_rows = kDefaultMaxTraceRows;
};

// The segments of `trace`'s device at the replay's peak reserved. false when the replay could not
// serve the trace (then the plan would not be what the program needs).
bool plan_device(const PreparedTrace& trace, const ReplayConfig& cfg, WarmPlan* plan, std::size_t* replayed_peak) {
  ReplayConfig find = cfg;
  find.track_peak = true;
  const ReplayResult peak = replay_trace(trace, find);
  *replayed_peak = static_cast<std::size_t>(peak.stats.reserved_bytes[kAll].peak);
  ReplayConfig take = cfg;
  take.snapshot_after_op = peak.peak_op;
  const ReplayResult r = replay_trace(trace, take);
  if (!r.snapshot) return false;
  const int dev = trace.facts.device;
  plan->devices.push_back(WarmDevice{dev, *replayed_peak});
  for (const SegmentInfo& s : r.snapshot->segments) {
    WarmSegment w;
    w.device = dev;
    w.small = s.is_small;
    w.expandable = s.is_expandable;
    w.bytes = s.total_size;
    if (w.bytes == 0 || w.bytes % kWarmUnit != 0 || w.bytes > kMaxWarmSegmentBytes) continue;
    if (s.blocks.size() > 1 && s.blocks.size() <= kMaxWarmSplit)
      for (const BlockInfo& b : s.blocks) w.split.push_back(b.size);
    plan->segments.push_back(std::move(w));
  }
  return true;
}

// The policy the recorded pool ran under, unless --conf names another (the plan is for a run
// under that policy), into cfg->pool. false after printing why it is invalid.
bool plan_policy(const PlanCliOptions& o, const TraceFacts& facts, std::string* conf, ReplayConfig* cfg) {
  *conf = o.conf_given ? o.conf : facts.recorded_policy.value_or("");
  Policy policy;
  std::string err;
  if (!policy_from_conf(*conf, &policy, &err)) {
    print_error("cudapool plan: invalid policy '%s'%s: %s\n", conf->c_str(),
                o.conf_given ? "" : " (the trace's policy row; override it with --conf)", err.c_str());
    return false;
  }
  cfg->pool = policy.pool;
  return true;
}

// Each device's segments at its replay's peak into *plan, a line each on `say`. 0, or the exit
// status after printing why.
int plan_devices(const PlanCliOptions& o, const LoadedTrace& loaded, const ReplayConfig& cfg, FILE* say,
                 WarmPlan* plan) {
  const char* who = "cudapool plan";
  const TraceFacts& first = loaded.prepared.facts;
  std::vector<int> devices{first.device};
  devices.insert(devices.end(), first.other_devices.begin(), first.other_devices.end());
  std::sort(devices.begin(), devices.end());
  for (int dev : devices) {
    const PreparedTrace prepared = dev == first.device ? loaded.prepared : prepare_trace(loaded.rows, dev);
    if (prepared.ops.empty()) continue;  // a device with no allocation needs nothing
    std::size_t replayed = 0;
    const std::size_t before = plan->segments.size();
    if (!plan_device(prepared, cfg, plan, &replayed)) {
      print_error("%s: the replay of device %d took no snapshot\n", who, dev);
      return kExitBadInput;
    }
    std::size_t bytes = 0;
    for (std::size_t i = before; i < plan->segments.size(); ++i) bytes += plan->segments[i].bytes;
    if (!o.quiet) {
      std::fprintf(say, "device %d: %zu segments, %s at the peak", dev, plan->segments.size() - before,
                   format_bytes(static_cast<double>(bytes)).c_str());
      const auto& recorded = prepared.facts.recorded_peak_reserved;
      if (recorded)
        std::fprintf(say, " (recorded peak reserved %s)", format_bytes(static_cast<double>(*recorded)).c_str());
      std::fprintf(say, "\n");
    }
    if (plan->segments.size() > kMaxWarmSegments) {
      print_error("%s: more than %zu segments at the peak: more than a plan may hold\n", who, kMaxWarmSegments);
      return kExitBadInput;
    }
  }
  return 0;
}

// Replays the trace and writes the segments held at the peak as a warm-start plan.
int run_plan(const PlanCliOptions& o, ReplayConfig cfg) {
  const char* who = "cudapool plan";
  // The summary goes to stderr when the plan itself goes to stdout: nothing but the plan may be
  // in a file made with `-o - > PLAN`.
  FILE* say = o.output == "-" ? stderr : stdout;
  LoadedTrace loaded;
  if (int rc = load_trace(o.trace, -1, &loaded, who, o.max_rows); rc != 0) return rc;
  std::string conf;
  if (!plan_policy(o, loaded.prepared.facts, &conf, &cfg)) return kPolicyErrorExitStatus;
  WarmPlan plan;
  plan.source = "cudapool plan of " + o.trace + " under " + (conf.empty() ? std::string("the defaults") : conf);
  if (plan.source.size() > 1024) plan.source.resize(1024);
  if (int rc = plan_devices(o, loaded, cfg, say, &plan); rc != 0) return rc;
  if (plan.segments.empty()) {
    print_error("%s: %s: the replay holds no segment at its peak (no allocation in the trace)\n", who, o.trace.c_str());
    return kExitBadInput;
  }
  const std::string text = format_warm_plan(plan);
  if (o.output == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  if (!write_text_file(o.output, text, who)) return kExitNoInput;
  if (!o.quiet)
    std::printf("plan written to %s; run with CUDAPOOL_CONF=warm_start:%s\n", o.output.c_str(), o.output.c_str());
  return 0;
}

int plan_main(const PlanCliOptions& o) {
  if (!output_option_ok(o.output, "-o", "cudapool plan")) return kExitNoInput;
  ReplayConfig cfg;
  if (!device_memory_option(o.device_memory, &cfg.device_memory, "cudapool plan")) return kExitUsage;
  return run_plan(o, std::move(cfg));
}

}  // namespace

void add_plan_command(CLI::App& root, int* exit_status) {
  auto o = std::make_shared<PlanCliOptions>();
  CLI::App* sub = root.add_subcommand("plan",
                                      "write a warm-start plan: the segments a trace's run held at its peak, for the "
                                      "policy key warm_start");
  sub->add_option("trace", o->trace, "cudapool trace CSV (trace_file)")->required();
  sub->add_option("-o,--output", o->output, "where the plan goes ('-': stdout, with the summary on stderr)")
      ->required();
  sub->add_option("--conf", o->conf, "replay under this policy (default: the trace's recorded policy)")
      ->each([o](const std::string&) { o->conf_given = true; });
  sub->add_option("--device-memory", o->device_memory, "simulated device size, e.g. 80GiB (default: recorded)");
  sub->add_flag("--quiet", o->quiet, "print nothing but errors");
  sub->add_option("--max-rows", o->max_rows, kMaxRowsHelp)->check(CLI::PositiveNumber);
  sub->callback([o, exit_status] { *exit_status = plan_main(*o); });
}

}  // namespace cudapool::tools
