// The subcommands of `cudapool`. Each add_* declares its options on `root` and arranges for its
// body to run when chosen; the body's exit status is stored in *exit_status.
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cudapool::tools {

struct LaunchSettings;
// --config and --profile (and --conf when with_conf) bound to *settings; shared by run, ab, check.
void add_launch_options(CLI::App* sub, LaunchSettings* settings, bool with_conf);

// The words after the first "--" of `run`, `ab` and `check`, split off before CLI11 parses the rest so that
// the child's own options ("-n", "--conf") never reach our parser.
struct CommandTail {
  std::vector<std::string> words;
  bool present = false;  // a "--" was given
};

void add_run_command(CLI::App& root, const CommandTail& tail, int* exit_status);
void add_ab_command(CLI::App& root, const CommandTail& tail, int* exit_status);
void add_replay_command(CLI::App& root, int* exit_status);
void add_plan_command(CLI::App& root, int* exit_status);
void add_tune_command(CLI::App& root, int* exit_status);
void add_report_command(CLI::App& root, int* exit_status);
void add_check_command(CLI::App& root, const CommandTail& tail, int* exit_status);
void add_top_command(CLI::App& root, int* exit_status);

// Exit statuses shared by the subcommands (the child's own status passes through `run`).
inline constexpr int kExitUsage = 2;       // bad arguments (CLI11 uses 105-109 internally; we map)
inline constexpr int kExitBadInput = 65;   // EX_DATAERR: a trace or summary file is malformed
inline constexpr int kExitNoInput = 66;    // EX_NOINPUT: a file cannot be opened
inline constexpr int kExitFailedRuns = 1;  // ab: at least one run failed
inline constexpr int kExitInternal = 70;   // EX_SOFTWARE: a failure of cudapool itself (main's last catch)

}  // namespace cudapool::tools
