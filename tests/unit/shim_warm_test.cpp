// Warm start (policy key warm_start) under the fake driver: a program's first step grows the
// pool (driver allocations) unless the segments of an earlier run's peak were preallocated from
// its trace or from `cudapool plan`'s plan; a plan that does not fit, or cannot be read, costs a
// warning and never the program.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <string>

#include "tests/unit/shim_child.h"

namespace {

using cudapool::test::ChildResult;
using cudapool::test::run_under_shim;

const std::string kApp = std::string(CUDAPOOL_FAKECUDA_DIR) + "/app_cudart";

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Driver allocations of step `n` of the warm_steps scenario, -1 when the output has none.
long step_allocs(const std::string& out, int n) {
  std::smatch m;
  const std::regex re("step " + std::to_string(n) + " driver_allocs=([0-9]+)");
  return std::regex_search(out, m, re) ? std::stol(m[1]) : -1;
}

// A figure of a stats file (the JSON summary): "KEY": N, of the first device; -1 when missing.
long stat_of(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::smatch m;
  const std::regex re("\"" + std::regex_replace(key, std::regex("\\."), "\\.") + "\": ([0-9]+)");
  return std::regex_search(text, m, re) ? std::stol(m[1]) : -1;
}

class WarmStart : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cudapool-warm-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  ChildResult steps(const std::string& conf, std::map<std::string, std::string> env = {}) {
    env["CUDAPOOL_CONF"] = conf;
    ChildResult r = run_under_shim({kApp, "warm_steps"}, env);
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_TRUE(has(r.output, "PASS warm_steps")) << r.output;
    return r;
  }
  std::string dir_;
};

// The mechanism's own check: without the plan the first step allocates from the driver, with it
// (from the trace itself or from the plan file, expandable or classic segments) it does not.
TEST_F(WarmStart, TheFirstStepGrowsNothingWithThePlan) {
  for (const std::string segs : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(segs);
    const std::string trace = path("run-" + segs.substr(20) + ".csv"), plan = path("run.plan");
    const std::string cold_stats = path("cold.json"), warm_stats = path("warm.json");
    const ChildResult cold = steps(segs + ",trace_file:" + trace + ",stats_file:" + cold_stats);
    ASSERT_GT(step_allocs(cold.output, 1), 0) << cold.output;
    EXPECT_EQ(step_allocs(cold.output, 2), 0) << cold.output;  // a warm pool: what the plan aims at

    const ChildResult from_trace = steps(segs + ",warm_start:" + trace + ",stats_file:" + warm_stats);
    EXPECT_EQ(step_allocs(from_trace.output, 1), 0) << from_trace.output;
    EXPECT_EQ(step_allocs(from_trace.output, 2), 0) << from_trace.output;
    EXPECT_FALSE(has(from_trace.output, "warning")) << from_trace.output;
    // The program's own figures: the warm start allocated nothing in its name (its blocks are
    // split from preallocated memory, so they may be tighter than the cold run's pages).
    EXPECT_GT(stat_of(cold_stats, "allocation.all.allocated"), 0);
    EXPECT_EQ(stat_of(warm_stats, "allocation.all.allocated"), stat_of(cold_stats, "allocation.all.allocated"));
    EXPECT_GT(stat_of(warm_stats, "allocated_bytes.all.peak"), 0);
    EXPECT_LE(stat_of(warm_stats, "allocated_bytes.all.peak"), stat_of(cold_stats, "allocated_bytes.all.peak"));
    EXPECT_EQ(stat_of(warm_stats, "num_ooms"), 0);

    ChildResult made = run_under_shim({CUDAPOOL_BIN_PATH, "plan", trace, "-o", plan}, {}, /*preload=*/false);
    ASSERT_EQ(made.exit_status, 0) << made.output;
    EXPECT_TRUE(has(made.output, "device 0: ")) << made.output;
    const ChildResult from_plan = steps(segs + ",warm_start:" + plan + ",log_level:info");
    EXPECT_EQ(step_allocs(from_plan.output, 1), 0) << from_plan.output;
    EXPECT_TRUE(has(from_plan.output, "warm_start: device 0: ")) << from_plan.output;
    EXPECT_TRUE(has(from_plan.output, "MiB preallocated")) << from_plan.output;
  }
}

