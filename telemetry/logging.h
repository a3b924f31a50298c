// The "cudapool" logger: spdlog, to stderr (default, level warn) or to a file named by the policy.
// Logging never touches CUDA and never allocates device memory, so it is safe from any hook and
// at exit. Levels that are off cost one integer compare at the call site (spdlog's should_log).
#pragma once
#include <string>
#include <string_view>

#include <spdlog/logger.h>

#include "config/path_pattern.h"  // expand_path_pattern: the patterns of log_file
#include "config/policy.h"

namespace cudapool {

// (Re)configures the logger from policy.log_level and policy.log_file (expanded by
// expand_path_pattern, config/path_pattern.h; opened as sys/output_file.h says).
// Returns "" on success, else why (unknown level, file not writable); on failure the logger
// keeps writing to stderr at the previous level. Registers an atexit flush once.
// Thread-safe; the previous logger object is kept alive (leaked) so concurrent callers of log()
// never see a dangling reference.
std::string init_logging(const Policy& policy);

// The logger. Valid before init_logging (stderr, level warn) and after exit handlers ran.
spdlog::logger& log();

// Changes the level at run time ("trace" … "off", spdlog names). false if the name is unknown.
bool set_log_level(std::string_view level);
// The current level's spdlog name.
std::string log_level_name();

// Writes out anything buffered. Called automatically at exit; callable from the shim's own
// exit path. Never calls CUDA.
void flush_logs() noexcept;

}  // namespace cudapool
