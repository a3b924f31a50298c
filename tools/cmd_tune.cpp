// `cudapool tune TRACE [--conf BASE] [--budget N] [--bound X] [--device-memory SIZE]
//  [--free-as recorded|async|sync] [--fence-latency-us X] [--top N]`
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>

#include "config/policy.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/fidelity.h"
#include "tools/json_text.h"
#include "tools/metrics.h"
#include "tools/policies.h"
#include "tools/table.h"
#include "tools/trace_input.h"
#include "tools/tune.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

struct TuneCliOptions {
  std::string trace;
  std::optional<std::string> conf;
  int budget = 60;
  double bound = 1.5;
  std::string device_memory;
  FreeReplayOptions frees;
  int top = 15;
  std::string json;
  std::uint64_t max_rows = kDefaultMaxTraceRows;
};

// A line of text on stdout, unless --json - makes the JSON all of stdout.
struct Say {
  bool text;
  void operator()(const std::string& line) const {
    if (text) std::printf("%s\n", line.c_str());
  }
};

// The search's base: --conf, else as choose_base_policy says, without the keys that name a file
// a run writes (*file_keys); printed. 0, or the exit status after printing why it is invalid.
int resolve_tune_base(const TuneCliOptions& o, const TraceFacts& facts, const Say& say, BasePolicy* base,
                      std::vector<std::string>* file_keys) {
  *base = choose_base_policy(facts, o.conf);
  // The search and the recommendation are about the pool: keys that name a file a run writes
  // (from $CUDAPOOL_CONF or --conf; a trace's own are dropped when it is read) stay out of both.
  base->conf = without_output_files(base->conf, file_keys);
  Policy p;
  std::string err;
  if (!policy_from_conf(base->conf, &p, &err)) {
    print_error("cudapool tune: invalid base policy '%s' (%s; give another with --conf): %s\n", base->conf.c_str(),
                base->origin.c_str(), err.c_str());
    return kPolicyErrorExitStatus;
  }
  say("base policy: " + (base->conf.empty() ? std::string("the defaults") : base->conf) + " (" + base->origin + ")");
  if (!file_keys->empty()) {
    std::string names;
    for (const auto& k : *file_keys) names += (names.empty() ? "" : ", ") + k;
    say("left out of the base and the recommendation: " + names + " (a file a run writes; set it for each run)");
  }
  return 0;
}

// Fidelity: against the base's replay when the base is the recorded policy, else one more. Its
// gap is the replay error (nullopt: unknown): a change that saves less is not told from the
// replay's own error. The fidelity line and advice printed.
std::optional<double> tune_replay_error(const TuneCliOptions& o, const LoadedTrace& loaded, const TuneConfig& cfg,
                                        const BasePolicy& base, const TuneResult& result, const Say& say) {
  const TraceFacts& facts = loaded.prepared.facts;
  const FreeMode mode = o.frees.mode();
  Fidelity fid;
  const Candidate& def = result.ranked[result.default_index];
  BasePolicy under = facts.recorded_policy ? BasePolicy{*facts.recorded_policy, "", true} : base;
  ReplayConfig rc = cfg.replay;
  std::string err;
  const bool under_ok = pool_options_from_conf(under.conf, &rc.pool, &err);
  if (under.recorded && !base.recorded) {
    if (under_ok) fid = check_fidelity(facts, under, replay_trace(loaded.prepared, rc), mode, o.frees.fence_latency_us);
  } else {
    fid = check_fidelity(facts, under, def.result, mode, o.frees.fence_latency_us);
  }
  if (!fid.line.empty()) say(fid.line);
  if (under_ok) {
    const std::string advice = fidelity_advice(loaded.prepared, rc, fid);
    if (!advice.empty()) say(advice);
  }
  return fid.compared ? std::optional<double>(std::fabs(fid.gap)) : std::nullopt;
}

// What a recommended change must save: more than the replay error, at least the minimum saving.
void print_tune_thresholds(const TuneResult& result, const Say& say) {
  if (result.replay_error) {
    char b[200];
    std::snprintf(b, sizeof b, "replay error: %.1f %% of peak reserved; a change that saves less is not recommended",
                  *result.replay_error * 100.0);
    say(b);
  } else {
    say("replay error: unknown (the trace records no peak reserved to compare with); rank with care");
  }
  char b[300];
  std::snprintf(b, sizeof b,
                "minimum saving: %s (%.0f %% of the base's peak reserved, and at least %s); a change that saves "
                "less is not recommended",
                format_bytes(static_cast<double>(result.min_saving)).c_str(), kMinSavingFraction * 100.0,
                format_bytes(static_cast<double>(kMinSavingBytes)).c_str());
  say(b);
}

double base_peak(const TuneResult& result) {
  return static_cast<double>(result.ranked[result.default_index].result.stats.reserved_bytes[kAll].peak);
}

