// Policy search on a trace. The objective, documented in docs/tools.md: the lowest peak reserved
// among policies whose upstream calls stay within `call_bound` × the base policy's and that have
// no more OOMs than it. Ties go to fewer upstream calls, then to fewer changed keys.
#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tools/replay.h"

namespace cudapool::tools {

// The value that removes a key from the base (back to the built-in default).
inline constexpr const char* kUnsetValue = "(unset)";

struct TuneKey {
  std::string key;
  std::vector<std::string> values;  // "" = the base's value; kUnsetValue = the built-in default
  bool expandable_only = false;     // matters only with expandable_segments:True
};

// The searched space: max_split_size_mb (values below the trace's largest allocation),
// roundup_power2_divisions, garbage_collection_threshold, expandable_segments, free_sync (when
// `sync_frees`: some frees replay as cudaFree, else the key changes nothing; gpu_wait, fenced,
// device: immediate changes what a program may observe, which a trace cannot show), and with
// expandable segments expandable_page_mb, expandable_unit_mb, expandable_headroom and
// expandable_wait.
std::vector<TuneKey> default_search_space(const TraceFacts& facts, bool sync_frees = false);

struct Candidate {
  std::string conf;     // the whole policy (config/'s canonical string); "" = the defaults
  std::string changes;  // the keys that differ from the base, as a conf string; "" = the base
  int changed_keys = 0;
  ReplayResult result;
  bool feasible = false;
  // It saves more peak reserved against the base than the replay is off from the recording (the
  // base itself always is): only such a candidate is recommended.
  bool beyond_error = true;
  // It saves at least the minimum saving (TuneResult::min_saving) against the base (the base
  // itself always does): only such a candidate is recommended.
  bool above_minimum = true;
};

// The smallest saving tune recommends: a change of policy is worth making only when it lowers the
// base's peak reserved by at least this fraction of it and by at least kMinSavingBytes.
inline constexpr double kMinSavingFraction = 0.02;
inline constexpr std::size_t kMinSavingBytes = std::size_t{64} << 20;

struct TuneResult {
  std::vector<Candidate> ranked;  // best first; ranked[0] is the recommendation when feasible
  std::size_t default_index = 0;  // where the base policy landed in `ranked`
  double call_limit = 0;          // the bound in upstream calls
  // |replayed / recorded - 1| of peak reserved under the recorded policy (apply_replay_error);
  // unknown for a trace that records no peak (an allocation log).
  std::optional<double> replay_error;
  // Bytes of peak reserved a recommended change saves at least (apply_minimum_saving; 0 = none).
  std::size_t min_saving = 0;
};

struct TuneConfig {
  ReplayConfig replay;  // device memory etc.; pool options are set per candidate
  std::string base;     // the policy the search starts from and is measured against
  int budget = 60;      // replays at most
  double call_bound = 1.5;
  std::function<void()> on_replay;  // after each replay (progress), if set
};

// Coordinate descent from the base: try each value of each key with the others at the best so
// far, keep improvements, repeat until a round improves nothing or the budget is spent. Keys
// marked expandable_only are tried only while expandable_segments is on.
// false with *error when a candidate string is rejected by config/ (the base, or a bug in the space).
bool tune(const PreparedTrace& trace, const std::vector<TuneKey>& space, const TuneConfig& config, TuneResult* out,
          std::string* error);

// Marks the candidates whose saving against the base is not more than `error` (a fraction of the
// base's peak reserved) and ranks them after every feasible candidate beyond it, so that
// ranked[0] is never a change the replay cannot tell from noise. nullopt: unknown, nothing moves.
void apply_replay_error(TuneResult* result, std::optional<double> error);

// The minimum saving for this result's base: max(`fraction` of its peak reserved, `bytes`).
// Marks the candidates that save less and ranks them after every candidate that is feasible,
// beyond the replay error and above it (call after apply_replay_error).
void apply_minimum_saving(TuneResult* result, double fraction = kMinSavingFraction,
                          std::size_t bytes = kMinSavingBytes);

// The reasons for the pick, in numbers: its trade-off against the base, the runner-up and why it
// ranks lower, and what each changed key of the pick is worth (from replays already made). Lines
// without a trailing newline.
std::vector<std::string> explain_pick(const TuneResult& result);

}  // namespace cudapool::tools
