// warm_start beside trace_file: a run that would empty the trace it means to start from is
// stopped with a message that says how to keep the recording; other combinations load.
#include <gtest/gtest.h>
#include <unistd.h>

#include "config/keys.h"
#include "config/policy.h"
#include "tests/unit/config_test_util.h"

namespace cudapool {
namespace {

using testing::TempFile;

bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

PolicyResult load_conf(const std::string& conf, const std::string& trace_env = "") {
  PolicySources s;
  s.conf = conf;
  s.trace_file = trace_env;
  s.trace_name = "CUDAPOOL_TRACE";
  s.check_outputs = false;  // no file is written here
  return load_policy(s);
}

TEST(WarmStartKey, TheTraceThisRunWritesIsRefused) {
  PolicyResult r = load_conf("trace_file:/tmp/cp-run.csv,warm_start:/tmp/cp-run.csv");
  ASSERT_FALSE(r.policy);
  EXPECT_TRUE(
      has(r.error, "warm_start:/tmp/cp-run.csv (CUDAPOOL_CONF col 28) names the file trace_file (CUDAPOOL_CONF col 1)"))
      << r.error;
  EXPECT_TRUE(has(r.error, "cudapool plan /tmp/cp-run.csv -o PLAN")) << r.error;
  // The same file under another name (a link to it) is the same file.
  TempFile f("");
  const std::string link = f.path() + ".link";
  ASSERT_EQ(::symlink(f.path().c_str(), link.c_str()), 0);
  r = load_conf("warm_start:" + link, f.path());
  ::unlink(link.c_str());
  ASSERT_FALSE(r.policy);
  EXPECT_TRUE(has(r.error, "names the file trace_file (CUDAPOOL_TRACE)")) << r.error;
}

TEST(WarmStartKey, AnotherFileOrNoTraceLoads) {
  PolicyResult r = load_conf("trace_file:/tmp/cp-next.csv,warm_start:/tmp/cp-last.plan");
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_EQ(r.policy->warm_start, "/tmp/cp-last.plan");
  r = load_conf("warm_start:/tmp/cp-last.csv");
  ASSERT_TRUE(r.policy) << r.error;
}

}  // namespace
}  // namespace cudapool
