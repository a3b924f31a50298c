// libFuzzer target: `cudapool report` on a whole trace, in memory: the analysis of its own rows,
// a replay that collects the pool's rows, the HTML and Perfetto renderings of both, and the
// PyTorch snapshot at the peak and at the trace's middle.
#include "tests/fuzz/tools_fuzz_input.h"
#include "tools/analysis.h"
#include "tools/fidelity.h"
#include "tools/policies.h"
#include "tools/render.h"
#include "tools/snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool;
  using namespace cudapool::tools;
  fuzz::FuzzTrace t;
  if (!fuzz::read_fuzz_trace(data, size, &t)) return 0;
  const TraceFacts& facts = t.prepared.facts;
  ReportContext ctx;
  ctx.title = "fuzz";
  ctx.device_memory = facts.device_memory.value_or(0);
  TraceReport own = analyze_rows(t.rows, facts.device);
  (void)render_html(own, ctx);
  (void)render_perfetto(own, t.rows);
  (void)render_text_summary(own, ctx);

  const BasePolicy base = choose_base_policy(facts, std::nullopt);
  ReplayConfig cfg = fuzz::bounded_replay(facts);
  std::string err;
  if (!pool_options_from_conf(base.conf, &cfg.pool, &err)) fuzz::fail("the filtered policy row does not load", err);
  cfg.collect_rows = true;
  ReplayResult replayed = replay_trace(t.prepared, cfg);
  TraceReport rep = analyze_rows(replayed.rows, facts.device);
  (void)render_html(rep, ctx);
  (void)render_perfetto(rep, replayed.rows);
  cfg.collect_rows = false;
  SnapshotFigures fig;
  std::string peak = snapshot_from_replay(t.prepared, cfg, std::nullopt, base.conf, &fig);
  if (peak.empty()) fuzz::fail("an empty snapshot", base.conf);
  // A snapshot is bounded by the replay: its device lists by kMaxTraceDevice, its entries by the rows.
  if (peak.size() > (std::size_t{1} << 26)) fuzz::fail("a snapshot out of proportion", std::to_string(peak.size()));
  const std::int64_t middle = (facts.end_ns - facts.start_ns) / 2;
  (void)snapshot_from_replay(t.prepared, cfg, middle, base.conf, &fig);
  return 0;
}
