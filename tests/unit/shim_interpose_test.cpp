// Runs the fake-driver test programs (tests/fakecuda/app.cpp) under LD_PRELOAD=libcudapool.so,
// one process per scenario, in both driver-resolution styles, and checks what they report.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/unit/shim_child.h"
#include "tests/unit/shim_hooked_names.h"

extern char** environ;

namespace {

const std::string kShim = CUDAPOOL_SHIM_SO;
const std::string kFakeDir = CUDAPOOL_FAKECUDA_DIR;
// Sanitizer builds: the runtimes the instrumented shim needs, preloaded in front of it.
const std::string kSanPreload = CUDAPOOL_SAN_PRELOAD;

using RunResult = cudapool::test::ChildResult;

// Runs argv with the shim preloaded (unless `preload` is false) and the fake driver on the
// library path, plus `env` (VAR=value; an empty value unsets).
RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
              bool preload = true) {
  return cudapool::test::run_under_shim(argv, env, preload);
}

std::string app(bool linked) { return kFakeDir + (linked ? "/app_linked" : "/app_cudart"); }

class Scenario : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(Scenario, PassesUnderTheShim) {
  const auto& [name, linked] = GetParam();
  // These check classic segments' own figures (cuMemAlloc segments and their sizes, legacy IPC
  // handles, what a reset frees); vmm_app's scenarios check the same for expandable segments.
  const bool classic = name == "queries" || name == "reset" || name == "c_api_calls";
  std::map<std::string, std::string> env;
  if (classic) env["CUDAPOOL_CONF"] = "expandable_segments:False";
  // Sanitizer builds: the sanitizers' allocator is not fork-safe, so a fork while the stats
  // publisher thread is inside malloc leaves the child waiting on its lock for ever (glibc's
  // malloc takes its locks around fork). The fork scenario then runs without that thread.
  if (name == "fork_child" && !kSanPreload.empty()) env["CUDAPOOL_CONF"] = "publish_stats:False";
  RunResult r = run({app(linked), name}, env);
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_EQ(r.signal, 0) << r.output;
  EXPECT_NE(r.output.find("PASS " + name), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(BothResolutionStyles, Scenario,
                         ::testing::Combine(::testing::Values("pooling", "resolution", "fenced_reuse", "async_streams",
                                                              "foreign_pointers", "capture", "bad_frees", "queries",
                                                              "reset", "fork_child", "threads", "c_api_calls",
                                                              "pitch_overflow"),
                                            ::testing::Bool()),
                         [](const auto& test_info) {
                           return std::get<0>(test_info.param) + (std::get<1>(test_info.param) ? "_lcuda" : "_cudart");
                         });

TEST(Shim, PoolingNeedsTheShim) {
  // Without the preload the same program makes one driver allocation per pair and fails its
  // "handful of allocations" check: the scenario measures the shim, not the fake.
  RunResult r = run({app(false), "pooling"}, {}, /*preload=*/false);
  EXPECT_NE(r.exit_status, 0) << r.output;
}

TEST(Shim, OutOfMemoryIsCudasErrorWithADiagnosis) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "oom"}, {{"FAKECUDA_TOTAL_MB", "64"}});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("out of memory"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Tried to allocate 40.00 MiB"), std::string::npos) << r.output;
  }
}

TEST(Shim, BadFreesAreLogged) {
  RunResult r = run({app(false), "bad_frees"});
  ASSERT_EQ(r.exit_status, 0) << r.output;
  EXPECT_NE(r.output.find("double_free"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("interior_pointer"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("another context"), std::string::npos) << r.output;
}

// Every block exports a handle of the shim's own (opening them: tests/unit/shim_ipc_test.cpp).
TEST(Shim, IpcHandlesAreTheShimsForSplitAndWholeBlocks) {
  RunResult r = run({app(true), "queries"}, {{"CUDAPOOL_CONF", "expandable_segments:False,log_level:debug"}});
  ASSERT_EQ(r.exit_status, 0) << r.output;
  EXPECT_NE(r.output.find("export 1 of a classic block of 67108864 bytes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("export 2 of a classic block of 1000 bytes"), std::string::npos) << r.output;
}

// A child forked while another thread of the parent is inside the logger must still be able to
// log and to exit (the log flush at exit takes the sink's lock): the fork hands the logging locks
// over to the child. 200 forks against a thread that logs without pause.
TEST(Shim, ForkWhileAnotherThreadLogsNeverHangs) {
  // The sanitizers' runtimes keep locks of their own that are not handed over at fork (see
  // PassesUnderTheShim): 200 forks against a busy thread would test them, not the shim.
  if (!kSanPreload.empty()) GTEST_SKIP() << "fork against a busy thread: release builds only";
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "fork_while_logging"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS fork_while_logging"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("200 forks, 0 hung, 0 failed"), std::string::npos) << r.output;
  }
}

TEST(Shim, NoCudaCallAtExit) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "exit_path"});
    ASSERT_EQ(r.exit_status, 0) << r.output;
    const auto at = r.output.find("exit free: ");
    ASSERT_NE(at, std::string::npos) << r.output;
    int result = -1;
    long before = -1, after = -2;
    ASSERT_EQ(std::sscanf(r.output.c_str() + at, "exit free: result %d, event records %ld -> %ld", &result, &before,
                          &after),
              3)
        << r.output;
    EXPECT_EQ(result, 0);      // the free "succeeds" (leaked)
    EXPECT_EQ(before, after);  // and records no event: no driver call once exiting
  }
}

