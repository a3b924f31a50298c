// Runs a piece of a test that a regression would block for ever (an open(2) of a FIFO that no one
// opens from the other side) in a forked child that alarm() ends: a hang then fails the test
// instead of blocking the whole suite. Nothing waits for time to pass: the parent reads the
// child's answer until the child is gone, and a child that answers at once is never timed.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <functional>
#include <string>

namespace cudapool::testing {

struct BoundedRun {
  bool finished = false;  // the piece returned (it did not block until the alarm, nor crash)
  int signal = 0;         // the signal that ended the child otherwise (SIGALRM: it blocked)
  std::string answer;     // what the piece returned

  std::string describe() const {
    if (finished) return "returned: " + answer;
    if (signal == SIGALRM) return "blocked until the alarm ended it";
    return signal != 0 ? std::string("died of signal ") + strsignal(signal) : "did not report";
  }
};

// `piece` runs in a child, which alarm(`limit_s`) ends should it block; what it returns comes
// back in BoundedRun::answer.
inline BoundedRun run_bounded(const std::function<std::string()>& piece, unsigned limit_s = 60) {
  BoundedRun r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return r;
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGALRM, SIG_DFL);
    ::alarm(limit_s);
    const std::string answer = piece();
    const char* p = answer.data();
    std::size_t left = answer.size();
    while (left > 0) {
      const ssize_t w = ::write(fds[1], p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) ::_exit(2);
      p += w;
      left -= static_cast<std::size_t>(w);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.answer.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

}  // namespace cudapool::testing
