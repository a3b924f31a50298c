#include "tools/metrics.h"

#include <cstdio>

#include "tools/units.h"

namespace cudapool::tools {

const std::vector<MetricDef>& metric_defs() {
  static const std::vector<MetricDef> defs = {
      {"wall_time_s", "wall time", MetricUnit::seconds},
      {"peak_reserved_bytes", "peak reserved", MetricUnit::bytes},
      {"peak_allocated_bytes", "peak allocated", MetricUnit::bytes},
      {"fragmentation", "fragmentation", MetricUnit::fraction},
      {"upstream_calls", "upstream calls", MetricUnit::count},
      {"upstream_time_s", "upstream time", MetricUnit::seconds},
      {"hit_rate", "hit rate", MetricUnit::fraction},
      {"ooms", "OOMs", MetricUnit::count},
  };
  return defs;
}

double fragmentation(double peak_allocated, double peak_reserved) {
  return peak_reserved > 0 ? 1.0 - peak_allocated / peak_reserved : 0.0;
}

std::int64_t upstream_calls(const Stats& s) {
  return s.num_device_alloc + s.num_device_free + s.num_device_map + s.num_device_unmap;
}

Metrics metrics_from_stats(const Stats& s, std::optional<double> wall_seconds) {
  double reserved = static_cast<double>(s.reserved_bytes[kAll].peak);
  double allocated = static_cast<double>(s.allocated_bytes[kAll].peak);
  double lookups = static_cast<double>(s.cache_hits + s.cache_misses);
  Metrics m;
  m.values = {
      wall_seconds,
      reserved,
      allocated,
      fragmentation(allocated, reserved),
      static_cast<double>(upstream_calls(s)),
      static_cast<double>(s.upstream_ns) * 1e-9,
      lookups > 0 ? std::optional<double>(static_cast<double>(s.cache_hits) / lookups) : std::nullopt,
      static_cast<double>(s.num_ooms),
  };
  return m;
}

std::string format_metric(MetricUnit unit, double v) {
  char buf[48];
  switch (unit) {
    case MetricUnit::seconds: return format_seconds(v);
    case MetricUnit::bytes: return format_bytes(v);
    case MetricUnit::fraction: std::snprintf(buf, sizeof buf, "%.1f %%", v * 100.0); return buf;
    case MetricUnit::count: std::snprintf(buf, sizeof buf, "%.0f", v); return buf;
  }
  return "?";
}

}  // namespace cudapool::tools