TEST(Shim, AllocationsAfterExitBeganGoToTheDriver) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "alloc_at_exit"});
    ASSERT_EQ(r.exit_status, 0) << r.output;
    ASSERT_NE(r.output.find("PASS alloc_at_exit"), std::string::npos) << r.output;
    const auto at = r.output.find("exit alloc: ");
    ASSERT_NE(at, std::string::npos) << r.output;
    int result = -1, free_result = -1;
    long allocs = -1, allocs_after = -1, frees = -1, frees_after = -1;
    ASSERT_EQ(std::sscanf(r.output.c_str() + at,
                          "exit alloc: result %d, driver allocations %ld -> %ld, free result %d, driver frees %ld -> "
                          "%ld",
                          &result, &allocs, &allocs_after, &free_result, &frees, &frees_after),
              6)
        << r.output;
    EXPECT_EQ(result, 0);
    EXPECT_EQ(allocs_after, allocs + 1);  // the driver's allocation, not the pool's cached block
    EXPECT_EQ(free_result, 0);
    EXPECT_EQ(frees_after, frees + 1);  // so its free is the driver's too, not leaked in the pool
  }
}

TEST(Shim, ProcessWithoutCudaIsUndisturbed) {
  RunResult r = run({app(false), "no_cuda"});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_EQ(r.output, "hello without CUDA\nPASS no_cuda\n");  // not one extra byte from the shim
  RunResult sh = run({"/bin/sh", "-c", "echo hi"});
  EXPECT_EQ(sh.exit_status, 0);
  EXPECT_EQ(sh.output, "hi\n");
}

