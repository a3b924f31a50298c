// Expandable segments through the shim's CUDA upstream: runs tests/fakecuda/vmm_app (linked with
// the fake libcuda.so.1) under LD_PRELOAD=libcudapool.so with expandable_segments:True, one
// process per scenario, and checks what it reports. The program itself asserts the fake driver's
// VMM accounting (pages of the driver's granularity, one handle per page, pages given back on
// empty-cache and trim, nothing leaked, bounded reservations); this driver adds the environment
// (granularity, device size) and checks the log lines.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace {

const std::string kShim = CUDAPOOL_SHIM_SO;
const std::string kFakeDir = CUDAPOOL_FAKECUDA_DIR;
const std::string kSanPreload = CUDAPOOL_SAN_PRELOAD;

struct Outcome {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string output;
};

// Runs `vmm_app scenario` with the shim preloaded, expandable segments on, and `extra` set on
// top of a cleaned environment (policy variables from the caller's shell removed).
Outcome run_app(const std::string& scenario, std::map<std::string, std::string> extra = {}) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const char* v : {"CUDAPOOL_CONFIG", "CUDAPOOL_PROFILE", "CUDAPOOL_ON_ERROR", "CUDAPOOL_STATS",
                        "PYTORCH_CUDA_ALLOC_CONF", "CUDAPOOL_LOG_LEVEL", "FAKECUDA_TOTAL_MB",
                        "FAKECUDA_VMM_GRANULARITY_KB"})
    env.erase(v);
  env["CUDAPOOL_CONF"] = "expandable_segments:True";
  env["LD_PRELOAD"] = kSanPreload.empty() ? kShim : kSanPreload + " " + kShim;
  if (!kSanPreload.empty()) {
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1";
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1";
  }
  env["LD_LIBRARY_PATH"] = kFakeDir;
  for (auto& [k, v] : extra) env[k] = v;

  std::vector<std::string> strings;
  for (auto& [k, v] : env) strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string prog = kFakeDir + "/vmm_app";
  std::string arg = scenario;
  char* argv[] = {prog.data(), arg.data(), nullptr};

  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    alarm(30);  // a hang fails the test instead of blocking the suite
    execve(argv[0], argv, envp.data());
    _exit(127);
  }
  close(fds[1]);
  Outcome o;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) o.output.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFEXITED(st)) o.status = WEXITSTATUS(st);
  return o;
}

void expect_pass(const std::string& scenario, const std::map<std::string, std::string>& extra = {}) {
  const Outcome o = run_app(scenario, extra);
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS " + scenario), std::string::npos) << o.output;
}

// Pages follow the driver's granularity, whatever it is (4 MiB default of the fake, a non-power
// of two, and the 2 MiB of today's GPUs).
TEST(ShimVmm, PagesReleasedOnEmptyCacheAtDriverGranularity) {
  expect_pass("release");
  expect_pass("release", {{"FAKECUDA_VMM_GRANULARITY_KB", "6144"}});
  expect_pass("release", {{"FAKECUDA_VMM_GRANULARITY_KB", "2048"}});
}

// cuMemCreate pages are not freed with their context: a reset releases them through the shim.
TEST(ShimVmm, ContextResetReleasesPagesAndRanges) {
  const Outcome o = run_app("reset", {{"CUDAPOOL_CONF", "expandable_segments:True,log_level:info"}});
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS reset"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("context gone, released"), std::string::npos) << o.output;
}

TEST(ShimVmm, TrimOfDefaultPoolReleasesPages) { expect_pass("trim"); }

TEST(ShimVmm, TwoBoundedRangesPerDeviceHoweverManyStreams) { expect_pass("bounded"); }

// The process-wide address-space cap (16 TiB): on an 8 TiB device the second range is refused.
TEST(ShimVmm, ReservationsCappedPerProcess) {
  const Outcome o = run_app("cap", {{"FAKECUDA_TOTAL_MB", "8388608"}});
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS cap"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("refusing to reserve"), std::string::npos) << o.output;
}

TEST(ShimVmm, OutOfMemoryFromCuMemCreateIsTheProgramsError) {
  const Outcome o = run_app("oom", {{"FAKECUDA_TOTAL_MB", "256"}});
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS oom"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("CUDA out of memory"), std::string::npos) << o.output;
}

TEST(ShimVmm, IpcOfExpandableBlockRefusedWithLogLine) {
  const Outcome o = run_app("ipc");
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("expandable segment"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("legacy CUDA IPC cannot export"), std::string::npos) << o.output;
}

// A granularity the pool cannot use (0: not a multiple of 512) turns expandable segments off:
// classic cuMemAlloc segments, no reservation, and a log line that says so.
TEST(ShimVmm, UnusableGranularityFallsBackToClassicSegments) {
  const Outcome o = run_app("classic", {{"FAKECUDA_VMM_GRANULARITY_KB", "0"}});
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("PASS classic"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("no usable allocation granularity"), std::string::npos) << o.output;
}

}  // namespace
