// CLI11 first: it comes precompiled (tools/module.mk), which only works before any other code.
#include <CLI/CLI.hpp>

#include "tools/cli_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "config/policy.h"
#include "sys/output_file.h"
#include "tools/json_text.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {
std::string g_last_error;
bool g_json_written = false;
}  // namespace

void print_error(const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fputs(buf, stderr);
  g_last_error = buf;
  while (!g_last_error.empty() && g_last_error.back() == '\n') g_last_error.pop_back();
}

void remember_error(const std::string& message) { g_last_error = message; }

bool emit_json(const std::string& path, const std::string& text, const char* who) {
  g_json_written = true;
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return true;
  }
  return write_text_file(path, text, who);
}

std::string json_flag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) return argv[i + 1];
    if (a.rfind("--json=", 0) == 0) return a.substr(7);
  }
  return "";
}

std::string error_json(const std::string& message, int exit_status) {
  return "{\n  \"error\": {\"message\": " + json_string(message) + ", \"exit_status\": " + std::to_string(exit_status) +
         "}\n}\n";
}

void finish_json(const std::string& json_path, int exit_status) {
  if (json_path.empty() || exit_status == 0 || g_json_written) return;
  const std::string message = g_last_error.empty() ? "failed (see the message above)" : g_last_error;
  if (json_path == "-") {
    std::fputs(error_json(message, exit_status).c_str(), stdout);
    return;
  }
  // The file may be what failed: then stderr has said so already.
  std::string why;
  const int fd = open_output_file(json_path, O_TRUNC, "output file", &why);
  if (fd < 0) return;
  const std::string text = error_json(message, exit_status);
  (void)write_all_fd(fd, text.data(), text.size());
  ::close(fd);
}

bool write_text_file(const std::string& path, const std::string& text, const char* who, bool shared) {
  std::string why;
  struct stat before {};
  const bool created = ::lstat(path.c_str(), &before) != 0 && errno == ENOENT;
  const int fd = open_output_file(path, O_TRUNC, "output file", &why);
  if (fd < 0) {
    print_error("%s: %s\n", who, why.c_str());
    return false;
  }
  if (shared && created) {
    // The descriptor is the regular file of this user that was opened; the umask still applies.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    (void)::fchmod(fd, static_cast<mode_t>(0644) & ~mask);
  }
  bool ok = write_all_fd(fd, text.data(), text.size());
  int e = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (!ok) print_error("%s: cannot write %s: %s\n", who, path.c_str(), std::strerror(e));
  return ok;
}

Progress::Progress(const char* who, std::size_t total, const char* unit)
    : who_(who), unit_(unit), total_(total), on_(total > 0 && ::isatty(2) == 1) {}

void Progress::step() {
  ++n_;
  if (on_) std::fprintf(stderr, "\r%s: %zu/%zu %s", who_, n_, total_, unit_);
}

void Progress::done() {
  if (on_ && n_ > 0) std::fprintf(stderr, "\r\033[K");
  on_ = false;
}

bool output_option_ok(const std::string& path, const char* flag, const char* who) {
  if (path.empty() || path == "-") return true;
  std::string e = check_output_file(path, flag, "");
  if (e.empty()) return true;
  print_error("%s: %s\n", who, e.c_str());
  return false;
}

bool device_memory_option(const std::string& text, std::optional<std::size_t>* out, const char* who) {
  if (text.empty()) return true;
  auto size = parse_size(text);
  // Usage errors, as CLI11's own: each ends with where the options are described.
  if (!size || *size == 0) {
    print_error("%s: --device-memory '%s' is not a size (e.g. 80GiB); run %s --help for the options\n", who,
                text.c_str(), who);
    return false;
  }
  // A bare number is bytes; a device of less than 1 MiB is surely a missing unit.
  const bool has_unit = text.find_first_not_of("0123456789. \t") != std::string::npos;
  if (!has_unit && *size < (std::size_t{1} << 20)) {
    print_error(
        "%s: --device-memory '%s' would be %zu bytes; write the unit, e.g. %sGiB; run %s --help for the "
        "options\n",
        who, text.c_str(), *size, text.c_str(), who);
    return false;
  }
  *out = size;
  return true;
}

void FreeReplayOptions::add_to(CLI::App* sub) {
  sub->add_option("--fence-latency-us", fence_latency_us, "simulated GPU lag behind a free, in trace time")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--free-as", free_as,
                  "replay each free as the trace records it (recorded; cudaFreeAsync where it does not say), "
                  "or every free as cudaFreeAsync (async) or cudaFree (sync)")
      ->check(CLI::IsMember({"recorded", "async", "sync"}));
}

FreeMode FreeReplayOptions::mode() const {
  return free_as == "sync" ? FreeMode::sync : free_as == "async" ? FreeMode::async : FreeMode::recorded;
}

void FreeReplayOptions::apply(ReplayConfig* rc) const {
  rc->free_mode = mode();
  rc->fence_latency_ns = static_cast<std::int64_t>(fence_latency_us * 1000.0);
}

}  // namespace cudapool::tools