TEST(Shim, InvalidPolicyStopsBeforeTheFirstAllocation) {
  RunResult r = run({app(false), "alloc_once"}, {{"CUDAPOOL_CONF", "reserve_percentage:10"}});
  EXPECT_EQ(r.exit_status, 78) << r.output;  // kPolicyErrorExitStatus (EX_CONFIG)
  EXPECT_NE(r.output.find("invalid policy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reserve_percentage"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("active="), std::string::npos) << r.output;
}

TEST(Shim, InvalidPolicyWithOnErrorPassthroughRunsWithoutThePool) {
  RunResult r = run({app(true), "alloc_once"},
                    {{"CUDAPOOL_CONF", "reserve_percentage:10"}, {"CUDAPOOL_ON_ERROR", "passthrough"}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_NE(r.output.find("active=0"), std::string::npos) << r.output;
}

// An output file that cannot be written is a policy error at load, not a lost summary at exit;
// a process that never touches CUDA is not disturbed by it.
TEST(Shim, UnwritableStatsFileIsAPolicyError) {
  const std::map<std::string, std::string> env = {{"CUDAPOOL_CONF", "stats_file:/nonexistent-dir/s.json"}};
  RunResult r = run({app(false), "alloc_once"}, env);
  EXPECT_EQ(r.exit_status, 78) << r.output;
  EXPECT_NE(r.output.find("stats_file '/nonexistent-dir/s.json' (CUDAPOOL_CONF col 1): directory '/nonexistent-dir' "
                          "does not exist"),
            std::string::npos)
      << r.output;
  RunResult pass = run({app(true), "alloc_once"},
                       {{"CUDAPOOL_CONF", "trace_file:/nonexistent-dir/t.csv"}, {"CUDAPOOL_ON_ERROR", "passthrough"}});
  EXPECT_EQ(pass.exit_status, 0) << pass.output;
  EXPECT_NE(pass.output.find("trace_file '/nonexistent-dir/t.csv'"), std::string::npos) << pass.output;
  EXPECT_NE(pass.output.find("active=0"), std::string::npos) << pass.output;
  RunResult quiet = run({app(false), "no_cuda"}, env);
  EXPECT_EQ(quiet.exit_status, 0) << quiet.output;
  EXPECT_EQ(quiet.output, "hello without CUDA\nPASS no_cuda\n");
}

// Nothing at a path the shim opens can block the program: a FIFO at trace_file or
// CUDAPOOL_CONFIG is a policy error at start (exit 78, on_error stop), at log_file a warning
// with the log on stderr. (A blocking open would leave the program to be killed after 30 s.)
TEST(Shim, FifoAtAPathItOpensIsRefusedWithoutBlocking) {
  char dir[] = "/tmp/cudapool-shim-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/f.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string not_regular = "not a regular file (a FIFO): give the path of a regular file";
  RunResult trace = run({app(false), "alloc_once"}, {{"CUDAPOOL_TRACE", fifo}});
  EXPECT_EQ(trace.exit_status, 78) << trace.output;
  EXPECT_NE(trace.output.find("trace_file '" + fifo + "' (CUDAPOOL_TRACE) is " + not_regular), std::string::npos)
      << trace.output;
  RunResult log = run({app(false), "alloc_once"}, {{"CUDAPOOL_CONF", "log_file:" + fifo}});
  EXPECT_EQ(log.exit_status, 0) << log.output;
  EXPECT_NE(log.output.find("cannot open log file '" + fifo + "': " + not_regular), std::string::npos) << log.output;
  EXPECT_NE(log.output.find("PASS alloc_once"), std::string::npos) << log.output;
  RunResult config = run({app(false), "alloc_once"}, {{"CUDAPOOL_CONFIG", fifo}});
  EXPECT_EQ(config.exit_status, 78) << config.output;
  EXPECT_NE(config.output.find("CUDAPOOL_CONFIG=" + fifo + ": " + not_regular), std::string::npos) << config.output;
  std::remove(fifo.c_str());
  ::rmdir(dir);
}

// Another user's file at an output path, left writable by everyone in a sticky directory, is
// never written: at stats_file or trace_file the policy check refuses it at start (exit 78
// before the first allocation; with on_error passthrough the program runs without the pool), at
// log_file the log stays on stderr. The file keeps its contents and its owner.
TEST(Shim, AnotherUsersFileAtAnOutputPathIsNeverWritten) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give files to another user";
  char dir[] = "/tmp/cudapool-shim-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_EQ(::chmod(dir, 01777), 0);
  const std::string d = dir;
  for (const char* name : {"/s.json", "/t.csv", "/log.txt"}) {
    std::ofstream(d + name) << "theirs\n";
    ASSERT_EQ(::chmod((d + name).c_str(), 0666), 0);
    ASSERT_EQ(::chown((d + name).c_str(), 65534, 65534), 0);
  }
  const std::string owned =
      "is owned by uid 65534, not by this process's user (uid 0): remove it or choose another path";
  RunResult stats = run({app(false), "alloc_once"}, {{"CUDAPOOL_STATS", d + "/s.json"}});
  EXPECT_EQ(stats.exit_status, 78) << stats.output;
  EXPECT_NE(stats.output.find("stats_file '" + d + "/s.json' (CUDAPOOL_STATS) " + owned), std::string::npos)
      << stats.output;
  RunResult pass = run({app(false), "alloc_once"},
                       {{"CUDAPOOL_STATS", d + "/s.json"}, {"CUDAPOOL_ON_ERROR", "passthrough"}});
  EXPECT_EQ(pass.exit_status, 0) << pass.output;
  EXPECT_NE(pass.output.find("active=0"), std::string::npos) << pass.output;
  RunResult trace = run({app(false), "alloc_once"}, {{"CUDAPOOL_TRACE", d + "/t.csv"}});
  EXPECT_EQ(trace.exit_status, 78) << trace.output;
  EXPECT_NE(trace.output.find("trace_file '" + d + "/t.csv' (CUDAPOOL_TRACE) " + owned), std::string::npos)
      << trace.output;
  RunResult log = run({app(false), "alloc_once"}, {{"CUDAPOOL_CONF", "log_file:" + d + "/log.txt,log_level:info"}});
  EXPECT_EQ(log.exit_status, 0) << log.output;
  EXPECT_NE(log.output.find("cannot open log file '" + d + "/log.txt': owned by uid 65534"), std::string::npos)
      << log.output;
  for (const char* name : {"/s.json", "/t.csv", "/log.txt"}) {
    std::ifstream in(d + name);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "theirs\n") << name;
    struct stat st {};
    ASSERT_EQ(::lstat((d + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 65534u) << name;
  }
  std::set<std::string> left;  // no summary or temporary file beside them
  for (const auto& e : std::filesystem::directory_iterator(d)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"log.txt", "s.json", "t.csv"}));
  std::filesystem::remove_all(d);
}

TEST(Shim, PytorchAllocConfGetsAHint) {
  RunResult r = run({app(true), "alloc_once"},
                    {{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}, {"PYTORCH_NO_CUDA_MEMORY_CACHING", "1"}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_NE(r.output.find("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True configures PyTorch's own"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("CUDAPOOL_CONF (unset"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("to carry the keys over, set CUDAPOOL_CONF=\"expandable_segments:True\""), std::string::npos)
      << r.output;
  RunResult quiet = run({app(true), "alloc_once"});
  EXPECT_EQ(quiet.output.find("PYTORCH_CUDA_ALLOC_CONF"), std::string::npos) << quiet.output;
}

TEST(Shim, BackendPassthroughSendsEverythingToTheDriver) {
  RunResult on = run({app(false), "alloc_once"});
  EXPECT_NE(on.output.find("active=1"), std::string::npos) << on.output;
  RunResult off = run({app(false), "alloc_once"}, {{"CUDAPOOL_CONF", "backend:passthrough"}});
  EXPECT_EQ(off.exit_status, 0) << off.output;
  EXPECT_NE(off.output.find("active=0 backend_passes=2"), std::string::npos) << off.output;  // alloc + free
  // And the pooling scenario then sees one driver allocation per pair.
  RunResult pool = run({app(false), "pooling"}, {{"CUDAPOOL_CONF", "backend:passthrough"}});
  EXPECT_NE(pool.exit_status, 0) << pool.output;
}

TEST(Shim, FreeSyncImmediateReusesWhileWorkIsPending) {
  // free_sync:fenced refuses the early reuse on the same stream (the scenario's check fails)…
  // (The default may reuse it too, under a GPU-side order once the batch's fence is recorded,
  // which happens when its window has passed: a timing the test cannot fix, so the default's
  // reuse is checked by the gpu_wait scenarios instead.)
  RunResult fenced = run({app(false), "immediate_reuse"}, {{"CUDAPOOL_CONF", "free_sync:fenced"}});
  EXPECT_NE(fenced.exit_status, 0) << fenced.output;
  // …free_sync:immediate allows it (PyTorch's semantics).
  RunResult imm = run({app(false), "immediate_reuse"}, {{"CUDAPOOL_CONF", "free_sync:immediate"}});
  EXPECT_EQ(imm.exit_status, 0) << imm.output;
}

TEST(Shim, PoolHitsMakeNoDriverCallsBeyondTheContextRead) {
  for (bool linked : {false, true}) {
    RunResult imm = run({app(linked), "hot_calls_immediate"}, {{"CUDAPOOL_CONF", "free_sync:immediate"}});
    EXPECT_EQ(imm.exit_status, 0) << imm.output;
    EXPECT_NE(imm.output.find("PASS hot_calls_immediate"), std::string::npos) << imm.output;
    RunResult fenced = run({app(linked), "hot_calls_fenced"});
    EXPECT_EQ(fenced.exit_status, 0) << fenced.output;
    EXPECT_NE(fenced.output.find("PASS hot_calls_fenced"), std::string::npos) << fenced.output;
  }
}

TEST(Shim, FreeSyncDeviceWaitsInsteadOfAllocating) {
  RunResult fenced = run({app(true), "device_sync"}, {{"CUDAPOOL_CONF", "free_sync:fenced"}});
  EXPECT_NE(fenced.exit_status, 0) << fenced.output;  // fenced: a new segment instead
  RunResult dflt = run({app(true), "device_sync"});
  EXPECT_NE(dflt.exit_status, 0) << dflt.output;  // the default reuses it, but without a host wait
  RunResult dev = run({app(true), "device_sync"}, {{"CUDAPOOL_CONF", "free_sync:device"}});
  EXPECT_EQ(dev.exit_status, 0) << dev.output;
}

// The default policy: pending memory is reused at once, every stream waits on the GPU.
TEST(Shim, GpuWaitReusesPendingMemoryAndEveryStreamWaits) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "gpu_wait_reuse"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS gpu_wait_reuse"), std::string::npos) << r.output;
  }
  // Without context-wide events (a driver before CUDA 12.5): legacy events, sweeps and joins.
  RunResult legacy = run({app(true), "gpu_wait_reuse"}, {{"FAKECUDA_NO_CONTEXT_EVENTS", "1"}});
  EXPECT_EQ(legacy.exit_status, 0) << legacy.output;
  EXPECT_NE(legacy.output.find("PASS gpu_wait_reuse"), std::string::npos) << legacy.output;
  // The same under classic segments.
  RunResult classic = run({app(true), "gpu_wait_reuse"}, {{"CUDAPOOL_CONF", "expandable_segments:False"}});
  EXPECT_EQ(classic.exit_status, 0) << classic.output;
  // Its negative controls: fenced mode never hands pending memory out early. Classic segments
  // grow instead (q != p); expandable segments wait on the host for the fence (expandable_wait).
  RunResult fenced = run({app(true), "gpu_wait_reuse"},
                         {{"CUDAPOOL_CONF", "free_sync:fenced,expandable_segments:False"}});
  EXPECT_NE(fenced.exit_status, 0) << fenced.output;
  EXPECT_NE(fenced.output.find("q == p"), std::string::npos) << fenced.output;
  RunResult fenced_x = run({app(true), "gpu_wait_reuse"}, {{"CUDAPOOL_CONF", "free_sync:fenced"}});
  EXPECT_NE(fenced_x.exit_status, 0) << fenced_x.output;
  EXPECT_NE(fenced_x.output.find("fakecuda_event_syncs() == syncs"), std::string::npos) << fenced_x.output;
}

// No non-blocking stream: reuse needs no driver call, and a stream created later still waits.
TEST(Shim, GpuWaitWithOnlyTheLegacyStreamsOrder) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "gpu_wait_legacy_only"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS gpu_wait_legacy_only"), std::string::npos) << r.output;
  }
  RunResult classic = run({app(true), "gpu_wait_legacy_only"}, {{"CUDAPOOL_CONF", "expandable_segments:False"}});
  EXPECT_EQ(classic.exit_status, 0) << classic.output;
}

// The same context, a free/allocate loop: batches are reused when their fence is recorded, with
// no cuEventQuery each; with a non-blocking stream alive they are asked again.
TEST(Shim, GpuWaitWithOnlyTheLegacyStreamsAsksNoFence) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "gpu_wait_without_queries"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS gpu_wait_without_queries"), std::string::npos) << r.output;
  }
  RunResult legacy = run({app(true), "gpu_wait_without_queries"}, {{"FAKECUDA_NO_CONTEXT_EVENTS", "1"}});
  EXPECT_EQ(legacy.exit_status, 0) << legacy.output;
  EXPECT_NE(legacy.output.find("0 context-wide"), std::string::npos) << legacy.output;
}