// More than the device has free: the segments that fit are preallocated, the rest named once.
TEST_F(WarmStart, APlanLargerThanTheDeviceWarnsAndTakesWhatFits) {
  const std::string plan = path("big.plan");
  std::ofstream(plan) << "cudapool-warm-start-plan 1\n"
                         "segment 0 large classic 2147483648\n"  // 2 GiB: more than the 1 GiB device
                         "segment 0 large classic 41943040\n"    // 40 MiB
                         "segment 0 small classic 2097152\n";    // 2 MiB
  const ChildResult r = steps("expandable_segments:False,warm_start:" + plan + ",log_level:info");
  EXPECT_TRUE(has(r.output, "warm_start: the plan " + plan + " holds 2090 MiB of segments for device 0")) << r.output;
  EXPECT_TRUE(has(r.output, "than fits the device's free memory")) << r.output;
  EXPECT_TRUE(has(r.output, "preallocating 42 MiB of it")) << r.output;
  EXPECT_TRUE(has(r.output, "42 MiB preallocated (2 MiB small pool, 40 MiB large pool)")) << r.output;
}

// Over the pool's cap: the warning names the key and the value that would make it fit.
TEST_F(WarmStart, APlanOverTheCapNamesTheKeyToRaise) {
  const std::string plan = path("cap.plan");
  std::ofstream(plan) << "cudapool-warm-start-plan 1\n"
                         "segment 0 large classic 419430400\n"     // 400 MiB
                         "segment 0 large expandable 419430400\n"  // 400 MiB
                         "segment 0 small expandable 16777216\n";  // 16 MiB
  const ChildResult r = steps("warm_start:" + plan + ",max_reserved_mb:900");
  EXPECT_FALSE(has(r.output, "warm_start")) << r.output;  // 816 MiB fit under 900 MiB: nothing to say
  EXPECT_EQ(step_allocs(r.output, 1), 0) << r.output;
  const ChildResult capped = steps("warm_start:" + plan + ",max_reserved_mb:720");
  EXPECT_TRUE(has(capped.output, "than fits the pool's cap max_reserved_mb:720")) << capped.output;
  EXPECT_TRUE(has(capped.output, "preallocating 416 MiB of it")) << capped.output;
  EXPECT_TRUE(has(capped.output, "raise the cap to at least 816 MiB (max_reserved_mb:816")) << capped.output;
  // 816 of the fake device's 1024 MiB, rounded up so that the value given fits.
  EXPECT_TRUE(has(capped.output, "or per_process_memory_fraction:0.797)")) << capped.output;
}

// A classic pool makes a 20 MiB segment for a large request of less than 10 MiB: the fit counts
// that, not the plan's smaller run.
TEST_F(WarmStart, TheFitCountsWhatThePoolWouldTake) {
  const std::string plan = path("small-run.plan");
  std::ofstream(plan) << "cudapool-warm-start-plan 1\nsegment 0 large expandable 4194304\n";
  const ChildResult r = run_under_shim({kApp, "alloc_once"},
                                       {{"CUDAPOOL_CONF",
                                         "expandable_segments:False,max_reserved_mb:16,warm_start:" + plan}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_TRUE(has(r.output, "holds 20 MiB of segments for device 0, 4 MiB more than fits the pool's cap")) << r.output;
  EXPECT_TRUE(has(r.output, "preallocating 0 MiB of it")) << r.output;
  EXPECT_FALSE(has(r.output, "MiB of the plan's")) << r.output;
}

// Over the group budget's room: the same, naming the group's keys.
TEST_F(WarmStart, APlanOverTheGroupBudgetNamesItsKeys) {
  const std::string plan = path("group.plan");
  std::ofstream(plan) << "cudapool-warm-start-plan 1\n"
                         "segment 0 large expandable 838860800\n"  // 800 MiB
                         "segment 0 small expandable 16777216\n";  // 16 MiB
  const ChildResult r = steps("warm_start:" + plan + ",group:warm_test,group_budget_mb:720,group_budget_counts:pool",
                              {{"CUDAPOOL_SHM_DIR", dir_}});
  EXPECT_TRUE(has(r.output, "96 MiB more than fits the group budget's room (720 MiB of its 720 MiB")) << r.output;
  EXPECT_TRUE(has(r.output, "preallocating 16 MiB of it")) << r.output;
  EXPECT_TRUE(has(r.output, "raise group_budget_mb (or group_budget_fraction) by at least 96 MiB")) << r.output;
}

// A plan that cannot be read: one warning naming the file and line; the run is as without one.
TEST_F(WarmStart, AnUnreadablePlanWarnsAndChangesNothing) {
  const std::string plan = path("bad.plan");
  std::ofstream(plan) << "cudapool-warm-start-plan 1\nsegment 0 large classic 20971521\n";
  const ChildResult bad = steps("warm_start:" + plan);
  EXPECT_TRUE(has(bad.output, "warm_start: " + plan + ":2: segment size '20971521' is not a multiple of 512"))
      << bad.output;
  EXPECT_GT(step_allocs(bad.output, 1), 0) << bad.output;
  const ChildResult missing = steps("warm_start:" + path("none.plan"));
  EXPECT_TRUE(has(missing.output, "none.plan: cannot open")) << missing.output;
  EXPECT_GT(step_allocs(missing.output, 1), 0) << missing.output;
}

}  // namespace
