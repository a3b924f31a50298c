// The pool-shaping keys of an untrusted policy (config/policy.h, pool_shaping_conf): the text is
// parsed as any policy is, then only its `Reach::pool` settings are carried over to the defaults,
// so no key that reaches a file, a signal, a group, logging or publishing survives, whatever its
// spelling in the text.
#include <algorithm>

#include "config/keys.h"
#include "config/policy.h"
#include "sys/printable.h"

namespace cudapool {

UntrustedConf pool_shaping_conf(std::string_view text, std::string_view source) {
  UntrustedConf out;
  const std::string src(source);
  PolicyResult parsed = parse_conf(text, Policy{}, src + "'s policy");
  if (!parsed.policy) {
    // The message quotes the text, which is the file's: escaped, so that it prints as text.
    out.error = printable(parsed.error);
    return out;
  }
  Policy kept;
  for (const config::KeySpec& k : config::keys()) {
    // Keys without `format` set nothing of their own (ignored keys, second spellings).
    if (k.format == nullptr || k.is_default(*parsed.policy)) continue;
    switch (k.reach) {
      case config::Reach::pool: {
        // A value format() wrote is one apply() takes back (to_conf_string relies on the same).
        std::vector<std::string> warnings;
        if (std::string why = k.apply(kept, k.format(*parsed.policy), warnings); !why.empty())
          out.dropped.push_back({std::string(k.name), "its value does not read back: " + printable(why)});
        break;
      }
      case config::Reach::files:
        out.dropped.push_back({std::string(k.name), src + " cannot choose files to write"});
        break;
      case config::Reach::reads:
        out.dropped.push_back({std::string(k.name), src + " cannot choose files to read"});
        break;
      case config::Reach::process:
        out.dropped.push_back({std::string(k.name), src + " cannot set signals, logging, groups or publishing"});
        break;
    }
  }
  out.conf = to_conf_string(kept);
  return out;
}

std::string describe_dropped(const std::vector<UntrustedConf::Dropped>& dropped) {
  std::vector<std::string> whys;  // each reason once, in the order first seen
  for (const auto& d : dropped)
    if (std::find(whys.begin(), whys.end(), d.why) == whys.end()) whys.push_back(d.why);
  std::string line;
  for (const std::string& why : whys) {
    std::string keys;
    for (const auto& d : dropped)
      if (d.why == why) keys += (keys.empty() ? "" : ", ") + d.key;
    line += (line.empty() ? "" : "; ") + keys + " (" + why + ")";
  }
  return line;
}

}  // namespace cudapool
