#include "tools/tune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

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

// The candidates replayed so far (by canonical conf, at most the budget) and the bound the base,
// replayed first, sets for the others.
class Search {
 public:
  Search(const PreparedTrace& trace, const std::vector<TuneKey>& space, const TuneConfig& config, std::string base_conf)
      : trace_(trace),
        space_(space),
        config_(config),
        budget_(std::max(1, config.budget)),
        base_conf_(std::move(base_conf)),
        base_entries_(entries(base_conf_)) {
    for (std::size_t k = 0; k < space.size(); ++k)
      if (space[k].key == "expandable_segments") expandable_key_ = k;
    Policy p;
    std::string e;
    base_expandable_ = policy_from_conf(base_conf_, &p, &e) && p.pool.expandable_segments;
  }

  // The candidate of an assignment, replayed unless seen before; null when the budget is spent or
  // (with *error) its conf is rejected.
  const Candidate* evaluate(const Assignment& a, std::string* error) {
    std::string conf;
    Policy policy;
    if (!conf_of(base_conf_, space_, a, &conf, &policy, error)) return nullptr;
    if (auto it = seen_.find(conf); it != seen_.end()) return &it->second;
    if (!budget_left()) return nullptr;
    ReplayConfig rc = config_.replay;
    rc.pool = policy.pool;
    Candidate c;
    c.conf = conf;
    c.changes = changes_of(base_entries_, conf, &c.changed_keys);
    c.result = replay_trace(trace_, rc);
    if (config_.on_replay) config_.on_replay();
    if (seen_.empty()) {  // the base comes first and sets the bound
      base_cost_ = costly(c);
      base_ooms_ = c.result.stats.num_ooms;
    }
    c.feasible = static_cast<double>(costly(c)) <= config_.call_bound * static_cast<double>(base_cost_) &&
                 c.result.stats.num_ooms <= base_ooms_;
    return &seen_.emplace(conf, std::move(c)).first->second;
  }

  bool expandable_on(const Assignment& a) const {
    if (expandable_key_ == space_.size() || a[expandable_key_].empty()) return base_expandable_;
    return a[expandable_key_] == "True";
  }

  bool budget_left() const { return static_cast<int>(seen_.size()) < budget_; }

  // Every candidate seen, best first.
  void rank(TuneResult* out) {
    out->ranked.clear();
    for (auto& [conf, c] : seen_) out->ranked.push_back(std::move(c));
    std::sort(out->ranked.begin(), out->ranked.end(), better);
    for (std::size_t i = 0; i < out->ranked.size(); ++i)
      if (out->ranked[i].changes.empty()) out->default_index = i;
    out->call_limit = config_.call_bound * static_cast<double>(base_cost_);
  }

 private:
  const PreparedTrace& trace_;
  const std::vector<TuneKey>& space_;
  const TuneConfig& config_;
  int budget_;
  std::string base_conf_;
  std::map<std::string, std::string> base_entries_;
  std::map<std::string, Candidate> seen_;
  std::int64_t base_cost_ = 0, base_ooms_ = 0;
  std::size_t expandable_key_ = space_.size();
  bool base_expandable_ = false;
};

// The best assignment so far and its candidate.
struct Best {
  Assignment assignment;
  const Candidate* candidate = nullptr;
};

// Each value of key k with the others at the best so far; *improved when one ranks before it.
// false (with *error) when a candidate is rejected.
bool try_key(Search& search, const TuneKey& key, std::size_t k, Best* best, bool* improved, std::string* error) {
  for (const auto& v : key.values) {
    if (v == best->assignment[k]) continue;
    Assignment trial = best->assignment;
    trial[k] = v;
    const Candidate* c = search.evaluate(trial, error);
    if (!c) {
      if (!error->empty()) return false;
      continue;  // budget spent: the remaining candidates are cached ones only
    }
    if (better(*c, *best->candidate)) {
      best->assignment = trial;
      best->candidate = c;
      *improved = true;
    }
  }
  return true;
}

}  // namespace

