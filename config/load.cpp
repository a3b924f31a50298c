// Layering, lowest to highest: built-in defaults < file [policy] (+ [log]) < chosen profile <
// CUDAPOOL_CONF. CUDAPOOL_ON_ERROR is read first and on its own, so the shim knows what to do with
// an invalid policy.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "config/keys.h"
#include "config/path_pattern.h"
#include "config/policy.h"
#include "config/toml_loader.h"
#include "config/values.h"
#include "sys/input_file.h"
#include "sys/output_file.h"
#include "sys/printable.h"
#include "sys/secure.h"

namespace cudapool {
namespace {

constexpr std::size_t kMaxPolicyFileBytes = 1 << 20;  // a policy is a few lines; more is a wrong path

std::string read_policy_file(const std::string& path, const std::string& name, std::string& out) {
  const std::string who = (name.rfind("--", 0) == 0 ? name + " " : name + "=") + path + ": ";
  std::string why;
  const int fd = open_input_file(path, &why);  // a FIFO or a device is refused without blocking
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return who + "no such file; create it or point " + name + " at an existing TOML file";
    if (err == EACCES) return who + "permission denied; make it readable or point " + name + " elsewhere";
    if (err == EISDIR) return who + "is a directory; " + name + " must name a TOML file";
    if (err == EINVAL) return who + why;
    return who + "cannot open: " + why;
  }
  out.clear();
  char buf[8192];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return who + "cannot read: " + std::strerror(err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > kMaxPolicyFileBytes) {
      ::close(fd);
      return who + "larger than 1 MiB; that is not a policy file";
    }
  }
  ::close(fd);
  return {};
}

std::string parse_on_error(std::string_view text, OnError& out) {
  const std::string l = config::lower(text);
  if (l.empty() || l == "stop")
    out = OnError::stop;
  else if (l == "passthrough")
    out = OnError::passthrough;
  else
    return "CUDAPOOL_ON_ERROR=" + std::string(text) +
           ": not a choice; use stop (the default: an invalid policy stops a CUDA process with exit status " +
           std::to_string(kPolicyErrorExitStatus) + ") or passthrough (run it untouched, without the pool)";
  return {};
}

// Warnings about combinations that are valid but do not do what they seem to.
void add_combination_warnings(Policy& p) {
  if (p.backend == Backend::passthrough)
    for (const auto& [key, origin] : p.origin)
      if (key != "backend" && key != "on_error" && key.rfind("log_", 0) != 0 && origin != "default") {
        config::warn_once(p.warnings, "backend:passthrough: the pool is off, so " + key + " has no effect");
      }
  // expandable_page_mb, expandable_unit_mb, ... tune the expandable ranges only: set without
  // them (a profile that dropped expandable_segments, a typo in an A/B) they silently do nothing.
  if (p.group.empty())
    for (const char* key :
         {"group_release_wait_ms", "group_budget_counts", "group_outside_mb", "group_outside_growth_mb", "group_park",
          "group_park_host_mb", "group_park_idle_ms", "group_park_wait_ms"})
      if (p.origin.count(key) != 0 && p.origin.at(key) != "default")
        config::warn_once(p.warnings, std::string(key) + " has no effect without group");
  // The parking figures without parking, and parking where nothing can move.
  if (!p.group.empty() && !p.group_park)
    for (const char* key : {"group_park_host_mb", "group_park_idle_ms", "group_park_wait_ms"})
      if (p.origin.count(key) != 0 && p.origin.at(key) != "default")
        config::warn_once(p.warnings, std::string(key) + " has no effect without group_park:on");
  if (!p.group.empty() && p.group_park && !p.pool.expandable_segments)
    config::warn_once(p.warnings,
                      "group_park:on with expandable_segments:False: memory in classic segments cannot come back at "
                      "the same address, so this process is never parked (it can still park others)");
  if (!p.pool.expandable_segments)
    for (const auto& [key, origin] : p.origin)
      if (key.rfind("expandable_", 0) == 0 && key != "expandable_segments" && origin != "default") {
        config::warn_once(p.warnings, key + " has no effect without expandable_segments:True");
      }
}

