#include "tools/process.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace cudapool::tools {

std::vector<std::string> build_environment(const EnvChanges& changes) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    std::string key = entry.substr(0, eq);
    if (changes.count(key)) continue;  // replaced (or removed) below
    env.push_back(std::move(entry));
  }
  for (const auto& [key, value] : changes)
    if (!value.empty()) env.push_back(key + "=" + value);
  return env;
}

namespace {

std::vector<char*> c_array(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// The shell's convention: 127 = command not found, 126 = found but not executable.
int exec_failure_status(int err) { return err == ENOENT ? 127 : 126; }

}  // namespace

int exec_replace(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  if (argv.empty()) {
    std::fprintf(stderr, "cudapool: no command given\n");
    return 2;
  }
  auto args = c_array(argv);
  auto envp = c_array(env);
  execvpe(args[0], args.data(), envp.data());
  int err = errno;
  std::fprintf(stderr, "cudapool: cannot run '%s': %s\n", argv[0].c_str(), std::strerror(err));
  return exec_failure_status(err);
}

ChildResult run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env, bool hide_output) {
  ChildResult result;
  if (argv.empty()) return result;
  // Prepare everything before fork: only async-signal-safe calls are allowed in the child.
  auto args = c_array(argv);
  auto envp = c_array(env);
  int pipefd[2];  // close-on-exec: the parent reads errno from it only if exec failed
  if (pipe2(pipefd, O_CLOEXEC) != 0) return result;
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return result;
  }
  if (pid == 0) {
    close(pipefd[0]);
    if (hide_output) {
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0) {
        dup2(null, 1);
        dup2(null, 2);
        close(null);
      }
    }
    execvpe(args[0], args.data(), envp.data());
    int err = errno;
    ssize_t ignored = write(pipefd[1], &err, sizeof err);
    (void)ignored;
    _exit(127);
  }
  close(pipefd[1]);
  int exec_errno = 0;
  ssize_t got;
  do got = read(pipefd[0], &exec_errno, sizeof exec_errno);
  while (got < 0 && errno == EINTR);
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    std::fprintf(stderr, "cudapool: cannot run '%s': %s\n", argv[0].c_str(), std::strerror(exec_errno));
    result.exit_status = exec_failure_status(exec_errno);
    return result;
  }
  result.started = true;
  if (WIFSIGNALED(status)) {
    result.signaled = true;
    result.exit_status = 128 + WTERMSIG(status);
  } else {
    result.exit_status = WEXITSTATUS(status);
  }
  return result;
}

std::string check_program(const std::string& argv0, int* status) {
  auto usable = [](const std::string& path, std::string* why) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      *why = "no such file";
      return 127;
    }
    if (S_ISDIR(st.st_mode)) {
      *why = "is a directory";
      return 126;
    }
    if (::access(path.c_str(), X_OK) != 0) {
      *why = "not executable";
      return 126;
    }
    return 0;
  };
  std::string why;
  if (argv0.empty()) {
    *status = 127;
    return "an empty command";
  }
  if (argv0.find('/') != std::string::npos) {
    *status = usable(argv0, &why);
    return *status == 0 ? "" : "'" + argv0 + "': " + why;
  }
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  int best = 127;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    const int st = usable(dir + "/" + argv0, &why);
    if (st == 0) {
      *status = 0;
      return "";
    }
    if (st == 126) best = 126;
    start = end + 1;
  }
  *status = best;
  return "'" + argv0 + "': " + (best == 127 ? "not found in PATH" : "found in PATH but not executable");
}

}  // namespace cudapool::tools