bool tune(const PreparedTrace& trace, const std::vector<TuneKey>& space, const TuneConfig& config, TuneResult* out,
          std::string* error) {
  Policy base_policy;
  if (!policy_from_conf(config.base, &base_policy, error)) {
    *error = "base policy '" + config.base + "': " + *error;
    return false;
  }
  Search search(trace, space, config, to_conf_string(base_policy));
  Best best{Assignment(space.size(), ""), nullptr};
  best.candidate = search.evaluate(best.assignment, error);
  if (!best.candidate) return false;
  bool improved = true;
  while (improved && search.budget_left()) {
    improved = false;
    for (std::size_t k = 0; k < space.size(); ++k) {
      if (space[k].expandable_only && !search.expandable_on(best.assignment)) continue;  // would change nothing
      if (!try_key(search, space[k], k, &best, &improved, error)) return false;
    }
  }
  search.rank(out);
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

namespace {

double peak(const Candidate& c) { return static_cast<double>(c.result.stats.reserved_bytes[kAll].peak); }
double pct(double a, double b) { return b > 0 ? (a / b - 1.0) * 100.0 : 0.0; }

// A candidate's figures in one line.
std::string numbers(const Candidate& c) {
  char b[300];
  std::snprintf(b, sizeof b, "peak reserved %s, %llu upstream calls, %lld fence waits, %llu VMM handle ops, %lld OOMs",
                format_bytes(peak(c)).c_str(), static_cast<unsigned long long>(c.result.upstream_calls),
                static_cast<long long>(c.result.stats.fence_waits), static_cast<unsigned long long>(c.result.unit_ops),
                static_cast<long long>(c.result.stats.num_ooms));
  return std::string(b);
}

// The pick against the base: why nothing was picked, or what the pick saves and costs.
void add_pick_lines(const TuneResult& r, const Candidate& pick, const Candidate& base,
                    std::vector<std::string>* lines) {
  char buf[700];
  if (pick.changes.empty()) {
    std::string by;
    if (r.replay_error) {
      std::snprintf(buf, sizeof buf, "by more than the replay error (%.1f %%) ", *r.replay_error * 100.0);
      by = buf;
    }
    if (r.min_saving > 0)
      by += (by.empty() ? "" : "and ") + std::string("by at least the minimum saving (") +
            format_bytes(static_cast<double>(r.min_saving)) + ") ";
    lines->push_back("why: nothing searched lowers peak reserved " + by +
                     "within the bound; the base: " + numbers(base));
    return;
  }
  std::snprintf(buf, sizeof buf,
                "why: %s saves %s of peak reserved (%+.1f %%) against the base, for %+lld upstream calls and "
                "%+lld fence waits (bound: %.0f of the two together)",
                pick.changes.c_str(), format_bytes(peak(base) - peak(pick)).c_str(), pct(peak(pick), peak(base)),
                static_cast<long long>(pick.result.upstream_calls) - static_cast<long long>(base.result.upstream_calls),
                static_cast<long long>(pick.result.stats.fence_waits) -
                    static_cast<long long>(base.result.stats.fence_waits),
                r.call_limit);
  lines->push_back(buf);
  lines->push_back("  pick: " + numbers(pick));
  lines->push_back("  base: " + numbers(base));
}

// Why the runner-up (the best candidate that is a different policy) ranks after the pick.
std::string runner_up_reason(const TuneResult& r, const Candidate& pick, const Candidate& base, const Candidate& ru) {
  char buf[300];
  if (ru.feasible && ru.beyond_error && !ru.above_minimum && peak(ru) < peak(base)) {
    std::snprintf(buf, sizeof buf, "its saving (%s) is under the minimum saving (%s)",
                  format_bytes(peak(base) - peak(ru)).c_str(), format_bytes(static_cast<double>(r.min_saving)).c_str());
    return buf;
  }
  if (ru.feasible && !ru.beyond_error && r.replay_error) {
    std::snprintf(buf, sizeof buf, "its saving (%.1f %%) is inside the replay error (%.1f %%)",
                  -pct(peak(ru), peak(base)), *r.replay_error * 100.0);
    return buf;
  }
  if (!ru.feasible && pick.feasible)
    return ru.result.stats.num_ooms > base.result.stats.num_ooms ? "more OOMs than the base"
                                                                 : "over the bound on upstream calls";
  if (peak(ru) != peak(pick)) {
    std::snprintf(buf, sizeof buf, "%s more peak reserved", format_bytes(peak(ru) - peak(pick)).c_str());
    return buf;
  }
  if (ru.result.upstream_calls != pick.result.upstream_calls) return "the same peak with more upstream calls";
  if (ru.changed_keys != pick.changed_keys) return "the same peak and calls with more changed keys";
  return "a tie with the pick (taken by name)";
}

// The lowest peak found, when the bound is what kept it out.
void add_outside_bound_line(const TuneResult& r, const Candidate& pick, const Candidate& base,
                            std::vector<std::string>* lines) {
  const Candidate* lowest = nullptr;
  for (const Candidate& c : r.ranked)
    if (!c.feasible && c.result.stats.num_ooms <= base.result.stats.num_ooms && peak(c) < peak(pick) &&
        (!lowest || peak(c) < peak(*lowest)))
      lowest = &c;
  if (!lowest) return;
  const double cost = static_cast<double>(lowest->result.upstream_calls +
                                          static_cast<std::uint64_t>(lowest->result.stats.fence_waits));
  const double base_cost = static_cast<double>(base.result.upstream_calls +
                                               static_cast<std::uint64_t>(base.result.stats.fence_waits));
  char buf[700];
  std::snprintf(buf, sizeof buf,
                "outside the bound: %s would peak at %s (%+.1f %% against the pick) but costs %.0f upstream calls "
                "+ fence waits, over the bound of %.0f (--bound %.1f would admit it)",
                lowest->changes.c_str(), format_bytes(peak(*lowest)).c_str(), pct(peak(*lowest), peak(pick)), cost,
                r.call_limit, base_cost > 0 ? std::ceil(cost / base_cost * 10.0) / 10.0 : 1000.0);
  lines->push_back(buf);
}

// The candidate that is the pick without key k (its other changes the same), or null.
const Candidate* pick_without(const TuneResult& r, const Candidate& pick,
                              const std::map<std::string, std::string>& pick_entries, const std::string& k) {
  for (const Candidate& c : r.ranked) {
    auto ce = entries(c.changes);
    if (c.changed_keys != pick.changed_keys - 1 || ce.count(k)) continue;
    bool rest_same = true;
    for (const auto& [k2, v2] : pick_entries)
      if (k2 != k && (!ce.count(k2) || ce[k2] != v2)) rest_same = false;
    if (rest_same) return &c;
  }
  return nullptr;
}

// What each changed key of the pick is worth: the pick without that key, where replayed.
void add_key_worth_lines(const TuneResult& r, const Candidate& pick, std::vector<std::string>* lines) {
  if (pick.changed_keys <= 1) return;
  const auto pick_entries = entries(pick.changes);
  for (const auto& [k, v] : pick_entries) {
    const Candidate* c = pick_without(r, pick, pick_entries, k);
    if (!c) continue;
    char buf[700];
    std::snprintf(buf, sizeof buf, "  without %s:%s: peak reserved %s (%+.1f %%), %llu upstream calls", k.c_str(),
                  v.c_str(), format_bytes(peak(*c)).c_str(), pct(peak(*c), peak(pick)),
                  static_cast<unsigned long long>(c->result.upstream_calls));
    lines->push_back(buf);
  }
}

}  // namespace

std::vector<std::string> explain_pick(const TuneResult& r) {
  std::vector<std::string> lines;
  if (r.ranked.empty()) return lines;
  const Candidate& pick = r.ranked.front();
  const Candidate& base = r.ranked[r.default_index];
  add_pick_lines(r, pick, base, &lines);
  if (r.ranked.size() > 1) {
    const Candidate& ru = r.ranked[1];
    lines.push_back("runner-up: " + (ru.changes.empty() ? std::string("the base policy") : ru.changes) + ": " +
                    numbers(ru) + "; ranks lower: " + runner_up_reason(r, pick, base, ru));
  }
  add_outside_bound_line(r, pick, base, &lines);
  add_key_worth_lines(r, pick, &lines);
  if (pick.conf.find("free_sync:immediate") != std::string::npos)
    lines.push_back(
        "caution: free_sync:immediate reuses cudaFree'd memory at once on its stream; right only for "
        "programs that order every reuse themselves (README, \"Choosing free_sync\")");
  return lines;
}

}  // namespace cudapool::tools