// Idle non-blocking streams (libraries create them by the dozen) cost no event per fence: device
// fences are context-wide, or, where the driver has no such events, the streams are asked in
// sweeps; a busy one still holds its freed memory back either way. Negative control: under
// free_sync:immediate the block comes back while the stream may still use it.
namespace {
// The figures of the app's idle-streams line: stream queries, context-wide records, events on
// one of the idle streams (-1 each: no such line).
struct IdleFigures {
  long stream_queries = -1, context_records = -1, on_stream = -1;
};
IdleFigures idle_figures(const std::string& out) {
  const std::size_t at = out.find("idle streams: ");
  IdleFigures f;
  long records = 0, allocs = 0, iters = 0, ms = 0;
  if (at == std::string::npos ||
      std::sscanf(out.c_str() + at,
                  "idle streams: %ld event records, %ld stream queries, %ld driver allocations in %ld iterations "
                  "(%ld ms); %ld context-wide records, %ld events on the first stream",
                  &records, &f.stream_queries, &allocs, &iters, &ms, &f.context_records, &f.on_stream) != 7)
    return {};
  return f;
}
}  // namespace

TEST(Shim, GpuWaitSweepsIdleNonBlockingStreams) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "gpu_wait_idle_streams"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS gpu_wait_idle_streams"), std::string::npos) << r.output;
    const IdleFigures f = idle_figures(r.output);
    EXPECT_EQ(f.stream_queries, 0) << r.output;
    EXPECT_GT(f.context_records, 100) << r.output;  // about one per batch (400 iterations)
    EXPECT_EQ(f.on_stream, 0) << r.output;          // and no sweep
  }
  // Without context-wide events: sweeps, gathered, not asked.
  RunResult swept = run({app(true), "gpu_wait_idle_streams"}, {{"FAKECUDA_NO_CONTEXT_EVENTS", "1"}});
  EXPECT_EQ(swept.exit_status, 0) << swept.output;
  EXPECT_NE(swept.output.find("PASS gpu_wait_idle_streams"), std::string::npos) << swept.output;
  const IdleFigures sf = idle_figures(swept.output);
  EXPECT_EQ(sf.stream_queries, 0) << swept.output;
  EXPECT_EQ(sf.context_records, 0) << swept.output;
  EXPECT_GT(sf.on_stream, 0) << swept.output;
  RunResult classic = run({app(true), "gpu_wait_idle_streams"}, {{"CUDAPOOL_CONF", "expandable_segments:False"}});
  EXPECT_EQ(classic.exit_status, 0) << classic.output;
  RunResult imm = run({app(true), "gpu_wait_idle_streams"}, {{"CUDAPOOL_CONF", "free_sync:immediate"}});
  EXPECT_EQ(imm.exit_status, 0) << imm.output;  // passes only if the block did come back early
  // The driver refuses the shim's gather stream (the program's 16 streams are all it allows):
  // sweeps ask each stream instead, as safely.
  RunResult asked = run({app(true), "gpu_wait_idle_streams"},
                        {{"FAKECUDA_MAX_STREAMS", "16"}, {"FAKECUDA_NO_CONTEXT_EVENTS", "1"}});
  EXPECT_EQ(asked.exit_status, 0) << asked.output;
  EXPECT_NE(asked.output.find("could not create the fence stream"), std::string::npos) << asked.output;
  EXPECT_NE(asked.output.find("PASS gpu_wait_idle_streams"), std::string::npos) << asked.output;
  EXPECT_GT(idle_figures(asked.output).stream_queries, 0) << asked.output;
}

