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

// A policy value as JSON: a number as a number, True/False as a boolean, anything else ("none",
// "gpu_wait", a path, a list) as a string.
inline std::string json_value(const std::string& v) {
  if (v == "True") return "true";
  if (v == "False") return "false";
  std::size_t i = 0, digits = 0;
  bool dot = false;
  for (; i < v.size(); ++i) {
    if (v[i] >= '0' && v[i] <= '9') {
      ++digits;
    } else if (v[i] == '.' && !dot && digits > 0) {
      dot = true;
    } else {
      break;
    }
  }
  if (!v.empty() && i == v.size() && digits > 0 && v.back() != '.' && !(v.size() > 1 && v[0] == '0' && v[1] != '.'))
    return v;
  return json_string(v);
}

}  // namespace cudapool::tools
