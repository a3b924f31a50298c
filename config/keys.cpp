#include "config/keys.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "config/roundup.h"
#include "config/values.h"

namespace cudapool::config {
namespace {

using Warnings = std::vector<std::string>;
constexpr std::uint64_t kMaxMiB = kNoLimit / MiB;  // larger MiB counts clamp here, as in PyTorch

// ---- sizes in MiB ------------------------------------------------------------------------------

std::string set_mib(std::size_t& field, std::string_view v, std::uint64_t min) {
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why;
  if (n < min) return "below the minimum " + std::to_string(min);
  field = static_cast<std::size_t>(std::min(n, kMaxMiB)) * MiB;
  return {};
}

std::string apply_max_split(Policy& p, std::string_view v, Warnings&) {
  // PyTorch 2.9+: >= 20 (the large segment size); earlier versions wanted > 20.
  return set_mib(p.pool.max_split_size, v, kLargeBuffer / MiB);
}
std::string format_max_split(const Policy& p) {
  return p.pool.max_split_size == kNoLimit ? "none" : std::to_string(p.pool.max_split_size / MiB);
}
bool default_max_split(const Policy& p) { return p.pool.max_split_size == kNoLimit; }

std::string apply_non_split(Policy& p, std::string_view v, Warnings&) {
  return set_mib(p.pool.max_non_split_rounding, v, kLargeBuffer / MiB);
}
std::string format_non_split(const Policy& p) { return std::to_string(p.pool.max_non_split_rounding / MiB); }
bool default_non_split(const Policy& p) {
  return p.pool.max_non_split_rounding == PoolOptions{}.max_non_split_rounding;
}

std::string apply_max_reserved(Policy& p, std::string_view v, Warnings&) {
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why;
  p.pool.max_reserved = n == 0 ? kNoLimit : static_cast<std::size_t>(std::min(n, kMaxMiB)) * MiB;
  return {};
}
std::string format_max_reserved(const Policy& p) {
  return p.pool.max_reserved == kNoLimit ? "0" : std::to_string(p.pool.max_reserved / MiB);
}
bool default_max_reserved(const Policy& p) { return p.pool.max_reserved == kNoLimit; }

// ---- fractions ---------------------------------------------------------------------------------

std::string apply_gc(Policy& p, std::string_view v, Warnings&) {
  double x = 0;
  if (std::string why = parse_number(v, x); !why.empty()) return why;
  if (!(x > 0.0 && x < 1.0)) return "outside the open interval";
  p.pool.garbage_collection_threshold = x;
  return {};
}
std::string format_gc(const Policy& p) { return format_number(p.pool.garbage_collection_threshold); }
bool default_gc(const Policy& p) { return p.pool.garbage_collection_threshold == 0.0; }

std::string apply_fraction(Policy& p, std::string_view v, Warnings&) {
  double x = 0;
  if (std::string why = parse_number(v, x); !why.empty()) return why;
  if (!(x >= 0.0 && x <= 1.0)) return "outside [0, 1]";
  p.pool.per_process_memory_fraction = x;
  return {};
}
std::string format_fraction(const Policy& p) { return format_number(p.pool.per_process_memory_fraction); }
bool default_fraction(const Policy& p) { return p.pool.per_process_memory_fraction == 0.0; }

// ---- booleans ----------------------------------------------------------------------------------

std::string apply_expandable(Policy& p, std::string_view v, Warnings&) {
  return parse_bool(v, p.pool.expandable_segments);
}
std::string format_expandable(const Policy& p) { return p.pool.expandable_segments ? "True" : "False"; }
bool default_expandable(const Policy& p) { return p.pool.expandable_segments; }

std::string apply_release_lock(Policy& p, std::string_view v, Warnings&) {
  return parse_bool(v, p.pool.release_lock_on_cudamalloc);
}
std::string format_release_lock(const Policy& p) { return p.pool.release_lock_on_cudamalloc ? "True" : "False"; }
bool default_release_lock(const Policy& p) { return !p.pool.release_lock_on_cudamalloc; }

// Expandable pages and units are single physical allocations, given back only when all of one
// is free: one near the device's size never would be, hence the 1 GiB cap.
std::string set_physical_mib(std::size_t& out, std::string_view v) {
  std::size_t bytes = 0;
  if (std::string why = set_mib(bytes, v, 0); !why.empty()) return why;
  if (bytes > 1024 * MiB) return "above the maximum 1024";
  out = bytes;
  return {};
}

std::string apply_expandable_page(Policy& p, std::string_view v, Warnings&) {
  return set_physical_mib(p.pool.expandable_large_page, v);
}
std::string format_expandable_page(const Policy& p) { return std::to_string(p.pool.expandable_large_page / MiB); }
bool default_expandable_page(const Policy& p) {
  return p.pool.expandable_large_page == PoolOptions{}.expandable_large_page;
}

// Set, the size holds for every unit; unset, units scale with the pool up to the default.
std::string apply_expandable_unit(Policy& p, std::string_view v, Warnings&) {
  if (std::string why = set_physical_mib(p.pool.expandable_max_unit, v); !why.empty()) return why;
  p.pool.expandable_unit_share = 0;
  return {};
}
std::string format_expandable_unit(const Policy& p) { return std::to_string(p.pool.expandable_max_unit / MiB); }
bool default_expandable_unit(const Policy& p) {
  return p.pool.expandable_max_unit == PoolOptions{}.expandable_max_unit &&
         p.pool.expandable_unit_share == PoolOptions{}.expandable_unit_share;
}

std::string apply_expandable_headroom(Policy& p, std::string_view v, Warnings&) {
  double x = 0.0;
  if (std::string why = parse_number(v, x); !why.empty()) return why;
  if (!(x >= 0.0 && x < 1.0)) return "not in [0, 1)";
  p.pool.expandable_headroom = x;
  return {};
}
std::string format_expandable_headroom(const Policy& p) { return format_number(p.pool.expandable_headroom); }
bool default_expandable_headroom(const Policy& p) { return p.pool.expandable_headroom == 0.0; }

std::string apply_expandable_wait(Policy& p, std::string_view v, Warnings&) {
  return parse_bool(v, p.pool.expandable_wait);
}
std::string format_expandable_wait(const Policy& p) { return p.pool.expandable_wait ? "True" : "False"; }
bool default_expandable_wait(const Policy& p) { return p.pool.expandable_wait; }

std::string apply_peer_access(Policy& p, std::string_view v, Warnings&) {
  return parse_bool(v, p.expandable_peer_access);
}
std::string format_peer_access(const Policy& p) { return p.expandable_peer_access ? "True" : "False"; }
bool default_peer_access(const Policy& p) { return !p.expandable_peer_access; }

// ---- roundup -----------------------------------------------------------------------------------

std::string apply_roundup(Policy& p, std::string_view v, Warnings&) {
  return parse_roundup(v, p.pool.roundup_power2_divisions);
}
std::string format_roundup_key(const Policy& p) { return format_roundup(p.pool.roundup_power2_divisions); }
bool default_roundup(const Policy& p) {
  return std::all_of(p.pool.roundup_power2_divisions.begin(), p.pool.roundup_power2_divisions.end(),
                     [](std::uint32_t d) { return d == 0; });
}

// ---- choices -----------------------------------------------------------------------------------

std::string apply_backend(Policy& p, std::string_view v, Warnings& w) {
  const std::string l = lower(v);
  if (l == "native")
    p.backend = Backend::native;
  else if (l == "passthrough")
    p.backend = Backend::passthrough;
  else if (l == "cudamallocasync")
    warn_once(w,
              "backend:cudaMallocAsync is ignored: cudapool serves allocations from its own pool "
              "(backend stays " +
                  std::string(p.backend == Backend::native ? "native" : "passthrough") +
                  "; use backend:passthrough to hand every call to CUDA untouched)");
  else
    return "not a backend";
  return {};
}
std::string format_backend(const Policy& p) { return p.backend == Backend::native ? "native" : "passthrough"; }
bool default_backend(const Policy& p) { return p.backend == Backend::native; }

std::string apply_free_sync(Policy& p, std::string_view v, Warnings&) {
  const std::string l = lower(v);
  if (l == "gpu_wait")
    p.pool.free_sync = FreeSync::gpu_wait;
  else if (l == "fenced")
    p.pool.free_sync = FreeSync::fenced;
  else if (l == "device")
    p.pool.free_sync = FreeSync::device;
  else if (l == "immediate")
    p.pool.free_sync = FreeSync::immediate;
  else
    return "not a free_sync mode";
  return {};
}
std::string format_free_sync(const Policy& p) {
  switch (p.pool.free_sync) {
    case FreeSync::fenced: return "fenced";
    case FreeSync::device: return "device";
    case FreeSync::immediate: return "immediate";
    case FreeSync::gpu_wait: break;
  }
  return "gpu_wait";
}
bool default_free_sync(const Policy& p) { return p.pool.free_sync == FreeSync::gpu_wait; }

std::string apply_free_host_sync(Policy& p, std::string_view v, Warnings&) { return parse_bool(v, p.free_host_sync); }
std::string format_free_host_sync(const Policy& p) { return p.free_host_sync ? "True" : "False"; }
bool default_free_host_sync(const Policy& p) { return !p.free_host_sync; }

std::string apply_log_level(Policy& p, std::string_view v, Warnings&) {
  // spdlog's names, plus its aliases "warning" and "err", stored in the canonical spelling.
  const std::string l = lower(v);
  static constexpr std::array<std::string_view, 7> names{"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (l == "warning")
    p.log_level = "warn";
  else if (l == "err")
    p.log_level = "error";
  else if (std::find(names.begin(), names.end(), l) != names.end())
    p.log_level = l;
  else
    return "not a log level";
  return {};
}
std::string format_log_level(const Policy& p) { return p.log_level; }
bool default_log_level(const Policy& p) { return p.log_level == Policy{}.log_level; }

// ---- paths -------------------------------------------------------------------------------------

std::string check_path(std::string_view v) {
  for (char c : v)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "contains a control character";
  return {};
}
std::string apply_log_file(Policy& p, std::string_view v, Warnings&) {
  if (std::string why = check_path(v); !why.empty()) return why;
  p.log_file = v;
  return {};
}
std::string apply_trace_file(Policy& p, std::string_view v, Warnings&) {
  if (std::string why = check_path(v); !why.empty()) return why;
  p.trace_file = v;
  return {};
}
std::string apply_stats_file(Policy& p, std::string_view v, Warnings&) {
  if (std::string why = check_path(v); !why.empty()) return why;
  p.stats_file = v;
  return {};
}
std::string format_log_file(const Policy& p) { return p.log_file; }
std::string format_trace_file(const Policy& p) { return p.trace_file; }
std::string format_stats_file(const Policy& p) { return p.stats_file; }
bool default_log_file(const Policy& p) { return p.log_file.empty(); }
bool default_trace_file(const Policy& p) { return p.trace_file.empty(); }
bool default_stats_file(const Policy& p) { return p.stats_file.empty(); }

// The plan or trace is read when a device's pool starts (shim/warm_start.cpp), where a file that
// is missing or malformed costs a warning, never the program: here only the text of the path.
std::string apply_warm_start(Policy& p, std::string_view v, Warnings&) {
  if (std::string why = check_path(v); !why.empty()) return why;
  if (v.size() > 4096) return "longer than 4096 characters";
  p.warm_start = v;
  return {};
}
std::string format_warm_start(const Policy& p) { return p.warm_start; }
bool default_warm_start(const Policy& p) { return p.warm_start.empty(); }

// ---- groups ------------------------------------------------------------------------------------
// A group name is part of a shared-memory file name: letters, digits, '_', '-', '.', at most 48.
std::string apply_group(Policy& p, std::string_view v, Warnings&) {
  if (v.size() > 48) return "longer than 48 characters";
  for (char c : v)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
      return "contains a character other than letters, digits, '_', '-' and '.'";
  if (v == "." || v == "..") return "not a name";
  p.group = v;
  return {};
}
std::string format_group(const Policy& p) { return p.group; }
bool default_group(const Policy& p) { return p.group.empty(); }

std::string apply_group_budget(Policy& p, std::string_view v, Warnings&) {
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why;
  p.group_budget = static_cast<std::size_t>(std::min(n, kMaxMiB)) * MiB;
  return {};
}
std::string format_group_budget(const Policy& p) { return std::to_string(p.group_budget / MiB); }
bool default_group_budget(const Policy& p) { return p.group_budget == 0; }

std::string apply_group_fraction(Policy& p, std::string_view v, Warnings&) {
  double x = 0;
  if (std::string why = parse_number(v, x); !why.empty()) return why;
  if (!(x >= 0.0 && x <= 1.0)) return "outside [0, 1]";
  p.group_budget_fraction = x;
  return {};
}
std::string format_group_fraction(const Policy& p) { return format_number(p.group_budget_fraction); }
bool default_group_fraction(const Policy& p) { return p.group_budget_fraction == 0.0; }

std::string apply_group_wait(Policy& p, std::string_view v, Warnings&) {
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why;
  if (n > 10000) return "above the maximum 10000";
  p.group_release_wait_ms = static_cast<int>(n);
  return {};
}
std::string format_group_wait(const Policy& p) { return std::to_string(p.group_release_wait_ms); }
bool default_group_wait(const Policy& p) { return p.group_release_wait_ms == Policy{}.group_release_wait_ms; }

std::string apply_call_sites(Policy& p, std::string_view v, Warnings&) { return parse_bool(v, p.trace_call_sites); }
std::string format_call_sites(const Policy& p) { return p.trace_call_sites ? "True" : "False"; }
bool default_call_sites(const Policy& p) { return !p.trace_call_sites; }

std::string apply_group_counts(Policy& p, std::string_view v, Warnings&) {
  const std::string l = lower(v);
  if (l == "footprint")
    p.group_pool_only = false;
  else if (l == "pool")
    p.group_pool_only = true;
  else
    return "not footprint or pool";
  return {};
}
std::string format_group_counts(const Policy& p) { return p.group_pool_only ? "pool" : "footprint"; }
bool default_group_counts(const Policy& p) { return !p.group_pool_only; }

std::string apply_group_outside(Policy& p, std::string_view v, Warnings&) {
  if (lower(v) == "auto") {
    p.group_outside = -1;
    return {};
  }
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why + " (or auto)";
  p.group_outside = static_cast<std::int64_t>(std::min(n, kMaxMiB) * MiB);
  return {};
}
std::string format_group_outside(const Policy& p) {
  return p.group_outside < 0 ? "auto" : std::to_string(static_cast<std::uint64_t>(p.group_outside) / MiB);
}
bool default_group_outside(const Policy& p) { return p.group_outside < 0; }

std::string apply_group_park(Policy& p, std::string_view v, Warnings&) {
  const std::string l = lower(v);
  if (l == "on" || l == "true")
    p.group_park = true;
  else if (l == "off" || l == "false")
    p.group_park = false;
  else
    return "not on or off";
  return {};
}
std::string format_group_park(const Policy& p) { return p.group_park ? "on" : "off"; }
bool default_group_park(const Policy& p) { return !p.group_park; }

std::string apply_group_park_host(Policy& p, std::string_view v, Warnings&) {
  if (lower(v) == "auto") {
    p.group_park_host = -1;
    return {};
  }
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why + " (or auto)";
  if (n == 0) return "0 MiB would refuse every park; use group_park:off to turn parking off";
  p.group_park_host = static_cast<std::int64_t>(std::min(n, kMaxMiB) * MiB);
  return {};
}
std::string format_group_park_host(const Policy& p) {
  return p.group_park_host < 0 ? "auto" : std::to_string(static_cast<std::uint64_t>(p.group_park_host) / MiB);
}
bool default_group_park_host(const Policy& p) { return p.group_park_host < 0; }

// Milliseconds up to `max`, for the parking waits.
std::string set_ms(int& out, std::string_view v, std::uint64_t max) {
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why;
  if (n > max) return "above the maximum " + std::to_string(max);
  out = static_cast<int>(n);
  return {};
}

std::string apply_group_park_idle(Policy& p, std::string_view v, Warnings&) {
  return set_ms(p.group_park_idle_ms, v, 86'400'000);
}
std::string format_group_park_idle(const Policy& p) { return std::to_string(p.group_park_idle_ms); }
bool default_group_park_idle(const Policy& p) { return p.group_park_idle_ms == Policy{}.group_park_idle_ms; }

std::string apply_group_park_wait(Policy& p, std::string_view v, Warnings&) {
  if (std::string why = set_ms(p.group_park_wait_ms, v, 600'000); !why.empty()) return why;
  if (p.group_park_wait_ms == 0) return "0 would never wait for a park to finish; use group_park:off instead";
  return {};
}
std::string format_group_park_wait(const Policy& p) { return std::to_string(p.group_park_wait_ms); }
bool default_group_park_wait(const Policy& p) { return p.group_park_wait_ms == Policy{}.group_park_wait_ms; }

std::string apply_publish_stats(Policy& p, std::string_view v, Warnings&) { return parse_bool(v, p.publish_stats); }
std::string format_publish_stats(const Policy& p) { return p.publish_stats ? "True" : "False"; }
bool default_publish_stats(const Policy& p) { return p.publish_stats; }

// ---- the dump signal ---------------------------------------------------------------------------
// By name (SIGUSR1/USR1, SIGUSR2/USR2, any case) or number. Signals whose default action or
// meaning the program relies on for errors and job control are refused: catching them to dump
// would hide a crash or break the shell.
constexpr int kSigUsr1 = 10, kSigUsr2 = 12;  // Linux numbering (x86-64, arm64)

std::string apply_dump_signal(Policy& p, std::string_view v, Warnings&) {
  std::string l = lower(v);
  if (l.starts_with("sig")) l.erase(0, 3);
  if (l == "off" || l == "none" || l == "0" || l == "false")
    p.dump_signal = 0;
  else if (l == "usr1")
    p.dump_signal = kSigUsr1;
  else if (l == "usr2")
    p.dump_signal = kSigUsr2;
  else {
    std::uint64_t n = 0;
    if (!parse_uint(v, n).empty()) return "not a signal name or number";
    // SIGKILL 9 and SIGSTOP 19 cannot be caught; SIGILL 4, SIGTRAP 5, SIGABRT 6, SIGBUS 7,
    // SIGFPE 8, SIGSEGV 11 report faults; SIGCHLD 17 and SIGTSTP/TTIN/TTOU 20-22 are job control.
    static constexpr std::array<std::uint64_t, 12> refused{4, 5, 6, 7, 8, 9, 11, 17, 19, 20, 21, 22};
    if (n < 1 || n > 64 || std::find(refused.begin(), refused.end(), n) != refused.end())
      return "a signal that cannot be caught or that reports faults or job control";
    p.dump_signal = static_cast<int>(n);
  }
  return {};
}
std::string format_dump_signal(const Policy& p) {
  if (p.dump_signal == 0) return "off";
  if (p.dump_signal == kSigUsr1) return "SIGUSR1";
  if (p.dump_signal == kSigUsr2) return "SIGUSR2";
  return std::to_string(p.dump_signal);
}
bool default_dump_signal(const Policy& p) { return p.dump_signal == 0; }

// ---- PyTorch keys that configure something other than device memory ---------------------------
// Checked the way PyTorch checks them (so a string PyTorch refuses is refused here too), then dropped.

std::string ignore_bool(Policy&, std::string_view v, Warnings&) {
  bool b = false;
  return parse_bool(v, b);
}
// ---- pinned host memory ---------------------------------------------------------------------

std::string apply_pinned_cache(Policy& p, std::string_view v, Warnings&) { return parse_bool(v, p.pinned.enabled); }
std::string format_pinned_cache(const Policy& p) { return p.pinned.enabled ? "True" : "False"; }
bool default_pinned_cache(const Policy& p) { return !p.pinned.enabled; }

std::string apply_pinned_register(Policy& p, std::string_view v, Warnings&) {
  return parse_bool(v, p.pinned.use_host_register);
}
std::string format_pinned_register(const Policy& p) { return p.pinned.use_host_register ? "True" : "False"; }
bool default_pinned_register(const Policy& p) { return !p.pinned.use_host_register; }

std::string apply_pinned_threads(Policy& p, std::string_view v, Warnings&) {
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why;
  if (!is_power_of_two(n) || n > 128) return "not a power of two <= 128";
  p.pinned.register_threads = static_cast<int>(n);
  return {};
}
std::string format_pinned_threads(const Policy& p) { return std::to_string(p.pinned.register_threads); }
bool default_pinned_threads(const Policy& p) { return p.pinned.register_threads == HostPoolOptions{}.register_threads; }

std::string apply_pinned_reserve(Policy& p, std::string_view v, Warnings&) {
  return set_mib(p.pinned.reserve_segment, v, 1);
}
std::string format_pinned_reserve(const Policy& p) { return std::to_string(p.pinned.reserve_segment / MiB); }
bool default_pinned_reserve(const Policy& p) { return p.pinned.reserve_segment == 0; }

std::string apply_pinned_round(Policy& p, std::string_view v, Warnings&) {
  return set_mib(p.pinned.max_round_threshold, v, 0);
}
std::string format_pinned_round(const Policy& p) {
  return p.pinned.max_round_threshold == kNoLimit ? "none" : std::to_string(p.pinned.max_round_threshold / MiB);
}
bool default_pinned_round(const Policy& p) { return p.pinned.max_round_threshold == kNoLimit; }

std::string apply_pinned_cap(Policy& p, std::string_view v, Warnings&) { return set_mib(p.pinned.max_cached, v, 0); }
std::string format_pinned_cap(const Policy& p) {
  return p.pinned.max_cached == kNoLimit ? "none" : std::to_string(p.pinned.max_cached / MiB);
}
bool default_pinned_cap(const Policy& p) { return p.pinned.max_cached == kNoLimit; }

std::string refuse(Policy&, std::string_view, Warnings&) {
  return "cudapool does not implement it: segments for requests under 10 MiB are always 20 MiB; "
         "remove the key";
}

constexpr std::string_view kPinnedHip = "cudapool runs on CUDA; pinned_use_cuda_host_register is the key here";
constexpr std::string_view kPinnedBackground =
    "a pooled free records a fence and returns at once, so there is nothing to move to a thread";

using K = ValueKind;
const std::array<KeySpec, 45> kKeys{{
    // PyTorch's device-pool keys: same spelling, same bounds, same meaning.
    {"max_split_size_mb",
     K::integer,
     Reach::pool,
     "a whole number of MiB >= 20 (unset = no limit)",
     "128",
     "blocks this large or larger are never split and serve only requests of at least this size",
     {},
     apply_max_split,
     format_max_split,
     default_max_split},
    {"max_non_split_rounding_mb",
     K::integer,
     Reach::pool,
     "a whole number of MiB >= 20",
     "40",
     "a request >= max_split_size_mb takes a cached oversize block only if it wastes less than this",
     {},
     apply_non_split,
     format_non_split,
     default_non_split},
    {"roundup_power2_divisions",
     K::roundup,
     Reach::pool,
     "0 or a power of two <= 2^31, or a list [MiB:N,...,>:N] of power-of-two MiB boundaries",
     "[256:1,512:2,>:4]",
     "round request sizes up to one of N equal steps between powers of two (0 = plain 512 B rounding)",
     {},
     apply_roundup,
     format_roundup_key,
     default_roundup},
    {"garbage_collection_threshold",
     K::number,
     Reach::pool,
     "a number strictly between 0 and 1",
     "0.8",
     "free old cached blocks when reserved memory exceeds this fraction of the allowed memory "
     "(the limit set by per_process_memory_fraction or max_reserved_mb, else the device's total memory)",
     {},
     apply_gc,
     format_gc,
     default_gc},
    {"expandable_segments",
     K::boolean,
     Reach::pool,
     "True or False (any case)",
     "False",
     "grow one virtual range per pool kind (small, large) by mapping pages instead of allocating separate segments",
     {},
     apply_expandable,
     format_expandable,
     default_expandable},
    {"release_lock_on_cudamalloc",
     K::boolean,
     Reach::pool,
     "True or False (any case)",
     "True",
     "drop the pool lock while CUDA allocates or frees a segment",
     {},
     apply_release_lock,
     format_release_lock,
     default_release_lock},
    {"per_process_memory_fraction",
     K::number,
     Reach::pool,
     "a number in [0, 1] (0 = no limit)",
     "0.9",
     "reserved memory may not exceed this fraction of the device's total memory",
     {},
     apply_fraction,
     format_fraction,
     default_fraction},
    {"backend",
     K::choice,
     Reach::pool,
     "native, passthrough (cudaMallocAsync is accepted and ignored)",
     "native",
     "native = serve allocations from the pool; passthrough = hand every call to CUDA untouched",
     {},
     apply_backend,
     format_backend,
     default_backend},
    // cudapool's own keys.
    {"free_sync",
     K::choice,
     Reach::pool,
     "gpu_wait, fenced, device or immediate",
     "fenced",
     "when memory freed by cudaFree may be reused: gpu_wait = after a device-wide fence completes, "
     "or at once when memory is short, with every stream made to wait on the GPU for that fence; "
     "fenced = only after the fence completes (the pool grows meanwhile); device = the same, the "
     "host waiting on the fence when memory is short; immediate = at once on its allocation stream "
     "(PyTorch's semantics; unsafe for programs that rely on cudaFree's wait)",
     {},
     apply_free_sync,
     format_free_sync,
     default_free_sync},
    {"free_host_sync",
     K::boolean,
     Reach::pool,
     "True or False (any case)",
     "True",
     "cudaFree (and a pooled cudaFreeHost) also returns only after the device has finished all earlier "
     "work, as CUDA's own does (for programs that read results through mapped host memory after a free); "
     "costs what CUDA's wait costs",
     {},
     apply_free_host_sync,
     format_free_host_sync,
     default_free_host_sync},
    {"expandable_wait",
     K::boolean,
     Reach::pool,
     "True or False (any case)",
     "False",
     "with expandable_segments: before mapping memory beyond the most ever reserved, wait for the "
     "oldest fence of freed memory that would cover the growth instead of mapping new pages",
     {},
     apply_expandable_wait,
     format_expandable_wait,
     default_expandable_wait},
    {"expandable_page_mb",
     K::integer,
     Reach::pool,
     "a whole number of MiB <= 1024 (0 = the driver's granularity, 2 MiB on current GPUs)",
     "20",
     "with expandable_segments: the large pool maps memory in pages of this size (rounded up to the "
     "driver's granularity), one physical allocation each; larger pages make growth cheaper (CUDA's "
     "map calls cost per allocation), smaller ones give memory back and recycle it more finely",
     {},
     apply_expandable_page,
     format_expandable_page,
     default_expandable_page},
    {"expandable_unit_mb",
     K::integer,
     Reach::pool,
     "a whole number of MiB <= 1024 (0 = one page per physical allocation)",
     "64",
     "with expandable_segments: growth maps fresh memory in physical allocations of up to this size "
     "(whole pages); CUDA's map calls cost per allocation, so larger units make growth cheaper, while "
     "a unit is recycled or given back only when all of it is free. Unset, units scale with the pool: "
     "1/64 of its reserved memory, rounded down to a power of two, from one page up to 16 MiB",
     {},
     apply_expandable_unit,
     format_expandable_unit,
     default_expandable_unit},
    {"expandable_headroom",
     K::number,
     Reach::pool,
     "a number in [0, 1)",
     "0.03",
     "with expandable_segments: map fresh pages without recycling or waiting while the mapped total "
     "stays within the peak of allocated bytes times 1 + this (0 = recycle at the memory floor)",
     {},
     apply_expandable_headroom,
     format_expandable_headroom,
     default_expandable_headroom},
    {"expandable_peer_access",
     K::boolean,
     Reach::pool,
     "True or False (any case)",
     "True",
     "with expandable_segments: also let every other GPU that can reach this one (peer access) read "
     "and write the pool's pages; off, only the owning GPU can",
     {},
     apply_peer_access,
     format_peer_access,
     default_peer_access},
    {"max_reserved_mb",
     K::integer,
     Reach::pool,
     "a whole number of MiB (0 = no limit)",
     "16384",
     "absolute cap on the memory the pool reserves from the device",
     {},
     apply_max_reserved,
     format_max_reserved,
     default_max_reserved},
    {"log_level",
     K::choice,
     Reach::process,
     "trace, debug, info, warn, error, critical or off",
     "info",
     "how much cudapool logs",
     {},
     apply_log_level,
     format_log_level,
     default_log_level},
    {"log_file",
     K::text,
     Reach::files,
     "a path; %p = process id, %h = host name, %t = Unix time, %% = % (empty = stderr)",
     "/tmp/cudapool-%p.log",
     "where the log goes",
     {},
     apply_log_file,
     format_log_file,
     default_log_file},
    {"trace_file",
     K::text,
     Reach::files,
     "a path; %p, %h, %t, %% as for log_file (empty = no trace)",
     "/tmp/cudapool-%p.csv",
     "write one CSV line per pool event here",
     {},
     apply_trace_file,
     format_trace_file,
     default_trace_file},
    {"trace_call_sites",
     K::boolean,
     Reach::process,
     "True or False (any case)",
     "True",
     "with trace_file: also record where each allocation was made (the program's return addresses, as "
     "module+offset, on the allocate row), so a snapshot from the trace shows it; costs a stack walk per "
     "allocation",
     {},
     apply_call_sites,
     format_call_sites,
     default_call_sites},
    {"stats_file",
     K::text,
     Reach::files,
     "a path; %p, %h, %t, %% as for log_file (empty = none)",
     "/tmp/cudapool-%p.json",
     "write a JSON summary of the pool's counters here at exit",
     {},
     apply_stats_file,
     format_stats_file,
     default_stats_file},
    {"warm_start",
     K::text,
     Reach::reads,
     "a path to a plan written by `cudapool plan` or to a trace written under trace_file (empty = none)",
     "/var/tmp/train.plan",
     "when a device's pool starts, preallocate the segments the recorded run held at its peak, so the "
     "first step does not grow the pool; what does not fit the free memory, the caps or the group budget "
     "is left out, with a warning",
     {},
     apply_warm_start,
     format_warm_start,
     default_warm_start},
    {"dump_signal",
     K::choice,
     Reach::process,
     "off, SIGUSR1, SIGUSR2 or a signal number (not a fault or job-control signal)",
     "SIGUSR1",
     "on this signal, log the pool's stats table and a snapshot of every device and flush the "
     "trace; the program keeps running (see docs/shim.md)",
     {},
     apply_dump_signal,
     format_dump_signal,
     default_dump_signal},
    {"group",
     K::text,
     Reach::process,
     "a name of letters, digits, '_', '-' or '.' (at most 48; empty = no group)",
     "serving",
     "processes of this user on one GPU with the same group share one budget of reserved memory "
     "(needs group_budget_mb or group_budget_fraction)",
     {},
     apply_group,
     format_group,
     default_group},
    {"group_budget_mb",
     K::integer,
     Reach::process,
     "a whole number of MiB (0 = not set)",
     "40960",
     "with group: the reserved memory of all the group's processes on one GPU together stays under this",
     {},
     apply_group_budget,
     format_group_budget,
     default_group_budget},
    {"group_budget_fraction",
     K::number,
     Reach::process,
     "a number in [0, 1] (0 = not set)",
     "0.8",
     "with group: the group's budget as a fraction of the device's total memory (with group_budget_mb too, "
     "the tighter applies)",
     {},
     apply_group_fraction,
     format_group_fraction,
     default_group_fraction},
    {"group_release_wait_ms",
     K::integer,
     Reach::process,
     "a whole number of milliseconds <= 10000 (0 = do not ask)",
     "250",
     "with group: an allocation the budget refuses asks the other processes of the group to give back "
     "idle cached memory and waits up to this long before returning out-of-memory",
     {},
     apply_group_wait,
     format_group_wait,
     default_group_wait},
    {"group_budget_counts",
     K::choice,
     Reach::process,
     "footprint or pool",
     "pool",
     "with group: what the budget bounds: footprint = each process's whole device memory as the driver "
     "sees it (its pool, and its CUDA context, libraries and other memory outside the pool, charged when it "
     "joins and whenever the device shows more in use than the group has counted); pool = the pools' "
     "reserved memory only",
     {},
     apply_group_counts,
     format_group_counts,
     default_group_counts},
    {"group_outside_mb",
     K::text,
     Reach::process,
     "auto or a whole number of MiB",
     "600",
     "with group and group_budget_counts:footprint: the memory outside the pool charged to each process: "
     "auto = measured from the device's used memory (assumes the GPU runs only the group); N = N MiB per "
     "process, never measured (for a GPU shared with processes outside the group)",
     {},
     apply_group_outside,
     format_group_outside,
     default_group_outside},
    {"group_park",
     K::choice,
     Reach::process,
     "on or off",
     "on",
     "with group: when the budget still refuses an allocation after the idle-cache release, park members "
     "idle for group_park_idle_ms: their live device memory moves to their own host memory and their "
     "pages are given back (addresses kept); a parked process is restored at its next GPU call",
     {},
     apply_group_park,
     format_group_park,
     default_group_park},
    {"group_park_host_mb",
     K::text,
     Reach::process,
     "auto or a whole number of MiB >= 1",
     "65536",
     "with group_park:on: the host memory the group's parked data may take on this machine: N = the "
     "members' parked bytes together stay under N MiB; auto = one park takes at most half of the host's "
     "MemAvailable (/proc/meminfo) when it starts",
     {},
     apply_group_park_host,
     format_group_park_host,
     default_group_park_host},
    {"group_park_idle_ms",
     K::integer,
     Reach::process,
     "a whole number of milliseconds <= 86400000",
     "5000",
     "with group_park:on: a member may be parked only when it has made no GPU call for this long (members "
     "that all work take turns: one idle this long is parked even if it worked before)",
     {},
     apply_group_park_idle,
     format_group_park_idle,
     default_group_park_idle},
    {"group_park_wait_ms",
     K::integer,
     Reach::process,
     "a whole number of milliseconds in [1, 600000]",
     "60000",
     "with group_park:on: how long an allocation the budget refuses (or a parked process's restore) waits "
     "for other members to be parked before it returns out-of-memory (a park copies gigabytes)",
     {},
     apply_group_park_wait,
     format_group_park_wait,
     default_group_park_wait},
    {"publish_stats",
     K::boolean,
     Reach::process,
     "True or False (any case)",
     "False",
     "publish this process's pool figures every 250 ms for `cudapool top` (a small file in /dev/shm, "
     "readable by this user only)",
     {},
     apply_publish_stats,
     format_publish_stats,
     default_publish_stats},
    // Pinned host memory (cudaHostAlloc, cudaMallocHost): PyTorch's keys for its host allocator,
    // with the same spelling and bounds, for the shim's pinned pool (docs/policy.md).
    {"pinned_cache",
     K::boolean,
     Reach::pool,
     "True or False (any case)",
     "True",
     "serve pinned host memory (cudaHostAlloc, cudaMallocHost and the driver's cuMemHostAlloc, "
     "cuMemAllocHost) from a caching pool: a freed block is reused once the device is done with it",
     {},
     apply_pinned_cache,
     format_pinned_cache,
     default_pinned_cache},
    {"pinned_use_cuda_host_register",
     K::boolean,
     Reach::pool,
     "True or False (any case)",
     "True",
     "with pinned_cache: pin memory the pool maps itself with cudaHostRegister instead of cudaHostAlloc "
     "(write-combined requests still use cudaHostAlloc)",
     {},
     apply_pinned_register,
     format_pinned_register,
     default_pinned_register},
    {"pinned_use_hip_host_register", K::boolean, Reach::pool, "True or False (any case)", "False",
     "PyTorch on ROCm: the same as pinned_use_cuda_host_register", kPinnedHip, ignore_bool, nullptr, nullptr},
    {"pinned_num_register_threads",
     K::integer,
     Reach::pool,
     "a power of two <= 128",
     "8",
     "with pinned_use_cuda_host_register: threads that fault the pages in before they are registered",
     {},
     apply_pinned_threads,
     format_pinned_threads,
     default_pinned_threads},
    {"pinned_use_background_threads", K::boolean, Reach::pool, "True or False (any case)", "False",
     "PyTorch: free pinned memory from a background thread", kPinnedBackground, ignore_bool, nullptr, nullptr},
    {"pinned_reserve_segment_size_mb",
     K::integer,
     Reach::pool,
     "a whole number of MiB > 0",
     "64",
     "with pinned_cache: one segment of this size pinned at the first request and carved first "
     "(never given back)",
     {},
     apply_pinned_reserve,
     format_pinned_reserve,
     default_pinned_reserve},
    {"pinned_max_round_threshold_mb",
     K::integer,
     Reach::pool,
     "a whole number of MiB (unset = every size)",
     "64",
     "with pinned_cache: requests up to this size are rounded to a size class (at most 1.25x); larger ones "
     "to whole pages, and they reuse only blocks of exactly their size",
     {},
     apply_pinned_round,
     format_pinned_round,
     default_pinned_round},
    {"pinned_max_cached_size_mb",
     K::integer,
     Reach::pool,
     "a whole number of MiB (unset = no limit)",
     "1024",
     "with pinned_cache: cached (freed) pinned memory kept at most; beyond it the longest-cached goes back",
     {},
     apply_pinned_cap,
     format_pinned_cap,
     default_pinned_cap},
    {"graph_capture_record_stream_reuse", K::boolean, Reach::pool, "True or False (any case)", "False",
     "PyTorch: reuse of recorded-stream blocks during CUDA graph capture",
     "it tunes PyTorch's CUDA-graph private pools, which cudapool does not have", ignore_bool, nullptr, nullptr},
    {"release_lock_on_hipmalloc",
     K::boolean,
     Reach::pool,
     "True or False (any case)",
     "True",
     "the same as release_lock_on_cudamalloc (PyTorch accepts either spelling on every build)",
     {},
     apply_release_lock,
     nullptr,
     nullptr,
     "release_lock_on_cudamalloc"},
    // Changes device segment sizes in newer PyTorch; running without it would not be the policy
    // the user wrote, so it is refused rather than ignored.
    {"large_segment_size_mb",
     K::integer,
     Reach::pool,
     "not supported",
     "20",
     "PyTorch: segment size for requests under 10 MiB (not supported by cudapool)",
     {},
     refuse,
     nullptr,
     nullptr},
}};

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      std::size_t best = diag + (a[i - 1] == b[j - 1] ? 0 : 1);
      if (row[j] + 1 < best) best = row[j] + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[b.size()];
}

std::string_view kind_name(ValueKind k) {
  switch (k) {
    case K::integer: return "integer";
    case K::number: return "number";
    case K::boolean: return "boolean";
    case K::choice: return "choice";
    case K::text: return "path";
    case K::roundup: return "integer or list";
  }
  return "";
}

}  // namespace

std::span<const KeySpec> keys() { return kKeys; }

const KeySpec* find_key(std::string_view name) {
  for (const KeySpec& k : kKeys)
    if (k.name == name) return &k;
  return nullptr;
}

std::string suggest_key(std::string_view unknown) {
  const std::string u = lower(unknown);
  const KeySpec* best = nullptr;
  std::size_t best_d = ~std::size_t{0};
  for (const KeySpec& k : kKeys) {
    // A key cut short or with something appended ("max_split", "expandable_segments_on") is close
    // whatever its edit distance.
    const bool prefix = u.size() >= 4 && (k.name.starts_with(u) || std::string_view(u).starts_with(k.name));
    // The length difference bounds the distance from below: skip keys that cannot beat the best.
    const std::size_t floor = u.size() > k.name.size() ? u.size() - k.name.size() : k.name.size() - u.size();
    if (!prefix && floor >= best_d) continue;
    std::size_t d = prefix ? 1 : edit_distance(u, k.name);
    if (d < best_d) best_d = d, best = &k;
  }
  if (best != nullptr && (best_d <= 2 || best_d * 4 <= best->name.size()))
    return "did you mean '" + std::string(best->name) + "'?";
  std::string list;
  for (const KeySpec& k : kKeys) {
    if (!k.ignored_because.empty() || k.format == nullptr) continue;
    list += list.empty() ? "" : ", ";
    list += k.name;
  }
  return "valid keys: " + list + " (and a few PyTorch keys, accepted and ignored)";
}

std::string bad_value_message(const KeySpec& key, std::string_view value, std::string_view reason, bool toml) {
  std::string example;
  if (toml) {
    const bool quoted = key.kind == K::choice || key.kind == K::text ||
                        (key.kind == K::roundup && key.example.starts_with('['));
    std::string ex(key.example);
    if (key.kind == K::boolean) ex = lower(ex);
    example = std::string(key.name) + " = " + (quoted ? "\"" + ex + "\"" : ex);
  } else {
    example = std::string(key.name) + ":" + std::string(key.example);
  }
  std::string msg = "bad value '" + std::string(value) + "' for " + std::string(key.name);
  if (!reason.empty()) msg += " (" + std::string(reason) + ")";
  return msg + "; allowed: " + std::string(key.allowed) + ", e.g. " + example;
}

std::string apply_setting(Policy& policy, const KeySpec& key, std::string_view value, std::string origin, bool toml) {
  if (std::string why = key.apply(policy, value, policy.warnings); !why.empty())
    return bad_value_message(key, value, why, toml);
  if (!key.ignored_because.empty())
    warn_once(policy.warnings, std::string(key.name) + " is ignored: " + std::string(key.ignored_because));
  else
    policy.origin[std::string(key.alias_of.empty() ? key.name : key.alias_of)] = std::move(origin);
  return {};
}

namespace {

// A key's default as the tables print it: `value`, (empty), or — for an ignored key.
std::string default_cell(const KeySpec& k, const Policy& defaults) {
  if (k.format == nullptr) return "—";
  const std::string def = k.format(defaults);
  return def.empty() ? "(empty)" : "`" + def + "`";
}

}  // namespace

std::string key_table_markdown() {
  const Policy defaults;
  std::string s =
      "| key | type | allowed | default | what it does |\n"
      "| --- | --- | --- | --- | --- |\n";
  for (const KeySpec& k : kKeys) {
    std::string help(k.help);
    if (!k.ignored_because.empty()) help += "; **ignored**: " + std::string(k.ignored_because);
    s += "| `" + std::string(k.name) + "` | " + std::string(kind_name(k.kind)) + " | " + std::string(k.allowed) +
         " | " + default_cell(k, defaults) + " | " + help + " |\n";
  }
  return s;
}

std::string key_table_markdown_brief() {
  const Policy defaults;
  std::string s =
      "| key | default | what it does |\n"
      "| --- | --- | --- |\n";
  for (const KeySpec& k : kKeys) {
    if (k.format == nullptr) continue;  // ignored, refused or a second spelling: sets nothing itself
    s += "| `" + std::string(k.name) + "` | " + default_cell(k, defaults) + " | " + std::string(k.help) + " |\n";
  }
  return s;
}

std::optional<std::string> with_key_table(std::string_view doc, std::string_view table) {
  constexpr std::string_view kBegin = "<!-- keys:begin -->\n", kEnd = "<!-- keys:end -->";
  const auto b = doc.find(kBegin);
  if (b == std::string_view::npos) return std::nullopt;
  const auto e = doc.find(kEnd, b + kBegin.size());
  if (e == std::string_view::npos || doc.find(kBegin, e) != std::string_view::npos) return std::nullopt;
  std::string out(doc.substr(0, b + kBegin.size()));
  out += table;
  out += doc.substr(e);
  return out;
}

}  // namespace cudapool::config
