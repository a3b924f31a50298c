// What a replay starts from and how far to trust it: the base policy (a flag, the environment,
// the trace's own policy row, or the defaults), how frees are replayed, and whether a replay
// under the recorded policy reproduces the recorded peak reserved. replay and tune print these
// lines first.
#pragma once
#include <optional>
#include <string>

#include "tools/replay.h"

namespace cudapool::tools {

struct BasePolicy {
  std::string conf;       // "" = the defaults
  std::string origin;     // "from --conf", "from $CUDAPOOL_CONF", "from the trace's policy row", …
  bool recorded = false;  // conf is the trace's own policy
};

// Precedence: --conf (when given) > $CUDAPOOL_CONF (when set, even empty: `cudapool ab
// --no-preload` hands each side's policy over that way) > the trace's policy row > the defaults.
BasePolicy choose_base_policy(const TraceFacts& facts, const std::optional<std::string>& conf_flag);

// One line: how the frees are replayed, with the trace's counts.
std::string describe_frees(const TraceFacts& facts, FreeMode mode);

// The same policy in the same words (config/'s canonical CUDAPOOL_CONF string); "" when invalid.
std::string canonical_conf(const std::string& conf);

// The allowed gap between a replay under the recorded policy and the recorded peak reserved.
inline constexpr double kFidelityTolerance = 0.03;

struct Fidelity {
  bool compared = false;  // the trace records a peak reserved and a replay was compared with it
  bool within = false;    // |replayed / recorded - 1| <= kFidelityTolerance
  double gap = 0;         // replayed / recorded - 1
  std::string line;       // "fidelity: …" with the numbers, or why there is nothing to compare
};

// `replayed` is the replay under `base` (the recorded policy when the trace has one), with the
// free mode and latency the user chose.
Fidelity check_fidelity(const TraceFacts& facts, const BasePolicy& base, const ReplayResult& replayed, FreeMode mode,
                        double fence_latency_us);

// When `fidelity` is outside the tolerance: replays `trace` under `config` (the compared replay's
// policy and flags) with the other --free-as and --fence-latency-us settings, and returns one
// "  advice: …" line: the setting that brings the replay within the tolerance, or that none
// does and what to do instead. "" when within (or nothing was compared).
std::string fidelity_advice(const PreparedTrace& trace, const ReplayConfig& config, const Fidelity& fidelity);

}  // namespace cudapool::tools
