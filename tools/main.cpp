// `cudapool`: run a program under the pool, compare policies, replay and tune on traces, report,
// watch the pooled processes (top).
#include <CLI/CLI.hpp>
#include <cstring>
#include <exception>
#include <new>

#include "config/printable.h"
#include "config/version.h"
#include "tools/cli_io.h"
#include "tools/commands.h"

using namespace cudapool::tools;

int main(int argc, char** argv) {
  // Split "CMD…" off `run`, `ab` and `check` at the first "--" (see CommandTail).
  CommandTail tail;
  int parsed_argc = argc;
  if (argc > 1 &&
      (std::strcmp(argv[1], "run") == 0 || std::strcmp(argv[1], "ab") == 0 || std::strcmp(argv[1], "check") == 0)) {
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--") == 0) {
        tail.present = true;
        tail.words.assign(argv + i + 1, argv + argc);
        parsed_argc = i;
        break;
      }
    }
  }

  CLI::App app{"cudapool: run CUDA programs on a caching pool, compare policies, replay and tune on traces"};
  const std::string version = std::string("cudapool ") + cudapool::kVersion;
  app.set_version_flag("-V,--version", version);
  app.require_subcommand(1);
  // Defaults in every command's --help; an error is one line and a pointer to --help.
  app.option_defaults()->always_capture_default();
  app.failure_message(CLI::FailureMessage::simple);
  int exit_status = 0;
  add_run_command(app, tail, &exit_status);
  add_ab_command(app, tail, &exit_status);
  add_replay_command(app, &exit_status);
  add_plan_command(app, &exit_status);
  add_tune_command(app, &exit_status);
  add_report_command(app, &exit_status);
  add_check_command(app, tail, &exit_status);
  add_top_command(app, &exit_status);
  // `cudapool replay --version` answers as `cudapool --version` does.
  for (CLI::App* sub : app.get_subcommands({})) sub->set_version_flag("-V,--version", version);
  // With --json, a failure is JSON too (tools/cli_io.h): usage errors included.
  const std::string json = json_flag(parsed_argc, argv);
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
    app.parse(parsed_argc, argv);
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
  finish_json(json, exit_status);
  return exit_status;
}
