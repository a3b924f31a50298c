#include "tools/policies.h"

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

std::string with_conf_key(const std::string& conf, const std::string& key, const std::string& value) {
  std::string out, cur;
  int depth = 0;
  bool replaced = false;
  auto flush = [&] {
    if (cur.empty()) return;
    const std::string k = cur.substr(0, cur.find_first_of(":="));
    if (k == key) {
      replaced = true;
      if (!value.empty()) out = join_conf(out, key + ":" + value);
    } else {
      out = join_conf(out, cur);
    }
    cur.clear();
  };
  for (char c : conf) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) flush();
    else cur += c;
  }
  flush();
  if (!replaced && !value.empty()) out = join_conf(out, key + ":" + value);
  return out;
}

bool expand_sweep(const std::string& base, const std::string& sweep, std::vector<NamedConf>* out,
                  std::string* error) {
  auto eq = sweep.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 >= sweep.size()) {
    *error = "--sweep wants key=v1,v2,... (got '" + sweep + "')";
    return false;
  }
  std::string key = sweep.substr(0, eq);
  std::string values = sweep.substr(eq + 1);
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : values) {
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
  for (const auto& v : parts) {
    if (v.empty()) {
      *error = "--sweep '" + sweep + "' has an empty value";
      return false;
    }
    out->push_back({key + "=" + v, join_conf(base, key + ":" + v)});
  }
  return true;
}

}  // namespace cudapool::tools
