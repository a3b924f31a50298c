// Nothing is lost at exit: a child process traces and logs, then leaves by exit(), by a SIGTERM
// its own handler turns into exit(), or by the shim-style signal path (flush from the handler,
// then _exit). The parent checks the files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "telemetry/logging.h"
#include "telemetry/trace.h"
#include "telemetry_util.h"

// A forked child of this multithreaded test may inherit the sanitizer allocator's locks held by
// another thread (a trace writer's formatter) at the fork: LeakSanitizer's check at the child's
// exit takes them all and would wait forever. Forked children skip that check; the parent's
// check covers the same code. (Read by LeakSanitizer only; unused in other builds.)
namespace {
std::atomic<bool> g_forked_child{false};
}  // namespace
extern "C" int __lsan_is_turned_off() { return g_forked_child.load() ? 1 : 0; }

namespace cudapool {
// Where a child keeps its writer, as the shim keeps its own: alive until the process ends and
// reachable (so leak checkers do not flag the deliberate non-destruction). External linkage so
// the store is not optimised away.
extern TraceWriter* g_telemetry_test_child_writer;
TraceWriter* g_telemetry_test_child_writer = nullptr;

namespace {

// Emits events from a static destructor. Constructed at program start, before any writer
// registers its exit handler, so its destructor runs *after* that handler — like a CUDA runtime
// that frees its memory during teardown. Armed only in the child of the test below.
struct LateFreer {
  std::uint64_t first = 0, count = 0;
  ~LateFreer() {
    for (std::uint64_t i = 0; i < count; ++i)
      g_telemetry_test_child_writer->on_event(
          Event{EventKind::allocate, 0, 0x100000 + (first + i) * 512, 512, 500, 0, 0});
  }
};
LateFreer g_late_freer;

using testing::read_lines;
using testing::TempPath;

Event alloc_event(std::uint64_t i) { return Event{EventKind::allocate, 0, 0x100000 + i * 512, 512, 500, 0, 0}; }

int wait_child(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Counts the trace rows and checks that they are the events 0..n-1 in order.
std::size_t check_trace_rows(const std::string& path) {
  std::vector<TraceRow> rows;
  std::string err;
  EXPECT_TRUE(read_trace_file(path, &rows, &err)) << err;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].ptr, 0x100000 + i * 512) << "row " << i;
    if (rows[i].ptr != 0x100000 + i * 512) break;
  }
  return rows.size();
}

TEST(TelemetryExit, TraceAndLogCompleteAfterExit) {
  TempPath trace, logfile;
  constexpr int kEvents = 1000;  // fewer than one buffer: nothing is written before exit
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    g_forked_child = true;
    Policy p;
    p.log_level = "info";
    p.log_file = logfile.str();
    if (!init_logging(p).empty()) ::_exit(3);
    std::string err;
    // Never destroyed, as in the shim: only the exit handler can flush it.
    TraceWriter* w = g_telemetry_test_child_writer = TraceWriter::open(trace.str(), &err).release();
    if (w == nullptr) ::_exit(4);
    for (std::uint64_t i = 0; i < kEvents; ++i) w->on_event(alloc_event(i));
    for (int i = 0; i < 50; ++i) log().info("line {}", i);
    std::exit(0);
  }
  ASSERT_EQ(wait_child(pid), 0);
  EXPECT_EQ(check_trace_rows(trace.str()), static_cast<std::size_t>(kEvents));
  auto lines = read_lines(logfile.str());
  ASSERT_EQ(lines.size(), 50u);
  EXPECT_NE(lines.back().find("[info] line 49"), std::string::npos) << lines.back();
}

