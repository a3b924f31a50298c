// The whole policy a process runs with: the pool's options plus the shim's own settings, and
// where each key's value came from (so `cudapool check` and the shim's start line can say it).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "allocator/host_options.h"
#include "allocator/options.h"

namespace cudapool {

enum class Backend : std::uint8_t { native, passthrough };
enum class OnError : std::uint8_t { stop, passthrough };

struct Policy {
  // The shim's default differs from the bare pool's in one key: expandable segments are on (the
  // pool then maps pages into one growing range per pool kind; docs/policy.md says why). A
  // driver without virtual memory management still gets classic segments.
  // (A default member initializer rather than a constructor: Policy stays an aggregate, so the
  // config tests can count its fields and notice one their comparison does not cover.)
  PoolOptions pool = [] {
    PoolOptions o;
    o.expandable_segments = true;
    return o;
  }();
  Backend backend = Backend::native;
  std::string log_level = "warn";  // spdlog names: trace debug info warn error critical off
  std::string log_file;            // empty = stderr; %p = pid (see docs/policy.md)
  std::string trace_file;          // empty = no trace
  bool trace_call_sites = false;   // the trace records where each allocation was made
  std::string stats_file;          // empty = no JSON summary
  // A plan (`cudapool plan`) or a trace (trace_file) of an earlier run: the segments it held at
  // its peak are preallocated when a device's pool starts (shim/warm_start/warm_start.h). Empty = none.
  std::string warm_start;
  int dump_signal = 0;  // 0 = off; else the signal that dumps stats + snapshot to the log
  // expandable_segments: pages are also readable/writable by every other GPU that can reach the
  // owning one (cuDeviceCanAccessPeer); off: the owning device only.
  bool expandable_peer_access = false;
  // cudaFree (a free without a stream) also returns only once the device has finished all work
  // issued before it, as CUDA's own does (a context synchronize after the pool's free).
  bool free_host_sync = false;
  OnError on_error = OnError::stop;
  // A group of processes of this user on one GPU that share one budget of reserved memory
  // (docs/design.md, "The group ledger"). Empty = no group.
  std::string group;
  std::size_t group_budget = 0;        // bytes; 0 = not set
  double group_budget_fraction = 0.0;  // of the device's total memory; 0 = not set
  // How long an allocation that the group's budget refuses waits for other members to give
  // back idle cached memory before it returns out-of-memory.
  int group_release_wait_ms = 100;
  // What the group's budget bounds: every member's whole device footprint (its pool's reserved
  // memory and its memory outside the pool: the CUDA context, libraries, allocations the pool
  // does not serve) or, with `pool_only`, the pools' reserved memory alone.
  bool group_pool_only = false;
  // The memory outside the pool charged to each member: measured from the device's used memory
  // (-1, the default) or this many bytes per process.
  std::int64_t group_outside = -1;
  // With the measured charge: what each member's context may still grow by after it joins
  // (kernels loaded at their first launch, library handles), held for it in the budget from its
  // join, so that the device stays under the budget while contexts grow.
  std::uint64_t group_outside_growth = 128ull << 20;
  // Parking (docs/policy.md, "Parking"): with it on, an allocation the group's budget still
  // refuses after the idle-cache release asks members that have been idle for group_park_idle_ms
  // to move their live memory to host memory (their ranges kept, restored at their next GPU
  // call), and waits up to group_park_wait_ms for the bytes; off by default.
  bool group_park = false;
  // The host memory the group's parked data may take on this machine, in bytes: -1 (auto) = a
  // park takes at most half of the host's MemAvailable when it starts; else the parked data of
  // all the group's members together stays under this.
  std::int64_t group_park_host = -1;
  int group_park_idle_ms = 2000;   // a member idle at least this long may be parked
  int group_park_wait_ms = 30000;  // a refused allocation (or a restore) waits this long for a park
  // Publish a small per-process stats record for `cudapool top` (every 250 ms, from a helper
  // thread started with the first pool).
  bool publish_stats = true;
  // Pinned host memory (cudaHostAlloc, cudaMallocHost) from a caching pool: the pinned_* keys.
  HostPoolOptions pinned;
  // key -> origin ("default", "file /p/x.toml:3", "profile train (/p/x.toml:9)", "CUDAPOOL_CONF col 5")
  std::map<std::string, std::string> origin;
  std::vector<std::string> warnings;  // accepted-but-ignored keys etc.
  // The TOML profile applied ("" = none) and why ("CUDAPOOL_PROFILE", "match glob '*train*'").
  std::string profile;
  std::string profile_reason;
};

// Where the policy comes from. Empty strings mean "not set".
struct PolicySources {
  std::string conf;          // CUDAPOOL_CONF
  std::string config_path;   // CUDAPOOL_CONFIG
  std::string profile;       // CUDAPOOL_PROFILE
  std::string command_line;  // for profile `match` globs ("prog arg1 arg2")
  std::string on_error;      // CUDAPOOL_ON_ERROR: "stop" (default) or "passthrough"
  std::string trace_file;    // CUDAPOOL_TRACE: shortcut for trace_file, above CUDAPOOL_CONF
  std::string stats_file;    // CUDAPOOL_STATS: shortcut for stats_file, above CUDAPOOL_CONF
  // How messages name each source: what the user set (a variable, or a flag of `cudapool`).
  std::string conf_name = "CUDAPOOL_CONF";
  std::string config_name = "CUDAPOOL_CONFIG";
  std::string profile_name = "CUDAPOOL_PROFILE";
  std::string trace_name = "CUDAPOOL_TRACE";
  std::string stats_name = "CUDAPOOL_STATS";
  // Check that trace_file and stats_file can be written (see check_output_file). On for every
  // caller: a process that would lose its trace or summary at exit should hear so at start.
  bool check_outputs = true;
  // Secure mode (sys/secure.h): every source above is ignored; the policy is the default with
  // nothing that writes a file (publish_stats off). `ignored` names the CUDAPOOL_* variables that
  // were set, for the message.
  bool secure = false;
  std::vector<std::string> ignored;
};

struct PolicyResult {
  std::optional<Policy> policy;  // set on success
  std::string error;             // set on failure: what is wrong and how to fix it
  // What to do when `error` is set (from CUDAPOOL_ON_ERROR, read first so it holds even then).
  OnError on_error = OnError::stop;
  // Loaded in secure mode, and the variables it ignored (PolicySources::secure).
  bool secure = false;
  std::vector<std::string> ignored;
};

// Parse a CUDAPOOL_CONF / PYTORCH_CUDA_ALLOC_CONF string over `base`.
PolicyResult parse_conf(std::string_view text, const Policy& base, std::string_view origin_name = "CUDAPOOL_CONF");
// Full layering: defaults < file [policy] < profile < CUDAPOOL_CONF < CUDAPOOL_TRACE/CUDAPOOL_STATS.
PolicyResult load_policy(const PolicySources& sources);
// Sources from the environment (CUDAPOOL_CONF, CUDAPOOL_CONFIG, CUDAPOOL_PROFILE, CUDAPOOL_ON_ERROR,
// CUDAPOOL_TRACE, CUDAPOOL_STATS, /proc/self/cmdline); in secure mode none of the variables.
PolicySources sources_from_environment();
// What the shim calls once at start: load_policy(sources_from_environment()), never throws.
PolicyResult load_policy_from_environment();
// One line per key: "key = value   (origin)"; the effective policy as `cudapool check` prints it.
std::string describe(const Policy& policy);
// The effective policy as a CUDAPOOL_CONF string that parse_conf accepts back.
std::string to_conf_string(const Policy& policy);

// A policy from a file the tools are only given to read (a trace's policy row) is untrusted: it
// must not choose files to write, signals to catch, groups to join, logging or publishing. Its
// pool-shaping keys (config::Reach::pool) pass, as config/'s canonical CUDAPOOL_CONF string;
// every other key it sets is dropped and named.
struct UntrustedConf {
  struct Dropped {
    std::string key;  // "stats_file"
    std::string why;  // "a trace cannot choose files to write"
  };
  std::string conf;              // what is kept; "" = the defaults (and when `error` is set)
  std::vector<Dropped> dropped;  // in the key table's order
  std::string error;             // set when the text is not a valid policy: then nothing of it is kept
};
// "stats_file, trace_file (a trace cannot choose files to write); group (...)": one line.
std::string describe_dropped(const std::vector<UntrustedConf::Dropped>& dropped);
// `source` names the file's kind in the reasons ("a trace").
UntrustedConf pool_shaping_conf(std::string_view text, std::string_view source);

// "" when `path` can be created or overwritten by this process (its directory exists and is
// writable, and what is there already is a regular file of this process's user: not a directory,
// a symbolic link, a FIFO, a device or another user's file, which the writers refuse:
// sys/output_file.h), else what is wrong and how to fix it. `key` and
// `origin` name the setting in the message ("stats_file", "CUDAPOOL_CONF col 5").
std::string check_output_file(const std::string& path, const std::string& key, const std::string& origin);

// Exit status of a CUDA process stopped because its policy is invalid.
inline constexpr int kPolicyErrorExitStatus = 78;  // EX_CONFIG from sysexits.h

}  // namespace cudapool
