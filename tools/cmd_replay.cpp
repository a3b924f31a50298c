// `cudapool replay TRACE [--conf S …] [--sweep key=v1,v2,…] [--device-memory SIZE] …`
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "config/policy.h"
#include "telemetry/summary.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/compare.h"
#include "tools/fidelity.h"
#include "tools/json_text.h"
#include "tools/metrics.h"
#include "tools/policies.h"
#include "tools/replay.h"
#include "tools/trace_input.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

struct ReplayCliOptions {
  std::string trace;
  std::vector<std::string> confs;
  std::string sweep;
  std::string device_memory;
  FreeReplayOptions frees;
  int device = -1;
  std::string stats;
  std::string json;
  bool quiet = false;
  bool check = false;
  std::uint64_t max_rows = kDefaultMaxTraceRows;
};

// One policy's figures as JSON numbers (the table's rows, in bytes, counts and fractions).
std::string policy_json(const std::string& name, const std::string& conf, const Metrics& m, const ReplayResult& r) {
  const auto& defs = metric_defs();
  std::string o = "{\"name\": " + json_string(name) + ", \"conf\": " + json_string(conf);
  for (std::size_t i = 0; i < defs.size() && i < m.values.size(); ++i)
    if (m.values[i]) o += ", " + json_string(defs[i].key) + ": " + json_number(*m.values[i]);
  o += ", \"failed_allocations\": " + std::to_string(r.failed_allocations) +
       ", \"fence_waits\": " + std::to_string(r.stats.fence_waits) +
       ", \"reserved_in_all_bytes\": " + std::to_string(r.stats.reserved_bytes[kAll].allocated) +
       ", \"vmm_handle_ops\": " + std::to_string(r.unit_ops) +
       ", \"device_memory_bytes\": " + std::to_string(r.device_memory) + "}";
  return o;
}

std::string fidelity_json(const TraceFacts& f, const Fidelity& fid, const ReplayResult* under) {
  if (!fid.compared) return "{\"compared\": false, \"tolerance\": " + json_number(kFidelityTolerance) + "}";
  return "{\"compared\": true, \"within\": " + std::string(fid.within ? "true" : "false") +
         ", \"gap\": " + json_number(fid.gap) + ", \"tolerance\": " + json_number(kFidelityTolerance) +
         ", \"recorded_peak_reserved_bytes\": " + std::to_string(f.recorded_peak_reserved.value_or(0)) +
         ", \"replayed_peak_reserved_bytes\": " + std::to_string(under->stats.reserved_bytes[kAll].peak) + "}";
}

// The policies replayed, one column each, and the base they start from.
struct ReplayPolicies {
  std::vector<NamedConf> named;
  std::vector<Policy> parsed;  // named[i]'s policy
  BasePolicy base;
};

// The policies' replays, one a policy, in column order.
struct ReplayRuns {
  std::vector<std::string> names;
  std::vector<Metrics> results;
  std::vector<ReplayResult> raw;
  double seconds = 0;
  std::size_t ops = 0;
};

// The replay under the trace's own policy against its recorded peak. `match` is the column that
// is that policy, else `extra` (one more replay), else null.
struct ReplayFidelity {
  Fidelity fid;
  ReplayResult extra;
  const ReplayResult* match = nullptr;
};

// Each --conf given is a valid policy (false after printing why).
bool given_confs_valid(const std::vector<NamedConf>& policies) {
  for (const auto& p : policies) {
    Policy check;
    std::string err;
    if (!policy_from_conf(p.conf, &check, &err)) {
      print_error("cudapool replay: invalid policy '%s': %s\n", p.conf.c_str(), err.c_str());
      return false;
    }
  }
  return true;
}

// A swept value is checked alone first, so that its error names --sweep, not the base.
bool swept_value_valid(const NamedConf& policy) {
  const std::string one = policy.name.substr(0, policy.name.find('=')) + ":" +
                          policy.name.substr(policy.name.find('=') + 1);
  PolicyResult alone = parse_conf(one, Policy{}, "--sweep");
  if (!alone.policy) {
    print_error("cudapool replay: invalid --sweep value '%s': %s\n", policy.name.c_str(), alone.error.c_str());
    return false;
  }
  return true;
}

