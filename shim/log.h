// The shim's log lines go to telemetry's "cudapool" logger (stderr at warn until the policy says
// otherwise). Thin helpers so hook code stays short.
#pragma once
#include <utility>

#include "telemetry/logging.h"

namespace cudapool::shim {

template <typename... Args>
void log_warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  cudapool::log().warn(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void log_info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  cudapool::log().info(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void log_debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  cudapool::log().debug(fmt, std::forward<Args>(args)...);
}

}  // namespace cudapool::shim
