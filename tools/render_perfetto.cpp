#include <cstdio>

#include "tools/json_text.h"
#include "tools/render.h"

namespace cudapool::tools {

std::string render_perfetto(const TraceReport& r, const std::vector<TraceRow>& rows) {
  // One process per device; counters on it become Perfetto counter tracks. Timestamps are
  // microseconds (the trace-event format's unit) from the first row.
  std::string pid = std::to_string(r.device);
  std::string o = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  o += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"name\":" +
       json_string("cudapool device " + pid) + "}}";
  char buf[160];
  // Perfetto copes with large files, but a million counter events help nobody: keep each
  // bucket's extremes of at most 200 000 points (every point when there are fewer).
  for (const auto& p : downsample(r.timeline, 200000)) {
    std::snprintf(buf, sizeof buf, ",\n{\"name\":\"memory\",\"ph\":\"C\",\"pid\":%s,\"tid\":0,\"ts\":%.3f,\"args\":{",
                  pid.c_str(), static_cast<double>(p.t_ns) / 1000.0);
    o += buf;
    o += "\"allocated\":" + std::to_string(p.allocated) + ",\"reserved\":" + std::to_string(p.reserved) + "}}";
  }
  std::int64_t start = -1;
  for (const auto& row : rows) {
    if (row.device != r.device) continue;
    if (start < 0) start = row.time_ns;
    const char* name = row.action == TraceAction::oom ? "oom"
                       : row.action == TraceAction::allocate_failure ? "allocate failure"
                       : row.action == TraceAction::gc ? "gc"
                       : row.action == TraceAction::empty_cache ? "empty_cache" : nullptr;
    if (!name) continue;
    std::snprintf(buf, sizeof buf, ",\n{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%s,\"tid\":0,\"ts\":%.3f,",
                  name, pid.c_str(), static_cast<double>(row.time_ns - start) / 1000.0);
    o += buf;
    o += "\"args\":{\"bytes\":" + std::to_string(row.size) + "}}";
  }
  o += "\n]}\n";
  return o;
}

}  // namespace cudapool::tools
