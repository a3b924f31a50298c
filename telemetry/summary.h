// The run summary: what CUDAPOOL_STATS=path.json writes at exit and what `cudapool ab` reads
// (with telemetry/summary_reader.h). JSON written with our own small codec (json.h); the format
// is documented in docs/trace-format.md ("JSON summary").
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/stats.h"

namespace cudapool {

struct DeviceSummary {
  int device = 0;
  Stats stats;                           // the pool's stats at exit
  std::uint64_t driver_total_bytes = 0;  // 0 = unknown
  // The driver calls the pool's stream safety made (fence events recorded, queried, waited on,
  // GPU-side waits, context switches; "non_blocking_streams": such streams the program created),
  // by name. Empty where the process has no such counts (a replay).
  std::map<std::string, std::int64_t> driver_calls;
  // Derived from stats (also written to the JSON for readers that do not recompute).
  double hit_rate() const;  // cache_hits / (cache_hits + cache_misses); 0 if none
};

struct Summary {
  static constexpr int kFormatVersion = 1;
  std::int64_t pid = 0;
  std::string command;  // the process's command line, space separated
  std::string policy;   // the effective policy as a CUDAPOOL_CONF string
  std::string backend;  // "native" or "passthrough"
  std::int64_t start_unix_ns = 0;
  double wall_time_s = 0.0;  // from library start to exit
  int exit_status = -1;      // -1 = unknown
  std::vector<DeviceSummary> devices;
  // Pass-through decisions by kind ("foreign_pointer", "capture", "managed", …) → count.
  std::map<std::string, std::int64_t> passthrough;
  // The pinned host pool's counters by name ("reserved_bytes.peak", "cache_hits", …); empty
  // when it never served an allocation (written only then).
  std::map<std::string, std::int64_t> pinned_host;
  // Calls of cudart's entry points the shim served itself, without cudart's wrapper, by name
  // ("cudaMalloc", "cudaFree"); empty when there were none (written only then).
  std::map<std::string, std::int64_t> runtime_api;

  // Over all devices.
  double hit_rate() const;
  std::int64_t upstream_ns() const;
};

// Serializes as one JSON object (pretty-printed, stable key order).
std::string to_json(const Summary& s);
// Writes the summary to `path` (patterns of expand_path_pattern expanded) with plain
// open/write/rename/close, safe at exit: a temporary file beside it, renamed over it
// (sys/output_file.h: a symbolic link at `path` is refused, the file has mode 0600).
// Returns "" or why it failed.
std::string write_summary_file(const std::string& path, const Summary& s);

// Flat PyTorch-style stat names ("allocated_bytes.all.peak", "num_ooms", "cache_hits", …) and
// values, in a fixed order. The JSON uses these names; tools can use them for tables.
std::vector<std::pair<std::string, std::int64_t>> flatten_stats(const Stats& s);
// Sets the stat named `name` (as flatten_stats names it). false if the name is unknown.
bool set_stat(Stats* s, std::string_view name, std::int64_t value);

// The exit summary table for the log: one block per device (reserved/allocated current and
// peak, hit rate, upstream calls and time, OOMs, GC, bad frees) plus pass-through counts.
std::string format_summary_table(const Summary& s);

}  // namespace cudapool
