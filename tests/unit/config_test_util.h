// Helpers shared by the config tests.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <string>

#include "config/policy.h"

namespace cudapool::testing {

inline Policy must_parse(std::string_view conf, const Policy& base = Policy{}) {
  PolicyResult r = parse_conf(conf, base);
  EXPECT_TRUE(r.policy.has_value()) << "conf: " << conf << "\nerror: " << r.error;
  EXPECT_TRUE(r.error.empty());
  return r.policy.value_or(Policy{});
}

inline std::string must_fail(std::string_view conf) {
  PolicyResult r = parse_conf(conf, Policy{});
  EXPECT_FALSE(r.policy.has_value()) << "conf unexpectedly accepted: " << conf;
  EXPECT_FALSE(r.error.empty()) << "no message for: " << conf;
  return r.error;
}

// The number of fields of the aggregate T (each initialized from one AnyField, the largest count
// that compiles), so that a field added to PoolOptions or Policy fails the build below until
// expect_same_policy compares it too.
struct AnyField {
  template <typename T>
  operator T() const;
};
template <typename T, typename... Fields>
constexpr std::size_t count_fields(Fields... f) {
  if constexpr (requires { T{f..., AnyField{}}; })
    return count_fields<T>(f..., AnyField{});
  else
    return sizeof...(Fields);
}

// Every field of Policy and its PoolOptions, except origin and warnings (bookkeeping: where each
// value came from, not what it is).
inline void expect_same_policy(const Policy& a, const Policy& b) {
  static_assert(count_fields<PoolOptions>() == 16, "a PoolOptions field is not compared below");
  static_assert(count_fields<Policy>() == 29, "a Policy field is not compared below");
  static_assert(count_fields<HostPoolOptions>() == 6, "a HostPoolOptions field is not compared below");
  EXPECT_EQ(a.pool.max_split_size, b.pool.max_split_size);
  EXPECT_EQ(a.pool.max_non_split_rounding, b.pool.max_non_split_rounding);
  EXPECT_EQ(a.pool.roundup_power2_divisions, b.pool.roundup_power2_divisions);
  EXPECT_EQ(a.pool.garbage_collection_threshold, b.pool.garbage_collection_threshold);
  EXPECT_EQ(a.pool.expandable_segments, b.pool.expandable_segments);
  EXPECT_EQ(a.pool.release_lock_on_cudamalloc, b.pool.release_lock_on_cudamalloc);
  EXPECT_EQ(a.pool.per_process_memory_fraction, b.pool.per_process_memory_fraction);
  EXPECT_EQ(a.pool.max_reserved, b.pool.max_reserved);
  EXPECT_EQ(a.pool.free_sync, b.pool.free_sync);
  EXPECT_EQ(a.pool.expandable_wait, b.pool.expandable_wait);
  EXPECT_EQ(a.pool.expandable_slack, b.pool.expandable_slack);
  EXPECT_EQ(a.pool.expandable_large_page, b.pool.expandable_large_page);
  EXPECT_EQ(a.pool.expandable_max_unit, b.pool.expandable_max_unit);
  EXPECT_EQ(a.pool.expandable_unit_share, b.pool.expandable_unit_share);
  EXPECT_EQ(a.pool.expandable_headroom, b.pool.expandable_headroom);
  EXPECT_EQ(a.pool.cache_from_first_thread, b.pool.cache_from_first_thread);
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.log_level, b.log_level);
  EXPECT_EQ(a.log_file, b.log_file);
  EXPECT_EQ(a.trace_file, b.trace_file);
  EXPECT_EQ(a.trace_call_sites, b.trace_call_sites);
  EXPECT_EQ(a.stats_file, b.stats_file);
  EXPECT_EQ(a.warm_start, b.warm_start);
  EXPECT_EQ(a.dump_signal, b.dump_signal);
  EXPECT_EQ(a.expandable_peer_access, b.expandable_peer_access);
  EXPECT_EQ(a.free_host_sync, b.free_host_sync);
  EXPECT_EQ(a.on_error, b.on_error);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.group_budget, b.group_budget);
  EXPECT_EQ(a.group_budget_fraction, b.group_budget_fraction);
  EXPECT_EQ(a.group_pool_only, b.group_pool_only);
  EXPECT_EQ(a.group_outside, b.group_outside);
  EXPECT_EQ(a.group_outside_growth, b.group_outside_growth);
  EXPECT_EQ(a.group_release_wait_ms, b.group_release_wait_ms);
  EXPECT_EQ(a.group_park, b.group_park);
  EXPECT_EQ(a.group_park_host, b.group_park_host);
  EXPECT_EQ(a.group_park_idle_ms, b.group_park_idle_ms);
  EXPECT_EQ(a.group_park_wait_ms, b.group_park_wait_ms);
  EXPECT_EQ(a.publish_stats, b.publish_stats);
  EXPECT_EQ(a.pinned.enabled, b.pinned.enabled);
  EXPECT_EQ(a.pinned.use_host_register, b.pinned.use_host_register);
  EXPECT_EQ(a.pinned.register_threads, b.pinned.register_threads);
  EXPECT_EQ(a.pinned.reserve_segment, b.pinned.reserve_segment);
  EXPECT_EQ(a.pinned.max_round_threshold, b.pinned.max_round_threshold);
  EXPECT_EQ(a.pinned.max_cached, b.pinned.max_cached);
  EXPECT_EQ(a.profile, b.profile);
  EXPECT_EQ(a.profile_reason, b.profile_reason);
}

// A file under $TMPDIR (or /tmp) removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/cudapool-policy-XXXXXX";
    int fd = ::mkstemp(tmpl.data());
    EXPECT_GE(fd, 0);
    path_ = tmpl;
    ssize_t n = ::write(fd, contents.data(), contents.size());
    EXPECT_EQ(n, static_cast<ssize_t>(contents.size()));
    ::close(fd);
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace cudapool::testing
