// What both fuzz targets assert about a result: a rejection carries a message; an accepted policy
// survives to_conf_string -> parse_conf unchanged, and its canonical text is a fixed point.
#pragma once
#include <cstdio>
#include <cstdlib>

#include "config/policy.h"

namespace cudapool::fuzz {

[[noreturn]] inline void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz check failed: %s\n%s\n", what, detail.c_str());
  std::abort();
}

inline bool same(const Policy& a, const Policy& b) {
  return a.pool.max_split_size == b.pool.max_split_size &&
         a.pool.max_non_split_rounding == b.pool.max_non_split_rounding &&
         a.pool.roundup_power2_divisions == b.pool.roundup_power2_divisions &&
         a.pool.garbage_collection_threshold == b.pool.garbage_collection_threshold &&
         a.pool.expandable_segments == b.pool.expandable_segments &&
         a.pool.release_lock_on_cudamalloc == b.pool.release_lock_on_cudamalloc &&
         a.pool.per_process_memory_fraction == b.pool.per_process_memory_fraction &&
         a.pool.max_reserved == b.pool.max_reserved && a.pool.free_sync == b.pool.free_sync && a.backend == b.backend &&
         a.log_level == b.log_level && a.log_file == b.log_file && a.trace_file == b.trace_file &&
         a.stats_file == b.stats_file;
}

inline void check(const PolicyResult& r) {
  if (!r.policy) {
    if (r.error.empty()) fail("rejected without a message", "");
    return;
  }
  if (!r.error.empty()) fail("accepted with an error set", r.error);
  const std::string canon = to_conf_string(*r.policy);
  PolicyResult back = parse_conf(canon, Policy{});
  if (!back.policy) fail("to_conf_string output rejected", canon + "\n" + back.error);
  if (!same(*back.policy, *r.policy)) fail("round trip changed the policy", canon);
  if (to_conf_string(*back.policy) != canon) fail("canonical text not a fixed point", canon);
  if (describe(*r.policy).empty()) fail("empty describe()", canon);
}

}  // namespace cudapool::fuzz
