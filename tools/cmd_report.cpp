// `cudapool report TRACE [-o out.html] [--perfetto out.json] [--conf S]`
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "config/policy.h"
#include "tools/analysis.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/policies.h"
#include "tools/render.h"
#include "tools/trace_input.h"

namespace cudapool::tools {

namespace {

struct ReportOptions {
  std::string trace, html, perfetto, conf;
  bool replay = false;
};

int report_main(const ReportOptions& o) {
  LoadedTrace loaded;
  if (int rc = load_trace(o.trace, -1, &loaded, "cudapool report"); rc != 0) return rc;
  const TraceFacts& f = loaded.prepared.facts;
  ReportContext ctx;
  ctx.title = o.trace;
  const std::vector<TraceRow>* rows = &loaded.rows;
  ReplayResult replayed;
  // A plain allocation log has no segments: replay it to show what the pool would reserve.
  if (f.rmm_only || o.replay || !o.conf.empty()) {
    ReplayConfig cfg;
    std::string err;
    if (!pool_options_from_conf(o.conf, &cfg.pool, &err)) {
      std::fprintf(stderr, "cudapool report: invalid policy '%s': %s\n", o.conf.c_str(), err.c_str());
      return kPolicyErrorExitStatus;
    }
    cfg.collect_rows = true;
    replayed = replay_trace(loaded.prepared, cfg);
    rows = &replayed.rows;
    ctx.source_note = "segments from a replay under " + (o.conf.empty() ? std::string("the default policy") : o.conf) +
                      (f.rmm_only ? " (the trace records allocations only)" : "");
    ctx.device_memory = replayed.device_memory == kUnknownDeviceMemory ? 0 : replayed.device_memory;
  } else {
    ctx.device_memory = f.device_memory.value_or(0);
  }
  TraceReport rep = analyze_rows(*rows, f.device);
  std::printf("%s", render_text_summary(rep, ctx).c_str());
  bool ok = true;
  if (!o.html.empty() && (ok &= write_text_file(o.html, render_html(rep, ctx), "cudapool report"))) std::printf("wrote %s\n", o.html.c_str());
  if (!o.perfetto.empty() && (ok &= write_text_file(o.perfetto, render_perfetto(rep, *rows), "cudapool report")))
    std::printf("wrote %s (open in ui.perfetto.dev or chrome://tracing)\n", o.perfetto.c_str());
  return ok ? 0 : kExitNoInput;
}

}  // namespace

void add_report_command(CLI::App& root, int* exit_status) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* sub = root.add_subcommand("report", "summarize a trace; write an HTML page and Perfetto JSON");
  sub->add_option("trace", o->trace, "cudapool trace CSV or plain RMM log")->required();
  sub->add_option("-o,--output", o->html, "write a self-contained HTML report here");
  sub->add_option("--perfetto", o->perfetto, "write Chrome/Perfetto trace-event JSON here");
  sub->add_option("--conf", o->conf, "replay under this policy and report the replay");
  sub->add_flag("--replay", o->replay, "report a replay under the defaults instead of the recorded pool");
  sub->callback([o, exit_status] { *exit_status = report_main(*o); });
}

}  // namespace cudapool::tools
