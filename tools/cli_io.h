// Small pieces the subcommands share: writing an output file, reading --device-memory (each with
// the error printed in the subcommand's name), and the replay flags of replay and tune.
#pragma once
#include <cstddef>
#include <optional>
#include <string>

#include "tools/replay.h"

namespace CLI {
class App;
}

namespace cudapool::tools {

// Errors, the same way in every command: "who: what" on stderr, and with --json the last one as
// JSON too, {"error": {"message": "who: what", "exit_status": N}}, where the command's JSON would
// have gone (stdout for '-'), so a script that asked for JSON always gets JSON.
void print_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// The same for an error someone else printed (CLI11's usage errors).
void remember_error(const std::string& message);
// The command's JSON (`--json PATH`, '-' = stdout): written, and remembered as written.
bool emit_json(const std::string& path, const std::string& text, const char* who);
// The --json of `argv` (the first `argc` words: the command's own), or "" when none is given.
std::string json_flag(int argc, char** argv);
// At the end of main: a failed command (status != 0) with --json that wrote no JSON of its own
// writes the last error as JSON.
void finish_json(const std::string& json_path, int exit_status);
// The error object alone (tests and finish_json).
std::string error_json(const std::string& message, int exit_status);

// Writes `text` to `path`, opened as sys/output_file.h says (a symbolic link there is
// refused, a new file has mode 0600); false (after printing "<who>: why") on failure. `shared`:
// a file this call creates gets mode 0644 less the umask instead (a page meant to be passed
// around); an existing file keeps its mode.
bool write_text_file(const std::string& path, const std::string& text, const char* who, bool shared = false);

// An output file given by `flag` ("--json", "-o"), checked before any work: "" and "-" (stdout)
// pass; else false, after printing "<who>: FLAG 'PATH': what is wrong; how to fix it", when it
// could not be written (its directory is missing or read-only, it is a directory).
bool output_option_ok(const std::string& path, const char* flag, const char* who);

// "what: 12/60 replays" on stderr, rewritten in place, only when stderr is a terminal (a log or
// a pipe gets nothing). total 0: no progress shown.
class Progress {
 public:
  Progress(const char* who, std::size_t total, const char* unit);
  ~Progress() { done(); }
  void step();
  void done();  // clears the line

 private:
  const char* who_;
  const char* unit_;
  std::size_t total_, n_ = 0;
  bool on_ = false;
};

// --device-memory: "" leaves *out unset; else a positive size ("80GiB"). false (after printing
// why) when it is not one.
bool device_memory_option(const std::string& text, std::optional<std::size_t>* out, const char* who);

// --free-as recorded|async|sync and --fence-latency-us X: how frees replay (replay, tune).
struct FreeReplayOptions {
  std::string free_as = "recorded";
  double fence_latency_us = 0;
  void add_to(CLI::App* sub);
  void apply(ReplayConfig* rc) const;
  FreeMode mode() const;
  const char* free_call() const {
    return free_as == "sync" ? "cudaFree" : free_as == "async" ? "cudaFreeAsync" : "recorded";
  }
};

}  // namespace cudapool::tools
