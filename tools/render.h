// The report's outputs: one self-contained HTML page (inline SVG and CSS, no script, no network)
// and Chrome/Perfetto trace-event JSON with counter tracks.
#pragma once
#include <string>

#include "tools/analysis.h"

namespace cudapool::tools {

struct ReportContext {
  std::string title;        // usually the trace path
  std::string source_note;  // e.g. "segments from a replay under the default policy"
  // The figures are a replay's (this version of the pool on a simulated device), not the
  // recording's (the program as it ran): every output says which.
  bool replayed = false;
  std::size_t device_memory = 0;  // 0 = unknown
  // The rows' upstream durations are the recording's own; false when they come from a replay
  // (its simulated device's times say nothing of a GPU's).
  bool upstream_times = true;
};

// Elements a test (or a script) can find: <svg id="timeline">, <svg id="segments"> with one
// <rect class="segment"> per segment and <rect class="block"> per live block, <svg id="sizes">
// with one <rect class="size-bar"> per size; data-* attributes carry the exact byte counts.
std::string render_html(const TraceReport& report, const ReportContext& context);

// "figures recorded: …" or "figures replayed: …": where the report's figures come from, as the
// text summary and the HTML page say it (one line, no newline).
std::string figures_note(const ReportContext& context);

// {"traceEvents":[…],"displayTimeUnit":"ms"}: counter events "allocated"/"reserved" (bytes) on
// the device's process track (at most 200 000 points, see downsample()), instant events for OOMs,
// failed allocations, GC and empty_cache, and one async slice per allocation (category
// "allocation", begin at its allocate row, end at its free row or the trace's end; at most
// 200 000); ts in microseconds from the trace start.
std::string render_perfetto(const TraceReport& report, const std::vector<TraceRow>& rows);

// The terminal summary: peaks, fragmentation at the peak, segments, the largest sizes.
std::string render_text_summary(const TraceReport& report, const ReportContext& context);

}  // namespace cudapool::tools
