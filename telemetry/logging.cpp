// spdlog setup. The logger objects are never destroyed: hooks may log during static destruction
// and after our own exit handler ran, and spdlog's registry is not used (the host program may
// have its own spdlog with its own registry).
#include "telemetry/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <pthread.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include <spdlog/sinks/base_sink.h>

#include "sys/output_file.h"
#include "sys/timed_lock.h"

namespace cudapool {
namespace {

// "[cudapool 12345] [warn] message": pid first because the log often interleaves with the
// program's own stderr and with other processes of a multi-process job.
constexpr const char* kPattern = "[cudapool %P %Y-%m-%d %H:%M:%S.%e] [%l] %v";

std::atomic<spdlog::logger*> g_logger{nullptr};
// Guards g_retired and the swap of g_logger. Timed, like the sinks' locks: fork() hands it over
// (see the fork handlers below).
std::timed_mutex g_init_mutex;
std::once_flag g_atexit_once;
// Loggers replaced by init_logging; never destroyed (heap vector: no exit-time destructor).
std::vector<spdlog::logger*>& g_retired = *new std::vector<spdlog::logger*>();

// Every message is written with one write(2) to a descriptor: stderr (fd 2, not owned) or the
// log file, opened by open_output_file (no link followed, O_APPEND, mode 0600 when new). Nothing
// is buffered, so flush has nothing to do. spdlog's own sinks cannot be used: the file sink opens
// its own FILE* by name (no O_NOFOLLOW), and the console sinks share a lock of spdlog's that
// cannot be handed over at fork().
class FdSink final : public spdlog::sinks::base_sink<std::timed_mutex> {
 public:
  FdSink(int fd, bool owned) : fd_(fd), owned_(owned) {}
  ~FdSink() override {
    if (owned_) ::close(fd_);
  }
  FdSink(const FdSink&) = delete;
  FdSink& operator=(const FdSink&) = delete;

  std::timed_mutex& lock_for_fork() { return mutex_; }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    (void)write_all_fd(fd_, formatted.data(), formatted.size());  // nowhere to report a failed log write
  }
  void flush_() override {}

 private:
  int fd_;
  bool owned_;
};

// fork(): a child starts with one thread, and any lock another thread of the parent held at that
// moment stays locked in the child for ever (a child that logs, or flushes the log at exit, would
// hang). So the forking thread takes every logging lock before the fork and lets go of it on both
// sides afterwards (pthread_atfork), which waits at most for the message being written. A lock
// not obtained within the bound (its holder is blocked writing to a full pipe, or fork() was
// called from a signal handler that interrupted a log call) is replaced by a fresh one in the
// child instead: the holder does not exist there, and what the lock guards is only a formatter's
// cached timestamp.
constexpr auto kForkLockWait = std::chrono::milliseconds(200);
// The sinks of every logger created (current and retired): a logger is never destroyed, nor is
// its sink. Fixed slots of atomics, so the fork handlers neither allocate nor lock to walk them.
constexpr std::size_t kMaxSinks = 32;
std::array<std::atomic<FdSink*>, kMaxSinks> g_sinks{};
std::array<bool, kMaxSinks> g_sink_held{};  // written and read by the forking thread only
bool g_init_held = false;

void register_sink(FdSink* sink) {
  for (auto& slot : g_sinks) {
    FdSink* expected = nullptr;
    if (slot.compare_exchange_strong(expected, sink, std::memory_order_acq_rel)) return;
  }
  // More than kMaxSinks loggers (init_logging called that often): this one's lock is not handed
  // over at fork.
}

void before_fork() {
  g_init_held = lock_within(g_init_mutex, kForkLockWait);
  for (std::size_t i = 0; i < kMaxSinks; ++i) {
    FdSink* s = g_sinks[i].load(std::memory_order_acquire);
    g_sink_held[i] = s != nullptr && lock_within(s->lock_for_fork(), kForkLockWait);
  }
}

void after_fork_in_parent() {
  for (std::size_t i = 0; i < kMaxSinks; ++i)
    if (g_sink_held[i]) g_sinks[i].load(std::memory_order_relaxed)->lock_for_fork().unlock();
  if (g_init_held) g_init_mutex.unlock();
}

void after_fork_in_child() {
  for (std::size_t i = 0; i < kMaxSinks; ++i) {
    FdSink* s = g_sinks[i].load(std::memory_order_relaxed);
    if (s == nullptr) continue;
    if (g_sink_held[i])
      s->lock_for_fork().unlock();
    else
      new (&s->lock_for_fork()) std::timed_mutex;  // its holder is not in this process
  }
  if (g_init_held)
    g_init_mutex.unlock();
  else
    new (&g_init_mutex) std::timed_mutex;
}

void install_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); });
}

