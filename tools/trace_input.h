// Loading a trace for replay/tune/report with one error style: "path:line: what", exit 65/66.
#pragma once
#include <string>
#include <vector>

#include "telemetry/trace.h"
#include "tools/replay.h"

namespace cudapool::tools {

struct LoadedTrace {
  std::vector<TraceRow> rows;
  PreparedTrace prepared;
  double parse_seconds = 0;    // reading the CSV
  double prepare_seconds = 0;  // matching pointers, building the ops
  int columns = 0;             // 6 (RMM log), 10 (older cudapool trace), 11
};

// 0 on success; else prints "<who>: <path>:<line>: <what>" and returns kExitNoInput (cannot
// open) or kExitBadInput (malformed, or no allocation in it).
int load_trace(const std::string& path, int device, LoadedTrace* out, const char* who);

// Two lines about the trace: rows, allocations, streams, device memory, recorded peaks.
void print_trace_facts(const std::string& path, const LoadedTrace& t);

}  // namespace cudapool::tools