// The ranked candidates, the first `top`.
Table tune_table(const TuneResult& result, int top) {
  const double def_peak = base_peak(result);
  Table t;
  t.header = {"rank", "change from the base", "peak reserved", "vs base",     "upstream calls", "fragmentation",
              "OOMs", "within bound",         "beyond error",  "saves enough"};
  for (std::size_t i = 0; i < result.ranked.size() && static_cast<int>(i) < top; ++i) {
    const Candidate& c = result.ranked[i];
    const Stats& s = c.result.stats;
    double peak = static_cast<double>(s.reserved_bytes[kAll].peak);
    double alloc = static_cast<double>(s.allocated_bytes[kAll].peak);
    char vs[32], frag[32];
    std::snprintf(vs, sizeof vs, "%+.1f %%", def_peak > 0 ? (peak / def_peak - 1.0) * 100.0 : 0.0);
    std::snprintf(frag, sizeof frag, "%.1f %%", fragmentation(alloc, peak) * 100.0);
    t.add({std::to_string(i + 1), c.changes.empty() ? "(base)" : c.changes, format_bytes(peak), vs,
           std::to_string(upstream_calls(s)), frag, std::to_string(s.num_ooms), c.feasible ? "yes" : "no",
           c.beyond_error ? "yes" : "no", c.above_minimum ? "yes" : "no"});
  }
  return t;
}

// The table with its preamble, the reasons for the pick and the recommendation.
void print_tune_ranking(const TuneCliOptions& o, const TuneResult& result, const std::vector<std::string>& why,
                        const Say& say) {
  const Table t = tune_table(result, o.top);
  say("figures replayed: this version of the pool on a simulated device, not the recording's own (those: "
      "`cudapool report TRACE`)");
  if (say.text)
    std::printf(
        "%zu policies replayed (frees %s, fence latency %g us); bound: upstream calls + fence waits <= "
        "%.1f x the base's (%.0f), OOMs <= the base's\n",
        result.ranked.size(),
        o.frees.mode() == FreeMode::recorded ? "as recorded" : (std::string("as ") + o.frees.free_call()).c_str(),
        o.frees.fence_latency_us, o.bound, result.call_limit);
  if (say.text) std::printf("%s", t.to_text().c_str());
  for (const auto& line : why) say(line);
  const Candidate& best = result.ranked.front();
  if (best.changes.empty())
    say(std::string("recommended: the base policy") +
        (best.conf.empty() ? " (the defaults)" : ": CUDAPOOL_CONF=\"" + best.conf + "\"") +
        (result.replay_error ? " (no searched policy lowers peak reserved by more than the replay error and by the "
                               "minimum saving within the bound)"
                             : " (no searched policy lowers peak reserved by the minimum saving within the bound)"));
  else
    say("recommended: CUDAPOOL_CONF=\"" + best.conf + "\"");
}

std::string candidate_json(const Candidate& c, std::size_t rank, double def_peak) {
  const Stats& s = c.result.stats;
  const double peak = static_cast<double>(s.reserved_bytes[kAll].peak);
  return "{\"rank\": " + std::to_string(rank) + ", \"changes\": " + json_string(c.changes) +
         ", \"conf\": " + json_string(c.conf) +
         ", \"peak_reserved_bytes\": " + std::to_string(s.reserved_bytes[kAll].peak) +
         ", \"peak_allocated_bytes\": " + std::to_string(s.allocated_bytes[kAll].peak) +
         ", \"vs_base\": " + json_number(def_peak > 0 ? peak / def_peak - 1.0 : 0.0) +
         ", \"upstream_calls\": " + std::to_string(upstream_calls(s)) +
         ", \"fence_waits\": " + std::to_string(s.fence_waits) +
         ", \"fragmentation\": " + json_number(fragmentation(static_cast<double>(s.allocated_bytes[kAll].peak), peak)) +
         ", \"ooms\": " + std::to_string(s.num_ooms) + ", \"within_bound\": " + (c.feasible ? "true" : "false") +
         ", \"beyond_replay_error\": " + (c.beyond_error ? "true" : "false") +
         ", \"above_minimum_saving\": " + (c.above_minimum ? "true" : "false") + "}";
}

std::string tune_json(const TuneCliOptions& o, const BasePolicy& base, const std::vector<std::string>& file_keys,
                      const TuneResult& result, const std::vector<std::string>& why) {
  const Candidate& best = result.ranked.front();
  std::string j = "{\n  \"base\": " + json_string(base.conf) + ",\n  \"recommended\": " + json_string(best.conf) +
                  ",\n  \"changes\": " + json_string(best.changes) + ",\n  \"replay_error\": " +
                  (result.replay_error ? json_number(*result.replay_error) : std::string("null")) +
                  ",\n  \"min_saving_bytes\": " + std::to_string(result.min_saving) +
                  ",\n  \"figures\": \"replayed\",\n  \"left_out\": [";
  for (std::size_t i = 0; i < file_keys.size(); ++i) j += (i ? ", " : "") + json_string(file_keys[i]);
  j += "],\n  \"why\": [";
  for (std::size_t i = 0; i < why.size(); ++i) j += (i ? ", " : "") + json_string(why[i]);
  j += "],\n  \"candidates\": [";
  for (std::size_t i = 0; i < result.ranked.size() && static_cast<int>(i) < o.top; ++i)
    j += std::string(i ? ",\n    " : "\n    ") + candidate_json(result.ranked[i], i + 1, base_peak(result));
  return j + "\n  ]\n}\n";
}

