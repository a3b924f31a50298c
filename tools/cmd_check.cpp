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
