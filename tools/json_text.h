// Expression-style wrappers over telemetry's JSON writer, for the tools' own JSON outputs.
#pragma once
#include <string>
#include <string_view>

#include "telemetry/json.h"

namespace cudapool::tools {

inline std::string json_string(std::string_view s) {
  std::string o;
  json::append_string(&o, s);
  return o;
}

inline std::string json_number(double v) {
  std::string o;
  json::append_double(&o, v);
  return o;
}

}  // namespace cudapool::tools
