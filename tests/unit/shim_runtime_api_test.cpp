// cudart's cudaMalloc / cudaFree answered by the shim itself (shim/hooks/hooks_runtime_api.cpp): runs
// tests/fakecuda/cudart_app, one process per scenario, under the preloaded shim. The scenarios
// live in a library linked against a fake shared cudart (tests/fakecuda/fakecudart.cpp) that the
// program loads with dlopen, globally or locally (where the shim finds that cudart only through
// the calling library's own scope), and count what reached cudart's own entry points.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "tests/unit/shim_child.h"
#include "tests/unit/telemetry_util.h"

namespace {

const std::string kApp = std::string(CUDAPOOL_FAKECUDA_DIR) + "/cudart_app";

// `mode`: "global" or "local", how the program loads the scenarios' library. The fake cudart is
// CUDA 13.0 unless `env` says FAKE_CUDART_VERSION.
cudapool::test::ChildResult run(const std::string& scenario, const std::string& mode = "global",
                                std::map<std::string, std::string> env = {}, bool preload = true) {
  env.try_emplace("FAKE_CUDART_VERSION", "");  // empty: unset
  return cudapool::test::run_under_shim({kApp, scenario, mode}, env, preload);
}

void expect_pass(const cudapool::test::ChildResult& r, const std::string& scenario) {
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_EQ(r.signal, 0) << r.output;
  EXPECT_NE(r.output.find("PASS " + scenario), std::string::npos) << r.output;
}

int occurrences(const std::string& text, const std::string& part) {
  int n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

// The number after `"key":` in `json` at or after `from`; -1 if there is none.
long long json_number(const std::string& json, const std::string& key, std::size_t from) {
  const auto at = json.find("\"" + key + "\"", from);
  if (at == std::string::npos) return -1;
  const auto colon = json.find(':', at);
  if (colon == std::string::npos) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(json.c_str() + colon + 1, &end, 10);
  return end == json.c_str() + colon + 1 ? -1 : v;
}

// The library loaded with RTLD_GLOBAL (cudart in the global scope too) or RTLD_LOCAL (cudart
// only in the library's own scope, as Python's extension modules are loaded).
class CudartLoaded : public ::testing::TestWithParam<std::string> {};

TEST_P(CudartLoaded, PlainCallsAreThePoolsWithoutCudart) { expect_pass(run("served", GetParam()), "served"); }

TEST_P(CudartLoaded, ZeroBytesAndNullPointersAreCudarts) {
  expect_pass(run("zero_and_null", GetParam()), "zero_and_null");
}

TEST_P(CudartLoaded, AForeignPointerIsFreedByCudart) { expect_pass(run("foreign_free", GetParam()), "foreign_free"); }

INSTANTIATE_TEST_SUITE_P(RuntimeApi, CudartLoaded, ::testing::Values("global", "local"),
                         [](const auto& p) { return p.param; });

TEST(RuntimeApi, ServedNeedsTheShim) {
  // Without the preload every call reaches the fake cudart and the scenario fails its "cudart
  // ran once" check: it measures the shim, not the fake.
  auto r = run("served", "global", {}, /*preload=*/false);
  EXPECT_NE(r.exit_status, 0) << r.output;
  EXPECT_NE(r.output.find("cudart's cudaMalloc ran 1000 times"), std::string::npos) << r.output;
}

TEST(RuntimeApi, OutOfMemoryIsCudartsErrorAndLoggedOnce) {
  auto r = run("oom", "global", {{"CUDAPOOL_CONF", "max_reserved_mb:64"}});
  expect_pass(r, "oom");
  // The pool diagnosed it; cudart only reported it, so the diagnosis is not logged again.
  EXPECT_EQ(occurrences(r.output, "[warning] CUDA out of memory"), 1) << r.output;
}

TEST(RuntimeApi, DoubleFreeIsInvalidValueFromCudart) {
  auto r = run("double_free");
  expect_pass(r, "double_free");
  // The pool refused the second free once; cudart's call was handed that answer instead of the
  // driver hook asking the pool again (which would log the refusal twice).
  EXPECT_EQ(occurrences(r.output, "double_free; returning CUDA_ERROR_INVALID_VALUE"), 1) << r.output;
}

TEST(RuntimeApi, CudartOlderThan12IsNotAnsweredDirectly) {
  expect_pass(run("cudart11", "global", {{"FAKE_CUDART_VERSION", "11080"}}), "cudart11");
}

TEST(RuntimeApi, FreeHostSyncFreesGoThroughCudartAndWait) {
  expect_pass(run("free_host_sync", "global", {{"CUDAPOOL_CONF", "free_host_sync:True"}}), "free_host_sync");
}

TEST(RuntimeApi, ThreadsWithoutAContextGoThroughCudartOnce) {
  // Under ThreadSanitizer, threads of a program whose libraries came by dlopen (the fake driver
  // and cudart have thread-local state) end in a report from glibc's own freeing of their TLS
  // (_dl_deallocate_tls), which it cannot follow; the shim's code on this path runs threaded
  // under it in the other shim tests.
  if (std::string(CUDAPOOL_SAN_PRELOAD).find("tsan") != std::string::npos)
    GTEST_SKIP() << "ThreadSanitizer: glibc's TLS teardown of dlopen'ed libraries";
  expect_pass(run("threads"), "threads");
}

TEST(RuntimeApi, ExitSummaryCountsTheCallsServed) {
  char dir[] = "/tmp/cudapool-runtime-api-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string stats = std::string(dir) + "/stats.json";
  auto r = run("served", "global", {{"CUDAPOOL_STATS", stats}});
  expect_pass(r, "served");
  const std::string json = cudapool::testing::read_file(stats);
  const auto at = json.find("\"runtime_api\"");
  ASSERT_NE(at, std::string::npos) << json;
  EXPECT_GE(json_number(json, "cudaMalloc", at), 990) << json;
  EXPECT_GE(json_number(json, "cudaFree", at), 1000) << json;
  std::remove(stats.c_str());
  rmdir(dir);
}

}  // namespace
