// tune: the search finds the policy a hand-built trace calls for, respects the budget and bound.
#include <gtest/gtest.h>

#include "tools/policies.h"
#include "tools/tune.h"
#include "tools_util.h"

namespace cudapool::tools {
namespace {

using testing::TraceBuilder;

// A cached 100 MiB block is split by a 30 MiB request, so the next 100 MiB request needs a new
// segment (200 MiB reserved). With max_split_size_mb <= 64 the 30 MiB request gets its own segment
// and the 100 MiB block is reused (130 MiB).
TraceBuilder fragmenting() {
  TraceBuilder b;
  b.alloc(0x1, 100 * MiB).free(0x1, 100 * MiB).alloc(0x2, 30 * MiB).alloc(0x3, 100 * MiB);
  return b;
}

// Classic segments fragment here; the defaults (expandable segments) do not: the search finds
// nothing better than them, and says what classic segments would cost.
TEST(ToolsTune, ExpandableDefaultsAvoidTheSplitFragmentation) {
  PreparedTrace p = prepare_trace(fragmenting().rows());
  TuneConfig cfg;
  TuneResult res;
  std::string err;
  ASSERT_TRUE(tune(p, default_search_space(p.facts), cfg, &res, &err)) << err;
  ASSERT_FALSE(res.ranked.empty());
  const Candidate& best = res.ranked.front();
  EXPECT_TRUE(best.feasible);
  EXPECT_EQ(best.result.stats.reserved_bytes[kAll].peak, static_cast<std::int64_t>(130 * MiB)) << best.conf;
  const Candidate& def = res.ranked[res.default_index];
  EXPECT_EQ(def.conf, "");
  EXPECT_EQ(def.result.stats.reserved_bytes[kAll].peak, static_cast<std::int64_t>(130 * MiB));
  bool classic_found = false;
  for (const auto& c : res.ranked)
    if (c.conf == "expandable_segments:False") {
      classic_found = true;
      EXPECT_EQ(c.result.stats.reserved_bytes[kAll].peak, static_cast<std::int64_t>(200 * MiB));
    }
  EXPECT_TRUE(classic_found);
  // Ranked: feasible first, then by peak reserved.
  for (std::size_t i = 1; i < res.ranked.size(); ++i) {
    const auto& a = res.ranked[i - 1];
    const auto& b = res.ranked[i];
    if (a.feasible == b.feasible)
      EXPECT_LE(a.result.stats.reserved_bytes[kAll].peak, b.result.stats.reserved_bytes[kAll].peak);
    else
      EXPECT_TRUE(a.feasible);
  }
}

TEST(ToolsTune, DefaultsWinWhenNothingHelpsAndBudgetHolds) {
  TraceBuilder b;
  b.alloc(0x1, 100 * MiB).free(0x1, 100 * MiB).alloc(0x2, 100 * MiB);
  PreparedTrace p = prepare_trace(b.rows());
  TuneConfig cfg;
  cfg.budget = 3;
  TuneResult res;
  std::string err;
  ASSERT_TRUE(tune(p, default_search_space(p.facts), cfg, &res, &err)) << err;
  EXPECT_LE(res.ranked.size(), 3u);
  EXPECT_EQ(res.ranked.front().conf, "");  // ties go to fewer changed keys
}

TEST(ToolsTune, BoundExcludesPoliciesWithTooManyUpstreamCalls) {
  PreparedTrace p = prepare_trace(fragmenting().rows());
  TuneConfig cfg;
  cfg.call_bound = 1.0;
  TuneResult res;
  std::string err;
  ASSERT_TRUE(tune(p, default_search_space(p.facts), cfg, &res, &err)) << err;
  for (const auto& c : res.ranked) {
    // The bound counts what costs the program time: upstream calls and host waits on fences.
    const auto cost = c.result.upstream_calls + static_cast<std::size_t>(c.result.stats.fence_waits);
    EXPECT_EQ(c.feasible, static_cast<double>(cost) <= res.call_limit && c.result.stats.num_ooms == 0) << c.conf;
  }
  EXPECT_TRUE(res.ranked.front().feasible);
}

// A change that saves less than the minimum (2 % of the base's peak, at least 64 MiB) is not
// recommended: here classic segments split a cached 50 MiB block for a 12 MiB request, and
// max_split_size_mb:32 saves that split's new segment, well under 64 MiB.
TEST(ToolsTune, RecommendsNothingUnderTheMinimumSaving) {
  TraceBuilder b;
  b.alloc(0x1, 50 * MiB).free(0x1, 50 * MiB).alloc(0x2, 12 * MiB).alloc(0x3, 50 * MiB);
  PreparedTrace p = prepare_trace(b.rows());
  TuneConfig cfg;
  cfg.base = "expandable_segments:False";
  TuneResult res;
  std::string err;
  ASSERT_TRUE(tune(p, default_search_space(p.facts), cfg, &res, &err)) << err;
  // With no minimum some change wins, saving less than 64 MiB.
  TuneResult any = res;
  apply_minimum_saving(&any, 0.0, 0);
  ASSERT_FALSE(any.ranked.front().changes.empty());
  auto peak = [](const Candidate& c) { return c.result.stats.reserved_bytes[kAll].peak; };
  const std::int64_t saving = peak(any.ranked[any.default_index]) - peak(any.ranked.front());
  ASSERT_GT(saving, 0);
  ASSERT_LT(saving, static_cast<std::int64_t>(kMinSavingBytes));
  // With the default minimum the base is the pick, and every change that saves less says so.
  apply_minimum_saving(&res);
  EXPECT_EQ(res.min_saving, kMinSavingBytes);  // 2 % of this small base is less than 64 MiB
  EXPECT_TRUE(res.ranked.front().changes.empty()) << res.ranked.front().changes;
  for (const Candidate& c : res.ranked) {
    if (!c.changes.empty()) {
      EXPECT_FALSE(c.above_minimum) << c.changes;
    }
  }
  bool said = false;
  for (const std::string& line : explain_pick(res))
    said |= line.find("by at least the minimum saving (64.00 MiB)") != std::string::npos;
  EXPECT_TRUE(said);
  // 2 % of a large base is the minimum where it is more than the floor.
  TuneResult big = any;
  apply_minimum_saving(&big, 0.5, 1);
  EXPECT_EQ(big.min_saving, static_cast<std::size_t>((peak(big.ranked[big.default_index]) + 1) / 2));
}

// The base and the pick never carry a key that names a file a run writes.
TEST(ToolsTune, OutputFileKeysStayOutOfTheBase) {
  std::vector<std::string> dropped;
  EXPECT_EQ(without_output_files("max_split_size_mb:64,trace_file:/tmp/t.csv,log_file:/tmp/l.log,stats_file:/tmp/"
                                 "s.json",
                                 &dropped),
            "max_split_size_mb:64");
  EXPECT_EQ(dropped, (std::vector<std::string>{"log_file", "trace_file", "stats_file"}));
  dropped.clear();
  EXPECT_EQ(without_output_files("garbage_collection_threshold:0.8", &dropped), "garbage_collection_threshold:0.8");
  EXPECT_TRUE(dropped.empty());
}

}  // namespace
}  // namespace cudapool::tools
