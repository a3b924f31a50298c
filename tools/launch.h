// What `run` and `ab` need to start a program under the library: where libcudapool.so is and the
// environment that selects the policy and the output files.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "config/policy.h"
#include "tools/process.h"

namespace cudapool::tools {

// The policy-and-output settings a launched program receives as CUDAPOOL_* variables.
// Empty fields leave the variable as the caller's environment has it.
struct LaunchSettings {
  std::string conf;                  // CUDAPOOL_CONF (empty: the caller's CUDAPOOL_CONF)
  std::string config;                // CUDAPOOL_CONFIG
  std::string profile;               // CUDAPOOL_PROFILE
  std::string trace;                 // appended to the conf as trace_file:PATH
  std::string stats;                 // appended to the conf as stats_file:PATH
  std::string conf_flag = "--conf";  // how messages name `conf` when it is set
};

// The CUDAPOOL_CONF the program gets: `conf` (or the caller's) plus the output-file keys.
std::string launch_conf(const LaunchSettings& settings);

// Where libcudapool.so is, in this order: $CUDAPOOL_LIBRARY; next to this executable; ../lib
// relative to it (`make install`); build/release/ under the current directory. nullopt when none
// exists; *searched (if given) then lists the places looked at.
std::optional<std::string> find_library(std::vector<std::string>* searched = nullptr);

// `library` prepended to LD_PRELOAD (kept once, the caller's entries after it).
std::string preload_value(const std::string& library, const char* existing_ld_preload);

// The environment changes for a launch: LD_PRELOAD, CUDAPOOL_CONF = launch_conf(), and the
// non-empty --config/--profile.
EnvChanges launch_environment(const std::string& library, const LaunchSettings& settings);

// The policy sources a program started from this shell would see (sources_from_environment()),
// with the settings' flags over them, named as flags in messages.
PolicySources launch_policy_sources(const LaunchSettings& settings);

// The policy the program would run with (validated by config/), so `run` and `ab` stop with the
// config error before starting anything. "" when valid, else the message.
std::string validate_launch_policy(const LaunchSettings& settings, const std::vector<std::string>& command);

}  // namespace cudapool::tools
