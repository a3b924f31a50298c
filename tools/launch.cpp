#include "tools/launch.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "config/policy.h"

namespace fs = std::filesystem;

namespace cudapool::tools {

namespace {

constexpr const char* kLibraryName = "libcudapool.so";

std::string self_directory() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

}  // namespace

std::optional<std::string> find_library(std::vector<std::string>* searched) {
  std::vector<fs::path> candidates;
  if (const char* forced = ::secure_getenv("CUDAPOOL_LIBRARY"); forced && *forced) {
    // An explicit choice is the only candidate: silently falling back would test the wrong file.
    candidates.push_back(forced);
  } else {
    std::string self = self_directory();
    if (!self.empty()) {
      candidates.push_back(fs::path(self) / kLibraryName);
      candidates.push_back(fs::path(self) / ".." / "lib" / kLibraryName);
    }
    candidates.push_back(fs::current_path() / "build" / "release" / kLibraryName);
  }
  for (const auto& c : candidates) {
    if (searched) searched->push_back(c.string());
    if (is_file(c)) {
      std::error_code ec;
      fs::path abs = fs::weakly_canonical(c, ec);  // LD_PRELOAD must not depend on the child's cwd
      return (ec ? c : abs).string();
    }
  }
  return std::nullopt;
}

std::string preload_value(const std::string& library, const char* existing) {
  std::string out = library;
  if (!existing) return out;
  // LD_PRELOAD separates with ':' or spaces; keep every other entry in its order.
  std::string item;
  auto flush = [&] {
    if (!item.empty() && item != library) out += ":" + item;
    item.clear();
  };
  for (const char* p = existing; *p; ++p) {
    if (*p == ':' || *p == ' ')
      flush();
    else
      item += *p;
  }
  flush();
  return out;
}

std::string launch_conf(const LaunchSettings& s) {
  std::string conf = s.conf;
  if (conf.empty())
    if (const char* env = ::secure_getenv("CUDAPOOL_CONF")) conf = env;
  // The output files are policy keys (trace_file, stats_file): the highest layer carries them.
  auto add = [&](const char* key, const std::string& value) {
    if (value.empty()) return;
    conf += (conf.empty() ? "" : ",") + std::string(key) + ":" + value;
  };
  add("trace_file", s.trace);
  add("stats_file", s.stats);
  return conf;
}

EnvChanges launch_environment(const std::string& library, const LaunchSettings& s) {
  EnvChanges env;
  env["LD_PRELOAD"] = preload_value(library, ::secure_getenv("LD_PRELOAD"));
  auto set = [&](const char* key, const std::string& value) {
    if (!value.empty()) env[key] = value;
  };
  set("CUDAPOOL_CONF", launch_conf(s));
  set("CUDAPOOL_CONFIG", s.config);
  set("CUDAPOOL_PROFILE", s.profile);
  return env;
}

PolicySources launch_policy_sources(const LaunchSettings& s) {
  PolicySources sources = sources_from_environment();
  if (!s.conf.empty()) {
    sources.conf = s.conf;
    sources.conf_name = s.conf_flag;
  }
  if (!s.config.empty()) {
    sources.config_path = s.config;
    sources.config_name = "--config";
  }
  if (!s.profile.empty()) {
    sources.profile = s.profile;
    sources.profile_name = "--profile";
  }
  if (!s.trace.empty()) {
    sources.trace_file = s.trace;
    sources.trace_name = "--trace";
  }
  if (!s.stats.empty()) {
    sources.stats_file = s.stats;
    sources.stats_name = "--stats";
  }
  return sources;
}

std::string validate_launch_policy(const LaunchSettings& s, const std::vector<std::string>& command) {
  // As the program will load it, but naming the flags where the user gave them.
  PolicySources sources = launch_policy_sources(s);
  sources.command_line.clear();
  for (const auto& a : command) sources.command_line += (sources.command_line.empty() ? "" : " ") + a;
  PolicyResult r = load_policy(sources);
  return r.policy ? std::string() : r.error;
}

}  // namespace cudapool::tools
