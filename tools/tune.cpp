#include "tools/tune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "config/policy.h"
#include "tools/policies.h"
#include "tools/units.h"

namespace cudapool::tools {

std::vector<TuneKey> default_search_space(const TraceFacts& facts, bool sync_frees) {
  std::vector<TuneKey> space;
  // max_split_size_mb: only values below the largest allocation can change anything.
  TuneKey split{"max_split_size_mb", {"", kUnsetValue}};
  for (const std::size_t mb : std::initializer_list<std::size_t>{32, 64, 128, 256, 512, 1024})
    if (mb * 1024 * 1024 < std::max<std::size_t>(facts.largest_allocation, 64u << 20))
      split.values.push_back(std::to_string(mb));
  space.push_back(split);
  space.push_back({"roundup_power2_divisions", {"", kUnsetValue, "2", "4", "8", "16"}});
  space.push_back({"garbage_collection_threshold", {"", kUnsetValue, "0.6", "0.8"}});
  // free_sync decides when memory freed with cudaFree comes back; with none, nothing to try.
  // immediate is left out: it changes what the program may observe (memory reused while other
  // streams still read it), which no trace shows; compare it by hand with replay --sweep.
  if (sync_frees) space.push_back({"free_sync", {"", "gpu_wait", "fenced", "device"}});
  space.push_back({"expandable_segments", {"", "False", "True"}});
  space.push_back({"expandable_page_mb", {"", "0", "20"}, true});
  space.push_back({"expandable_unit_mb", {"", "0", "16", "64"}, true});
  space.push_back({"expandable_headroom", {"", "0", "0.03", "0.1"}, true});
  space.push_back({"expandable_wait", {"", "True", "False"}, true});
  return space;
}

namespace {

using Assignment = std::vector<std::string>;  // one value per key of the space

// key -> value of a canonical conf string (split at commas outside brackets).
std::map<std::string, std::string> entries(const std::string& conf) {
  std::map<std::string, std::string> out;
  for (const std::string& part : split_conf(conf)) {
    if (part.empty()) continue;
    const auto colon = part.find(':');
    out[part.substr(0, colon)] = colon == std::string::npos ? "" : part.substr(colon + 1);
  }
  return out;
}

// The candidate's conf over the base, canonical (so equal policies are one candidate).
bool conf_of(const std::string& base, const std::vector<TuneKey>& space, const Assignment& a, std::string* conf,
             Policy* policy, std::string* error) {
  std::string c = base;
  for (std::size_t k = 0; k < space.size(); ++k) {
    if (a[k].empty()) continue;
    c = with_conf_key(c, space[k].key, a[k] == kUnsetValue ? "" : a[k]);
  }
  if (!policy_from_conf(c, policy, error)) {
    *error = "candidate '" + c + "': " + *error;
    return false;
  }
  *conf = to_conf_string(*policy);
  return true;
}

std::string changes_of(const std::map<std::string, std::string>& base, const std::string& conf, int* changed) {
  auto mine = entries(conf);
  std::string out;
  *changed = 0;
  for (const auto& [k, v] : mine) {
    auto it = base.find(k);
    if (it == base.end() || it->second != v) {
      out = join_conf(out, k + ":" + v);
      ++*changed;
    }
  }
  for (const auto& [k, v] : base)
    if (!mine.count(k)) {
      out = join_conf(out, k + ":" + kUnsetValue);
      ++*changed;
    }
  return out;
}

std::int64_t peak_reserved(const Candidate& c) { return c.result.stats.reserved_bytes[kAll].peak; }
std::int64_t calls(const Candidate& c) { return static_cast<std::int64_t>(c.result.upstream_calls); }
// What the bound limits: calls to the device (each a synchronizing cudaMalloc/cudaFree or a
// map/unmap on a real GPU) and host waits on fences (each a stall of the program).
std::int64_t costly(const Candidate& c) { return calls(c) + c.result.stats.fence_waits; }

// Strict "a ranks before b".
bool better(const Candidate& a, const Candidate& b) {
  if (a.feasible != b.feasible) return a.feasible;
  if (peak_reserved(a) != peak_reserved(b)) return peak_reserved(a) < peak_reserved(b);
  if (calls(a) != calls(b)) return calls(a) < calls(b);
  if (a.changed_keys != b.changed_keys) return a.changed_keys < b.changed_keys;
  return a.conf < b.conf;
}

}  // namespace

bool tune(const PreparedTrace& trace, const std::vector<TuneKey>& space, const TuneConfig& config, TuneResult* out,
          std::string* error) {
  std::map<std::string, Candidate> seen;
  int budget = std::max(1, config.budget);
  std::int64_t base_cost = 0, base_ooms = 0;
  std::string base_conf;
  {
    Policy p;
    if (!policy_from_conf(config.base, &p, error)) {
      *error = "base policy '" + config.base + "': " + *error;
      return false;
    }
    base_conf = to_conf_string(p);
  }
  const auto base_entries = entries(base_conf);
  auto evaluate = [&](const Assignment& a) -> const Candidate* {
    std::string conf;
    Policy policy;
    if (!conf_of(base_conf, space, a, &conf, &policy, error)) return nullptr;
    if (auto it = seen.find(conf); it != seen.end()) return &it->second;
    if (static_cast<int>(seen.size()) >= budget) return nullptr;
    ReplayConfig rc = config.replay;
    rc.pool = policy.pool;
    Candidate c;
    c.conf = conf;
    c.changes = changes_of(base_entries, conf, &c.changed_keys);
    c.result = replay_trace(trace, rc);
    if (config.on_replay) config.on_replay();
    if (seen.empty()) {  // the base comes first and sets the bound
      base_cost = costly(c);
      base_ooms = c.result.stats.num_ooms;
    }
    c.feasible = static_cast<double>(costly(c)) <= config.call_bound * static_cast<double>(base_cost) &&
                 c.result.stats.num_ooms <= base_ooms;
    return &seen.emplace(conf, std::move(c)).first->second;
  };
  std::size_t expandable_key = space.size();
  for (std::size_t k = 0; k < space.size(); ++k)
    if (space[k].key == "expandable_segments") expandable_key = k;
  const bool base_expandable = [&] {
    Policy p;
    std::string e;
    return policy_from_conf(base_conf, &p, &e) && p.pool.expandable_segments;
  }();
  auto expandable_on = [&](const Assignment& a) {
    if (expandable_key == space.size() || a[expandable_key].empty()) return base_expandable;
    return a[expandable_key] == "True";
  };

  Assignment best(space.size(), "");
  const Candidate* best_c = evaluate(best);
  if (!best_c) return false;
  bool improved = true;
  while (improved && static_cast<int>(seen.size()) < budget) {
    improved = false;
    for (std::size_t k = 0; k < space.size(); ++k) {
      if (space[k].expandable_only && !expandable_on(best)) continue;  // would change nothing
      for (const auto& v : space[k].values) {
        if (v == best[k]) continue;
        Assignment trial = best;
        trial[k] = v;
        const Candidate* c = evaluate(trial);
        if (!c) {
          if (!error->empty()) return false;
          continue;  // budget spent: the remaining candidates are cached ones only
        }
        if (better(*c, *best_c)) {
          best = trial;
          best_c = c;
          improved = true;
        }
      }
    }
  }

  out->ranked.clear();
  for (auto& [conf, c] : seen) out->ranked.push_back(std::move(c));
  std::sort(out->ranked.begin(), out->ranked.end(), better);
  for (std::size_t i = 0; i < out->ranked.size(); ++i)
    if (out->ranked[i].changes.empty()) out->default_index = i;
  out->call_limit = config.call_bound * static_cast<double>(base_cost);
  return true;
}

void apply_replay_error(TuneResult* r, std::optional<double> error) {
  r->replay_error = error;
  if (!error || r->ranked.empty()) return;
  const double base_peak = static_cast<double>(r->ranked[r->default_index].result.stats.reserved_bytes[kAll].peak);
  for (Candidate& c : r->ranked) {
    const double peak = static_cast<double>(c.result.stats.reserved_bytes[kAll].peak);
    // (with a margin for rounding: a saving equal to the error is inside it)
    c.beyond_error = c.changes.empty() || (base_peak > 0 && 1.0 - peak / base_peak > *error + 1e-12);
  }
  // Feasible and beyond the error first (the base among them), in their order; then the rest.
  std::stable_partition(r->ranked.begin(), r->ranked.end(),
                        [](const Candidate& c) { return c.feasible && c.beyond_error; });
  for (std::size_t i = 0; i < r->ranked.size(); ++i)
    if (r->ranked[i].changes.empty()) r->default_index = i;
}

void apply_minimum_saving(TuneResult* r, double fraction, std::size_t bytes) {
  if (r->ranked.empty()) return;
  const auto base_peak = static_cast<double>(r->ranked[r->default_index].result.stats.reserved_bytes[kAll].peak);
  r->min_saving = std::max(bytes, static_cast<std::size_t>(std::ceil(base_peak * fraction)));
  for (Candidate& c : r->ranked) {
    const auto peak = static_cast<double>(c.result.stats.reserved_bytes[kAll].peak);
    c.above_minimum = c.changes.empty() || base_peak - peak >= static_cast<double>(r->min_saving);
  }
  std::stable_partition(r->ranked.begin(), r->ranked.end(),
                        [](const Candidate& c) { return c.feasible && c.beyond_error && c.above_minimum; });
  for (std::size_t i = 0; i < r->ranked.size(); ++i)
    if (r->ranked[i].changes.empty()) r->default_index = i;
}

std::vector<std::string> explain_pick(const TuneResult& r) {
  std::vector<std::string> lines;
  if (r.ranked.empty()) return lines;
  const Candidate& pick = r.ranked.front();
  const Candidate& base = r.ranked[r.default_index];
  auto peak = [](const Candidate& c) { return static_cast<double>(c.result.stats.reserved_bytes[kAll].peak); };
  auto pct = [](double a, double b) { return b > 0 ? (a / b - 1.0) * 100.0 : 0.0; };
  char buf[700];
  auto numbers = [&](const Candidate& c) {
    char b[300];
    std::snprintf(b, sizeof b,
                  "peak reserved %s, %llu upstream calls, %lld fence waits, %llu VMM handle ops, %lld OOMs",
                  format_bytes(peak(c)).c_str(), static_cast<unsigned long long>(c.result.upstream_calls),
                  static_cast<long long>(c.result.stats.fence_waits),
                  static_cast<unsigned long long>(c.result.unit_ops), static_cast<long long>(c.result.stats.num_ooms));
    return std::string(b);
  };
  const std::string name = pick.changes.empty() ? "the base policy" : pick.changes;
  if (pick.changes.empty()) {
    std::string by;
    if (r.replay_error) {
      std::snprintf(buf, sizeof buf, "by more than the replay error (%.1f %%) ", *r.replay_error * 100.0);
      by = buf;
    }
    if (r.min_saving > 0)
      by += (by.empty() ? "" : "and ") + std::string("by at least the minimum saving (") +
            format_bytes(static_cast<double>(r.min_saving)) + ") ";
    lines.push_back("why: nothing searched lowers peak reserved " + by +
                    "within the bound; the base: " + numbers(base));
  } else {
    std::snprintf(buf, sizeof buf,
                  "why: %s saves %s of peak reserved (%+.1f %%) against the base, for %+lld upstream calls and "
                  "%+lld fence waits (bound: %.0f of the two together)",
                  name.c_str(), format_bytes(peak(base) - peak(pick)).c_str(), pct(peak(pick), peak(base)),
                  static_cast<long long>(pick.result.upstream_calls) -
                      static_cast<long long>(base.result.upstream_calls),
                  static_cast<long long>(pick.result.stats.fence_waits) -
                      static_cast<long long>(base.result.stats.fence_waits),
                  r.call_limit);
    lines.push_back(buf);
    lines.push_back("  pick: " + numbers(pick));
    lines.push_back("  base: " + numbers(base));
  }
  // The runner-up: the best candidate that is a different policy.
  if (r.ranked.size() > 1) {
    const Candidate& ru = r.ranked[1];
    std::string why;
    if (ru.feasible && ru.beyond_error && !ru.above_minimum && peak(ru) < peak(base)) {
      std::snprintf(buf, sizeof buf, "its saving (%s) is under the minimum saving (%s)",
                    format_bytes(peak(base) - peak(ru)).c_str(),
                    format_bytes(static_cast<double>(r.min_saving)).c_str());
      why = buf;
    } else if (ru.feasible && !ru.beyond_error && r.replay_error) {
      std::snprintf(buf, sizeof buf, "its saving (%.1f %%) is inside the replay error (%.1f %%)",
                    -pct(peak(ru), peak(base)), *r.replay_error * 100.0);
      why = buf;
    } else if (!ru.feasible && pick.feasible) {
      why = ru.result.stats.num_ooms > base.result.stats.num_ooms ? "more OOMs than the base"
                                                                  : "over the bound on upstream calls";
    } else if (peak(ru) != peak(pick)) {
      std::snprintf(buf, sizeof buf, "%s more peak reserved", format_bytes(peak(ru) - peak(pick)).c_str());
      why = buf;
    } else if (ru.result.upstream_calls != pick.result.upstream_calls) {
      why = "the same peak with more upstream calls";
    } else if (ru.changed_keys != pick.changed_keys) {
      why = "the same peak and calls with more changed keys";
    } else {
      why = "a tie with the pick (taken by name)";
    }
    lines.push_back("runner-up: " + (ru.changes.empty() ? std::string("the base policy") : ru.changes) + ": " +
                    numbers(ru) + "; ranks lower: " + why);
  }
  // The lowest peak found, when the bound is what kept it out.
  const Candidate* lowest = nullptr;
  for (const Candidate& c : r.ranked)
    if (!c.feasible && c.result.stats.num_ooms <= base.result.stats.num_ooms && peak(c) < peak(pick) &&
        (!lowest || peak(c) < peak(*lowest)))
      lowest = &c;
  if (lowest) {
    const double cost = static_cast<double>(lowest->result.upstream_calls +
                                            static_cast<std::uint64_t>(lowest->result.stats.fence_waits));
    const double base_cost = static_cast<double>(base.result.upstream_calls +
                                                 static_cast<std::uint64_t>(base.result.stats.fence_waits));
    std::snprintf(buf, sizeof buf,
                  "outside the bound: %s would peak at %s (%+.1f %% against the pick) but costs %.0f upstream calls "
                  "+ fence waits, over the bound of %.0f (--bound %.1f would admit it)",
                  lowest->changes.c_str(), format_bytes(peak(*lowest)).c_str(), pct(peak(*lowest), peak(pick)), cost,
                  r.call_limit, base_cost > 0 ? std::ceil(cost / base_cost * 10.0) / 10.0 : 1000.0);
    lines.push_back(buf);
  }
  // What each changed key of the pick is worth: the pick without that key, where replayed.
  if (pick.changed_keys > 1) {
    auto pick_entries = entries(pick.changes);
    for (const auto& [k, v] : pick_entries) {
      for (const Candidate& c : r.ranked) {
        auto ce = entries(c.changes);
        if (c.changed_keys != pick.changed_keys - 1 || ce.count(k)) continue;
        bool rest_same = true;
        for (const auto& [k2, v2] : pick_entries)
          if (k2 != k && (!ce.count(k2) || ce[k2] != v2)) rest_same = false;
        if (!rest_same) continue;
        std::snprintf(buf, sizeof buf, "  without %s:%s: peak reserved %s (%+.1f %%), %llu upstream calls", k.c_str(),
                      v.c_str(), format_bytes(peak(c)).c_str(), pct(peak(c), peak(pick)),
                      static_cast<unsigned long long>(c.result.upstream_calls));
        lines.push_back(buf);
        break;
      }
    }
  }
  if (pick.conf.find("free_sync:immediate") != std::string::npos)
    lines.push_back(
        "caution: free_sync:immediate reuses cudaFree'd memory at once on its stream; right only for "
        "programs that order every reuse themselves (README, \"Choosing free_sync\")");
  return lines;
}

}  // namespace cudapool::tools
