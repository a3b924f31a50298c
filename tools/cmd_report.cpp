// `cudapool report TRACE [-o out.html] [--perfetto out.json] [--conf S | --replay] [--snapshot F [--at S]]`
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include <optional>
#include "config/policy.h"
#include "tools/analysis.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/fidelity.h"
#include "tools/json_text.h"
#include "tools/metrics.h"
#include "tools/policies.h"
#include "tools/render.h"
#include "tools/snapshot.h"
#include "tools/trace_input.h"

namespace cudapool::tools {

namespace {

struct ReportOptions {
  std::string trace, html, perfetto, conf, snapshot, json;
  std::optional<double> at_s;
  bool replay = false;
  FreeReplayOptions frees;  // how a replay (--conf, --replay, --snapshot) plays the frees
  std::uint64_t max_rows = kDefaultMaxTraceRows;
};

std::string report_json(const TraceReport& r, const std::string& trace, const ReportContext& c) {
  const std::string& note = c.source_note;
  const double unused = unused_at_snapshot(r);
  auto n = [](double v) { return json_number(v); };
  std::string o = "{\n  \"trace\": " + json_string(trace) +
                  ",\n  \"figures\": " + json_string(c.replayed ? "replayed" : "recorded") +
                  ",\n  \"source\": " + json_string(note.empty() ? "the trace" : note);
  o += ",\n  \"device\": " + std::to_string(r.device) +
       ",\n  \"duration_s\": " + n(static_cast<double>(r.duration_ns) * 1e-9);
  o += ",\n  \"allocations\": " + std::to_string(r.allocations) + ",\n  \"frees\": " + std::to_string(r.frees);
  o += ",\n  \"peak_allocated_bytes\": " + std::to_string(r.peak_allocated);
  o += ",\n  \"peak_reserved_bytes\": " + std::to_string(r.peak_reserved);
  o += ",\n  \"fragmentation\": " + n(peak_fragmentation(r));
  o += ",\n  \"unused_at_peak\": " + n(unused) +
       ",\n  \"segments_at_peak\": " + std::to_string(r.segments_at_peak.size());
  o += ",\n  \"upstream_calls\": " + std::to_string(r.segment_allocs + r.segment_frees);
  o += ",\n  \"ooms\": " + std::to_string(r.ooms) +
       ",\n  \"failed_allocations\": " + std::to_string(r.failed_allocations);
  o += ",\n  \"gc_passes\": " + std::to_string(r.gc_passes) + ",\n  \"fence_waits\": " + std::to_string(r.fence_waits);
  if (c.upstream_times) o += ",\n  \"fence_wait_s\": " + n(static_cast<double>(r.fence_wait_ns) * 1e-9);
  if (const PeakCause& pc = r.peak_cause; pc.found) {
    o += ",\n  \"peak_allocated_at_s\": " + n(static_cast<double>(pc.t_ns) * 1e-9) +
         ",\n  \"peak_allocated_set_by_bytes\": " + std::to_string(pc.size) +
         ",\n  \"live_at_peak_allocated\": " + std::to_string(pc.live) +
         ",\n  \"fence_waits_after_peak\": " + std::to_string(pc.later_fence_waits);
    o += ",\n  \"upstream_calls_after_peak\": " + std::to_string(pc.later_segment_allocs + pc.later_segment_frees) +
         (c.upstream_times ? ",\n  \"upstream_s_after_peak\": " + n(static_cast<double>(pc.later_upstream_ns) * 1e-9)
                           : std::string());
  }
  o += "\n}\n";
  return o;
}

// The policy a replay of the report runs under (--conf; the default with --replay; else the
// trace's own) and the replay's configuration from it; false after saying why the policy is bad.
bool replay_policy(const ReportOptions& o, const TraceFacts& f, BasePolicy* base, ReplayConfig* cfg) {
  *base = !o.conf.empty() ? BasePolicy{o.conf, "from --conf", false}
          : o.replay      ? BasePolicy{"", "", false}
                          : choose_base_policy(f, std::nullopt);
  std::string err;
  if (!pool_options_from_conf(base->conf, &cfg->pool, &err)) {
    print_error("cudapool report: invalid policy '%s': %s\n", base->conf.c_str(), err.c_str());
    return false;
  }
  o.frees.apply(cfg);
  return true;
}

// --at: only with --snapshot, and within the trace. 0, or the exit status after printing why.
int check_at_option(const ReportOptions& o, const TraceFacts& f) {
  const std::int64_t duration_ns = f.end_ns - f.start_ns;
  if (o.at_s && o.snapshot.empty()) {
    print_error("cudapool report: --at chooses the moment of --snapshot; give --snapshot FILE.pickle too\n");
    return kExitUsage;
  }
  if (o.at_s && (*o.at_s < 0 || *o.at_s * 1e9 > static_cast<double>(duration_ns) + 0.5)) {
    print_error("cudapool report: --at %g is outside the trace, which lasts %.6f s (give 0 to %.6f)\n", *o.at_s,
                static_cast<double>(duration_ns) * 1e-9, static_cast<double>(duration_ns) * 1e-9);
    return kExitUsage;
  }
  return 0;
}

// The rows the report shows come from a replay (into *replayed), described in ctx; false after
// saying why the policy is bad.
bool replay_for_report(const ReportOptions& o, const LoadedTrace& loaded, ReplayResult* replayed, ReportContext* ctx) {
  const TraceFacts& f = loaded.prepared.facts;
  BasePolicy base;
  ReplayConfig cfg;
  if (!replay_policy(o, f, &base, &cfg)) return false;
  cfg.collect_rows = true;
  *replayed = replay_trace(loaded.prepared, cfg);
  ctx->replayed = true;
  ctx->source_note = "segments from a replay under " +
                     (base.conf.empty() ? std::string("the default policy") : base.conf) +
                     (base.recorded ? " (the trace's own)" : "") +
                     (f.rmm_only ? " (the trace records allocations only)" : "") +
                     ", by this version of the pool on a simulated device";
  ctx->device_memory = replayed->device_memory == kUnknownDeviceMemory ? 0 : replayed->device_memory;
  ctx->upstream_times = false;
  return true;
}

// --snapshot: a trace records events, not where the pool placed each block: the snapshot's
// segments and blocks come from a replay (under --conf, else the trace's policy), and the line
// says so with how closely that replay matches the recording. 0, or the exit status.
int write_report_snapshot(const ReportOptions& o, const LoadedTrace& loaded) {
  const TraceFacts& f = loaded.prepared.facts;
  BasePolicy base;
  ReplayConfig cfg;
  if (!replay_policy(o, f, &base, &cfg)) return kPolicyErrorExitStatus;
  SnapshotFigures fig;
  std::optional<std::int64_t> at;
  if (o.at_s) at = static_cast<std::int64_t>(*o.at_s * 1e9);
  std::string bytes = snapshot_from_replay(loaded.prepared, cfg, at, base.conf, &fig);
  if (!write_text_file(o.snapshot, bytes, "cudapool report")) return kExitNoInput;
  const bool say = o.json != "-";  // with --json - stdout is the JSON alone
  if (say)
    std::printf(
        "snapshot at %.6f s (%s): %zu segments, %llu B reserved, %llu B allocated, %llu B requested, "
        "%zu of %zu blocks active, %zu trace events, %zu active blocks with call sites\n",
        static_cast<double>(fig.t_ns) * 1e-9, fig.at_peak ? "the moment of peak reserved" : "--at", fig.segments,
        static_cast<unsigned long long>(fig.reserved), static_cast<unsigned long long>(fig.allocated),
        static_cast<unsigned long long>(fig.requested), fig.active_blocks, fig.blocks, fig.events,
        fig.blocks_with_frames);
  const Fidelity fid = check_fidelity(f, base, replay_trace(loaded.prepared, cfg), o.frees.mode(),
                                      o.frees.fence_latency_us);
  if (say)
    std::printf(
        "wrote %s (PyTorch memory snapshot: pytorch.org/memory_viz or torch.cuda._memory_viz): block placement "
        "from a replay under %s, since a trace records events, not placement%s%s\n",
        o.snapshot.c_str(), base.conf.empty() ? "the defaults" : base.conf.c_str(), fid.compared ? "; " : "",
        fid.compared ? fid.line.substr(fid.line.find(':') + 2, fid.line.find('\n') - fid.line.find(':') - 2).c_str()
                     : "");
  return 0;
}

// One output file (none when `path` is empty); *ok false once any failed, and "wrote PATH" said
// only while all went well and stdout is not the JSON alone.
void write_report_file(const ReportOptions& o, const std::string& path, const std::string& text, bool shared,
                       const char* note, bool* ok) {
  if (path.empty()) return;
  *ok &= write_text_file(path, text, "cudapool report", shared);
  if (*ok && o.json != "-") std::printf("wrote %s%s\n", path.c_str(), note);
}

// The summary on stdout, then the JSON, the HTML page and the Perfetto trace.
int write_report(const ReportOptions& o, const TraceReport& rep, const std::vector<TraceRow>& rows,
                 const ReportContext& ctx) {
  if (o.json != "-") std::printf("%s", render_text_summary(rep, ctx).c_str());
  bool ok = true;
  if (!o.json.empty()) ok &= emit_json(o.json, report_json(rep, o.trace, ctx), "cudapool report");
  // The page is meant to be shared: a new one is readable by others (0644 less the umask).
  if (!o.html.empty()) write_report_file(o, o.html, render_html(rep, ctx), true, "", &ok);
  if (!o.perfetto.empty())
    write_report_file(o, o.perfetto, render_perfetto(rep, rows), false,
                      " (open in ui.perfetto.dev or chrome://tracing)", &ok);
  return ok ? 0 : kExitNoInput;
}

// Summarizes the trace (or a replay of it) and writes what the options ask for.
int run_report(const ReportOptions& o) {
  LoadedTrace loaded;
  if (int rc = load_trace(o.trace, -1, &loaded, "cudapool report", o.max_rows); rc != 0) return rc;
  const TraceFacts& f = loaded.prepared.facts;
  if (int rc = check_at_option(o, f); rc != 0) return rc;
  ReportContext ctx;
  ctx.title = o.trace;
  const std::vector<TraceRow>* rows = &loaded.rows;
  ReplayResult replayed;
  // A plain allocation log has no segments: replay it to show what the pool would reserve. So
  // do --replay and --conf; --snapshot alone does not change what the report shows.
  if (f.rmm_only || o.replay || !o.conf.empty()) {
    if (!replay_for_report(o, loaded, &replayed, &ctx)) return kPolicyErrorExitStatus;
    rows = &replayed.rows;
  } else {
    ctx.device_memory = f.device_memory.value_or(0);
  }
  if (!o.snapshot.empty())
    if (int rc = write_report_snapshot(o, loaded); rc != 0) return rc;
  return write_report(o, analyze_rows(*rows, f.device), *rows, ctx);
}

int report_main(const ReportOptions& o) {
  for (const auto& [path, flag] : {std::pair<const std::string*, const char*>{&o.html, "-o"},
                                   {&o.perfetto, "--perfetto"},
                                   {&o.snapshot, "--snapshot"},
                                   {&o.json, "--json"}})
    if (!output_option_ok(*path, flag, "cudapool report")) return kExitNoInput;
  return run_report(o);
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
  sub->add_option("--snapshot", o->snapshot,
                  "also write a PyTorch memory snapshot (pickle); its block placement comes from a replay under the "
                  "trace's policy (or --conf), the report itself stays the recorded pool's");
  sub->add_option("--json", o->json, "also write the summary's figures as JSON here ('-': print only the JSON)");
  sub->add_option("--at", o->at_s,
                  "seconds since the trace's start for --snapshot (default: the moment of peak reserved)");
  o->frees.add_to(sub);
  sub->add_option("--max-rows", o->max_rows, kMaxRowsHelp)->check(CLI::PositiveNumber);
  sub->callback([o, exit_status] { *exit_status = report_main(*o); });
}

}  // namespace cudapool::tools
