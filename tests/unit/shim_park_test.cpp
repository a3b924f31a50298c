// Parking through the shim: runs tests/fakecuda/park_app (linked with the fake libcuda.so.1) under
// LD_PRELOAD=libcudapool.so with expandable segments, one process per scenario. The fake's test
// kernel touches its arguments' memory on a worker thread, so a launch that reached the driver
// while the process was parked would kill the program with SIGSEGV; the bypass scenario shows that
// it does.
#include <csignal>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "tests/unit/shim_child.h"

namespace {

const std::string kFakeDir = CUDAPOOL_FAKECUDA_DIR;

cudapool::test::ChildResult run_app(const std::string& scenario, std::map<std::string, std::string> extra = {}) {
  extra.emplace("CUDAPOOL_CONF", "expandable_segments:True");
  return cudapool::test::run_under_shim({kFakeDir + "/park_app", scenario}, extra);
}

void expect_pass(const std::string& scenario, const std::map<std::string, std::string>& extra = {}) {
  const auto o = run_app(scenario, extra);
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS " + scenario), std::string::npos) << o.output;
}

// Parked: every page back to the device, the addresses kept; the next launch, copy or allocation
// restores the bytes first.
TEST(ShimPark, ParkGivesPagesBackAndTheNextCallRestoresThem) {
  expect_pass("basic");
  const auto o = run_app("basic", {{"CUDAPOOL_CONF", "expandable_segments:True,log_level:info"}});
  EXPECT_NE(o.output.find("parking: parked"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("parking: restored"), std::string::npos) << o.output;
}

TEST(ShimPark, DiscardKeepsTheAddressesNotTheBytes) { expect_pass("discard"); }

// A restore keeps its pinned buffer: the next park that fits pins nothing (pinning gigabytes costs
// far more than copying them); one that does not fit replaces it.
// (No publisher thread: it frees a spare kept 10 s, which a slow machine could reach.)
TEST(ShimPark, TheNextParkReusesThePinnedBuffer) { expect_pass("spare", {{"CUDAPOOL_CONF", "publish_stats:False"}}); }

// No launch slips between the drain and the unmap: a thread launches without pause while another
// parks and unparks (also under ThreadSanitizer in `make test SAN=thread`).
TEST(ShimPark, LaunchesRacingParksAllSeeTheirBytes) {
  // 2000 rounds; 200 under a sanitizer, where a round costs some 40 ms (no membarrier under
  // ThreadSanitizer: every door fences) and 2000 would pass the child's time limit.
  const std::string san = CUDAPOOL_SAN_PRELOAD;
  expect_pass("race", {{"PARK_APP_ROUNDS", san.empty() ? "2000" : "200"}});
}

// Never parked: a block exported over CUDA IPC, a graph capture in progress, peer access, a range
// exported as a dma-buf, the allocation handle behind an address taken, classic segments only.
// Each says why, in the log too.
TEST(ShimPark, WhatCannotMoveIsNeverParked) {
  expect_pass("refusals");
  expect_pass("peer");
  expect_pass("dmabuf");
  expect_pass("retain");
  const auto o = run_app("classic", {{"CUDAPOOL_CONF", "expandable_segments:False,log_level:info"}});
  EXPECT_EQ(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("parking: not parked"), std::string::npos) << o.output;
}

// The negative control: the driver's own cuLaunchKernel, called past the shim, against a parked
// process faults. Without this the race test could pass with a kernel that touched nothing.
TEST(ShimPark, ALaunchPastTheDoorFaults) {
  // Under a sanitizer the fault must still kill the child: the sanitizer's own handler would
  // report it and exit with a status instead.
  const auto o = run_app("bypass", {{"ASAN_OPTIONS", "detect_leaks=0:halt_on_error=1:handle_segv=0:handle_sigbus=0"},
                                    {"TSAN_OPTIONS", "die_after_fork=0:handle_segv=0:handle_sigbus=0"}});
  EXPECT_EQ(o.exit_status, -1) << o.output;
  EXPECT_TRUE(o.signal == SIGSEGV || o.signal == SIGBUS) << "signal " << o.signal << "\n" << o.output;
  EXPECT_NE(o.output.find("launching past the shim"), std::string::npos) << o.output;
  EXPECT_EQ(o.output.find("no fault"), std::string::npos) << o.output;
}

}  // namespace
