// The dump signal (policy key dump_signal) and the start report, under the fake driver.
//
// The programs are this test binary itself: re-executed with CUDAPOOL_SIGNAL_CHILD=<mode> and
// LD_PRELOAD=libcudapool.so, a static initializer runs the child scenario before gtest's main and
// exits. The child reaches the driver the way cudart does (dlopen libcuda.so.1, dlsym).
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/unit/shim_child.h"
#include "tests/unit/shim_hooked_names.h"

extern char** environ;

namespace {

// ---- the child -------------------------------------------------------------------------------

using CUresult = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
constexpr std::size_t MiB = 1 << 20;

#define CHILD_CHECK(expr)                                  \
  do {                                                     \
    if (!(expr)) {                                         \
      std::printf("CHILD FAIL %d: %s\n", __LINE__, #expr); \
      std::fflush(stdout);                                 \
      std::_Exit(3);                                       \
    }                                                      \
  } while (0)

struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, int);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuMemAlloc)(CUdeviceptr*, std::size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
};

Driver open_driver() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  CHILD_CHECK(h != nullptr);
  Driver d{};
  d.cuInit = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(h, "cuInit"));
  d.cuDevicePrimaryCtxRetain = reinterpret_cast<CUresult (*)(CUcontext*, int)>(dlsym(h, "cuDevicePrimaryCtxRetain"));
  d.cuCtxSetCurrent = reinterpret_cast<CUresult (*)(CUcontext)>(dlsym(h, "cuCtxSetCurrent"));
  // The hooked entry points, as a program linked against libcuda resolves them (the preloaded
  // shim comes first).
  d.cuMemAlloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, std::size_t)>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  d.cuMemFree = reinterpret_cast<CUresult (*)(CUdeviceptr)>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
  CHILD_CHECK(d.cuInit && d.cuDevicePrimaryCtxRetain && d.cuCtxSetCurrent && d.cuMemAlloc && d.cuMemFree);
  CHILD_CHECK(d.cuInit(0) == 0);
  CUcontext ctx = nullptr;
  CHILD_CHECK(d.cuDevicePrimaryCtxRetain(&ctx, 0) == 0);
  CHILD_CHECK(d.cuCtxSetCurrent(ctx) == 0);
  return d;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

volatile sig_atomic_t g_program_handler_calls = 0;
void program_handler(int) { g_program_handler_calls = g_program_handler_calls + 1; }

