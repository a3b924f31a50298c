// Runs a program under the shim, the way every interposition test does: the caller's
// environment with the policy variables removed, the shim (and, in sanitizer builds, the
// sanitizer runtimes in front of it) in LD_PRELOAD, the fake libcuda.so.1 on the library path,
// stdout and stderr captured together, killed after 30 s so a hang fails instead of blocking.
// Needs CUDAPOOL_SHIM_SO, CUDAPOOL_FAKECUDA_DIR and CUDAPOOL_SAN_PRELOAD (tests/mk/shim.mk).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

extern char** environ;

namespace cudapool::test {

struct ChildResult {
  int exit_status = -1;  // -1: killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr together
};

// A child started by start_under_shim: its pid and the read end of its output.
struct RunningChild {
  pid_t pid = -1;
  int fd = -1;
  std::string output;  // read so far
};

// `env` is applied last; an empty value unsets the variable.
// The child is killed after `alarm_s` seconds (SIGALRM): a hung child fails its test instead of
// holding the suite; a scenario whose work grows with the machine's slowness passes more.
inline RunningChild start_under_shim(std::vector<std::string> argv, const std::map<std::string, std::string>& env = {},
                                     bool preload = true, unsigned alarm_s = 30) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  // A clean policy and fake-driver environment unless the test sets one.
  for (const char* v :
       {"CUDAPOOL_CONF", "CUDAPOOL_CONFIG", "CUDAPOOL_PROFILE", "CUDAPOOL_ON_ERROR", "CUDAPOOL_STATS", "CUDAPOOL_TRACE",
        "CUDAPOOL_LOG_LEVEL", "PYTORCH_CUDA_ALLOC_CONF", "FAKECUDA_TOTAL_MB", "FAKECUDA_VMM_GRANULARITY_KB"})
    vars.erase(v);
  const std::string shim = CUDAPOOL_SHIM_SO, san = CUDAPOOL_SAN_PRELOAD;
  if (preload) {
    vars["LD_PRELOAD"] = san.empty() ? shim : san + " " + shim;
    if (!san.empty()) {
      // The shim leaks its pools on purpose (no teardown at exit); any report fails the run.
      vars["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1";
      vars["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1";
      // A pooled process starts its stats thread with its first pool, also in the child of a
      // fork whose parent had threads: allowed by glibc, refused by ThreadSanitizer by default.
      if (vars.count("TSAN_OPTIONS") == 0) vars["TSAN_OPTIONS"] = "die_after_fork=0";
    }
  }
  vars["LD_LIBRARY_PATH"] = CUDAPOOL_FAKECUDA_DIR;
  for (const auto& [k, v] : env) {
    if (v.empty())
      vars.erase(k);
    else
      vars[k] = v;
  }
  std::vector<std::string> envs;
  for (const auto& [k, v] : vars) envs.push_back(k + "=" + v);
  std::vector<char*> cenv, cargv;
  for (auto& s : envs) cenv.push_back(s.data());
  cenv.push_back(nullptr);
  for (auto& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);

  int fds[2];
  if (pipe(fds) != 0) return {};
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    alarm(alarm_s);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(fds[1]);
  return RunningChild{pid, fds[0], {}};
}

// Reads the child's output until it ends, then reaps the child.
inline ChildResult finish(RunningChild& c) {
  ChildResult r;
  char buf[4096];
  ssize_t n;
  while ((n = read(c.fd, buf, sizeof buf)) > 0) c.output.append(buf, static_cast<std::size_t>(n));
  close(c.fd);
  r.output = c.output;
  int status = 0;
  waitpid(c.pid, &status, 0);
  if (WIFEXITED(status)) r.exit_status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

inline ChildResult run_under_shim(std::vector<std::string> argv, const std::map<std::string, std::string>& env = {},
                                  bool preload = true) {
  RunningChild c = start_under_shim(std::move(argv), env, preload);
  if (c.pid < 0) return {};
  return finish(c);
}

}  // namespace cudapool::test
