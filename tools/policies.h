// Policy strings as the tools use them: a CUDAPOOL_CONF string turned into the pool's options by
// config/ (so every string the tools print is one the library accepts), and --sweep expansion.
#pragma once
#include <string>
#include <vector>

#include "allocator/options.h"

namespace cudapool {
struct Policy;
}

namespace cudapool::tools {

struct NamedConf {
  std::string name;  // column title: "defaults", the conf string, or "key=value" for a sweep
  std::string conf;
};

// The policy of `conf` over the defaults; false with *error when config/ rejects it.
bool policy_from_conf(const std::string& conf, Policy* out, std::string* error);
// Just its pool options.
bool pool_options_from_conf(const std::string& conf, PoolOptions* out, std::string* error);

// "a,b" + "c" -> "a,c"-style join that skips empty parts.
std::string join_conf(const std::string& base, const std::string& extra);

// `text` split at commas outside brackets ("a:1,b:[2:1,>:4]" -> "a:1", "b:[2:1,>:4]"); empty
// parts are kept (callers decide whether one is an error).
std::vector<std::string> split_conf(const std::string& text);

// `conf` with `key` set to `value` (replacing the key's entry if `conf` has one; "" removes it).
// `conf` is split at commas outside brackets; keys are compared as written, so give it config/'s
// canonical spelling (to_conf_string).
std::string with_conf_key(const std::string& conf, const std::string& key, const std::string& value);

// `conf` (a policy config/ accepts) without the keys that name a file a run writes (trace_file,
// log_file, stats_file: config::Reach::files), as config/'s canonical string; `conf` itself when
// it sets none. *dropped gets their names. A recommendation is for other runs: it must not send
// their output to the files of the run it was made from.
std::string without_output_files(const std::string& conf, std::vector<std::string>* dropped);

// --sweep "key=v1,v2,…" over `base`: one NamedConf per value ("key:v" appended to base).
// Values may be lists in brackets ("roundup_power2_divisions=[256:1,>:4],8"): commas inside
// brackets do not split. false with *error on a malformed sweep.
bool expand_sweep(const std::string& base, const std::string& sweep, std::vector<NamedConf>* out, std::string* error);

}  // namespace cudapool::tools
