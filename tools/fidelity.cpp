#include "tools/fidelity.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "config/policy.h"
#include "tools/policies.h"
#include "tools/units.h"

namespace cudapool::tools {

BasePolicy choose_base_policy(const TraceFacts& facts, const std::optional<std::string>& conf_flag) {
  if (conf_flag)
    return {*conf_flag, "from --conf",
            facts.recorded_policy && canonical_conf(*conf_flag) == canonical_conf(*facts.recorded_policy)};
  if (const char* env = ::secure_getenv("CUDAPOOL_CONF")) {
    std::string conf = env;
    return {conf, "from $CUDAPOOL_CONF",
            facts.recorded_policy && canonical_conf(conf) == canonical_conf(*facts.recorded_policy)};
  }
  if (facts.recorded_policy)
    return {*facts.recorded_policy,
            facts.policy_assumed ? "assumed: the trace records no policy; its segment rows show expandable_segments"
                                 : "from the trace's policy row",
            true};
  return {"", "the trace records no policy", false};
}

std::string canonical_conf(const std::string& conf) {
  Policy p;
  std::string err;
  if (!policy_from_conf(conf, &p, &err)) return "";
  return to_conf_string(p);
}

std::string describe_frees(const TraceFacts& f, FreeMode mode) {
  char buf[400];
  const std::size_t known = f.sync_frees + f.async_frees;
  if (mode == FreeMode::sync) {
    std::snprintf(buf, sizeof buf, "frees: every free replayed as cudaFree (--free-as sync)%s",
                  f.async_frees ? "; the trace records some as cudaFreeAsync" : "");
  } else if (mode == FreeMode::async) {
    std::snprintf(buf, sizeof buf, "frees: every free replayed as cudaFreeAsync (--free-as async)%s",
                  f.sync_frees ? "; the trace records some as cudaFree" : "");
  } else if (f.unknown_frees == 0) {
    std::snprintf(buf, sizeof buf, "frees: as recorded: %zu cudaFree, %zu cudaFreeAsync", f.sync_frees, f.async_frees);
  } else if (known == 0) {
    std::snprintf(buf, sizeof buf,
                  "frees: the trace does not say which call freed (%s); replayed as cudaFreeAsync, "
                  "use --free-as sync for a program that calls cudaFree",
                  f.rmm_only ? "an allocation log" : "written before traces recorded it");
  } else {
    std::snprintf(buf, sizeof buf,
                  "frees: as recorded: %zu cudaFree, %zu cudaFreeAsync; %zu unknown, replayed as cudaFreeAsync",
                  f.sync_frees, f.async_frees, f.unknown_frees);
  }
  return buf;
}

Fidelity check_fidelity(const TraceFacts& f, const BasePolicy& base, const ReplayResult& replayed, FreeMode mode,
                        double fence_latency_us) {
  Fidelity out;
  if (!f.recorded_peak_reserved || *f.recorded_peak_reserved == 0) {
    out.line = "fidelity: nothing to compare: the trace records no peak reserved (" +
               std::string(f.rmm_only ? "an allocation log without the pool's rows" : "no segment rows") + ")";
    return out;
  }
  const double rec = static_cast<double>(*f.recorded_peak_reserved);
  const double got = static_cast<double>(replayed.stats.reserved_bytes[kAll].peak);
  out.compared = true;
  out.gap = got / rec - 1.0;
  out.within = std::fabs(out.gap) <= kFidelityTolerance;
  char buf[600];
  std::string under = base.recorded ? (f.policy_assumed ? "the assumed policy" : "the recorded policy")
                                    : (base.conf.empty() ? "the defaults" : "'" + base.conf + "'");
  std::snprintf(buf, sizeof buf,
                "fidelity: under %s the replay peaks at %s reserved, the trace recorded %s (%+.1f %%): %s",
                under.c_str(), format_bytes(got).c_str(), format_bytes(rec).c_str(), out.gap * 100.0,
                out.within ? "within 3 %" : "NOT within 3 %");
  out.line = buf;
  // Why the two could differ, most likely first; said whenever it applies, and always when the
  // gap is over the tolerance.
  std::string why;
  auto add = [&](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
  if (!f.recorded_policy)
    add("the trace records no policy, so the recorded peak may be another policy's");
  else if (f.policy_assumed)
    add("the trace records no policy; only expandable_segments could be read from its rows");
  else if (!base.recorded)
    add("the replayed policy is not the recorded one (" + *f.recorded_policy + ")");
  if (mode == FreeMode::recorded && f.unknown_frees > 0)
    add("the trace does not say which call freed, so frees replayed as cudaFreeAsync");
  if (mode != FreeMode::recorded && f.sync_frees + f.async_frees > 0)
    add("--free-as overrides the recorded free calls");
  if (!f.rmm_only && !f.device_facts) add("the trace does not record the device's page size (2 MiB assumed)");
  if (!f.unit_mismatches.empty()) add("the recording pool's allocation units differ from this build's");
  if (f.upstream_durations)
    add(std::string("recorded on a real GPU: when each fence completed is not in the trace") +
        (fence_latency_us == 0 ? " (the replay's fences complete by the next call)" : ""));
  if (f.threads > 1) add("the program allocated from " + std::to_string(f.threads) + " threads, the replay uses one");
  if (!out.within && why.empty()) add("the pool's placement rules changed since the trace was recorded");
  if (!why.empty() && (!out.within || !base.recorded)) out.line += "\n  why it may differ: " + why;
  return out;
}

}  // namespace cudapool::tools

namespace cudapool::tools {

namespace {

// A replay's settings that flags can give, with those flags.
struct Try {
  std::string flags;
  ReplayConfig cfg;
};

// The replay's own assumptions that a flag can change: how frees replay, and how far the GPU
// lagged; every combination but the one already replayed.
std::vector<Try> advice_tries(const ReplayConfig& config) {
  std::vector<Try> tries;
  const char* modes[] = {"recorded", "sync", "async"};
  const FreeMode values[] = {FreeMode::recorded, FreeMode::sync, FreeMode::async};
  for (int m = 0; m < 3; ++m) {
    for (double lat : {0.0, 100.0, 1000.0}) {
      if (values[m] == config.free_mode && static_cast<std::int64_t>(lat * 1000) == config.fence_latency_ns) continue;
      Try t{"", config};
      t.cfg.free_mode = values[m];
      t.cfg.fence_latency_ns = static_cast<std::int64_t>(lat * 1000);
      if (values[m] != FreeMode::recorded) t.flags = std::string("--free-as ") + modes[m];
      if (lat > 0) {
        char b[48];
        std::snprintf(b, sizeof b, "%s--fence-latency-us %g", t.flags.empty() ? "" : " ", lat);
        t.flags += b;
      }
      if (t.flags.empty()) t.flags = "--free-as recorded --fence-latency-us 0";
      tries.push_back(std::move(t));
    }
  }
  return tries;
}

// Of the tries, the one closest to the recording within the tolerance (found), and the closest
// gap of all (starting from the replay's own).
struct TryOutcome {
  bool found = false;
  std::string best_flags;
  double best_gap = 0;
  double closest;
};

TryOutcome replay_tries(const PreparedTrace& trace, const std::vector<Try>& tries, double gap_now) {
  const double rec = static_cast<double>(*trace.facts.recorded_peak_reserved);
  TryOutcome out;
  out.closest = gap_now;
  for (const Try& t : tries) {
    const double got = static_cast<double>(replay_trace(trace, t.cfg).stats.reserved_bytes[kAll].peak);
    const double gap = got / rec - 1.0;
    if (std::fabs(gap) < std::fabs(out.closest)) out.closest = gap;
    if (std::fabs(gap) <= kFidelityTolerance && (!out.found || std::fabs(gap) < std::fabs(out.best_gap))) {
      out.found = true;
      out.best_gap = gap;
      out.best_flags = t.flags;
    }
  }
  return out;
}

}  // namespace

std::string fidelity_advice(const PreparedTrace& trace, const ReplayConfig& config, const Fidelity& fidelity) {
  if (!fidelity.compared || fidelity.within) return "";
  const TraceFacts& f = trace.facts;
  // Each assumption is tried; only what brings the replay within the tolerance is advised.
  const TryOutcome r = replay_tries(trace, advice_tries(config), fidelity.gap);
  char buf[400];
  if (r.found) {
    std::snprintf(buf, sizeof buf, "  advice: with %s the replay is within 3 %% (%+.1f %%); use it for this trace",
                  r.best_flags.c_str(), r.best_gap * 100.0);
  } else {
    std::snprintf(buf, sizeof buf,
                  "  advice: no --free-as or --fence-latency-us setting brings it within 3 %% (closest %+.1f %%); "
                  "%s",
                  r.closest * 100.0,
                  f.device_facts && f.recorded_policy && !f.policy_assumed ? "read its peaks as the pool's ranking of "
                                                                             "policies, not as exact figures"
                                                                           : "record the trace again with this "
                                                                             "cudapool (it then records its policy, "
                                                                             "free calls and "
                                                                             "page size), or give the recording's "
                                                                             "policy with --conf");
  }
  return buf;
}

}  // namespace cudapool::tools
