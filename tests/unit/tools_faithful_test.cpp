// What makes replay faithful and tune honest about it: the trace's recorded page size reaches
// the simulated device, tune recommends nothing inside its replay error, and the tools' JSON
// pieces follow the one convention (docs/tools.md, "JSON").
#include <gtest/gtest.h>

#include <sstream>

#include "config/policy.h"
#include "tools/cli_io.h"
#include "tools/json_text.h"
#include "tools/policies.h"
#include "tools/replay.h"
#include "tools/tune.h"
#include "tools_util.h"

namespace cudapool::tools {
namespace {

using testing::TraceBuilder;

// One 1 KiB allocation under expandable segments reserves one small-pool page: the page size the
// trace records (4 MiB, the fake driver's), else the assumed 2 MiB.
TEST(ToolsFaithful, ReplayMapsThePageSizeTheTraceRecords) {
  TraceBuilder b;
  b.alloc(0x1, 1024).free(0x1, 1024);
  PreparedTrace p = prepare_trace(b.rows());
  ReplayConfig cfg;
  ASSERT_TRUE(pool_options_from_conf("expandable_segments:True", &cfg.pool, nullptr));
  EXPECT_EQ(replay_trace(p, cfg).stats.reserved_bytes[kAll].peak, static_cast<std::int64_t>(kAssumedGranularity));
  p.facts.granularity = 4 * MiB;
  EXPECT_EQ(replay_trace(p, cfg).stats.reserved_bytes[kAll].peak, static_cast<std::int64_t>(4 * MiB));
  cfg.granularity = 8 * MiB;  // the config's own wins over the trace's
  EXPECT_EQ(replay_trace(p, cfg).stats.reserved_bytes[kAll].peak, static_cast<std::int64_t>(8 * MiB));
}

// The device row's facts read back from a file: read_trace_file hands them over by device.
TEST(ToolsFaithful, DeviceFactsComeBackFromTheFile) {
  TraceRow dev;
  dev.action = TraceAction::device;
  dev.size = 16 * GiB;
  dev.detail = TraceDetail::device_facts;
  const std::string csv = std::string(trace_header()) + "\n" + format_trace_row(dev, device_facts_text(4 * MiB)) + "\n";
  std::istringstream in(csv);
  TraceReader r(in);
  TraceRow row;
  while (r.next(&row)) {
  }
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.device_facts().count(0), 1u);
  EXPECT_EQ(r.device_facts().at(0).rfind("granularity:4194304,", 0), 0u);
}

Candidate candidate(const std::string& changes, std::int64_t peak) {
  Candidate c;
  c.changes = changes;
  c.conf = changes;
  c.feasible = true;
  c.result.stats.reserved_bytes[kAll].peak = peak;
  return c;
}

// A change that saves 1 % is not told apart from a replay that is 2 % off: the base is the pick.
// Under a 0.5 % error the same change is the pick.
TEST(ToolsFaithful, TuneRecommendsNothingInsideTheReplayError) {
  TuneResult r;
  r.ranked = {candidate("max_split_size_mb:64", 990), candidate("roundup_power2_divisions:4", 995),
              candidate("", 1000)};
  r.default_index = 2;
  TuneResult inside = r;
  apply_replay_error(&inside, 0.02);
  EXPECT_EQ(inside.ranked.front().changes, "");
  EXPECT_EQ(inside.default_index, 0u);
  EXPECT_FALSE(inside.ranked[1].beyond_error);
  EXPECT_FALSE(inside.ranked[2].beyond_error);
  const std::vector<std::string> why = explain_pick(inside);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.front().find("by more than the replay error (2.0 %)"), std::string::npos) << why.front();
  bool runner_up_says = false;
  for (const auto& l : why) runner_up_says |= l.find("inside the replay error (2.0 %)") != std::string::npos;
  EXPECT_TRUE(runner_up_says);

  TuneResult beyond = r;
  apply_replay_error(&beyond, 0.005);
  EXPECT_EQ(beyond.ranked.front().changes, "max_split_size_mb:64");
  EXPECT_TRUE(beyond.ranked.front().beyond_error);
  // 0.5 % saved is not more than 0.5 %: ranked after the base.
  ASSERT_EQ(beyond.ranked.size(), 3u);
  EXPECT_EQ(beyond.ranked[1].changes, "");
  EXPECT_EQ(beyond.default_index, 1u);
  EXPECT_EQ(beyond.ranked[2].changes, "roundup_power2_divisions:4");
  EXPECT_FALSE(beyond.ranked[2].beyond_error);

  TuneResult unknown = r;
  apply_replay_error(&unknown, std::nullopt);
  EXPECT_EQ(unknown.ranked.front().changes, "max_split_size_mb:64");
  EXPECT_FALSE(unknown.replay_error.has_value());
}

TEST(ToolsFaithful, JsonValuesAreTyped) {
  EXPECT_EQ(json_value("128"), "128");
  EXPECT_EQ(json_value("0.8"), "0.8");
  EXPECT_EQ(json_value("True"), "true");
  EXPECT_EQ(json_value("False"), "false");
  EXPECT_EQ(json_value("none"), "\"none\"");
  EXPECT_EQ(json_value(""), "\"\"");
  EXPECT_EQ(json_value("007"), "\"007\"");  // not a JSON number
  EXPECT_EQ(json_value("1."), "\"1.\"");
  EXPECT_EQ(json_value("[256:1,>:4]"), "\"[256:1,>:4]\"");
  EXPECT_EQ(json_value("/tmp/x.csv"), "\"/tmp/x.csv\"");
}

TEST(ToolsFaithful, ErrorJsonCarriesTheMessageAndTheStatus) {
  EXPECT_EQ(error_json("cudapool replay: t.csv:3: \"bad\"", 65),
            "{\n  \"error\": {\"message\": \"cudapool replay: t.csv:3: \\\"bad\\\"\", \"exit_status\": 65}\n}\n");
}

}  // namespace
}  // namespace cudapool::tools
