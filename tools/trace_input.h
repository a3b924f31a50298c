// Loading a trace for replay/tune/report with one error style: "path:line: what", exit 65/66.
#pragma once
#include <cstdint>
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

// The --max-rows option of every command that reads a trace (replay, tune, report, plan).
inline constexpr const char* kMaxRowsHelp =
    "refuse a trace of more rows than this, or of more than 512 bytes of text a row, before it takes the "
    "memory (each row takes a few hundred bytes)";

// 0 on success; else prints "<who>: <path>:<line>: <what>" and returns kExitNoInput (cannot
// open) or kExitBadInput (malformed, no allocation in it, more than `max_rows` rows or
// kTraceBytesPerRow bytes of text a row, or more than this machine's memory holds). Reading
// stops at the first bound passed; the message names --max-rows, which raises both.
int load_trace(const std::string& path, int device, LoadedTrace* out, const char* who,
               std::uint64_t max_rows = kDefaultMaxTraceRows);

// Two lines about the trace: rows, allocations, streams, device memory, recorded peaks.
void print_trace_facts(const std::string& path, const LoadedTrace& t);

}  // namespace cudapool::tools
