// Just enough JSON writing for the tools' own outputs (ab --json, perfetto): string escaping and
// numbers that stay valid JSON (no NaN/inf).
#pragma once
#include <string>
#include <string_view>

namespace cudapool::tools {

std::string json_string(std::string_view s);  // quoted and escaped
std::string json_number(double v);            // "null" for NaN/inf, integers without ".0"

}  // namespace cudapool::tools