// dump_signal:SIGUSR1 set: the program's own handler (installed first) keeps running, the dump
// lands in the log, and the program keeps allocating afterwards.
[[noreturn]] void child_dump() {
  struct sigaction sa {};
  sa.sa_handler = &program_handler;
  sigemptyset(&sa.sa_mask);
  CHILD_CHECK(sigaction(SIGUSR1, &sa, nullptr) == 0);
  Driver d = open_driver();
  CUdeviceptr a = 0, b = 0;
  CHILD_CHECK(d.cuMemAlloc(&a, 5 * MiB) == 0);
  CHILD_CHECK(d.cuMemAlloc(&b, 5 * MiB) == 0);
  CHILD_CHECK(raise(SIGUSR1) == 0);
  CHILD_CHECK(g_program_handler_calls == 1);  // chained
  const char* log_path = std::getenv("CHILD_LOG");
  CHILD_CHECK(log_path != nullptr);
  bool seen = false;
  for (int i = 0; i < 500 && !seen; ++i) {
    seen = slurp(log_path).find("snapshot device 0") != std::string::npos;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHILD_CHECK(seen);
  // The dump flushed the trace: its rows are in the file while the program still runs.
  if (const char* trace = std::getenv("CHILD_TRACE")) {
    const std::string csv = slurp(trace);
    CHILD_CHECK(csv.find(",segment_alloc,") != std::string::npos);
    CHILD_CHECK(csv.find(",allocate,") != std::string::npos);
  }
  // Still running, still pooling.
  CHILD_CHECK(d.cuMemFree(a) == 0);
  CUdeviceptr c = 0;
  CHILD_CHECK(d.cuMemAlloc(&c, 1 * MiB) == 0);
  CHILD_CHECK(d.cuMemFree(c) == 0);
  CHILD_CHECK(d.cuMemFree(b) == 0);
  std::printf("CHILD OK dump\n");
  std::fflush(stdout);
  std::exit(0);
}

// No dump_signal: after CUDA started, SIGUSR1 still has its default action, which ends the process.
[[noreturn]] void child_nokey() {
  Driver d = open_driver();
  CUdeviceptr a = 0;
  CHILD_CHECK(d.cuMemAlloc(&a, 1 * MiB) == 0);
  struct sigaction cur {};
  CHILD_CHECK(sigaction(SIGUSR1, nullptr, &cur) == 0);
  std::printf("handler %s\n", (cur.sa_flags & SA_SIGINFO) == 0 && cur.sa_handler == SIG_DFL ? "SIG_DFL" : "installed");
  std::fflush(stdout);
  raise(SIGUSR1);
  std::printf("CHILD survived SIGUSR1\n");
  std::exit(0);
}

// One allocation and one free with the logger at info: the start report and segment traffic.
[[noreturn]] void child_start() {
  Driver d = open_driver();
  CUdeviceptr a = 0;
  CHILD_CHECK(d.cuMemAlloc(&a, 3 * MiB) == 0);
  CHILD_CHECK(d.cuMemFree(a) == 0);
  CHILD_CHECK(d.cuMemFree(0x1234) != 0 || true);  // not pool memory: a pass-through
  std::printf("CHILD OK start\n");
  std::exit(0);
}

[[maybe_unused]] const int g_child = [] {
  const char* mode = std::getenv("CUDAPOOL_SIGNAL_CHILD");
  if (mode == nullptr) return 0;
  if (std::strcmp(mode, "dump") == 0) child_dump();
  if (std::strcmp(mode, "nokey") == 0) child_nokey();
  if (std::strcmp(mode, "start") == 0) child_start();
  std::_Exit(4);
}();

// ---- the parent ------------------------------------------------------------------------------

using RunResult = cudapool::test::ChildResult;

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

RunResult run_child(const std::string& mode, const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> vars = env;
  vars["CUDAPOOL_SIGNAL_CHILD"] = mode;
  return cudapool::test::run_under_shim({self_exe()}, vars);
}

std::string temp_path(const char* tag) {
  return "/tmp/cudapool-signal-test-" + std::to_string(getpid()) + "-" + tag + ".log";
}

// The text of the dump: from its first line to the end of the snapshot block.
std::string dump_section(const std::string& log) {
  const auto at = log.find("dump on signal");
  return at == std::string::npos ? std::string() : log.substr(at);
}

TEST(ShimSignal, DumpSignalLogsStatsAndSnapshotAndTheProgramKeepsRunning) {
  const std::string log_path = temp_path("dump"), trace_path = temp_path("trace");
  std::remove(log_path.c_str());
  RunResult r = run_child("dump",
                          {{"CUDAPOOL_CONF", "expandable_segments:False,dump_signal:SIGUSR1,log_file:" + log_path},
                           {"CUDAPOOL_TRACE", trace_path},
                           {"CHILD_LOG", log_path},
                           {"CHILD_TRACE", trace_path}});
  const std::string log = slurp(log_path);
  std::remove(log_path.c_str());
  std::remove(trace_path.c_str());
  ASSERT_EQ(r.exit_status, 0) << r.output << log;
  EXPECT_EQ(r.signal, 0);
  EXPECT_NE(r.output.find("CHILD OK dump"), std::string::npos) << r.output;
  const std::string dump = dump_section(log);
  ASSERT_FALSE(dump.empty()) << log;
  EXPECT_NE(dump.find("dump on signal 10"), std::string::npos) << dump;
  // Logged at the default level (warn), so it is visible without log_level.
  EXPECT_NE(log.find("[warn"), std::string::npos) << log;
  // Two 5 MiB blocks carved from one 20 MiB segment (requests under 10 MiB get 20 MiB segments).
  EXPECT_NE(dump.find("snapshot device 0: segments=1 blocks=3 reserved=20971520 allocated=10485760"), std::string::npos)
      << dump;
  EXPECT_NE(dump.find("size=20971520 allocated=10485760 large"), std::string::npos) << dump;
  EXPECT_NE(dump.find(": 5242880A 5242880A 10485760F"), std::string::npos) << dump;
  // The stats table with the same numbers.
  EXPECT_NE(dump.find("allocated (current)"), std::string::npos) << dump;
  EXPECT_NE(dump.find("10.00 MiB"), std::string::npos) << dump;
  EXPECT_NE(dump.find("20.00 MiB"), std::string::npos) << dump;
  // Exactly one dump for one signal.
  EXPECT_EQ(log.find("dump on signal", log.find("dump on signal") + 1), std::string::npos) << log;
}

TEST(ShimSignal, WithoutTheKeySigusr1KeepsItsDefaultAction) {
  RunResult r = run_child("nokey", {});
  EXPECT_NE(r.output.find("handler SIG_DFL"), std::string::npos) << r.output;
  EXPECT_EQ(r.signal, SIGUSR1) << r.output;  // the default action: the process ends
  EXPECT_EQ(r.output.find("CHILD survived"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("dump on signal"), std::string::npos) << r.output;
}

TEST(ShimSignal, StartReportListsVersionOriginsAndHookedEntryPoints) {
  RunResult r = run_child("start", {{"CUDAPOOL_CONF",
                                     "log_level:info,max_split_size_mb:64,expandable_segments:"
                                     "False"}});
  ASSERT_EQ(r.exit_status, 0) << r.output;
  const std::string& out = r.output;
  EXPECT_NE(out.find("cudapool 0."), std::string::npos) << out;
  EXPECT_NE(out.find("effective policy"), std::string::npos) << out;
  // Every key with its origin: the two set in CUDAPOOL_CONF say where, the rest are defaults.
  auto line_of = [&](const std::string& key) {
    const auto at = out.find("\n" + key + " ");
    if (at == std::string::npos) return std::string();
    return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  };
  EXPECT_NE(line_of("max_split_size_mb").find("= 64   (CUDAPOOL_CONF"), std::string::npos) << out;
  EXPECT_NE(line_of("log_level").find("= info   (CUDAPOOL_CONF"), std::string::npos) << out;
  EXPECT_NE(line_of("free_sync").find("(default)"), std::string::npos) << out;
  EXPECT_NE(line_of("dump_signal").find("= off   (default)"), std::string::npos) << out;
  // The start report names exactly the hooked entry points of shim/entry_points.def, in its order.
  const auto hooked_at = out.find("hooked entry points: ");
  ASSERT_NE(hooked_at, std::string::npos) << out;
  const auto names_at = hooked_at + std::strlen("hooked entry points: ");
  std::string expected;
  for (const std::string& name : cudapool::test::hooked_names()) expected += (expected.empty() ? "" : " ") + name;
  EXPECT_GT(expected.size(), 400u);
  EXPECT_EQ(out.substr(names_at, out.find('\n', names_at) - names_at), expected);
  // Segment traffic at info, with size and the upstream's time.
  EXPECT_NE(out.find("segment alloc on device 0: 20971520 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("upstream took"), std::string::npos) << out;
  // The first pass-through of a kind is logged once.
  const auto pass = out.find("pass-through (foreign_pointer)");
  EXPECT_NE(pass, std::string::npos) << out;
  // The exit summary table.
  EXPECT_NE(out.find("exit summary"), std::string::npos) << out;
}

// The one pool option the shim sets itself (thread caches from a pool's first thread under
// free_sync:immediate) is said at info, and only where it applies.
TEST(ShimSignal, StartSaysWhenThreadCachesEngageFromTheFirstThread) {
  const std::string line = "thread caches engage from a pool's first thread (free_sync:immediate)";
  RunResult immediate = run_child("start", {{"CUDAPOOL_CONF", "log_level:info,free_sync:immediate"}});
  ASSERT_EQ(immediate.exit_status, 0) << immediate.output;
  const auto at = immediate.output.find(line);
  EXPECT_NE(at, std::string::npos) << immediate.output;
  EXPECT_EQ(immediate.output.find(line, at + 1), std::string::npos) << "said more than once\n" << immediate.output;
  RunResult fenced = run_child("start", {{"CUDAPOOL_CONF", "log_level:info,free_sync:fenced"}});
  ASSERT_EQ(fenced.exit_status, 0) << fenced.output;
  EXPECT_EQ(fenced.output.find(line), std::string::npos) << fenced.output;
}

}  // namespace