// The columns: --conf as given; a sweep over the first (or the base); with neither, the base:
// $CUDAPOOL_CONF when set (a replay stands in for a program under the library, as `ab
// --no-preload` runs it), else the policy the trace records, else the defaults. 0, or the exit
// status after printing why.
int resolve_replay_policies(const ReplayCliOptions& o, const TraceFacts& facts, ReplayPolicies* out) {
  std::vector<NamedConf>& policies = out->named;
  out->base = choose_base_policy(facts, policies.empty() ? std::nullopt : std::optional(policies.front().conf));
  const BasePolicy& base = out->base;
  if (policies.empty()) policies.push_back({base.conf.empty() ? "defaults" : base.conf, base.conf});
  if (!o.sweep.empty()) {
    // The base stays as the first column, the reference each swept value is read against.
    std::string sweep_base = policies.front().conf;
    policies.resize(1);
    std::string err;
    if (!expand_sweep(sweep_base, o.sweep, &policies, &err)) {
      print_error("cudapool replay: %s\n", err.c_str());
      return kExitUsage;
    }
  }
  out->parsed.resize(policies.size());
  for (std::size_t i = 0; i < policies.size(); ++i) {
    std::string err;
    if (!o.sweep.empty() && i > 0 && !swept_value_valid(policies[i])) return kPolicyErrorExitStatus;
    if (!policy_from_conf(policies[i].conf, &out->parsed[i], &err)) {
      const bool recorded = i == 0 && base.recorded && o.confs.empty();
      print_error("cudapool replay: invalid policy '%s'%s: %s\n", policies[i].conf.c_str(),
                  recorded ? " (the trace's policy row; override it with --conf)" : "", err.c_str());
      return kPolicyErrorExitStatus;
    }
  }
  return 0;
}

void print_replay_header(const ReplayCliOptions& o, const LoadedTrace& loaded, const BasePolicy& base) {
  print_trace_facts(o.trace, loaded);
  if (o.confs.empty())
    std::printf("policy: %s (%s)\n", base.conf.empty() ? "the defaults" : base.conf.c_str(), base.origin.c_str());
  std::printf("%s\n", describe_frees(loaded.prepared.facts, o.frees.mode()).c_str());
}

ReplayRuns replay_policies(const LoadedTrace& loaded, const ReplayConfig& base_cfg, const ReplayPolicies& policies,
                           Progress* progress) {
  ReplayRuns runs;
  for (std::size_t i = 0; i < policies.named.size(); ++i) {
    ReplayConfig cfg = base_cfg;
    cfg.pool = policies.parsed[i].pool;
    runs.raw.push_back(replay_trace(loaded.prepared, cfg));
    progress->step();
    runs.seconds += runs.raw.back().seconds;
    runs.ops += runs.raw.back().ops;
    runs.names.push_back(policies.named[i].name);
    runs.results.push_back(metrics_from_stats(runs.raw.back().stats, std::nullopt));
    // Simulated time is not GPU time: leave the upstream-time row out rather than mislead.
    runs.results.back().values[5].reset();
  }
  return runs;
}

// Does a replay under the trace's own policy give back its recorded peak? Compared with the
// column that is that policy, else with one more replay; the fidelity line printed.
void check_replay_fidelity(const ReplayCliOptions& o, const LoadedTrace& loaded, const ReplayConfig& base_cfg,
                           const ReplayPolicies& policies, const ReplayRuns& runs, ReplayFidelity* out) {
  const TraceFacts& facts = loaded.prepared.facts;
  BasePolicy under = facts.recorded_policy ? BasePolicy{*facts.recorded_policy, "the trace's policy row", true}
                                           : BasePolicy{policies.named.front().conf, "", false};
  const std::string want = canonical_conf(under.conf);
  for (std::size_t i = 0; i < policies.named.size() && !out->match; ++i)
    if (canonical_conf(policies.named[i].conf) == want) out->match = &runs.raw[i];
  ReplayConfig cfg = base_cfg;
  std::string err;
  const bool under_ok = pool_options_from_conf(under.conf, &cfg.pool, &err);
  if (!out->match && under_ok) {
    out->extra = replay_trace(loaded.prepared, cfg);
    out->match = &out->extra;
  }
  if (!out->match) return;
  out->fid = check_fidelity(facts, under, *out->match, o.frees.mode(), o.frees.fence_latency_us);
  const std::string advice = under_ok ? fidelity_advice(loaded.prepared, cfg, out->fid) : "";
  if ((!o.quiet || o.check) && o.json != "-")
    std::printf("%s\n%s", out->fid.line.c_str(), advice.empty() ? "" : (advice + "\n").c_str());
}

