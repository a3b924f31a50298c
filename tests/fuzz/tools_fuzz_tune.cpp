// libFuzzer target: `cudapool tune` on a whole trace, in memory, with a small budget (the search
// is the same at any budget; the budget bounds the work per input). The recommendation must be a
// policy config/ accepts, and carry no key with an effect outside the pool.
#include "tests/fuzz/tools_fuzz_input.h"
#include "tools/fidelity.h"
#include "tools/policies.h"
#include "tools/tune.h"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool;
  using namespace cudapool::tools;
  fuzz::FuzzTrace t;
  if (!fuzz::read_fuzz_trace(data, size, &t)) return 0;
  const TraceFacts& facts = t.prepared.facts;
  const BasePolicy base = choose_base_policy(facts, std::nullopt);
  TuneConfig cfg;
  cfg.replay = fuzz::bounded_replay(facts);
  cfg.base = base.conf;
  cfg.budget = 6;
  TuneResult result;
  std::string error;
  if (!tune(t.prepared, default_search_space(facts, facts.sync_frees > 0), cfg, &result, &error))
    fuzz::fail("tune refused its own base or space", error);
  if (result.ranked.empty()) fuzz::fail("no candidate", base.conf);
  const std::string& pick = result.ranked.front().conf;
  Policy p;
  if (!policy_from_conf(pick, &p, &error)) fuzz::fail("the recommendation does not load", pick + "\n" + error);
  for (const char* key : {"stats_file", "trace_file", "log_file", "dump_signal", "group", "publish_stats"})
    if (pick.find(key) != std::string::npos) fuzz::fail("the recommendation sets a key beyond the pool", pick);
  (void)explain_pick(result);
  return 0;
}
