#include "tools/trace_input.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <new>

#include <charconv>

#include "allocator/types.h"
#include "config/policy.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/gzip_input.h"
#include "tools/policies.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

// How much of a gzip trace is decompressed past a malformed row to look for damage behind it.
constexpr std::uint64_t kDrainBytes = std::uint64_t{64} << 20;

// A trace is untrusted input: its policy row may name files, signals, groups. Only the keys that
// shape the pool pass (config/, pool_shaping_conf); what is dropped is said on stderr, in one line.
std::optional<std::string> recorded_policy(const std::optional<std::string>& row, const char* who) {
  if (!row) return std::nullopt;
  UntrustedConf kept = pool_shaping_conf(*row, "a trace");
  if (!kept.error.empty()) {
    std::fprintf(stderr,
                 "%s: trace policy: ignored, it is not a valid policy (%s); the trace counts as recording none\n", who,
                 kept.error.c_str());
    return std::nullopt;
  }
  if (!kept.dropped.empty())
    std::fprintf(stderr, "%s: trace policy: ignored %s\n", who, describe_dropped(kept.dropped).c_str());
  return kept.conf;
}

// The device row's facts ("granularity:N,min_block:512,…"): the granularity into *facts, and
// every allocation unit that differs from this build's (a replay cannot change those).
void apply_device_facts(const std::string& text, TraceFacts* facts) {
  facts->device_facts = true;
  const std::pair<const char*, std::size_t> units[] = {
      {"min_block", kMinBlockSize},        {"small_size", kSmallSize},     {"small_buffer", kSmallBuffer},
      {"min_large_alloc", kMinLargeAlloc}, {"large_buffer", kLargeBuffer}, {"round_large", kRoundLarge}};
  for (const std::string& part : split_conf(text)) {
    const auto colon = part.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = part.substr(0, colon);
    std::size_t value = 0;
    const char* v = part.c_str() + colon + 1;
    auto [end, ec] = std::from_chars(v, part.c_str() + part.size(), value);
    if (ec != std::errc() || end != part.c_str() + part.size()) continue;
    if (key == "granularity") facts->granularity = value;
    for (const auto& [name, here] : units)
      if (key == name && value != here)
        facts->unit_mismatches.push_back(key + " " + std::to_string(value) + " (here " + std::to_string(here) + ")");
  }
}

// A gzipped trace read as it is shipped (tests/traces/*.csv.gz), no zcat first.
bool read_gzip_rows(GzipInput& gz, const std::string& path, std::vector<TraceRow>* rows, std::string* error,
                    TraceMeta* meta, const TraceLimits& limits) {
  bool read = read_trace_stream(gz.stream(), path, rows, error, meta, limits);
  // A malformed row may be the first sign of damaged data: look a little further for it.
  if (!read && !meta->over_limit) gz.drain(kDrainBytes);
  // Rows read before a damaged end are not a trace: say so rather than replay part of it.
  if (!gz.error().empty()) {
    *error = path + ": " + gz.error() + " after " + std::to_string(rows->size()) + " rows; `gzip -t " + path +
             "` checks the file";
    read = false;
    meta->over_limit = false;
  }
  return read;
}

// A trace too large for this machine, reading it or preparing its replay: its rows dropped, the
// error printed with the --max-rows that refuses it at once; the exit status.
int out_of_memory(const std::string& path, const char* who, bool preparing, LoadedTrace* out) {
  const std::size_t n = out->rows.size();
  out->rows = {};
  char when[128];
  if (preparing)
    std::snprintf(when, sizeof when, "preparing its %zu rows for a replay", n);
  else
    std::snprintf(when, sizeof when, "after %zu rows: the trace is larger than this machine can read", n);
  print_error("%s: %s: out of memory %s; pass a --max-rows below %zu to refuse such a trace at once\n", who,
              path.c_str(), when, n);
  return kExitBadInput;
}

// The trace's rows into out->rows. 0, or the exit status after printing why not.
int read_rows(const std::string& path, LoadedTrace* out, TraceMeta* meta, std::uint64_t max_rows, const char* who) {
  std::string error;
  bool read = false;
  const TraceLimits limits = TraceLimits::for_rows(max_rows);
  try {
    if (is_gzip_file(path)) {
      GzipInput gz(path);
      if (!gz.opened()) {
        print_error("%s: cannot open trace '%s'\n", who, path.c_str());
        return kExitNoInput;
      }
      read = read_gzip_rows(gz, path, &out->rows, &error, meta, limits);
    } else {
      read = read_trace_file(path, &out->rows, &error, meta, limits);
    }
  } catch (const std::bad_alloc&) {
    // Within the bounds, but more than this machine (or its ulimit) holds.
    return out_of_memory(path, who, false, out);
  }
  if (!read) {
    if (meta->over_limit) error += ": pass --max-rows N to raise it";
    print_error("%s: %s\n", who, error.c_str());
    return kExitBadInput;
  }
  return 0;
}

