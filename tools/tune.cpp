#include "tools/tune.h"

#include <algorithm>
#include <map>

#include "tools/policies.h"

namespace cudapool::tools {

std::vector<TuneKey> default_search_space(const TraceFacts& facts) {
  std::vector<TuneKey> space;
  // max_split_size_mb: only values below the largest allocation can change anything.
  TuneKey split{"max_split_size_mb", {""}};
  for (std::size_t mb : {32, 64, 128, 256, 512, 1024})
    if (mb * 1024 * 1024 < std::max<std::size_t>(facts.largest_allocation, 64u << 20))
      split.values.push_back(std::to_string(mb));
  space.push_back(split);
  space.push_back({"roundup_power2_divisions", {"", "2", "4", "8", "16"}});
  space.push_back({"garbage_collection_threshold", {"", "0.6", "0.8"}});
  space.push_back({"expandable_segments", {"", "False"}});  // the default is True
  return space;
}

namespace {

using Assignment = std::vector<std::string>;  // one value per key of the space

std::string conf_of(const std::vector<TuneKey>& space, const Assignment& a, int* changed) {
  std::string conf;
  *changed = 0;
  for (std::size_t k = 0; k < space.size(); ++k) {
    if (a[k].empty()) continue;
    conf = join_conf(conf, space[k].key + ":" + a[k]);
    ++*changed;
  }
  return conf;
}

std::int64_t peak_reserved(const Candidate& c) { return c.result.stats.reserved_bytes[kAll].peak; }
std::int64_t calls(const Candidate& c) { return static_cast<std::int64_t>(c.result.upstream_calls); }

// Strict "a ranks before b".
bool better(const Candidate& a, const Candidate& b) {
  if (a.feasible != b.feasible) return a.feasible;
  if (peak_reserved(a) != peak_reserved(b)) return peak_reserved(a) < peak_reserved(b);
  if (calls(a) != calls(b)) return calls(a) < calls(b);
  if (a.changed_keys != b.changed_keys) return a.changed_keys < b.changed_keys;
  return a.conf < b.conf;
}

}  // namespace

bool tune(const PreparedTrace& trace, const std::vector<TuneKey>& space, const TuneConfig& config,
          TuneResult* out, std::string* error) {
  std::map<std::string, Candidate> seen;
  int budget = std::max(1, config.budget);
  std::int64_t default_calls = 0, default_ooms = 0;
  auto evaluate = [&](const Assignment& a) -> const Candidate* {
    int changed;
    std::string conf = conf_of(space, a, &changed);
    if (auto it = seen.find(conf); it != seen.end()) return &it->second;
    if (static_cast<int>(seen.size()) >= budget) return nullptr;
    ReplayConfig rc = config.replay;
    if (!pool_options_from_conf(conf, &rc.pool, error)) {
      *error = "candidate '" + conf + "': " + *error;
      return nullptr;
    }
    Candidate c{conf, changed, replay_trace(trace, rc), false};
    if (seen.empty()) {  // the defaults come first and set the bound
      default_calls = calls(c);
      default_ooms = c.result.stats.num_ooms;
    }
    c.feasible = static_cast<double>(calls(c)) <= config.call_bound * static_cast<double>(default_calls) &&
                 c.result.stats.num_ooms <= default_ooms;
    return &seen.emplace(conf, std::move(c)).first->second;
  };

  Assignment best(space.size(), "");
  const Candidate* best_c = evaluate(best);
  if (!best_c) return false;
  bool improved = true;
  while (improved && static_cast<int>(seen.size()) < budget) {
    improved = false;
    for (std::size_t k = 0; k < space.size(); ++k) {
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
    if (out->ranked[i].conf.empty()) out->default_index = i;
  out->call_limit = config.call_bound * static_cast<double>(default_calls);
  return true;
}

}  // namespace cudapool::tools
