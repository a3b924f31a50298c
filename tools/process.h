// Starting child processes for `run` and `ab`: an argv, extra environment, the wall time it took.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace cudapool::tools {

// Environment changes applied on top of the current environment; an empty value unsets the key.
using EnvChanges = std::map<std::string, std::string>;

// The current environment with `changes` applied, as "KEY=value" strings.
std::vector<std::string> build_environment(const EnvChanges& changes);

// Replace this process with argv[0] (searched in PATH) under the given environment.
// Returns only on failure: the exit status a shell would use (127 not found, 126 not executable),
// after printing why to stderr.
int exec_replace(const std::vector<std::string>& argv, const std::vector<std::string>& env);

// Whether argv0 can be started as execvp would find it (a path with '/', else searched in PATH):
// "" when it can; else why not, with *status the shell's 127 (not found) or 126 (not executable).
std::string check_program(const std::string& argv0, int* status);

struct ChildResult {
  bool started = false;  // false: exec failed (exit_status is then 126/127)
  int exit_status = 0;   // the child's exit status, or 128 + signal when killed by one
  bool signaled = false;
  double wall_seconds = 0;  // from fork to reap
};

// Run argv to completion under env and report how it ended. stdout/stderr are inherited, or
// sent to /dev/null with `hide_output`.
ChildResult run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      bool hide_output = false);

}  // namespace cudapool::tools
