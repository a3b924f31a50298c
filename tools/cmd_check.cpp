// `cudapool check [--conf S] [--config F] [--profile P]`: validate a policy the way the library
// will see it and print the effective value and origin of every key.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "config/policy.h"
#include "tools/commands.h"
#include "tools/launch.h"

namespace cudapool::tools {

namespace {

int check_main(const LaunchSettings& s) {
  // The environment is the base, as it would be for a program started from this shell; the
  // command-line flags override it.
  PolicySources sources = sources_from_environment();
  if (!s.conf.empty()) sources.conf = s.conf;
  if (!s.config.empty()) sources.config_path = s.config;
  if (!s.profile.empty()) sources.profile = s.profile;
  PolicyResult r = load_policy(sources);
  if (!r.policy) {
    std::fprintf(stderr, "cudapool check: invalid policy: %s\n", r.error.c_str());
    return kPolicyErrorExitStatus;
  }
  std::printf("%s", describe(*r.policy).c_str());
  if (const Policy& p = *r.policy; !p.group.empty()) {
    std::string budget;
    if (p.group_budget != 0) budget = std::to_string(p.group_budget / MiB) + " MiB";
    if (p.group_budget_fraction > 0.0) {
      char pct[32];
      std::snprintf(pct, sizeof pct, "%g%% of the device", p.group_budget_fraction * 100.0);
      budget = budget.empty() ? std::string(pct) : budget + " or " + pct + ", whichever is smaller";
    }
    std::printf("group %s: a budget of %s on each GPU for this user's processes of the group together; "
                "an allocation over it waits up to %d ms for the others' idle cache\n",
                p.group.c_str(), budget.c_str(), p.group_release_wait_ms);
  }
  for (const auto& w : r.policy->warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  std::printf("CUDAPOOL_CONF=%s\n", to_conf_string(*r.policy).c_str());
  return 0;
}

}  // namespace

void add_check_command(CLI::App& root, int* exit_status) {
  auto s = std::make_shared<LaunchSettings>();
  CLI::App* sub = root.add_subcommand("check", "validate a policy and print each key's value and origin");
  add_launch_options(sub, s.get(), true);
  sub->callback([s, exit_status] { *exit_status = check_main(*s); });
}

}  // namespace cudapool::tools