// --check's ending: its JSON, and 1 when the replay is not within the tolerance.
int finish_replay_check(const ReplayCliOptions& o, const TraceFacts& facts, const ReplayFidelity& fidelity) {
  if (!o.json.empty()) {
    const std::string j = "{\n  \"trace\": " + json_string(o.trace) +
                          ",\n  \"fidelity\": " + fidelity_json(facts, fidelity.fid, fidelity.match) + "\n}\n";
    if (!emit_json(o.json, j, "cudapool replay")) return kExitNoInput;
  }
  return fidelity.fid.compared && !fidelity.fid.within ? kExitFailedRuns : 0;
}

Table replay_table(const ReplayRuns& runs) {
  Table t = policy_table(runs.names, runs.results);
  // The figures are this pool's on a simulated device, not the recording's (`cudapool report`).
  t.header.front() = "replayed";
  std::vector<std::string> fails{"failed allocations"}, served{"device memory"};
  // What the pool did to get its peak: host waits on fences, and every byte it ever reserved
  // (segments and mapped pages; a recycled page counts again where it is mapped anew).
  // And, with expandable segments, the driver's work: physical allocations created, moved and
  // released, each ~40-50 us on an H200 whatever its size (docs/benchmarks.md).
  std::vector<std::string> waits{"fence waits"}, mapped{"reserved in all"}, units{"VMM handle ops"};
  for (const auto& r : runs.raw) {
    units.push_back(std::to_string(r.unit_ops));
    fails.push_back(std::to_string(r.failed_allocations));
    served.push_back(format_bytes(static_cast<double>(r.device_memory)));
    waits.push_back(std::to_string(r.stats.fence_waits));
    mapped.push_back(format_bytes(static_cast<double>(r.stats.reserved_bytes[kAll].allocated)));
  }
  t.add(fails);
  t.add(waits);
  t.add(mapped);
  t.add(units);
  t.add(served);
  return t;
}

bool write_replay_json(const ReplayCliOptions& o, const TraceFacts& facts, const ReplayPolicies& policies,
                       const ReplayRuns& runs, const ReplayFidelity& fidelity) {
  std::string j = "{\n  \"trace\": " + json_string(o.trace) + ",\n  \"figures\": \"replayed\",\n  \"policies\": [";
  for (std::size_t i = 0; i < runs.raw.size(); ++i)
    j += std::string(i ? ",\n    " : "\n    ") +
         policy_json(runs.names[i], policies.named[i].conf, runs.results[i], runs.raw[i]);
  j += "\n  ],\n  \"fidelity\": " + fidelity_json(facts, fidelity.fid, fidelity.match) + "\n}\n";
  return emit_json(o.json, j, "cudapool replay");
}

void print_replay_speed(const LoadedTrace& loaded, const ReplayRuns& runs) {
  std::printf(
      "replayed %zu events x %zu policies in %s (%.2f M events/s); reading the trace took %s "
      "(%.2f M rows/s), preparing it %s\n",
      loaded.prepared.ops.size(), runs.raw.size(), format_seconds(runs.seconds).c_str(),
      runs.seconds > 0 ? static_cast<double>(runs.ops) / runs.seconds / 1e6 : 0.0,
      format_seconds(loaded.parse_seconds).c_str(),
      loaded.parse_seconds > 0 ? static_cast<double>(loaded.rows.size()) / loaded.parse_seconds / 1e6 : 0.0,
      format_seconds(loaded.prepare_seconds).c_str());
}

// A summary file (--stats, or the policy's stats_file as `cudapool ab` sets it) makes a replay
// usable as the program under `cudapool ab --no-preload`. false after printing why it failed.
bool write_replay_stats(const ReplayCliOptions& o, const LoadedTrace& loaded, const ReplayPolicies& policies,
                        const ReplayRuns& runs) {
  std::string stats_path = o.stats.empty() ? policies.parsed.front().stats_file : o.stats;
  if (stats_path.empty()) return true;
  Summary s;
  s.command = "cudapool replay " + o.trace;
  s.policy = policies.named.front().conf;
  s.backend = "native";
  s.wall_time_s = runs.raw.front().seconds;
  s.exit_status = 0;
  DeviceSummary d;
  d.device = loaded.prepared.facts.device;
  d.stats = runs.raw.front().stats;
  d.driver_total_bytes = runs.raw.front().device_memory;
  s.devices.push_back(d);
  if (std::string err = write_summary_file(stats_path, s); !err.empty()) {
    print_error("cudapool replay: %s\n", err.c_str());
    return false;
  }
  return true;
}