// out->prepared from out->rows. 0, or the exit status after printing why not.
int prepare_rows(const std::string& path, int device, LoadedTrace* out, const char* who) {
  try {
    out->prepared = prepare_trace(out->rows, device);
  } catch (const std::bad_alloc&) {
    return out_of_memory(path, who, true, out);
  }
  return 0;
}

// What the trace's header and meta rows say (call sites, policy, device facts); warnings for
// what a faithful replay needs that older traces lack, and what is assumed instead.
void apply_meta(TraceMeta* meta, LoadedTrace* out, const char* who) {
  TraceFacts& facts = out->prepared.facts;
  out->prepared.sites = std::move(meta->sites);
  facts.recorded_policy = recorded_policy(meta->policy, who);
  out->columns = meta->columns;
  if (!meta->warning.empty()) std::fprintf(stderr, "%s: warning: %s\n", who, meta->warning.c_str());
  if (auto it = meta->device_facts.find(facts.device); it != meta->device_facts.end())
    apply_device_facts(it->second, &facts);
  if (!facts.unit_mismatches.empty()) {
    std::string list;
    for (const auto& m : facts.unit_mismatches) list += (list.empty() ? "" : ", ") + m;
    std::fprintf(stderr,
                 "%s: warning: the trace was recorded by a pool with other allocation units (%s); this build "
                 "replays with its own, so the peaks may differ\n",
                 who, list.c_str());
  }
  if (!facts.rmm_only && !facts.device_facts)
    std::fprintf(stderr,
                 "%s: warning: the trace does not record the device's page size or the pool's allocation units "
                 "(written by an older cudapool); assuming %zu MiB pages and this build's units\n",
                 who, kAssumedGranularity >> 20);
  if (!facts.rmm_only && !meta->policy && (facts.classic_rows != facts.expandable_rows)) {
    // No policy row: whether segments were expandable shows in the rows themselves.
    facts.recorded_policy = facts.expandable_rows ? "expandable_segments:True" : "expandable_segments:False";
    facts.policy_assumed = true;
    std::fprintf(stderr,
                 "%s: warning: the trace records no policy (written by an older cudapool); assuming the defaults "
                 "with %s, as its segment rows show\n",
                 who, facts.recorded_policy->c_str());
  }
}

}  // namespace

int load_trace(const std::string& path, int device, LoadedTrace* out, const char* who, std::uint64_t max_rows) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    print_error("%s: cannot open trace '%s': %s\n", who, path.c_str(),
                std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
    return kExitNoInput;
  }
  auto start = std::chrono::steady_clock::now();
  TraceMeta meta;
  if (int rc = read_rows(path, out, &meta, max_rows, who); rc != 0) return rc;
  auto parsed = std::chrono::steady_clock::now();
  out->parse_seconds = std::chrono::duration<double>(parsed - start).count();
  if (int rc = prepare_rows(path, device, out, who); rc != 0) return rc;
  apply_meta(&meta, out, who);
  out->prepare_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - parsed).count();
  if (out->prepared.facts.allocations == 0) {
    print_error("%s: %s: no allocation to replay%s\n", who, path.c_str(), device >= 0 ? " on that device" : "");
    return kExitBadInput;
  }
  return 0;
}

void print_trace_facts(const std::string& path, const LoadedTrace& t) {
  const TraceFacts& f = t.prepared.facts;
  std::printf("trace %s: %zu rows%s, %zu allocations, %zu frees, %zu streams, %.3f s of program time\n", path.c_str(),
              f.rows, f.rmm_only ? " (plain allocation log)" : "", f.allocations, f.frees, f.streams,
              static_cast<double>(f.end_ns - f.start_ns) * 1e-9);
  std::printf("recorded: device memory %s, peak allocated %s, peak reserved %s\n",
              f.device_memory ? format_bytes(static_cast<double>(*f.device_memory)).c_str() : "unknown",
              format_bytes(static_cast<double>(f.recorded_peak_allocated)).c_str(),
              f.recorded_peak_reserved ? format_bytes(static_cast<double>(*f.recorded_peak_reserved)).c_str()
                                       : "not recorded");
  if (!f.other_devices.empty())
    std::printf("note: the trace has rows for %zu other device(s); replaying device %d (choose with --device)\n",
                f.other_devices.size(), f.device);
  if (f.blocking_streams + f.non_blocking_streams > 0)
    std::printf("streams the program created: %zu blocking, %zu non-blocking\n", f.blocking_streams,
                f.non_blocking_streams);
  if (f.unmatched_frees)
    std::printf("note: %zu frees of pointers the trace never allocated were skipped\n", f.unmatched_frees);
}

}  // namespace cudapool::tools
