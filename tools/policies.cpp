#include "tools/policies.h"

#include "config/keys.h"
#include "config/policy.h"

namespace cudapool::tools {

bool policy_from_conf(const std::string& conf, Policy* out, std::string* error) {
  PolicyResult r = parse_conf(conf, Policy{}, "--conf");
  if (!r.policy) {
    if (error) *error = r.error;
    return false;
  }
  *out = std::move(*r.policy);
  return true;
}

bool pool_options_from_conf(const std::string& conf, PoolOptions* out, std::string* error) {
  Policy p;
  if (!policy_from_conf(conf, &p, error)) return false;
  *out = p.pool;
  return true;
}

std::string join_conf(const std::string& base, const std::string& extra) {
  if (base.empty()) return extra;
  if (extra.empty()) return base;
  return base + "," + extra;
}

std::vector<std::string> split_conf(const std::string& text) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::string with_conf_key(const std::string& conf, const std::string& key, const std::string& value) {
  std::string out;
  bool replaced = false;
  for (const std::string& part : split_conf(conf)) {
    if (part.empty()) continue;
    if (part.substr(0, part.find_first_of(":=")) == key) {
      replaced = true;
      if (!value.empty()) out = join_conf(out, key + ":" + value);
    } else {
      out = join_conf(out, part);
    }
  }
  if (!replaced && !value.empty()) out = join_conf(out, key + ":" + value);
  return out;
}

std::string without_output_files(const std::string& conf, std::vector<std::string>* dropped) {
  Policy p;
  std::string err;
  if (!policy_from_conf(conf, &p, &err)) return conf;  // the caller reports the error
  std::string out = to_conf_string(p);
  bool any = false;
  for (const config::KeySpec& k : config::keys()) {
    if (k.reach != config::Reach::files || k.is_default == nullptr || k.is_default(p)) continue;
    out = with_conf_key(out, std::string(k.name), "");
    if (dropped) dropped->emplace_back(k.name);
    any = true;
  }
  return any ? out : conf;
}

bool expand_sweep(const std::string& base, const std::string& sweep, std::vector<NamedConf>* out, std::string* error) {
  auto eq = sweep.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 >= sweep.size()) {
    *error = "--sweep wants key=v1,v2,... (got '" + sweep + "')";
    return false;
  }
  std::string key = sweep.substr(0, eq);
  for (const auto& v : split_conf(sweep.substr(eq + 1))) {
    if (v.empty()) {
      *error = "--sweep '" + sweep + "' has an empty value";
      return false;
    }
    out->push_back({key + "=" + v, join_conf(base, key + ":" + v)});
  }
  return true;
}

}  // namespace cudapool::tools
