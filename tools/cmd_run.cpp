// `cudapool run [--conf S] [--config F] [--profile P] [--trace F] [--stats F] -- CMD …`
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "config/policy.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/launch.h"
#include "tools/process.h"

namespace cudapool::tools {

namespace {

struct RunOptions {
  LaunchSettings launch;
  std::vector<std::string> command;
};

int run_main(const RunOptions& o, const CommandTail& tail) {
  std::vector<std::string> command = tail.present ? tail.words : o.command;
  if (command.empty()) {
    print_error("cudapool run: no command given (usage: cudapool run [options] -- CMD ...)\n");
    return kExitUsage;
  }
  std::vector<std::string> searched;
  auto library = find_library(&searched);
  if (!library) {
    print_error("cudapool run: cannot find libcudapool.so; looked at:\n");
    for (const auto& s : searched) std::fprintf(stderr, "  %s\n", s.c_str());
    std::fprintf(stderr, "build it with `make` or set CUDAPOOL_LIBRARY=/path/libcudapool.so\n");
    return kExitNoInput;
  }
  for (const std::string* path : {&o.launch.trace, &o.launch.stats})
    if (path->find(',') != std::string::npos) {
      // They travel inside CUDAPOOL_CONF, where ',' separates keys.
      print_error("cudapool run: '%s': output paths cannot contain ','\n", path->c_str());
      return kExitUsage;
    }
  // Refuse an invalid policy here, where the message is easy to see, rather than inside the child.
  if (std::string err = validate_launch_policy(o.launch, command); !err.empty()) {
    print_error("cudapool run: invalid policy: %s\n", err.c_str());
    return kPolicyErrorExitStatus;
  }
  auto env = build_environment(launch_environment(*library, o.launch));
  std::fflush(nullptr);
  return exec_replace(command, env);  // returns only if exec failed
}

}  // namespace

void add_launch_options(CLI::App* sub, LaunchSettings* s, bool with_conf) {
  if (with_conf) sub->add_option("--conf", s->conf, "policy string (CUDAPOOL_CONF), PyTorch grammar");
  sub->add_option("--config", s->config, "TOML policy file (CUDAPOOL_CONFIG)");
  sub->add_option("--profile", s->profile, "profile of the TOML file (CUDAPOOL_PROFILE)");
}

void add_run_command(CLI::App& root, const CommandTail& tail, int* exit_status) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = root.add_subcommand("run", "run CMD with libcudapool.so preloaded; exits with CMD's status");
  add_launch_options(sub, &o->launch, true);
  sub->add_option("--trace", o->launch.trace, "write the event trace CSV here (policy key trace_file)");
  sub->add_option("--stats", o->launch.stats, "write the JSON summary here at exit (policy key stats_file)");
  sub->add_option("command", o->command, "the program and its arguments (after --)");
  sub->footer("Example: cudapool run --conf max_split_size_mb:128 -- ./app --iters 10");
  sub->callback([o, &tail, exit_status] { *exit_status = run_main(*o, tail); });
}

}  // namespace cudapool::tools
