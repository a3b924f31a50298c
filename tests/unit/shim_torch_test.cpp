// PyTorch's pluggable-allocator entry points (cudapool_torch_alloc / cudapool_torch_free) and the
// Python module's PyTorch glue: runs tests/fakecuda/torch_app, one process per scenario, with the
// shim preloaded or with the library loaded by dlopen alone (as cudapool.torch.use() loads it
// for a process started without LD_PRELOAD).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "tests/unit/shim_child.h"

namespace {

const std::string kShim = CUDAPOOL_SHIM_SO;
const std::string kApp = std::string(CUDAPOOL_FAKECUDA_DIR) + "/torch_app";

cudapool::test::ChildResult run(const std::string& scenario, bool preload,
                                std::map<std::string, std::string> env = {}) {
  if (!preload) env["TORCH_APP_LIB"] = kShim;
  return cudapool::test::run_under_shim({kApp, scenario}, env, preload);
}

void expect_pass(const cudapool::test::ChildResult& r, const std::string& scenario) {
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_NE(r.output.find("PASS " + scenario), std::string::npos) << r.output;
}

// Loaded by dlopen alone, a sanitizer build's library needs its runtime first in the process,
// which only a preload gives: those cases run in release builds.
class TorchPath : public ::testing::TestWithParam<bool> {  // true: preloaded
 protected:
  void SetUp() override {
    if (!GetParam() && !std::string(CUDAPOOL_SAN_PRELOAD).empty()) GTEST_SKIP() << "dlopen alone: release builds only";
  }
};

TEST_P(TorchPath, SameStreamReusesWithoutAFenceOtherStreamsAfterAnEvent) {
  expect_pass(run("stream_reuse", GetParam()), "stream_reuse");
}

TEST_P(TorchPath, DeviceFencedFreeWaitsForEveryStream) {
  expect_pass(run("free_device", GetParam(), {{"CUDAPOOL_CONF", "free_sync:fenced"}}), "free_device");
}

TEST_P(TorchPath, ARecordedBlockIsNotReusedOnItsStreamWhileTheOtherStreamRuns) {
  expect_pass(run("record_stream", GetParam()), "record_stream");
}

TEST_P(TorchPath, GlueRegistersInCppAndPassesRecordStreamToThePool) {
  expect_pass(run("glue_record_stream", GetParam()), "glue_record_stream");
}

TEST_P(TorchPath, GluesAllocatorClassAnswersCacheInfoAndStatsFromThePool) {
  expect_pass(run("glue_allocator_class", GetParam(), {{"CUDAPOOL_CONF", "max_reserved_mb:256"}}),
              "glue_allocator_class");
}

TEST_P(TorchPath, AThreadWithNoContextIsServedInThePrimaryContext) {
  expect_pass(run("thread_without_context", GetParam()), "thread_without_context");
}

TEST_P(TorchPath, DefaultStreamAndEmptyTensors) { expect_pass(run("default_stream", GetParam()), "default_stream"); }

TEST_P(TorchPath, OutOfMemoryIsNullWithThePoolsDiagnosis) {
  auto r = run("oom", GetParam(), {{"CUDAPOOL_CONF", "max_reserved_mb:64"}});
  expect_pass(r, "oom");
  // Logged too, as the shim logs its out-of-memory answers.
  EXPECT_NE(r.output.find("[warning] CUDA out of memory"), std::string::npos) << r.output;
}

TEST_P(TorchPath, GlueRaisesOutOfMemoryErrorWithTheDiagnosis) {
  expect_pass(run("glue_oom", GetParam(), {{"CUDAPOOL_CONF", "max_reserved_mb:64"}}), "glue_oom");
}

TEST_P(TorchPath, CapturedAllocationsAreGraphNodes) { expect_pass(run("capture", GetParam()), "capture"); }

TEST_P(TorchPath, AnotherDevicesAllocationIsRefused) { expect_pass(run("wrong_device", GetParam()), "wrong_device"); }

TEST_P(TorchPath, BackendPassthroughUsesTheDriversAllocator) {
  expect_pass(run("passthrough", GetParam(), {{"CUDAPOOL_CONF", "backend:passthrough"}}), "passthrough");
}

TEST_P(TorchPath, CApiForThePythonModule) { expect_pass(run("c_api", GetParam()), "c_api"); }

INSTANTIATE_TEST_SUITE_P(PreloadedOrLoaded, TorchPath, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "Preloaded" : "LoadedByDlopen"; });

TEST(TorchPath, OnePoolForPluggableAndCudaFreeUnderThePreloadedShim) {
  expect_pass(run("mixed_preloaded", true), "mixed_preloaded");
}

TEST(TorchPath, LoadedAloneItServesPyTorchAndGivesForeignPointersBack) {
  if (!std::string(CUDAPOOL_SAN_PRELOAD).empty()) GTEST_SKIP() << "dlopen alone: release builds only";
  expect_pass(run("mixed_loaded", false), "mixed_loaded");
}

TEST(TorchPath, ASecondCopyForwardsToThePreloadedOne) {
  char dir[] = "/tmp/cudapool-torch-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string copy = std::string(dir) + "/libcudapool-copy.so";
  std::filesystem::copy_file(kShim, copy);
  auto r = run("second_copy", true, {{"TORCH_APP_COPY", copy}});
  std::filesystem::remove_all(dir);
  expect_pass(r, "second_copy");
}

}  // namespace