// Replays the trace under each policy and prints the table (or only the fidelity check).
int run_replay(const ReplayCliOptions& o, const ReplayConfig& base_cfg, ReplayPolicies policies) {
  LoadedTrace loaded;
  if (int rc = load_trace(o.trace, o.device, &loaded, "cudapool replay", o.max_rows); rc != 0) return rc;
  const TraceFacts& facts = loaded.prepared.facts;
  if (int rc = resolve_replay_policies(o, facts, &policies); rc != 0) return rc;
  if (!o.quiet) print_replay_header(o, loaded, policies.base);
  Progress progress("cudapool replay", policies.named.size() > 1 ? policies.named.size() : 0, "policies");
  const ReplayRuns runs = replay_policies(loaded, base_cfg, policies, &progress);
  ReplayFidelity fidelity;
  check_replay_fidelity(o, loaded, base_cfg, policies, runs, &fidelity);
  if (o.check) return finish_replay_check(o, facts, fidelity);
  const Table t = replay_table(runs);
  progress.done();
  if (!o.quiet)
    std::printf(
        "figures replayed: this version of the pool on a simulated device; the recording's own: `cudapool report "
        "TRACE`\n");
  if (o.json != "-") std::printf("%s", t.to_text().c_str());
  if (!o.json.empty() && !write_replay_json(o, facts, policies, runs, fidelity)) return kExitNoInput;
  if (!o.quiet) print_replay_speed(loaded, runs);
  for (const auto& r : runs.raw)
    if (r.bad_frees) std::fprintf(stderr, "cudapool replay: warning: the pool refused %zu frees\n", r.bad_frees);
  return write_replay_stats(o, loaded, policies, runs) ? 0 : kExitNoInput;
}

int replay_main(const ReplayCliOptions& in) {
  ReplayCliOptions o = in;
  if (o.json == "-") o.quiet = true;  // the JSON alone on stdout
  if (o.check && (!o.sweep.empty() || o.confs.size() > 1)) {
    print_error(
        "cudapool replay: --check compares the recorded policy's replay with the recording; give no --sweep "
        "and at most one --conf\n");
    return kExitUsage;
  }
  if (!output_option_ok(o.json, "--json", "cudapool replay") ||
      !output_option_ok(o.stats, "--stats", "cudapool replay"))
    return kExitNoInput;
  ReplayConfig base_cfg;
  if (!device_memory_option(o.device_memory, &base_cfg.device_memory, "cudapool replay")) return kExitUsage;
  o.frees.apply(&base_cfg);
  ReplayPolicies policies;
  for (const auto& c : o.confs) policies.named.push_back({c.empty() ? "defaults" : c, c});
  if (!o.sweep.empty() && policies.named.size() > 1) {
    print_error("cudapool replay: --sweep takes at most one --conf (its base)\n");
    return kExitUsage;
  }
  if (!given_confs_valid(policies.named)) return kPolicyErrorExitStatus;
  return run_replay(o, base_cfg, std::move(policies));
}

}  // namespace

void add_replay_command(CLI::App& root, int* exit_status) {
  auto o = std::make_shared<ReplayCliOptions>();
  CLI::App* sub = root.add_subcommand("replay", "replay a trace through the pool on a simulated device (no GPU)");
  sub->add_option("trace", o->trace, "cudapool trace CSV or plain RMM log")->required();
  sub->add_option("--conf", o->confs,
                  "policy string; repeat for a side-by-side table (default: $CUDAPOOL_CONF if set, else the trace's "
                  "recorded policy, else the defaults)")
      ->allow_extra_args(false);
  sub->add_option("--sweep", o->sweep,
                  "key=v1,v2,...: one column per value over the --conf given, else the default policy (shown first)");
  sub->add_option("--device-memory", o->device_memory, "simulated device size, e.g. 80GiB (default: recorded)");
  o->frees.add_to(sub);
  sub->add_option("--device", o->device, "device to replay (default: the busiest)");
  sub->add_option("--stats", o->stats, "write the first policy's JSON summary here (default: its stats_file)");
  sub->add_flag("--quiet", o->quiet, "print only the table");
  sub->add_option("--max-rows", o->max_rows, kMaxRowsHelp)->check(CLI::PositiveNumber);
  sub->add_flag("--check", o->check,
                "only compare a replay under the recorded policy with the recorded peak reserved: print the "
                "fidelity line, exit 1 when it is not within 3 %");
  sub->add_option("--json", o->json,
                  "also write each policy's figures (numbers) and the fidelity check as JSON here ('-': print only "
                  "the JSON)");
  sub->callback([o, exit_status] { *exit_status = replay_main(*o); });
}

}  // namespace cudapool::tools
