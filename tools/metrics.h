// The figures ab, replay and tune compare, derived from the pool's Stats in one place so every
// table means the same thing by the same word.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "allocator/stats.h"

namespace cudapool::tools {

enum class MetricUnit { seconds, bytes, count, fraction };

struct MetricDef {
  const char* key;    // JSON key (ab --json)
  const char* label;  // table row label
  MetricUnit unit;
};

// The rows, in table order: wall_time, peak_reserved, peak_allocated, fragmentation,
// upstream_calls, upstream_time, hit_rate, ooms.
const std::vector<MetricDef>& metric_defs();

// One run's values, indexed like metric_defs(). wall_time is nullopt when not measured (replay).
struct Metrics {
  std::vector<std::optional<double>> values;
};

// The one definition of each metric every command prints (docs/tools.md, "Metrics"):
// fragmentation = 1 - peak allocated / peak reserved, both peaks over the whole run (0 when
// nothing was reserved); upstream calls = the pool's calls to the device for memory: segment
// allocations and releases, and with expandable segments every map and unmap (a move is both);
// hit rate = hits / (hits + misses), unset when the pool served nothing.
double fragmentation(double peak_allocated, double peak_reserved);
std::int64_t upstream_calls(const Stats& stats);
Metrics metrics_from_stats(const Stats& stats, std::optional<double> wall_seconds);

std::string format_metric(MetricUnit unit, double value);

}  // namespace cudapool::tools
