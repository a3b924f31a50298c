#include "config/values.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace cudapool::config {

std::string parse_uint(std::string_view text, std::uint64_t& out) {
  if (text.empty()) return "empty";
  if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) return "not a whole number";
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec == std::errc::result_out_of_range) return "too large";
  if (ec != std::errc() || end != text.data() + text.size()) return "not a whole number";
  return {};
}

std::string parse_number(std::string_view text, double& out) {
  if (text.empty()) return "empty";
  // from_chars also takes "inf" and "nan"; neither is a policy value, and a leading '+' it refuses.
  std::string_view body = text;
  if (body.front() == '+') body.remove_prefix(1);
  if (body.empty() || !std::all_of(body.begin(), body.end(), [](char c) {
        return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+';
      }))
    return "not a number";
  auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), out);
  if (ec != std::errc() || end != body.data() + body.size() || !std::isfinite(out)) return "not a number";
  return {};
}

std::string parse_bool(std::string_view text, bool& out) {
  std::string l = lower(text);
  if (l == "true") {
    out = true;
    return {};
  }
  if (l == "false") {
    out = false;
    return {};
  }
  return "not a boolean";
}

bool is_power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string lower(std::string_view text) {
  std::string s(text);
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

std::string format_number(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc()) return "0";
  return std::string(buf, end);
}

void warn_once(std::vector<std::string>& warnings, std::string message) {
  if (std::find(warnings.begin(), warnings.end(), message) == warnings.end()) warnings.push_back(std::move(message));
}

}  // namespace cudapool::config
