// The dump signal: handler → pipe → reader thread → log. See signal_dump.h.
#include "shim/signal_dump.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "shim/log.h"
#include "telemetry/logging.h"
#include "telemetry/summary.h"
#include "telemetry/trace.h"

namespace cudapool::shim {
namespace {

// Written once before the handler is installed, read by the handler: plain globals are fine.
int g_write_fd = -1;
int g_read_fd = -1;
int g_signo = 0;
struct sigaction g_previous {};
TraceWriter* g_trace = nullptr;
DumpTextFn g_text = nullptr;
std::atomic<bool> g_started{false};

// Async-signal-safe: write(2) and reading globals only. A full pipe means a dump is already
// pending, so a dropped byte loses nothing.
void on_signal(int sig, siginfo_t* info, void* uctx) {
  const int saved = errno;
  const char byte = 'd';
  [[maybe_unused]] ssize_t n = write(g_write_fd, &byte, 1);
  errno = saved;
  // The program's own handler still runs (its default action, which would end the process, does not:
  // naming the signal in the policy is asking for the dump instead).
  if ((g_previous.sa_flags & SA_SIGINFO) != 0) {
    if (g_previous.sa_sigaction != nullptr) g_previous.sa_sigaction(sig, info, uctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
  }
}

const char* state_letter(BlockState s) {
  switch (s) {
    case BlockState::active_allocated: return "A";
    case BlockState::active_pending_free: return "P";
    case BlockState::inactive: return "F";
  }
  return "F";
}

void dump_now() {
  std::string text;
  try {
    text = g_text(g_signo);
  } catch (...) {
    return;  // out of host memory: no dump this time
  }
  if (text.empty()) return;
  // The trace first: once the dump's text is readable in the log, the trace rows written before
  // the signal are in their file too, so a reader who waits for the one can read the other.
  if (g_trace != nullptr) g_trace->flush();
  // Visible at the configured level: at least info, raised to the logger's level (warn by
  // default) so a user who asked for the dump sees it without changing log_level.
  auto& lg = log();
  const auto level = std::clamp(lg.level(), spdlog::level::info, spdlog::level::critical);
  lg.log(level, "{}", text);
  flush_logs();
}

void* reader(void*) {
  char buf[64];
  for (;;) {
    const ssize_t n = read(g_read_fd, buf, sizeof buf);
    if (n > 0)
      dump_now();  // several signals while busy: one dump
    else if (n < 0 && errno == EINTR)
      continue;
    else
      return nullptr;  // pipe closed: stop
  }
}

}  // namespace

std::string format_dump(int signo, const Summary& s, const std::vector<DeviceSnapshot>& snapshots) {
  std::string snap;
  for (const DeviceSnapshot& ds : snapshots) {
    const Snapshot& sn = ds.snapshot;
    std::size_t reserved = 0, allocated = 0, blocks = 0;
    for (const SegmentInfo& seg : sn.segments) {
      reserved += seg.total_size;
      allocated += seg.allocated_size;
      blocks += seg.blocks.size();
    }
    fmt::format_to(std::back_inserter(snap), "snapshot device {}: segments={} blocks={} reserved={} allocated={}\n",
                   ds.device, sn.segments.size(), blocks, reserved, allocated);
    // One line per segment; blocks as size+state (A allocated, P pending free, F free).
    for (const SegmentInfo& seg : sn.segments) {
      fmt::format_to(std::back_inserter(snap), "  segment {:#x} size={} allocated={} {}{} stream={:#x}:", seg.address,
                     seg.total_size, seg.allocated_size, seg.is_small ? "small" : "large",
                     seg.is_expandable ? " expandable" : "", seg.stream);
      for (const BlockInfo& b : seg.blocks)
        fmt::format_to(std::back_inserter(snap), " {}{}", b.size, state_letter(b.state));
      snap += '\n';
    }
  }
  std::string out = fmt::format("dump on signal {} (the program keeps running)\n", signo);
  out += format_summary_table(s);
  if (!out.empty() && out.back() != '\n') out += '\n';
  out += snap.empty() ? "snapshot: no pool yet\n" : snap;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool start_signal_dump(int signo, TraceWriter* trace, DumpTextFn text) noexcept {
  if (signo <= 0 || text == nullptr || g_started.exchange(true)) return false;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    log_warn("dump_signal {}: no pipe ({}); the signal keeps its previous action", signo, std::strerror(errno));
    return false;
  }
  // Non-blocking write end: the handler must never block.
  fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK);
  g_read_fd = fds[0];
  g_write_fd = fds[1];
  g_signo = signo;
  g_trace = trace;
  g_text = text;

  // The reader runs with every signal blocked, so the dump signal lands on a program thread and
  // the reader is never interrupted mid-dump by signals the program expects to handle itself.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t tid;
  const int rc = pthread_create(&tid, nullptr, &reader, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    log_warn("dump_signal {}: no reader thread ({}); the signal keeps its previous action", signo, std::strerror(rc));
    return false;
  }
  pthread_setname_np(tid, "cudapool-dump");
  pthread_detach(tid);

  struct sigaction sa {};
  sa.sa_sigaction = &on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(signo, &sa, &g_previous) != 0) {
    log_warn("dump_signal {}: sigaction failed ({})", signo, std::strerror(errno));
    return false;
  }
  log_info("dump_signal: signal {} dumps the pool's stats and snapshot to the log", signo);
  return true;
}

}  // namespace cudapool::shim
