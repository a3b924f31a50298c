// Policy search on a trace. The objective, documented in docs/tools.md: the lowest peak reserved
// among policies whose upstream calls stay within `call_bound` × the defaults' and that have no
// more OOMs than the defaults. Ties go to fewer upstream calls, then to fewer changed keys.
#pragma once
#include <string>
#include <vector>

#include "tools/replay.h"

namespace cudapool::tools {

struct TuneKey {
  std::string key;
  std::vector<std::string> values;  // "" = leave the key out (the default)
};

// The searched space: max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold,
// expandable_segments (values chosen for the trace's largest allocation).
std::vector<TuneKey> default_search_space(const TraceFacts& facts);

struct Candidate {
  std::string conf;  // "" = defaults
  int changed_keys = 0;
  ReplayResult result;
  bool feasible = false;
};

struct TuneResult {
  std::vector<Candidate> ranked;  // best first; ranked[0] is the recommendation when feasible
  std::size_t default_index = 0;  // where the defaults landed in `ranked`
  double call_limit = 0;          // the bound in upstream calls
};

struct TuneConfig {
  ReplayConfig replay;     // device memory etc.; pool options are set per candidate
  int budget = 40;         // replays at most
  double call_bound = 1.5;
};

// Coordinate descent from the defaults: try each value of each key with the others at the best
// so far, keep improvements, repeat until a round improves nothing or the budget is spent.
// false with *error when a candidate string is rejected by config/ (a bug in the space).
bool tune(const PreparedTrace& trace, const std::vector<TuneKey>& space, const TuneConfig& config,
          TuneResult* out, std::string* error);

}  // namespace cudapool::tools