// The fences of GPU-side waits are polled by bisection: a poll after 200 completed fences with
// the newest still running asks a handful (202 with a poll that asks each, oldest first).
TEST(Shim, OrderedFencesArePolledByBisection) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "ordered_poll_bisection"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS ordered_poll_bisection"), std::string::npos) << r.output;
  }
}

// A completed legacy-stream fence does not complete an older context-wide one (the streams it
// covers may still run).
TEST(Shim, ContextWideFencesOutliveNewerLegacyOnes) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "context_fence_kinds"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS context_fence_kinds"), std::string::npos) << r.output;
  }
}

// A capture begun while a context-wide fence is being recorded (each takes 2 ms here) is not
// invalidated: the capture waits for the call; after it, fences use per-stream events only.
TEST(Shim, ContextWideFencesNeverMeetACapture) {
  RunResult r = run({app(true), "context_fence_capture"}, {{"FAKECUDA_CALL_COST_NS", "cuCtxRecordEvent=2000000"}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_NE(r.output.find("PASS context_fence_capture"), std::string::npos) << r.output;
}

TEST(Shim, GpuWaitAcrossThreadsContextsAndResets) {
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "gpu_wait_threads_contexts"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS gpu_wait_threads_contexts"), std::string::npos) << r.output;
  }
  RunResult legacy = run({app(true), "gpu_wait_threads_contexts"}, {{"FAKECUDA_NO_CONTEXT_EVENTS", "1"}});
  EXPECT_EQ(legacy.exit_status, 0) << legacy.output;
  EXPECT_NE(legacy.output.find("PASS gpu_wait_threads_contexts"), std::string::npos) << legacy.output;
}

// Under a cap, cuMemGetInfo reports the cap as the total and what the program could still get
// under it as free (cached bytes count as free); without one, the device's own numbers.
TEST(Shim, MemGetInfoShowsTheCap) {
  auto line = [](const std::string& out, const std::string& when) {
    const auto at = out.find(when + " ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  // The fake device: 1024 MiB, nothing else on it.
  RunResult none = run({app(true), "mem_info"});
  ASSERT_EQ(none.exit_status, 0) << none.output;
  EXPECT_EQ(line(none.output, "start"), "start total_mib=1024 free_mib=1024") << none.output;
  EXPECT_EQ(line(none.output, "allocated"), "allocated total_mib=1024 free_mib=1004") << none.output;
  RunResult cap = run({app(true), "mem_info"}, {{"CUDAPOOL_CONF", "max_reserved_mb:64"}});
  ASSERT_EQ(cap.exit_status, 0) << cap.output;
  EXPECT_EQ(line(cap.output, "start"), "start total_mib=64 free_mib=64") << cap.output;
  EXPECT_EQ(line(cap.output, "allocated"), "allocated total_mib=64 free_mib=44") << cap.output;
  EXPECT_EQ(line(cap.output, "freed"), "freed total_mib=64 free_mib=64") << cap.output;
  RunResult frac = run({app(true), "mem_info"}, {{"CUDAPOOL_CONF", "per_process_memory_fraction:0.25"}});
  ASSERT_EQ(frac.exit_status, 0) << frac.output;
  EXPECT_EQ(line(frac.output, "start"), "start total_mib=256 free_mib=256") << frac.output;
  EXPECT_EQ(line(frac.output, "allocated"), "allocated total_mib=256 free_mib=236") << frac.output;
  // The device's real free memory still bounds it: a cap above what is free shows what is free.
  RunResult big = run({app(true), "mem_info"},
                      {{"CUDAPOOL_CONF", "max_reserved_mb:1000"}, {"FAKECUDA_TOTAL_MB", "512"}});
  ASSERT_EQ(big.exit_status, 0) << big.output;
  EXPECT_EQ(line(big.output, "start"), "start total_mib=512 free_mib=512") << big.output;
}

// A cap shows from the first cuMemGetInfo of a fresh context, before anything was allocated,
// by every way a program reaches the call (app.cpp's info_first lists them), whatever made the
// context: the primary context retained by the program (linked) or by cudart's table (the
// runtime's implicit context), or cuCtxCreate. The same after an allocation and after its free.
TEST(Shim, CapIsVisibleFromAContextsFirstCall) {
  char dir[] = "/tmp/cudapool-caps-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  struct Case {
    std::string conf;
    std::size_t cap_mib;
  };
  const Case cases[] = {{"max_reserved_mb:256", 256},
                        {"per_process_memory_fraction:0.25", 256},
                        {"group:caps_first,group_budget_mb:300,group_outside_growth_mb:0", 300},
                        {"max_reserved_mb:512,group:caps_first,group_budget_mb:300,group_outside_growth_mb:0", 300}};
  for (const Case& c : cases) {
    for (bool linked : {false, true}) {
      for (const char* scenario : {"info_first_primary", "info_first_ctx_create"}) {
        SCOPED_TRACE(c.conf + " " + scenario + (linked ? " (linked)" : " (cudart)"));
        RunResult r = run({app(linked), scenario},
                          {{"CUDAPOOL_CONF", c.conf}, {"FAKECUDA_PROC_EXACT_NAMES", "1"}, {"CUDAPOOL_SHM_DIR", dir}});
        ASSERT_EQ(r.exit_status, 0) << r.output;
        std::map<std::string, int> ways;
        std::istringstream in(r.output);
        for (std::string l; std::getline(in, l);) {
          if (l.rfind("info ", 0) != 0) continue;
          std::istringstream f(l.substr(5));
          std::string phase, way, total, free;
          f >> phase >> way >> total >> free;
          ++ways[phase];
          const std::size_t want_free = phase == "allocated" ? c.cap_mib - 64 : c.cap_mib;
          EXPECT_EQ(total, "total_mib=" + std::to_string(c.cap_mib)) << l;
          EXPECT_EQ(free, "free_mib=" + std::to_string(want_free)) << l;
        }
        EXPECT_EQ(ways["first"], 12) << r.output;
        EXPECT_EQ(ways["allocated"], 12) << r.output;
        EXPECT_EQ(ways["freed"], 12) << r.output;
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// Pinned host memory: pooled under pinned_cache (reuse only after the device finished, a wait
// for a fitting block past the held-memory bound, foreign pointers and unseen memory to the
// driver, double frees refused, a reset context forgotten),
// the driver's alone by default; free_host_sync makes a pooled free wait as cudaFreeHost does.
TEST(Shim, PinnedHostMemoryIsPooledOnlyWhenAskedFor) {
  for (bool linked : {false, true}) {
    SCOPED_TRACE(linked ? "linked" : "cudart");
    char dir[] = "/tmp/cudapool-pinned-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    const std::string stats = std::string(dir) + "/stats.json";
    RunResult pooled = run({app(linked), "pinned"},
                           {{"CUDAPOOL_CONF", "pinned_cache:True,stats_file:" + stats}, {"PINNED", "pool"}});
    EXPECT_EQ(pooled.exit_status, 0) << pooled.output;
    EXPECT_NE(pooled.output.find("PASS pinned"), std::string::npos) << pooled.output;
    std::string json;
    if (FILE* f = std::fopen(stats.c_str(), "r")) {
      char buf[4096];
      for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) json.append(buf, n);
      std::fclose(f);
    }
    EXPECT_NE(json.find("\"pinned_host\""), std::string::npos) << json;
    EXPECT_NE(json.find("\"cache_hits\": 2,"), std::string::npos) << json;  // the pool's, at exit
    EXPECT_NE(json.find("\"bound_waits\": 1"), std::string::npos) << json;
    EXPECT_NE(json.find("\"bad_frees\": 1,"), std::string::npos) << json;
    std::filesystem::remove_all(dir);
    RunResult synced = run({app(linked), "pinned"}, {{"CUDAPOOL_CONF", "pinned_cache:True,free_host_sync:True"},
                                                     {"PINNED", "pool"},
                                                     {"HOST_SYNC", "1"}});
    EXPECT_EQ(synced.exit_status, 0) << synced.output;
    RunResult reg = run({app(linked), "pinned"}, {{"CUDAPOOL_CONF",
                                                   "pinned_cache:True,pinned_use_cuda_host_register:True,pinned_num_"
                                                   "register_threads:4"},
                                                  {"PINNED", "pool"},
                                                  {"REGISTER", "1"}});
    EXPECT_EQ(reg.exit_status, 0) << reg.output;
    RunResult off = run({app(linked), "pinned"}, {{"PINNED", "driver"}});
    EXPECT_EQ(off.exit_status, 0) << off.output;
    // The same checks fail where the pool is off: the scenario measures the pool.
    RunResult not_pooled = run({app(linked), "pinned"}, {{"PINNED", "pool"}});
    EXPECT_NE(not_pooled.exit_status, 0) << not_pooled.output;
  }
}

// A trace of pooled pinned memory: one pinned_allocate and one pinned_free row per block, with
// the block's size and the device of its context; a replay of device memory passes over them.
TEST(Shim, PinnedHostMemoryIsTraced) {
  char dir[] = "/tmp/cudapool-pinned-trace-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string trace = std::string(dir) + "/t.csv";
  RunResult pooled = run({app(true), "pinned"},
                         {{"CUDAPOOL_CONF", "pinned_cache:True,trace_file:" + trace}, {"PINNED", "pool"}});
  EXPECT_EQ(pooled.exit_status, 0) << pooled.output;
  std::ifstream in(trace);
  std::string line;
  std::map<std::string, std::string> live;  // pointer -> size of the allocate row
  int allocs = 0, frees = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) f.push_back(c);
    if (f.size() < 8 || (f[2] != "pinned_allocate" && f[2] != "pinned_free")) continue;
    EXPECT_EQ(f[6], "0") << line;  // the device of the context the memory belongs to
    EXPECT_EQ(f[5], "0x0") << line;
    EXPECT_GE(std::stoull(f[4]), std::stoull(f[7])) << line;  // the block holds the request
    if (f[2] == "pinned_allocate") {
      ++allocs;
      EXPECT_EQ(live.count(f[3]), 0u) << line;
      live[f[3]] = f[4];
    } else {
      ++frees;
      ASSERT_EQ(live.count(f[3]), 1u) << line;  // a free row only for a traced allocation
      EXPECT_EQ(live[f[3]], f[4]) << line;
      live.erase(f[3]);
    }
  }
  EXPECT_GE(allocs, 3);
  EXPECT_EQ(allocs, frees + static_cast<int>(live.size()));
  // The scenario allocates no device memory: the replay finds none, pinned rows are not taken for it.
  RunResult replay = run({CUDAPOOL_BIN_PATH, "replay", "--quiet", trace}, {}, /*preload=*/false);
  EXPECT_NE(replay.output.find("no allocation to replay"), std::string::npos) << replay.output;
  std::filesystem::remove_all(dir);
}

TEST(Shim, GpuWaitInsertsNothingWhileACaptureIsOpen) {
  RunResult r = run({app(true), "gpu_wait_capture"});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_NE(r.output.find("PASS gpu_wait_capture"), std::string::npos) << r.output;
}

TEST(Shim, FreeHostSyncWaitsForTheDeviceInCudaFree) {
  RunResult on = run({app(true), "free_host_sync"}, {{"CUDAPOOL_CONF", "free_host_sync:True"}});
  EXPECT_EQ(on.exit_status, 0) << on.output;
  RunResult off = run({app(true), "free_host_sync"});
  EXPECT_NE(off.exit_status, 0) << off.output;  // the default does not synchronize
}

TEST(Shim, StatsAndTraceFilesAreWritten) {
  char dir[] = "/tmp/cudapool-shim-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string stats = std::string(dir) + "/stats.json", trace = std::string(dir) + "/trace.csv";
  RunResult r = run({app(false), "pooling"}, {{"CUDAPOOL_CONF", "stats_file:" + stats + ",trace_file:" + trace}});
  ASSERT_EQ(r.exit_status, 0) << r.output;
  std::string json, csv;
  if (FILE* f = std::fopen(stats.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) json.append(buf, n);
    std::fclose(f);
  }
  EXPECT_NE(json.find("\"backend\": \"native\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"allocation.all.allocated\": 1000"), std::string::npos) << json;
  // A normal exit reports its status (not -1, "unknown"); no max split is -1, as PyTorch says.
  EXPECT_NE(json.find("\"exit_status\": 0,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"max_split_size\": -1"), std::string::npos) << json;
  int rows = 0;
  std::string device_row;
  if (FILE* f = std::fopen(trace.c_str(), "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::strstr(line, ",allocate,") != nullptr) ++rows;
      if (std::strstr(line, ",device,") != nullptr) device_row = line;
    }
    std::fclose(f);
  }
  EXPECT_EQ(rows, 1000);
  // The device row carries what a replay needs: the driver's page size (the fake driver's is
  // 4 MiB) and the pool's allocation units.
  EXPECT_NE(device_row.find(",\"granularity:4194304,min_block:512,"), std::string::npos) << device_row;
  std::remove(stats.c_str());
  std::remove(trace.c_str());
  // The short form: CUDAPOOL_STATS=path.
  RunResult env = run({app(true), "pooling"}, {{"CUDAPOOL_STATS", stats}});
  ASSERT_EQ(env.exit_status, 0) << env.output;
  FILE* f = std::fopen(stats.c_str(), "r");
  EXPECT_NE(f, nullptr);
  if (f != nullptr) std::fclose(f);
  std::remove(stats.c_str());
  rmdir(dir);
}

TEST(Shim, ExitSummaryKeepsPoolsOfContextsThatWereReset) {
  // A program that resets or releases its context before exiting must still find its
  // allocations in the stats file: the summary reports retired pools too (seen on the H200 with
  // a -lcuda program that released its primary context at the end).
  char dir[] = "/tmp/cudapool-shim-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string stats = std::string(dir) + "/stats.json";
  RunResult r = run({app(true), "reset"}, {{"CUDAPOOL_STATS", stats}, {"CUDAPOOL_CONF", "expandable_segments:False"}});
  ASSERT_EQ(r.exit_status, 0) << r.output;
  std::string json;
  if (FILE* f = std::fopen(stats.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) json.append(buf, n);
    std::fclose(f);
  }
  int device0 = 0;
  for (std::size_t at = json.find("\"device\": 0"); at != std::string::npos; at = json.find("\"device\": 0", at + 1))
    ++device0;
  // The reset scenario retires device 0's pool more than once; at most one of them is live.
  EXPECT_GE(device0, 2) << json;
  std::remove(stats.c_str());
  rmdir(dir);
}

std::string shell(const std::string& cmd);

std::string read_text(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

// After fork: the stats path stays the parent's. A child that never used CUDA writes no summary;
// one that did writes its own beside it (stats.<pid>.json); the parent's is its own, written at
// its exit (the scenario checks that no child wrote the path meanwhile).
TEST(Shim, ForkedChildrenNeverWriteTheParentsSummary) {
  for (bool linked : {false, true}) {
    char dir[] = "/tmp/cudapool-shim-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    const std::string stats = std::string(dir) + "/stats.json";
    std::map<std::string, std::string> env{{"CUDAPOOL_STATS", stats}};
    if (!kSanPreload.empty()) env["CUDAPOOL_CONF"] = "publish_stats:False";
    cudapool::test::RunningChild c = cudapool::test::start_under_shim({app(linked), "fork_summary"}, env);
    const pid_t parent = c.pid;
    RunResult r = cudapool::test::finish(c);
    ASSERT_EQ(r.exit_status, 0) << r.output;
    int child = 0;
    const auto at = r.output.find("child with CUDA: pid ");
    ASSERT_NE(at, std::string::npos) << r.output;
    child = std::atoi(r.output.c_str() + at + 21);
    const std::string mine = read_text(stats);
    EXPECT_NE(mine.find("\"pid\": " + std::to_string(parent) + ","), std::string::npos) << mine;
    EXPECT_NE(mine.find("\"allocation.all.allocated\": 1,"), std::string::npos) << mine;
    const std::string child_path = std::string(dir) + "/stats." + std::to_string(child) + ".json";
    const std::string theirs = read_text(child_path);
    EXPECT_NE(theirs.find("\"pid\": " + std::to_string(child) + ","), std::string::npos) << theirs;
    EXPECT_NE(theirs.find("\"allocation.all.allocated\": 1,"), std::string::npos) << theirs;
    // Nothing else: the child without CUDA wrote nothing anywhere.
    EXPECT_EQ(shell(std::string("ls ") + dir + " | wc -l"), "2\n");
    std::remove(stats.c_str());
    std::remove(child_path.c_str());
    rmdir(dir);
  }
}

// Secure mode (CUDAPOOL_SECURE=1 stands in for a setuid program's AT_SECURE, which a test cannot
// give itself): every policy variable is ignored, the pool runs with the defaults, no file is
// created (log, trace, summary, the stats record in CUDAPOOL_SHM_DIR), the policy file is not
// even opened, and the log says once why, on stderr.
TEST(Shim, SecureModeReadsNoConfigAndWritesNoFile) {
  char dir[] = "/tmp/cudapool-shim-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d = dir;
  const std::string secret = d + "/secret.toml";
  if (FILE* f = std::fopen(secret.c_str(), "w")) {
    std::fputs("[policy]\nsecret-line-7f3a = ]\n", f);  // a parse error would quote this line
    std::fclose(f);
  }
  std::map<std::string, std::string> env{{"CUDAPOOL_SECURE", "1"},
                                         {"CUDAPOOL_CONF", "log_file:" + d + "/log.txt,trace_file:" + d +
                                                               "/t.csv,stats_file:" + d +
                                                               "/s.json,log_level:info,dump_signal:SIGUSR1"},
                                         {"CUDAPOOL_CONFIG", secret},
                                         {"CUDAPOOL_STATS", d + "/s2.json"},
                                         {"CUDAPOOL_TRACE", d + "/t2.csv"},
                                         {"CUDAPOOL_SHM_DIR", d}};
  for (bool linked : {false, true}) {
    RunResult r = run({app(linked), "pooling"}, env);
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_NE(r.output.find("PASS pooling"), std::string::npos) << r.output;  // the pool, with the defaults
    EXPECT_EQ(shell("ls -A " + d), "secret.toml\n");
    EXPECT_EQ(r.output.find("secret-line"), std::string::npos) << r.output;
    const auto why = r.output.find("secure mode");
    ASSERT_NE(why, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("secure mode", why + 1), std::string::npos) << r.output;  // once
    EXPECT_NE(r.output.find("ignored: CUDAPOOL_CONF, CUDAPOOL_CONFIG"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(d + "/log.txt"), std::string::npos) << r.output;  // names, not values
  }
  // Without secure mode the same environment is read: the broken policy file stops the program.
  env.erase("CUDAPOOL_SECURE");
  RunResult plain = run({app(false), "pooling"}, env);
  EXPECT_EQ(plain.exit_status, 78) << plain.output;
  std::remove(secret.c_str());
  shell("rm -rf " + d);
}

std::string shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// The names between "global:" and "local:" of a version script, without their ';'.
std::set<std::string> version_script_globals(const std::string& map) {
  std::set<std::string> out;
  const auto from = map.find("global:"), to = map.find("local:");
  if (from == std::string::npos || to == std::string::npos) return out;
  std::istringstream words(map.substr(from + 7, to - from - 7));
  for (std::string w; words >> w;) {
    if (w.back() == ';') w.pop_back();
    out.insert(w);
  }
  return out;
}

// The C API: every cudapool_* function shim/cudapool.h declares.
std::set<std::string> c_api_names() {
  std::istringstream words(shell("grep -o 'cudapool_[a-z_0-9]*(' " CUDAPOOL_SHIM_HEADER " | tr -d '('"));
  std::set<std::string> out;
  for (std::string w; words >> w;) out.insert(w);
  return out;
}

std::string joined(const std::set<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += " " + n;
  return s;
}

// Exactly the names of shim/entry_points.def and the functions of shim/cudapool.h, nothing else.
TEST(ShimLibrary, ExportsOnlyHooksAndTheCApi) {
  const std::vector<std::string> list = cudapool::test::hooked_names();
  const std::set<std::string> hooked(list.begin(), list.end());
  ASSERT_EQ(hooked.size(), list.size()) << "a name is listed twice in shim/entry_points.def";
  ASSERT_GE(hooked.size(), 20u);
  ASSERT_TRUE(hooked.count("dlsym"));
  const std::set<std::string> c_api = c_api_names();
  ASSERT_GE(c_api.size(), 7u);
  std::set<std::string> exported_hooks, exported_c_api;
  std::istringstream syms(shell("nm -D --defined-only " + kShim + " | awk '{print $3}'"));
  for (std::string s; std::getline(syms, s);) {
    if (s.empty()) continue;
    (s.rfind("cudapool_", 0) == 0 ? exported_c_api : exported_hooks).insert(s);
  }
  EXPECT_EQ(exported_hooks, hooked) << "exported:" << joined(exported_hooks) << "\nlisted:" << joined(hooked);
  EXPECT_EQ(exported_c_api, c_api) << "exported:" << joined(exported_c_api) << "\ndeclared:" << joined(c_api);
  // The version script the build made from the list names the list and the C API's pattern.
  std::set<std::string> expected_script = hooked;
  expected_script.insert("cudapool_*");
  EXPECT_EQ(version_script_globals(shell("cat " CUDAPOOL_SHIM_EXPORTS)), expected_script);
}

// The shim writes JSON (the summary file, the C API's answers) and never reads any: the parser
// and the summary reader are the tools' (telemetry/json_reader.h, telemetry/summary_reader.h).
TEST(ShimLibrary, CarriesNoJsonReader) {
  const std::string syms = shell("nm -C " + kShim);
  // The writer is there: nm reads the library's own symbols, so the absences below mean something.
  ASSERT_NE(syms.find("cudapool::to_json"), std::string::npos) << "no symbols from nm -C " << kShim;
  ASSERT_NE(syms.find("cudapool::json::append_string("), std::string::npos);
  for (const char* reader : {"cudapool::json::parse(", "cudapool::json::Value", "nlohmann::", "cudapool::from_json(",
                             "cudapool::read_summary_file("}) {
    EXPECT_EQ(syms.find(reader), std::string::npos) << reader << " is linked into " << kShim;
  }
}

TEST(ShimLibrary, NeedsOnlyTheCLibraries) {
  if (!kSanPreload.empty()) GTEST_SKIP() << "sanitizer build: the shim needs the sanitizer runtimes";
  std::istringstream lines(shell("readelf -d " + kShim));
  std::string line;
  int needed = 0;
  while (std::getline(lines, line)) {
    if (line.find("(NEEDED)") == std::string::npos) continue;
    const auto open = line.find('['), close = line.rfind(']');
    ASSERT_TRUE(open != std::string::npos && close > open) << line;
    const std::string name = line.substr(open + 1, close - open - 1);
    ++needed;
    // The dynamic loader itself (for thread-local storage) is in every process anyway.
    const bool ok = name == "libc.so.6" || name == "libm.so.6" || name == "libdl.so.2" || name == "libpthread.so.0" ||
                    name.rfind("ld-linux", 0) == 0;
    EXPECT_TRUE(ok) << "unexpected NEEDED " << name;
  }
  EXPECT_GE(needed, 1);
}

}  // namespace
