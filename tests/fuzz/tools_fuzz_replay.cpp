// libFuzzer target: `cudapool replay` on a whole trace, in memory. The base policy is chosen as
// replay chooses it (the trace's policy row, filtered), then the trace is replayed under each way
// of playing its frees, with and without fence latency, and checked for fidelity. Besides "never
// crash", a replay must refuse no free of its own (bad_frees) and count what it replayed.
#include "tests/fuzz/tools_fuzz_input.h"
#include "tools/fidelity.h"
#include "tools/metrics.h"
#include "tools/policies.h"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool;
  using namespace cudapool::tools;
  fuzz::FuzzTrace t;
  if (!fuzz::read_fuzz_trace(data, size, &t)) return 0;
  const TraceFacts& facts = t.prepared.facts;
  const BasePolicy base = choose_base_policy(facts, std::nullopt);
  Policy policy;
  std::string err;
  if (!policy_from_conf(base.conf, &policy, &err)) fuzz::fail("the filtered policy row does not load", base.conf);
  for (FreeMode mode : {FreeMode::recorded, FreeMode::async, FreeMode::sync}) {
    ReplayConfig cfg = fuzz::bounded_replay(facts);
    cfg.pool = policy.pool;
    cfg.free_mode = mode;
    cfg.fence_latency_ns = mode == FreeMode::sync ? 20'000 : 0;
    ReplayResult r = replay_trace(t.prepared, cfg);
    if (r.bad_frees != 0) fuzz::fail("the pool refused a free of the replay", base.conf);
    if (r.ops != t.prepared.ops.size()) fuzz::fail("not every op was replayed", std::to_string(r.ops));
    (void)metrics_from_stats(r.stats, std::nullopt);
    (void)check_fidelity(facts, base, r, mode, static_cast<double>(cfg.fence_latency_ns) / 1e3);
    (void)describe_frees(facts, mode);
  }
  return 0;
}
