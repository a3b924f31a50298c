// The effective policy, two ways: for people (describe) and for parse_conf (to_conf_string).
#include <algorithm>

#include "config/keys.h"
#include "config/policy.h"

namespace cudapool {
namespace {

// Text values are quoted when the env grammar would otherwise change them (it drops whitespace
// and ends a value at ',').
std::string conf_value(const config::KeySpec& k, const std::string& v) {
  if (k.kind != config::ValueKind::text) return v;
  const bool plain = !v.empty() && v.front() != '[' && v.front() != '"' && std::none_of(v.begin(), v.end(), [](char c) {
    return c == ',' || c == '"' || c == '\\' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
           c == '\f';
  });
  if (plain) return v;
  std::string q = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

}  // namespace

std::string describe(const Policy& policy) {
  // One column of values: every name is padded to the longest one printed, the variable's too.
  const std::string var = "CUDAPOOL_ON_ERROR";
  std::size_t width = var.size();
  for (const config::KeySpec& k : config::keys())
    if (k.format != nullptr) width = std::max(width, k.name.size());
  std::string out;
  auto line = [&](std::string_view key, const std::string& value) {
    auto it = policy.origin.find(std::string(key));
    const std::string origin = it == policy.origin.end() ? "default" : it->second;
    out += std::string(key) + std::string(width - std::min(width, key.size()), ' ') + " = " +
           (value.empty() ? "\"\"" : value) + "   (" + origin + ")\n";
  };
  for (const config::KeySpec& k : config::keys())
    if (k.format != nullptr) line(k.name, k.format(policy));
  // Not a key: the variable that says what an invalid policy does (docs/policy.md), named as such.
  auto it = policy.origin.find("on_error");
  out += var + std::string(width - std::min(width, var.size()), ' ') + " = " +
         (policy.on_error == OnError::passthrough ? "passthrough" : "stop") + "   (" +
         (it == policy.origin.end() || it->second == "default" ? "default" : "set") +
         "; an environment variable, not a policy key: what an invalid policy does)\n";
  return out;
}

std::string to_conf_string(const Policy& policy) {
  std::string out;
  for (const config::KeySpec& k : config::keys()) {
    if (k.format == nullptr || k.is_default(policy)) continue;
    if (!out.empty()) out += ',';
    out += std::string(k.name) + ":" + conf_value(k, k.format(policy));
  }
  return out;
}

}  // namespace cudapool
