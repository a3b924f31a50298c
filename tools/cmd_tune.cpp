// `cudapool tune TRACE [--budget N] [--bound X] [--device-memory SIZE] [--free-as async|sync]
//  [--fence-latency-us X] [--top N]`
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/table.h"
#include "tools/trace_input.h"
#include "tools/tune.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

struct TuneCliOptions {
  std::string trace;
  int budget = 40;
  double bound = 1.5;
  std::string device_memory;
  FreeReplayOptions frees;
  int top = 15;
};

int tune_main(const TuneCliOptions& o) {
  TuneConfig cfg;
  cfg.budget = o.budget;
  cfg.call_bound = o.bound;
  if (!device_memory_option(o.device_memory, &cfg.replay.device_memory, "cudapool tune")) return kExitUsage;
  // As for replay: a program that frees with cudaFree (PyTorch without its cache, legacy code) is
  // tuned against the wrong baseline unless its frees replay as cudaFree.
  o.frees.apply(&cfg.replay);
  LoadedTrace loaded;
  if (int rc = load_trace(o.trace, -1, &loaded, "cudapool tune"); rc != 0) return rc;
  print_trace_facts(o.trace, loaded);

  TuneResult result;
  std::string error;
  if (!tune(loaded.prepared, default_search_space(loaded.prepared.facts), cfg, &result, &error)) {
    std::fprintf(stderr, "cudapool tune: %s\n", error.c_str());
    return 70;  // EX_SOFTWARE: the search space produced a string config/ rejects
  }
  const Candidate& def = result.ranked[result.default_index];
  double def_peak = static_cast<double>(def.result.stats.reserved_bytes[kAll].peak);
  Table t;
  t.header = {"rank", "policy", "peak reserved", "vs default", "upstream calls", "fragmentation", "OOMs", "within bound"};
  for (std::size_t i = 0; i < result.ranked.size() && static_cast<int>(i) < o.top; ++i) {
    const Candidate& c = result.ranked[i];
    const Stats& s = c.result.stats;
    double peak = static_cast<double>(s.reserved_bytes[kAll].peak);
    double alloc = static_cast<double>(s.allocated_bytes[kAll].peak);
    char vs[32], frag[32];
    std::snprintf(vs, sizeof vs, "%+.1f %%", def_peak > 0 ? (peak / def_peak - 1.0) * 100.0 : 0.0);
    std::snprintf(frag, sizeof frag, "%.1f %%", peak > 0 ? (1.0 - alloc / peak) * 100.0 : 0.0);
    t.add({std::to_string(i + 1), c.conf.empty() ? "(defaults)" : c.conf, format_bytes(peak), vs,
           std::to_string(c.result.upstream_calls), frag, std::to_string(s.num_ooms),
           c.feasible ? "yes" : "no"});
  }
  std::printf("%zu policies replayed (frees as %s, fence latency %g us); bound: upstream calls <= %.1f x the "
              "defaults' (%.0f), OOMs <= the defaults'\n",
              result.ranked.size(), o.frees.free_call(), o.frees.fence_latency_us, o.bound,
              result.call_limit);
  std::printf("%s", t.to_text().c_str());
  const Candidate& best = result.ranked.front();
  if (best.conf.empty())
    std::printf("recommended: the defaults (no searched policy lowers peak reserved within the bound)\n");
  else
    std::printf("recommended: CUDAPOOL_CONF=\"%s\"\n", best.conf.c_str());
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& root, int* exit_status) {
  auto o = std::make_shared<TuneCliOptions>();
  CLI::App* sub = root.add_subcommand("tune", "search policies on a trace; recommend a CUDAPOOL_CONF");
  sub->add_option("trace", o->trace, "cudapool trace CSV or plain RMM log")->required();
  sub->add_option("--budget", o->budget, "replays at most")->check(CLI::Range(1, 100000));
  sub->add_option("--bound", o->bound, "upstream calls allowed, as a multiple of the defaults'")
      ->check(CLI::Range(1.0, 1000.0));
  sub->add_option("--device-memory", o->device_memory, "simulated device size (default: recorded)");
  o->frees.add_to(sub);
  sub->add_option("--top", o->top, "rows of the ranked table")->check(CLI::Range(1, 100000));
  sub->callback([o, exit_status] { *exit_status = tune_main(*o); });
}

}  // namespace cudapool::tools