// A group needs a budget and a budget needs a group: either alone would silently do nothing.
std::string check_group(const Policy& p) {
  const bool budget = p.group_budget != 0 || p.group_budget_fraction > 0.0;
  if (!p.group.empty() && !budget)
    return "group:" + p.group + " (" + p.origin.at("group") +
           ") has no budget; add group_budget_mb:N (MiB) or group_budget_fraction:F (of the device), "
           "or remove group";
  if (p.group.empty() && budget) {
    const std::string key = p.group_budget != 0 ? "group_budget_mb" : "group_budget_fraction";
    return key + " (" + p.origin.at(key) +
           ") is set but group is not; add group:NAME (the processes "
           "that share the budget use the same name) or remove " +
           key;
  }
  return {};
}

// warm_start read from the file trace_file writes: the trace is emptied when the run starts, before
// the warm start reads it, so the recording the plan was to come from would be lost.
std::string check_warm_start(const Policy& p) {
  if (p.warm_start.empty() || p.trace_file.empty()) return {};
  struct stat a {
  }, b{};
  const bool same = p.warm_start == p.trace_file ||
                    (::stat(p.warm_start.c_str(), &a) == 0 && ::stat(p.trace_file.c_str(), &b) == 0 &&
                     a.st_dev == b.st_dev && a.st_ino == b.st_ino);
  if (!same) return {};
  auto from = [&](const char* key) {
    auto it = p.origin.find(key);
    return it != p.origin.end() ? it->second : std::string("?");
  };
  return "warm_start:" + printable(p.warm_start) + " (" + from("warm_start") + ") names the file trace_file (" +
         from("trace_file") +
         ") writes: this run would empty it before reading it. Make a plan from it once (`cudapool plan " +
         printable(p.warm_start) + " -o PLAN`) and use warm_start:PLAN, or write the trace elsewhere";
}

// Every key at its default, each origin saying so.
Policy defaults_with_origins() {
  Policy p;
  for (const config::KeySpec& k : config::keys())
    if (k.format != nullptr) p.origin[std::string(k.name)] = "default";
  return p;
}

// Secure mode: nothing from outside the program: no variable, no file (not even one to read: its
// lines could end up in an error message). The defaults, less the one that writes a file.
PolicyResult secure_defaults(const PolicySources& src) {
  PolicyResult r;
  Policy p = defaults_with_origins();
  p.origin["on_error"] = "default";
  p.publish_stats = false;
  p.origin["publish_stats"] = "secure mode";
  r.policy = std::move(p);
  r.secure = true;
  r.ignored = src.ignored;
  return r;
}

// The policy file's [policy] table and profile over `p`; "" or what is wrong.
std::string apply_policy_file(const PolicySources& src, Policy& p) {
  if (!src.config_path.empty()) {
    std::string text;
    if (std::string e = read_policy_file(src.config_path, src.config_name, text); !e.empty()) return e;
    return config::apply_toml(text, src.config_path, src.profile, src.command_line, p, src.profile_name,
                              src.config_name);
  }
  if (src.profile.empty()) return {};
  const bool flag = src.profile_name.rfind("--", 0) == 0;
  return (flag ? src.profile_name + " " : src.profile_name + "=") + src.profile + " is given but " + src.config_name +
         " is not; profiles live in a TOML file: " +
         (flag ? "add --config /path/policy.toml or drop --profile"
               : "set " + src.config_name + "=/path/policy.toml or unset " + src.profile_name);
}

// CUDAPOOL_CONF over `p`; "" or what is wrong.
std::string apply_conf_string(const PolicySources& src, Policy& p) {
  if (src.conf.empty()) return {};
  PolicyResult c = parse_conf(src.conf, p, src.conf_name);
  if (!c.policy) return std::move(c.error);
  p = std::move(*c.policy);
  return {};
}

// The two file shortcuts of the environment win over every other source, like a command-line
// flag would: `CUDAPOOL_TRACE=/tmp/t.csv ./app` must trace whatever the policy file says.
void apply_file_shortcuts(const PolicySources& src, Policy& p) {
  if (!src.trace_file.empty()) {
    p.trace_file = src.trace_file;
    p.origin["trace_file"] = src.trace_name;
  }
  if (!src.stats_file.empty()) {
    p.stats_file = src.stats_file;
    p.origin["stats_file"] = src.stats_name;
  }
}