TEST(TelemetryExit, EventsAfterTheExitFlushStillReachTheFile) {
  TempPath trace;
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    g_forked_child = true;
    std::string err;
    TraceWriter* w = g_telemetry_test_child_writer = TraceWriter::open(trace.str(), &err).release();
    if (w == nullptr) ::_exit(4);
    for (std::uint64_t i = 0; i < 100; ++i) w->on_event(alloc_event(i));
    g_late_freer.first = 100;
    g_late_freer.count = 25;  // emitted during static destruction, after the exit flush
    std::exit(0);
  }
  ASSERT_EQ(wait_child(pid), 0);
  EXPECT_EQ(check_trace_rows(trace.str()), 125u);
}

std::atomic<bool> g_term{false};
void on_term(int) { g_term.store(true); }

// The program handles SIGTERM itself (sets a flag, leaves its loop, calls exit()).
TEST(TelemetryExit, TraceAndLogCompleteAfterHandledSigterm) {
  TempPath trace, logfile;
  int ready[2], count[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(count), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    g_forked_child = true;
    struct sigaction sa {};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    Policy p;
    p.log_level = "debug";
    p.log_file = logfile.str();
    if (!init_logging(p).empty()) ::_exit(3);
    std::string err;
    TraceWriter* w = g_telemetry_test_child_writer = TraceWriter::open(trace.str(), &err).release();
    if (w == nullptr) ::_exit(4);
    std::uint64_t n = 0;
    while (!g_term.load()) {
      w->on_event(alloc_event(n++));
      if (n == 20000) (void)!::write(ready[1], "r", 1);  // several buffers written by now
    }
    log().debug("stopping after {} events", n);
    (void)!::write(count[1], &n, sizeof n);
    std::exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::kill(pid, SIGTERM);
  std::uint64_t n = 0;
  ASSERT_EQ(::read(count[0], &n, sizeof n), static_cast<ssize_t>(sizeof n));
  ASSERT_EQ(wait_child(pid), 0);
  EXPECT_GE(n, 20000u);
  EXPECT_EQ(check_trace_rows(trace.str()), n);
  auto lines = read_lines(logfile.str());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("stopping after " + std::to_string(n) + " events"), std::string::npos);
  for (int fd : {ready[0], ready[1], count[0], count[1]}) ::close(fd);
}

// The shim's path: its own SIGTERM handler flushes from inside the handler and then ends the
// process without running exit handlers (as re-raising the default action would).
void shim_style_handler(int) {
  TraceWriter::flush_all_writers_from_signal();
  ::_exit(7);
}

TEST(TelemetryExit, TraceCompleteAfterSignalPathFlush) {
  TempPath trace;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    g_forked_child = true;
    std::string err;
    TraceWriter* w = g_telemetry_test_child_writer = TraceWriter::open(trace.str(), &err).release();
    if (w == nullptr) ::_exit(4);
    for (std::uint64_t i = 0; i < 777; ++i) w->on_event(alloc_event(i));
    struct sigaction sa {};
    sa.sa_handler = shim_style_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    (void)!::write(ready[1], "r", 1);
    while (true) ::pause();
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::kill(pid, SIGTERM);
  ASSERT_EQ(wait_child(pid), 7);
  EXPECT_EQ(check_trace_rows(trace.str()), 777u);
  ::close(ready[0]);
  ::close(ready[1]);
}

// A forked child must not write its copy of the parent's buffered rows into the parent's file.
TEST(TelemetryExit, ForkedChildDoesNotDuplicateParentRows) {
  TempPath trace;
  std::string err;
  auto w = TraceWriter::open(trace.str(), &err);
  ASSERT_TRUE(w) << err;
  for (std::uint64_t i = 0; i < 10; ++i) w->on_event(alloc_event(i));
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    g_forked_child = true;
    w->on_event(alloc_event(99));  // ignored: the trace belongs to the parent
    std::exit(0);                  // the exit flush must skip the disowned writer
  }
  ASSERT_EQ(wait_child(pid), 0);
  for (std::uint64_t i = 10; i < 20; ++i) w->on_event(alloc_event(i));
  w.reset();
  EXPECT_EQ(check_trace_rows(trace.str()), 20u);
}

}  // namespace
}  // namespace cudapool
