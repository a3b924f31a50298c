// Summary → JSON. Stats go out under flat PyTorch memory_stats() names so a reader needs no
// knowledge of our struct layout (the reader, for the tools: telemetry/summary_reader.cpp).
#include "telemetry/summary.h"

#include "config/path_pattern.h"
#include "sys/output_file.h"
#include "telemetry/json.h"
#include "telemetry/logging.h"

namespace cudapool {
namespace {

struct CounterField {
  const char* name;
  std::int64_t StatCounter::*member;
};
constexpr CounterField kCounterFields[] = {{"current", &StatCounter::current},
                                           {"peak", &StatCounter::peak},
                                           {"allocated", &StatCounter::allocated},
                                           {"freed", &StatCounter::freed}};

struct ArrayFamily {
  const char* name;
  StatArray Stats::*member;
};
constexpr ArrayFamily kArrayFamilies[] = {
    {"allocation", &Stats::allocation},
    {"segment", &Stats::segment},
    {"active", &Stats::active},
    {"inactive_split", &Stats::inactive_split},
    {"allocated_bytes", &Stats::allocated_bytes},
    {"reserved_bytes", &Stats::reserved_bytes},
    {"active_bytes", &Stats::active_bytes},
    {"inactive_split_bytes", &Stats::inactive_split_bytes},
    {"requested_bytes", &Stats::requested_bytes},
};
constexpr const char* kPoolNames[kNumStatPools] = {"all", "small_pool", "large_pool"};

struct CounterFamily {
  const char* name;
  StatCounter Stats::*member;
};
constexpr CounterFamily kCounterFamilies[] = {
    {"oversize_allocations", &Stats::oversize_allocations},
    {"oversize_segments", &Stats::oversize_segments},
};

struct Scalar {
  const char* name;
  std::int64_t Stats::*member;
};
constexpr Scalar kScalars[] = {
    {"num_alloc_retries", &Stats::num_alloc_retries},
    {"num_ooms", &Stats::num_ooms},
    {"num_sync_all_streams", &Stats::num_sync_all_streams},
    {"num_device_alloc", &Stats::num_device_alloc},
    {"num_device_free", &Stats::num_device_free},
    {"num_device_map", &Stats::num_device_map},
    {"num_device_unmap", &Stats::num_device_unmap},
    {"num_device_alias", &Stats::num_device_alias},
    {"max_split_size", &Stats::max_split_size},
    {"cache_hits", &Stats::cache_hits},
    {"cache_misses", &Stats::cache_misses},
    {"upstream_ns", &Stats::upstream_ns},
    {"fences_recorded", &Stats::fences_recorded},
    {"fence_waits", &Stats::fence_waits},
    {"gpu_waits", &Stats::gpu_waits},
    {"pending_bytes", &Stats::pending_bytes},
    {"gc_passes", &Stats::gc_passes},
    {"gc_freed_bytes", &Stats::gc_freed_bytes},
    {"empty_cache_calls", &Stats::empty_cache_calls},
    {"bad_frees", &Stats::bad_frees},
};

double ratio(std::int64_t hits, std::int64_t misses) {
  const std::int64_t total = hits + misses;
  return total > 0 ? static_cast<double>(hits) / static_cast<double>(total) : 0.0;
}

void indent(std::string* out, int n) { out->append(static_cast<std::size_t>(n), ' '); }

void put_key(std::string* out, int n, std::string_view key) {
  indent(out, n);
  json::append_string(out, key);
  *out += ": ";
}

// An optional object of named counts (a top-level member, left out when empty).
void put_counts(std::string* out, std::string_view key, const std::map<std::string, std::int64_t>& counts) {
  if (counts.empty()) return;
  put_key(out, 2, key);
  *out += "{";
  bool first = true;
  for (const auto& [name, value] : counts) {
    *out += first ? "\n" : ",\n";
    first = false;
    put_key(out, 4, name);
    *out += std::to_string(value);
  }
  *out += "\n  },\n";
}

}  // namespace

double DeviceSummary::hit_rate() const { return ratio(stats.cache_hits, stats.cache_misses); }

double Summary::hit_rate() const {
  std::int64_t hits = 0, misses = 0;
  for (const auto& d : devices) {
    hits += d.stats.cache_hits;
    misses += d.stats.cache_misses;
  }
  return ratio(hits, misses);
}

std::int64_t Summary::upstream_ns() const {
  std::int64_t ns = 0;
  for (const auto& d : devices) ns += d.stats.upstream_ns;
  return ns;
}

std::vector<std::pair<std::string, std::int64_t>> flatten_stats(const Stats& s) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  out.reserve(9 * 3 * 4 + 2 * 4 + std::size(kScalars));
  for (const auto& fam : kArrayFamilies) {
    for (std::size_t p = 0; p < kNumStatPools; ++p) {
      for (const auto& f : kCounterFields) {
        out.emplace_back(std::string(fam.name) + "." + kPoolNames[p] + "." + f.name, (s.*fam.member)[p].*f.member);
      }
    }
  }
  for (const auto& fam : kCounterFamilies) {
    for (const auto& f : kCounterFields) {
      out.emplace_back(std::string(fam.name) + "." + f.name, (s.*fam.member).*f.member);
    }
  }
  for (const auto& sc : kScalars) out.emplace_back(sc.name, s.*sc.member);
  return out;
}

