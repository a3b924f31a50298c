// `cudapool check [--conf S] [--config F] [--profile P] [--json F] [-- CMD ARGS…]`: validate a
// policy the way the library will see it and print the effective value and origin of every key;
// with a command, which TOML profile that command line gets.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <utility>

#include "config/keys.h"
#include "config/policy.h"
#include "telemetry/warm_plan.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/json_text.h"
#include "tools/launch.h"

namespace cudapool::tools {

namespace {

struct CheckOptions {
  LaunchSettings launch;
  std::string json;
};

std::string check_json(const Policy& p, const std::string& command, bool has_command) {
  std::string o = "{\n  \"valid\": true,\n  \"keys\": {";
  bool first = true;
  auto key = [&](std::string_view name, const std::string& value) {
    auto it = p.origin.find(std::string(name));
    o += std::string(first ? "\n" : ",\n") + "    " + json_string(name) + ": {\"value\": " + json_value(value) +
         ", \"origin\": " + json_string(it == p.origin.end() ? "default" : it->second) + "}";
    first = false;
  };
  for (const config::KeySpec& k : config::keys())
    if (k.format != nullptr) key(k.name, k.format(p));
  // CUDAPOOL_ON_ERROR is an environment variable, not a policy key: beside the keys, not among them.
  auto on_error = p.origin.find("on_error");
  o += "\n  },\n  \"on_error\": {\"variable\": \"CUDAPOOL_ON_ERROR\", \"value\": " +
       json_string(p.on_error == OnError::passthrough ? "passthrough" : "stop") +
       ", \"origin\": " + json_string(on_error == p.origin.end() ? "default" : on_error->second) + "}";
  o += ",\n  \"warnings\": [";
  for (std::size_t i = 0; i < p.warnings.size(); ++i) o += (i ? ", " : "") + json_string(p.warnings[i]);
  o += "],\n  \"command\": " + (has_command ? json_string(command) : std::string("null"));
  o += ",\n  \"profile\": " + (p.profile.empty() ? std::string("null") : json_string(p.profile));
  o += ",\n  \"profile_reason\": " + (p.profile.empty() ? std::string("null") : json_string(p.profile_reason));
  o += ",\n  \"conf\": " + json_string(to_conf_string(p)) + "\n}\n";
  return o;
}

// The plan warm_start names, read as the shim will read it when a pool starts. The shim runs on
// without a plan it cannot use; a check is where the mistake is caught, so it fails here.
bool warm_plan_valid(const Policy& p, WarmPlan* plan) {
  if (p.warm_start.empty()) return true;
  std::string why;
  if (load_warm_plan(p.warm_start, plan, &why)) return true;
  print_error(
      "cudapool check: invalid policy: warm_start: %s (the library would run the program without a warm "
      "start)\n",
      why.c_str());
  return false;
}

void print_group(const Policy& p) {
  std::string budget;
  if (p.group_budget != 0) budget = std::to_string(p.group_budget / MiB) + " MiB";
  if (p.group_budget_fraction > 0.0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%g%% of the device", p.group_budget_fraction * 100.0);
    budget = budget.empty() ? std::string(pct) : budget + " or " + pct + ", whichever is smaller";
  }
  std::printf(
      "group %s: a budget of %s on each GPU for this user's processes of the group together; "
      "an allocation over it waits up to %d ms for the others' idle cache\n",
      p.group.c_str(), budget.c_str(), p.group_release_wait_ms);
}

void print_warm_plan(const WarmPlan& plan) {
  std::string per_device;
  for (const WarmDevice& d : plan.devices)
    per_device += (per_device.empty() ? "" : ", ") + std::string("device ") + std::to_string(d.device) + " " +
                  std::to_string((plan.bytes(d.device) + MiB / 2) / MiB) + " MiB";
  std::printf("warm_start: %zu segments to preallocate (%s), from %s\n", plan.segments.size(),
              per_device.empty() ? "no device" : per_device.c_str(), plan.source.c_str());
}

// Which profile applies, and why (or why none does).
void print_profile(const Policy& p, const PolicySources& sources, const std::string& command, bool has_command) {
  if (has_command) {
    if (!p.profile.empty())
      std::printf("profile: %s (chosen by %s; command line '%s')\n", p.profile.c_str(), p.profile_reason.c_str(),
                  command.c_str());
    else if (sources.config_path.empty())
      std::printf("profile: none (no policy file: set CUDAPOOL_CONFIG or give --config)\n");
    else
      std::printf("profile: none (no match glob in %s matches '%s'; [policy] alone applies)\n",
                  sources.config_path.c_str(), command.c_str());
  } else if (!p.profile.empty()) {
    std::printf("profile: %s (chosen by %s)\n", p.profile.c_str(), p.profile_reason.c_str());
  } else if (!sources.config_path.empty()) {
    std::printf(
        "profile: none chosen; profiles picked by match globs depend on the program: preview with "
        "`cudapool check -- CMD ARGS...`\n");
  }
}

// Loads the policy as a program started with `command` would get it, and prints each key.
int run_check(const CheckOptions& o, PolicySources sources, const std::string& command, bool has_command) {
  sources.command_line = command;
  PolicyResult r = load_policy(sources);
  if (!r.policy) {
    print_error("cudapool check: invalid policy: %s\n", r.error.c_str());
    return kPolicyErrorExitStatus;
  }
  const Policy& p = *r.policy;
  for (const auto& w : p.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  WarmPlan plan;
  if (!warm_plan_valid(p, &plan)) return kPolicyErrorExitStatus;
  if (!o.json.empty()) {
    if (!emit_json(o.json, check_json(p, command, has_command), "cudapool check")) return kExitNoInput;
    if (o.json == "-") return 0;
  }
  std::printf("%s", describe(p).c_str());
  if (!p.group.empty()) print_group(p);
  if (!p.warm_start.empty()) print_warm_plan(plan);
  print_profile(p, sources, command, has_command);
  std::printf("CUDAPOOL_CONF=%s\n", to_conf_string(p).c_str());
  return 0;
}

int check_main(const CheckOptions& o, const CommandTail& tail) {
  if (!output_option_ok(o.json, "--json", "cudapool check")) return kExitNoInput;
  // The environment is the base, as it would be for a program started from this shell; the
  // command-line flags override it, and messages name the flag where one was given.
  PolicySources sources = launch_policy_sources(o.launch);
  // Profiles chosen by `match` globs are matched against the program's command line: the one
  // after "--", never this command's own.
  std::string command;
  for (const auto& w : tail.words) command += (command.empty() ? "" : " ") + w;
  return run_check(o, std::move(sources), command, tail.present);
}

}  // namespace

void add_check_command(CLI::App& root, const CommandTail& tail, int* exit_status) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* sub = root.add_subcommand("check", "validate a policy and print each key's value and origin");
  add_launch_options(sub, &o->launch, true);
  sub->add_option("--json", o->json,
                  "also write the keys, origins, warnings and profile as JSON here ('-': "
                  "print only the JSON)");
  sub->footer(
      "With -- CMD ARGS...: which [profiles.NAME] that command line gets (match globs).\n"
      "Example: cudapool check --config job.toml -- python train.py --epochs 3");
  sub->callback([o, &tail, exit_status] { *exit_status = check_main(*o, tail); });
}

}  // namespace cudapool::tools
