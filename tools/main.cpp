// `cudapool`: run a program under the pool, compare policies, replay and tune on traces, report,
// watch the pooled processes (top).
#include <CLI/CLI.hpp>
#include <cstring>
#include <exception>
#include <new>

#include "config/version.h"
#include "sys/printable.h"
#include "tools/cli_io.h"
#include "tools/commands.h"

using namespace cudapool::tools;

namespace {

// Splits "CMD…" off `run`, `ab` and `check` at the first "--" (see CommandTail); returns how many
// of the words CLI11 parses.
int split_command_tail(int argc, char** argv, CommandTail* tail) {
  if (argc > 1 &&
      (std::strcmp(argv[1], "run") == 0 || std::strcmp(argv[1], "ab") == 0 || std::strcmp(argv[1], "check") == 0)) {
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--") == 0) {
        tail->present = true;
        tail->words.assign(argv + i + 1, argv + argc);
        return i;
      }
    }
  }
  return argc;
}

// The subcommands, each storing its exit status in *exit_status.
void add_commands(CLI::App& app, const CommandTail& tail, int* exit_status) {
  const std::string version = std::string("cudapool ") + cudapool::kVersion;
  app.set_version_flag("-V,--version", version);
  app.require_subcommand(1);
  // Defaults in every command's --help; an error is one line and a pointer to --help.
  app.option_defaults()->always_capture_default();
  app.failure_message(CLI::FailureMessage::simple);
  add_run_command(app, tail, exit_status);
  add_ab_command(app, tail, exit_status);
  add_replay_command(app, exit_status);
  add_plan_command(app, exit_status);
  add_tune_command(app, exit_status);
  add_report_command(app, exit_status);
  add_check_command(app, tail, exit_status);
  add_top_command(app, exit_status);
  // `cudapool replay --version` answers as `cudapool --version` does.
  for (CLI::App* sub : app.get_subcommands({})) sub->set_version_flag("-V,--version", version);
}

// Parses the words and runs the command chosen; its exit status. With --json (`json`), a
// failure is JSON too (tools/cli_io.h): usage errors included.
int parse_and_run(CLI::App& app, int argc, char** argv, const std::string& json, const int* exit_status) {
  const std::string sub = argc > 1 ? argv[1] : "";
  const std::string who = std::string("cudapool") + (sub.empty() ? "" : " ") + sub;
  // No exception ends the program with an abort: what a command did not catch itself is one line
  // and exit 70 (what reads untrusted input reports it as such, 65, before it gets here).
  auto internal = [&](const char* what) {
    print_error("%s: internal error: %s; please report it\n", who.c_str(), cudapool::printable(what).c_str());
    finish_json(json, kExitInternal);
    return kExitInternal;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    // --help is success; every other parse error is a usage error with one status.
    if (rc != 0) {
      remember_error(who + ": " + e.what());
      finish_json(json, kExitUsage);
    }
    return rc == 0 ? 0 : kExitUsage;
  } catch (const std::bad_alloc&) {
    print_error("%s: out of memory\n", who.c_str());
    finish_json(json, kExitInternal);
    return kExitInternal;
  } catch (const std::exception& e) {
    return internal(e.what());
  } catch (...) {
    return internal("an exception of an unknown type");
  }
  finish_json(json, *exit_status);
  return *exit_status;
}

}  // namespace

int main(int argc, char** argv) {
  CommandTail tail;
  const int parsed_argc = split_command_tail(argc, argv, &tail);
  CLI::App app{"cudapool: run CUDA programs on a caching pool, compare policies, replay and tune on traces"};
  int exit_status = 0;
  add_commands(app, tail, &exit_status);
  return parse_and_run(app, parsed_argc, argv, json_flag(parsed_argc, argv), &exit_status);
}