// Searches the policy space from the base on the trace and prints the ranking and the pick.
int run_tune(const TuneCliOptions& o, TuneConfig cfg) {
  const Say say{o.json != "-"};
  LoadedTrace loaded;
  if (int rc = load_trace(o.trace, -1, &loaded, "cudapool tune", o.max_rows); rc != 0) return rc;
  const TraceFacts& facts = loaded.prepared.facts;
  if (say.text) print_trace_facts(o.trace, loaded);
  BasePolicy base;
  std::vector<std::string> file_keys;
  if (int rc = resolve_tune_base(o, facts, say, &base, &file_keys); rc != 0) return rc;
  cfg.base = base.conf;
  say(describe_frees(facts, o.frees.mode()));
  const FreeMode mode = o.frees.mode();
  const bool sync_frees = mode == FreeMode::sync || (mode == FreeMode::recorded && facts.sync_frees > 0);
  if (!sync_frees) say("free_sync not searched: no free replays as cudaFree, so it changes nothing");
  TuneResult result;
  std::string error;
  Progress progress("cudapool tune", static_cast<std::size_t>(o.budget), "replays (at most)");
  cfg.on_replay = [&progress] { progress.step(); };
  const bool tuned = tune(loaded.prepared, default_search_space(facts, sync_frees), cfg, &result, &error);
  progress.done();
  if (!tuned) {
    print_error("cudapool tune: %s\n", error.c_str());
    return kPolicyErrorExitStatus;
  }
  apply_replay_error(&result, tune_replay_error(o, loaded, cfg, base, result, say));
  apply_minimum_saving(&result);
  print_tune_thresholds(result, say);
  const std::vector<std::string> why = explain_pick(result);
  print_tune_ranking(o, result, why, say);
  if (!o.json.empty() && !emit_json(o.json, tune_json(o, base, file_keys, result, why), "cudapool tune"))
    return kExitNoInput;
  return 0;
}

int tune_main(const TuneCliOptions& o) {
  if (!output_option_ok(o.json, "--json", "cudapool tune")) return kExitNoInput;
  TuneConfig cfg;
  cfg.budget = o.budget;
  cfg.call_bound = o.bound;
  if (!device_memory_option(o.device_memory, &cfg.replay.device_memory, "cudapool tune")) return kExitUsage;
  if (o.conf) {
    Policy p;
    std::string err;
    if (!policy_from_conf(*o.conf, &p, &err)) {
      print_error("cudapool tune: invalid --conf '%s': %s\n", o.conf->c_str(), err.c_str());
      return kPolicyErrorExitStatus;
    }
  }
  // Frees replay as the trace records them unless --free-as says otherwise: a program that frees
  // with cudaFree (PyTorch without its cache, legacy code) is tuned against the wrong baseline
  // if its frees replay as cudaFreeAsync.
  o.frees.apply(&cfg.replay);
  return run_tune(o, std::move(cfg));
}

}  // namespace

void add_tune_command(CLI::App& root, int* exit_status) {
  auto o = std::make_shared<TuneCliOptions>();
  CLI::App* sub = root.add_subcommand("tune", "search policies on a trace; recommend a CUDAPOOL_CONF");
  sub->add_option("trace", o->trace, "cudapool trace CSV or plain RMM log")->required();
  sub->add_option("--conf", o->conf,
                  "base policy the search starts from and compares against (default: $CUDAPOOL_CONF if set, "
                  "else the trace's recorded policy, else the defaults)");
  sub->add_option("--budget", o->budget, "replays at most")->check(CLI::Range(1, 100000));
  sub->add_option("--bound", o->bound, "upstream calls + fence waits allowed, as a multiple of the base's")
      ->check(CLI::Range(1.0, 1000.0));
  sub->add_option("--device-memory", o->device_memory, "simulated device size, e.g. 80GiB (default: recorded)");
  o->frees.add_to(sub);
  sub->add_option("--top", o->top, "rows of the ranked table")->check(CLI::Range(1, 100000));
  sub->add_option("--max-rows", o->max_rows, kMaxRowsHelp)->check(CLI::PositiveNumber);
  sub->add_option("--json", o->json,
                  "also write the pick, the why and the table as JSON here ('-': print only the JSON)");
  sub->callback([o, exit_status] { *exit_status = tune_main(*o); });
}

}  // namespace cudapool::tools