bool set_stat(Stats* s, std::string_view name, std::int64_t value) {
  for (const auto& sc : kScalars) {
    if (name == sc.name) {
      s->*sc.member = value;
      return true;
    }
  }
  const std::size_t dot = name.find('.');
  if (dot == std::string_view::npos) return false;
  const std::string_view family = name.substr(0, dot);
  std::string_view rest = name.substr(dot + 1);
  auto set_counter = [&](StatCounter* c, std::string_view field) {
    for (const auto& f : kCounterFields) {
      if (field == f.name) {
        c->*f.member = value;
        return true;
      }
    }
    return false;
  };
  for (const auto& fam : kCounterFamilies) {
    if (family == fam.name) return set_counter(&(s->*fam.member), rest);
  }
  for (const auto& fam : kArrayFamilies) {
    if (family != fam.name) continue;
    const std::size_t dot2 = rest.find('.');
    if (dot2 == std::string_view::npos) return false;
    const std::string_view pool = rest.substr(0, dot2);
    for (std::size_t p = 0; p < kNumStatPools; ++p) {
      if (pool == kPoolNames[p]) return set_counter(&(s->*fam.member)[p], rest.substr(dot2 + 1));
    }
    return false;
  }
  return false;
}

namespace {

// The run's own fields, "format" to "upstream_ns", each line ending with its comma.
void put_run(std::string* o, const Summary& s) {
  put_key(o, 2, "format");
  *o += "\"cudapool-summary\",\n";
  put_key(o, 2, "version");
  *o += std::to_string(Summary::kFormatVersion) + ",\n";
  put_key(o, 2, "pid");
  *o += std::to_string(s.pid) + ",\n";
  put_key(o, 2, "command");
  json::append_string(o, s.command);
  *o += ",\n";
  put_key(o, 2, "policy");
  json::append_string(o, s.policy);
  *o += ",\n";
  put_key(o, 2, "backend");
  json::append_string(o, s.backend);
  *o += ",\n";
  put_key(o, 2, "start_unix_ns");
  *o += std::to_string(s.start_unix_ns) + ",\n";
  put_key(o, 2, "wall_time_s");
  json::append_double(o, s.wall_time_s);
  *o += ",\n";
  put_key(o, 2, "exit_status");
  *o += std::to_string(s.exit_status) + ",\n";
  put_key(o, 2, "hit_rate");
  json::append_double(o, s.hit_rate());
  *o += ",\n";
  put_key(o, 2, "upstream_ns");
  *o += std::to_string(s.upstream_ns()) + ",\n";
}

// "passthrough": the calls handed to CUDA untouched, by kind; written even when there are none.
void put_passthrough(std::string* o, const std::map<std::string, std::int64_t>& passthrough) {
  put_key(o, 2, "passthrough");
  *o += "{";
  bool first = true;
  for (const auto& [kind, count] : passthrough) {
    *o += first ? "\n" : ",\n";
    first = false;
    put_key(o, 4, kind);
    *o += std::to_string(count);
  }
  *o += first ? "},\n" : "\n  },\n";
}

// One element of "devices", without the separator before it.
void put_device(std::string* o, const DeviceSummary& d) {
  *o += "    {\n";
  put_key(o, 6, "device");
  *o += std::to_string(d.device) + ",\n";
  put_key(o, 6, "driver_total_bytes");
  *o += std::to_string(d.driver_total_bytes) + ",\n";
  put_key(o, 6, "hit_rate");
  json::append_double(o, d.hit_rate());
  *o += ",\n";
  if (!d.driver_calls.empty()) {
    put_key(o, 6, "driver_calls");
    *o += "{";
    bool first_call = true;
    for (const auto& [name, count] : d.driver_calls) {
      *o += first_call ? "\n" : ",\n";
      first_call = false;
      put_key(o, 8, name);
      *o += std::to_string(count);
    }
    *o += "\n      },\n";
  }
  put_key(o, 6, "stats");
  *o += "{\n";
  auto flat = flatten_stats(d.stats);
  for (std::size_t k = 0; k < flat.size(); ++k) {
    put_key(o, 8, flat[k].first);
    *o += std::to_string(flat[k].second);
    *o += k + 1 < flat.size() ? ",\n" : "\n";
  }
  *o += "      }\n    }";
}

}  // namespace

std::string to_json(const Summary& s) {
  std::string o;
  o.reserve(16 * 1024);
  o += "{\n";
  put_run(&o, s);
  put_passthrough(&o, s.passthrough);
  put_counts(&o, "pinned_host", s.pinned_host);
  put_counts(&o, "runtime_api", s.runtime_api);
  put_key(&o, 2, "devices");
  o += "[";
  for (std::size_t i = 0; i < s.devices.size(); ++i) {
    o += i == 0 ? "\n" : ",\n";
    put_device(&o, s.devices[i]);
  }
  o += s.devices.empty() ? "]\n" : "\n  ]\n";
  o += "}\n";
  return o;
}

std::string write_summary_file(const std::string& path, const Summary& s) {
  // A temporary file beside the path, renamed over it: a reader (cudapool ab) never sees half
  // a file (sys/output_file.h: no link followed, an unpredictable temporary name, mode 0600).
  return write_file_atomically(expand_path_pattern(path), to_json(s), "summary file");
}

}  // namespace cudapool
