// spdlog setup. The logger objects are never destroyed: hooks may log during static destruction
// and after our own exit handler ran, and spdlog's registry is not used (the host program may
// have its own spdlog with its own registry).
#include "telemetry/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "config/output_file.h"

namespace cudapool {
namespace {

// "[cudapool 12345] [warn] message": pid first because the log often interleaves with the
// program's own stderr and with other processes of a multi-process job.
constexpr const char* kPattern = "[cudapool %P %Y-%m-%d %H:%M:%S.%e] [%l] %v";

std::atomic<spdlog::logger*> g_logger{nullptr};
std::mutex g_init_mutex;
std::once_flag g_atexit_once;
// Loggers replaced by init_logging; never destroyed (heap vector: no exit-time destructor).
std::vector<spdlog::logger*>& g_retired = *new std::vector<spdlog::logger*>();

// The log file: a descriptor opened by open_output_file (no link followed, O_APPEND, mode 0600
// when new), one write(2) per message, so nothing is buffered and flush has nothing to do.
// spdlog's basic_file_sink opens its own FILE* by name and cannot be told any of that.
class FdFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FdFileSink(int fd) : fd_(fd) {}
  ~FdFileSink() override { ::close(fd_); }
  FdFileSink(const FdFileSink&) = delete;
  FdFileSink& operator=(const FdFileSink&) = delete;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    (void)write_all_fd(fd_, formatted.data(), formatted.size());  // nowhere to report a failed log write
  }
  void flush_() override {}

 private:
  int fd_;
};

spdlog::logger* make_stderr_logger(spdlog::level::level_enum level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto* l = new spdlog::logger("cudapool", std::move(sink));
  l->set_pattern(kPattern);
  l->set_level(level);
  l->flush_on(spdlog::level::warn);
  return l;
}

spdlog::logger* current() {
  spdlog::logger* l = g_logger.load(std::memory_order_acquire);
  if (l != nullptr) return l;
  std::lock_guard<std::mutex> lock(g_init_mutex);
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
    auto sink = std::make_shared<FdFileSink>(fd);
    fresh = new spdlog::logger("cudapool", std::move(sink));
    fresh->set_pattern(kPattern);
    fresh->set_level(level);
    fresh->flush_on(spdlog::level::warn);
  }
  std::lock_guard<std::mutex> lock(g_init_mutex);
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