// What the keys mean together: "" or why the policy cannot run.
std::string check_policy(const PolicySources& src, Policy& p) {
  if (std::string e = check_group(p); !e.empty()) return e;
  if (std::string e = check_warm_start(p); !e.empty()) return e;
  // Files written at exit (the summary) or all along (the trace): a path that cannot be written
  // is found now, while the message can still stop the run, not after hours of work.
  if (src.check_outputs)
    for (const auto& [key, path] :
         {std::pair<const char*, const std::string*>{"trace_file", &p.trace_file}, {"stats_file", &p.stats_file}})
      if (!path->empty())
        if (std::string e = check_output_file(*path, key, p.origin[key]); !e.empty()) return e;
  return {};
}

PolicyResult load(const PolicySources& src) {
  if (src.secure) return secure_defaults(src);
  PolicyResult r;
  if (std::string e = parse_on_error(src.on_error, r.on_error); !e.empty()) {
    r.error = std::move(e);
    return r;
  }
  Policy p = defaults_with_origins();
  p.on_error = r.on_error;
  p.origin["on_error"] = src.on_error.empty() ? "default" : "CUDAPOOL_ON_ERROR";
  std::string e = apply_policy_file(src, p);
  if (e.empty()) e = apply_conf_string(src, p);
  if (e.empty()) {
    apply_file_shortcuts(src, p);
    e = check_policy(src, p);
  }
  if (!e.empty()) {
    r.error = std::move(e);
    return r;
  }
  add_combination_warnings(p);
  r.policy = std::move(p);
  return r;
}

}  // namespace

std::string check_output_file(const std::string& pattern, const std::string& key, const std::string& origin) {
  const std::string path = expand_path_pattern(pattern);
  const std::string who = key + " '" + pattern + "'" +
                          (origin.empty() || origin == "default" ? "" : " (" + origin + ")");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode))
      return who + " is a symbolic link: refusing to write through a symbolic link; name the file itself";
    if (S_ISDIR(st.st_mode)) return who + " is a directory; name a file in it instead";
    // The writers (sys/output_file.h) refuse these too; here they are found before any work.
    if (!S_ISREG(st.st_mode)) return who + " is " + not_a_regular_file(st.st_mode);
    if (st.st_uid != ::geteuid()) return who + " is " + foreign_owner(st.st_uid);
    if (::access(path.c_str(), W_OK) != 0)
      return who + " exists and cannot be written (" + std::strerror(errno) +
             "); fix its permissions or choose another path";
  }
  // The summary is written beside its path and renamed over it, so the directory must be
  // writable even when the file already is.
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return who + ": directory '" + dir + "' does not exist; create it or choose another path";
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return who + ": cannot create a file in '" + dir + "' (" + std::strerror(errno) + "); choose a writable directory";
  return {};
}

PolicyResult load_policy(const PolicySources& sources) {
  try {
    return load(sources);
  } catch (const std::exception& e) {  // allocation failure: report, never unwind into the caller
    PolicyResult r;
    r.error = std::string("internal error while loading the policy: ") + e.what();
    return r;
  }
}

PolicySources sources_from_environment() {
  PolicySources s;
  s.secure = secure_process();
  if (s.secure) s.ignored = cudapool_variables_set();
  auto env = [&s](const char* name) {
    const char* v = s.secure ? nullptr : ::secure_getenv(name);
    return v ? std::string(v) : std::string();
  };
  s.conf = env("CUDAPOOL_CONF");
  s.config_path = env("CUDAPOOL_CONFIG");
  s.profile = env("CUDAPOOL_PROFILE");
  s.on_error = env("CUDAPOOL_ON_ERROR");
  s.trace_file = env("CUDAPOOL_TRACE");
  s.stats_file = env("CUDAPOOL_STATS");
  // argv joined by spaces; /proc/self/cmdline separates (and ends) them with NULs.
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw)
    if (c == '\0') c = ' ';
  s.command_line = std::move(raw);
  return s;
}

PolicyResult load_policy_from_environment() {
  try {
    return load_policy(sources_from_environment());
  } catch (const std::exception& e) {
    PolicyResult r;
    r.error = std::string("internal error while reading the environment: ") + e.what();
    return r;
  }
}

}  // namespace cudapool