spdlog::logger* make_logger(int fd, bool owned, spdlog::level::level_enum level) {
  install_fork_handlers();
  auto sink = std::make_shared<FdSink>(fd, owned);
  register_sink(sink.get());
  auto* l = new spdlog::logger("cudapool", std::move(sink));
  l->set_pattern(kPattern);
  l->set_level(level);
  l->flush_on(spdlog::level::warn);
  return l;
}

spdlog::logger* make_stderr_logger(spdlog::level::level_enum level) { return make_logger(2, false, level); }

spdlog::logger* current() {
  spdlog::logger* l = g_logger.load(std::memory_order_acquire);
  if (l != nullptr) return l;
  std::lock_guard<std::timed_mutex> lock(g_init_mutex);
  l = g_logger.load(std::memory_order_relaxed);
  if (l == nullptr) {
    l = make_stderr_logger(spdlog::level::warn);
    g_logger.store(l, std::memory_order_release);
  }
  return l;
}

bool parse_level(std::string_view name, spdlog::level::level_enum* out) {
  // spdlog::level::from_str maps unknown names to "off"; we want to reject them instead.
  static const std::pair<std::string_view, spdlog::level::level_enum> table[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},       {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn},      {"error", spdlog::level::err},
      {"err", spdlog::level::err},     {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  for (const auto& [n, l] : table) {
    if (n == name) {
      *out = l;
      return true;
    }
  }
  return false;
}

void flush_at_exit() { flush_logs(); }

}  // namespace

std::string init_logging(const Policy& policy) {
  std::call_once(g_atexit_once, [] { std::atexit(flush_at_exit); });
  spdlog::level::level_enum level;
  if (!parse_level(policy.log_level, &level)) {
    return "unknown log level '" + policy.log_level + "' (use trace, debug, info, warn, error, critical or off)";
  }
  spdlog::logger* fresh = nullptr;
  if (policy.log_file.empty()) {
    fresh = make_stderr_logger(level);
  } else {
    const std::string path = expand_path_pattern(policy.log_file);
    std::string why;
    const int fd = open_output_file(path, O_APPEND, "log file", &why);
    if (fd < 0) return why;
    fresh = make_logger(fd, /*owned=*/true, level);
  }
  std::lock_guard<std::timed_mutex> lock(g_init_mutex);
  spdlog::logger* old = g_logger.exchange(fresh, std::memory_order_acq_rel);
  if (old != nullptr) {
    old->flush();
    // Kept alive on purpose (another thread may still be logging through it) and reachable,
    // so leak checkers see a deliberate keep, not a leak. Re-initialisation is rare.
    g_retired.push_back(old);
  }
  return "";
}

spdlog::logger& log() { return *current(); }

bool set_log_level(std::string_view level) {
  spdlog::level::level_enum l;
  if (!parse_level(level, &l)) return false;
  current()->set_level(l);
  return true;
}

std::string log_level_name() {
  auto sv = spdlog::level::to_string_view(current()->level());
  return std::string(sv.data(), sv.size());
}

void flush_logs() noexcept {
  try {
    if (spdlog::logger* l = g_logger.load(std::memory_order_acquire)) l->flush();
  } catch (...) {
    // Flushing at exit must never throw out of an atexit handler.
  }
}

}  // namespace cudapool
