// Expandable segments through the shim's CUDA upstream: runs tests/fakecuda/vmm_app (linked with
// the fake libcuda.so.1) under LD_PRELOAD=libcudapool.so with expandable_segments:True, one
// process per scenario, and checks what it reports. The program itself asserts the fake driver's
// VMM accounting (pages of the driver's granularity, handles of whole pages, pages given back on
// empty-cache and trim, nothing leaked, bounded reservations); this driver adds the environment
// (granularity, device size) and checks the log lines.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/unit/shim_child.h"

extern char** environ;

namespace {

const std::string kFakeDir = CUDAPOOL_FAKECUDA_DIR;

// Runs `vmm_app scenario` with the shim preloaded, expandable segments on, and `extra` set on
// top of a cleaned environment (policy variables from the caller's shell removed).
cudapool::test::ChildResult run_app(const std::string& scenario, std::map<std::string, std::string> extra = {}) {
  extra.emplace("CUDAPOOL_CONF", "expandable_segments:True");
  return cudapool::test::run_under_shim({kFakeDir + "/vmm_app", scenario}, extra);
}

void expect_pass(const std::string& scenario, const std::map<std::string, std::string>& extra = {}) {
  const auto o = run_app(scenario, extra);
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS " + scenario), std::string::npos) << o.output;
}

// Pages follow the driver's granularity, whatever it is (4 MiB default of the fake, a non-power
// of two, and the 2 MiB of today's GPUs).
TEST(ShimVmm, PagesReleasedOnEmptyCacheAtDriverGranularity) {
  expect_pass("release");
  expect_pass("release", {{"FAKECUDA_VMM_GRANULARITY_KB", "6144"}});
  expect_pass("release", {{"FAKECUDA_VMM_GRANULARITY_KB", "2048"}});
}

// expandable_page_mb: the large pool's pages are that size (rounded up to the granularity), one
// cuMemCreate handle each, released and recycled whole.
TEST(ShimVmm, LargePagesWhenAsked) {
  const std::map<std::string, std::string> twenty = {{"CUDAPOOL_CONF",
                                                      "expandable_segments:True,expandable_page_mb:"
                                                      "20"},
                                                     {"VMM_APP_LARGE_PAGE_MB", "20"}};
  expect_pass("release", twenty);
  auto six = twenty;
  six.emplace("FAKECUDA_VMM_GRANULARITY_KB", "6144");  // 20 MiB rounds up to 24 MiB
  expect_pass("release", six);
  expect_pass("recycle", twenty);
  // The app's own expectation must matter: told 20 MiB while the pool maps 4 MiB pages, it fails.
  const auto o = run_app("release", {{"VMM_APP_LARGE_PAGE_MB", "20"}});
  EXPECT_NE(o.exit_status, 0) << o.output;
}

// cuMemCreate pages are not freed with their context: a reset releases them through the shim.
TEST(ShimVmm, ContextResetReleasesPagesAndRanges) {
  const auto o = run_app("reset", {{"CUDAPOOL_CONF", "expandable_segments:True,log_level:info"}});
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS reset"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("context gone, released"), std::string::npos) << o.output;
}

// Physical units: a 100 MiB growth is ceil(100 / unit) handles, with the default's units (scaled
// to the pool: a 100 MiB pool maps one page each) and with units set; 0 = one handle per page
// (then 25 handles at the fake's 4 MiB granularity). The app checks handle counts against
// VMM_APP_MAX_UNIT_MB, so a pool ignoring the key fails it.
TEST(ShimVmm, GrowthMapsFewLargeUnits) {
  expect_pass("units");
  expect_pass("units", {{"FAKECUDA_VMM_GRANULARITY_KB", "2048"}});
  expect_pass("units",
              {{"CUDAPOOL_CONF", "expandable_segments:True,expandable_unit_mb:0"}, {"VMM_APP_MAX_UNIT_MB", "0"}});
  expect_pass("units",
              {{"CUDAPOOL_CONF", "expandable_segments:True,expandable_unit_mb:40"}, {"VMM_APP_MAX_UNIT_MB", "40"}});
  // Told 16 MiB units while the pool maps one page per handle, the app fails.
  const auto o = run_app("units", {{"CUDAPOOL_CONF", "expandable_segments:True,expandable_unit_mb:0"},
                                   {"VMM_APP_MAX_UNIT_MB", "16"}});
  EXPECT_NE(o.exit_status, 0) << o.output;
}

// Recycling moves pages (same handles, new address) instead of releasing and creating them.
TEST(ShimVmm, RecyclingMovesPagesWithoutNewHandles) {
  expect_pass("recycle");
  expect_pass("recycle", {{"FAKECUDA_VMM_GRANULARITY_KB", "2048"}});
}

TEST(ShimVmm, TrimOfDefaultPoolReleasesPages) { expect_pass("trim"); }

// Pages still in use by held work move into a growth by a second mapping of the same handles;
// the old mapping goes only after the work finished.
TEST(ShimVmm, HotPagesAreAliasedAndUnmappedAfterTheirWork) {
  expect_pass("alias");
  expect_pass("alias", {{"FAKECUDA_VMM_GRANULARITY_KB", "2048"}});
}

// expandable_peer_access: the peer that can reach the device is named in every mapping (without
// the key, check_accounting in the other scenarios asserts no peer descriptor at all).
TEST(ShimVmm, PeerAccessWhenAsked) {
  const auto o = run_app("peers",
                         {{"CUDAPOOL_CONF", "expandable_segments:True,expandable_peer_access:True,log_level:info"}});
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS peers"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("pages of device 1 are also mapped for device(s) 0"), std::string::npos) << o.output;
  // Without the key the same program maps for device 1 alone, and its peer check fails.
  const auto off = run_app("peers");
  EXPECT_NE(off.exit_status, 0) << off.output;
}

// cudaDeviceEnablePeerAccess grants the peer expandable pages already mapped and those mapped
// later, as it does for cudaMalloc memory.
TEST(ShimVmm, EnabledPeerAccessReachesExpandablePages) {
  const auto o = run_app("enable_peer", {{"CUDAPOOL_CONF", "expandable_segments:True,log_level:info"}});
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS enable_peer"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("pages of device 1 are also mapped for device 0"), std::string::npos) << o.output;
}

TEST(ShimVmm, TwoBoundedRangesPerDeviceHoweverManyStreams) { expect_pass("bounded"); }

// The process-wide address-space cap (16 TiB): on an 8 TiB device the second range is refused.
TEST(ShimVmm, ReservationsCappedPerProcess) {
  // The fake driver reserves each range as host address space (mmap): an 8 TiB range does not
  // fit in the application part of ThreadSanitizer's address-space layout, so the first
  // reservation fails there for a reason that has nothing to do with the cap.
  if (std::string(CUDAPOOL_SAN_PRELOAD).find("tsan") != std::string::npos)
    GTEST_SKIP() << "8 TiB of host address space is more than ThreadSanitizer leaves a program";
  const auto o = run_app("cap", {{"FAKECUDA_TOTAL_MB", "8388608"}});
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS cap"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("refusing to reserve"), std::string::npos) << o.output;
}

// cuMemCreate by the program itself counts against a cap or a group budget; without one it is
// the driver's business alone.
TEST(ShimVmm, MemoryTheProgramCreatesCountsAgainstTheCap) {
  expect_pass("foreign");
  const auto capped = run_app("foreign", {{"CUDAPOOL_CONF", "expandable_segments:True,max_reserved_mb:64"},
                                          {"VMM_APP_CAP_MB", "64"}});
  EXPECT_EQ(capped.exit_status, 0) << capped.output;
  EXPECT_NE(capped.output.find("PASS foreign"), std::string::npos) << capped.output;
  EXPECT_NE(capped.output.find("cuMemCreate of 50331648 bytes on device 0 refused"), std::string::npos)
      << capped.output;
  const std::string group = "vmmforeign" + std::to_string(::getpid());
  const auto grouped = run_app("foreign", {{"CUDAPOOL_CONF", "expandable_segments:True,group:" + group +
                                                                 ",group_budget_mb:64,group_release_wait_ms:20,group_"
                                                                 "outside_growth_mb:0"},
                                           {"VMM_APP_CAP_MB", "64"}});
  EXPECT_EQ(grouped.exit_status, 0) << grouped.output;
  EXPECT_NE(grouped.output.find("PASS foreign"), std::string::npos) << grouped.output;
  EXPECT_NE(grouped.output.find("group's budget"), std::string::npos) << grouped.output;
}

TEST(ShimVmm, OutOfMemoryFromCuMemCreateIsTheProgramsError) {
  const auto o = run_app("oom", {{"FAKECUDA_TOTAL_MB", "256"}});
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS oom"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("CUDA out of memory"), std::string::npos) << o.output;
}

TEST(ShimVmm, IpcExportOfExpandableBlockPinsNothingAfterItsFree) { expect_pass("ipc"); }

// A granularity the pool cannot use (0: not a multiple of 512) turns expandable segments off:
// classic cuMemAlloc segments, no reservation, and a log line that says so.
TEST(ShimVmm, UnusableGranularityFallsBackToClassicSegments) {
  const auto o = run_app("classic", {{"FAKECUDA_VMM_GRANULARITY_KB", "0"}});
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS classic"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("no usable allocation granularity"), std::string::npos) << o.output;
}

}  // namespace
