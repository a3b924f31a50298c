// CUDA IPC of pooled memory between processes: runs tests/fakecuda/ipc_app (the exporting
// parent, which runs itself again as importing children) under LD_PRELOAD=libcudapool.so on the
// fake libcuda.so.1, once per scenario and policy, and checks what it and the shim report.
#include <sys/resource.h>
#include <unistd.h>

#include <map>
#include <string>

#include <gtest/gtest.h>

#include "tests/unit/shim_child.h"

namespace {

const std::string kFakeDir = CUDAPOOL_FAKECUDA_DIR;

cudapool::test::ChildResult run_app(const std::string& scenario, const std::string& conf,
                                    std::map<std::string, std::string> extra = {}) {
  extra["CUDAPOOL_CONF"] = conf;
  return cudapool::test::run_under_shim({kFakeDir + "/ipc_app", scenario}, extra);
}

// Classic segments (the default policy) and expandable segments.
class ShimIpc : public ::testing::TestWithParam<const char*> {};

void expect_pass(const cudapool::test::ChildResult& o, const std::string& scenario) {
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS " + scenario), std::string::npos) << o.output;
  EXPECT_EQ(o.output.find("FAIL"), std::string::npos) << o.output;
}

// Split, whole, small and large blocks open in another process to exactly their bytes.
TEST_P(ShimIpc, AnyBlockOpensInAnotherProcess) { expect_pass(run_app("share", GetParam()), "share"); }

// Freed while open elsewhere: held, not reused, returned to the pool after the close; its handle
// (and that of a block freed with no importer) then names nothing, with a log line saying why.
TEST_P(ShimIpc, BlockFreedWhileOpenIsHeldUntilClosed) {
  const auto o = run_app("held", std::string(GetParam()) + ",log_level:info");
  expect_pass(o, "held");
  EXPECT_NE(o.output.find("importer open(s) still hold it"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("no such block (freed, or never exported by that process)"), std::string::npos) << o.output;
}

TEST_P(ShimIpc, ImporterThatDiesReleasesItsHolds) { expect_pass(run_app("crash", GetParam()), "crash"); }

TEST_P(ShimIpc, HandleOfAnExitedExporterIsRefused) {
  const auto o = run_app("gone", GetParam());
  expect_pass(o, "gone");
  EXPECT_NE(o.output.find("cannot be reached"), std::string::npos) << o.output;
}

// A process without the shim hands the handle to the driver, which refuses bytes it did not make.
TEST_P(ShimIpc, ImporterWithoutTheShimGetsAnError) { expect_pass(run_app("noshim", GetParam()), "noshim"); }

TEST_P(ShimIpc, ExportsEndWithTheirContext) {
  const auto o = run_app("reset", GetParam());
  expect_pass(o, "reset");
  EXPECT_NE(o.output.find("no such block"), std::string::npos) << o.output;
}

// Refused by both ends; the 51 connections of the other user make one log line, not 51.
TEST_P(ShimIpc, OtherUsersAreRefusedByBothEnds) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run the importer as another user";
  const auto o = run_app("foreign", GetParam());
  expect_pass(o, "foreign");
  EXPECT_NE(o.output.find("only processes of uid 0 may open"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("CUDA_ERROR_NOT_PERMITTED"), std::string::npos) << o.output;
  int lines = 0;
  for (std::size_t at = 0; (at = o.output.find("refused a connection from", at)) != std::string::npos; ++at) ++lines;
  EXPECT_GE(lines, 1);
  EXPECT_LE(lines, 2) << "refusals are logged at most every 10 s\n" << o.output;
}

// More silent connections than the exporter serves at once: a legitimate importer that comes
// after them is served (the idle ones that hold nothing make room), and an importer holding a
// freed block open keeps its connection, so the block is not handed out again.
TEST_P(ShimIpc, IdleConnectionsPastTheCapLeaveRoomForAnImporter) {
  rlimit l{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &l), 0);
  if (l.rlim_max != RLIM_INFINITY && l.rlim_max < 2200)
    GTEST_SKIP() << "needs a hard descriptor limit of 2200 (1100 connections on each end), not " << l.rlim_max;
  const auto o = run_app("crowd", GetParam());
  expect_pass(o, "crowd");
  EXPECT_NE(o.output.find("importers are connected already: dropped the connection"), std::string::npos) << o.output;
}

INSTANTIATE_TEST_SUITE_P(Policies, ShimIpc, ::testing::Values("expandable_segments:False", ""),
                         [](const auto& test_info) {
                           return std::string(test_info.param[0] != '\0' ? "classic" : "expandable_default");
                         });

// A driver that refuses exportable pages: expandable segments still work, and an export of their
// blocks says why it cannot be.
TEST(ShimIpcFallback, DriverWithoutExportablePagesRefusesTheExport) {
  const auto o = run_app("noexport", "expandable_segments:True,log_level:info", {{"FAKECUDA_VMM_NO_EXPORT", "1"}});
  expect_pass(o, "noexport");
  EXPECT_NE(o.output.find("refused exportable pages"), std::string::npos) << o.output;
}

// An exporter that never accepts: the open fails after the connect timeout, and other threads'
// imports do not wait for it.
TEST(ShimIpcPeers, StalledExporterBlocksNoOtherImport) {
  const auto o = run_app("stall", "");
  expect_pass(o, "stall");
  EXPECT_NE(o.output.find("accepts no connection"), std::string::npos) << o.output;
}

// Crafted replies (wrapping or out-of-range offsets and sizes, sizes the handle does not name,
// unit counts without their descriptors, unknown kinds) are refused and map nothing.
TEST(ShimIpcPeers, CraftedRepliesAreRefused) {
  const auto o = run_app("evil", "");
  expect_pass(o, "evil");
  EXPECT_NE(o.output.find("does not lie inside"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("where the handle names"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("unknown kind"), std::string::npos) << o.output;
}

// Out of descriptors with a connection pending, the exporter's server pauses instead of spinning,
// and serves the importer once descriptors are back.
TEST(ShimIpcPeers, ExporterOutOfDescriptorsDoesNotSpin) {
  // The sanitizers' runtimes need descriptors of their own once the app exhausts them.
  if (!std::string(CUDAPOOL_SAN_PRELOAD).empty()) GTEST_SKIP() << "descriptor exhaustion: release builds only";
  // No stats publisher: its thread opens and closes files, and one it closes while the app holds
  // every other descriptor would let the server's accept through (then the importer is answered
  // `busy` instead, which the app's second part covers).
  const auto o = run_app("emfile", "log_level:warn,publish_stats:False");
  expect_pass(o, "emfile");
  EXPECT_NE(o.output.find("cannot accept an importer's connection"), std::string::npos) << o.output;
}

}  // namespace
