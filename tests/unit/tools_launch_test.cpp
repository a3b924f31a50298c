// run/ab plumbing: LD_PRELOAD composition, the policy handed to the child, child processes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>

#include "tools/launch.h"
#include "tools/process.h"

namespace cudapool::tools {
namespace {

TEST(ToolsLaunch, PreloadPrependsOnce) {
  EXPECT_EQ(preload_value("/l/libcudapool.so", nullptr), "/l/libcudapool.so");
  EXPECT_EQ(preload_value("/l/libcudapool.so", ""), "/l/libcudapool.so");
  EXPECT_EQ(preload_value("/l/libcudapool.so", "/a.so:/b.so"), "/l/libcudapool.so:/a.so:/b.so");
  EXPECT_EQ(preload_value("/l/libcudapool.so", "/a.so /l/libcudapool.so"), "/l/libcudapool.so:/a.so");
}

TEST(ToolsLaunch, OutputFilesTravelInTheConf) {
  unsetenv("CUDAPOOL_CONF");
  LaunchSettings s;
  s.conf = "max_split_size_mb:64";
  s.stats = "/tmp/s.json";
  s.trace = "/tmp/t.csv";
  EXPECT_EQ(launch_conf(s), "max_split_size_mb:64,trace_file:/tmp/t.csv,stats_file:/tmp/s.json");
  setenv("CUDAPOOL_CONF", "garbage_collection_threshold:0.8", 1);
  s.conf.clear();  // the caller's conf is the base when --conf is not given
  EXPECT_EQ(launch_conf(s), "garbage_collection_threshold:0.8,trace_file:/tmp/t.csv,stats_file:/tmp/s.json");
  unsetenv("CUDAPOOL_CONF");
  EnvChanges env = launch_environment("/l/lib.so", s);
  EXPECT_EQ(env["CUDAPOOL_CONF"], "trace_file:/tmp/t.csv,stats_file:/tmp/s.json");
  EXPECT_EQ(env.count("CUDAPOOL_CONFIG"), 0u);
  EXPECT_EQ(env["LD_PRELOAD"].rfind("/l/lib.so", 0), 0u);
}

TEST(ToolsLaunch, ValidatesThePolicyBeforeStarting) {
  LaunchSettings s;
  s.conf = "max_split_size_mb:64";
  EXPECT_EQ(validate_launch_policy(s, {"app"}), "");
  s.conf = "no_such_key:1";
  EXPECT_NE(validate_launch_policy(s, {"app"}).find("no_such_key"), std::string::npos);
}

TEST(ToolsLaunch, FindLibraryHonoursTheOverride) {
  std::string path = ::testing::TempDir() + "/libcudapool_test.so";
  std::ofstream(path) << "x";
  setenv("CUDAPOOL_LIBRARY", path.c_str(), 1);
  auto found = find_library();
  ASSERT_TRUE(found);
  EXPECT_NE(found->find("libcudapool_test.so"), std::string::npos);
  setenv("CUDAPOOL_LIBRARY", "/nonexistent/libcudapool.so", 1);
  std::vector<std::string> searched;
  EXPECT_FALSE(find_library(&searched));  // an explicit choice never falls back
  EXPECT_EQ(searched.size(), 1u);
  unsetenv("CUDAPOOL_LIBRARY");
}

TEST(ToolsProcess, ExitStatusSignalAndMissingCommand) {
  auto env = build_environment({{"TOOLS_TEST_VAR", "hello"}});
  ChildResult r = run_child({"sh", "-c", "test \"$TOOLS_TEST_VAR\" = hello && exit 7"}, env);
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.exit_status, 7);
  EXPECT_GE(r.wall_seconds, 0.0);
  r = run_child({"sh", "-c", "kill -TERM $$"}, env);
  EXPECT_TRUE(r.signaled);
  EXPECT_EQ(r.exit_status, 128 + 15);
  r = run_child({"/nonexistent/program"}, env);
  EXPECT_FALSE(r.started);
  EXPECT_EQ(r.exit_status, 127);
}

TEST(ToolsProcess, EnvironmentChangesReplaceAndRemove) {
  setenv("TOOLS_TEST_KEEP", "1", 1);
  setenv("TOOLS_TEST_DROP", "1", 1);
  auto env = build_environment({{"TOOLS_TEST_DROP", ""}, {"TOOLS_TEST_NEW", "v"}});
  int keep = 0, drop = 0, added = 0;
  for (const auto& e : env) {
    keep += e == "TOOLS_TEST_KEEP=1";
    drop += e.rfind("TOOLS_TEST_DROP=", 0) == 0;
    added += e == "TOOLS_TEST_NEW=v";
  }
  EXPECT_EQ(keep, 1);
  EXPECT_EQ(drop, 0);
  EXPECT_EQ(added, 1);
}

}  // namespace
}  // namespace cudapool::tools
