// The env-string grammar (CUDAPOOL_CONF, and PyTorch's PYTORCH_CUDA_ALLOC_CONF spelling):
//   conf  := item? (',' item?)*            empty items and a trailing comma are skipped
//   item  := KEY (':' | '=') value
//   value := '[' ... ']'                   roundup_power2_divisions' list form
//          | '"' chars '"'                 quoted: keeps ',' and spaces (\" and \\ escape)
//          | chars up to the next ','      whitespace inside is dropped, as PyTorch does
// Every string PyTorch accepts lexes the same way here; `=`, any-case booleans and quotes are the
// extensions. Columns in messages are 1-based byte offsets into the original string.
#include <cctype>
#include <map>

#include "config/keys.h"
#include "config/policy.h"
#include "config/values.h"

namespace cudapool {
namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

class ConfParser {
 public:
  ConfParser(std::string_view text, std::string_view origin) : s_(text), origin_(origin) {}

  // Applies every item to `p`; returns the first error, or "".
  std::string run(Policy& p) {
    while (true) {
      skip_space();
      if (i_ >= s_.size()) return {};
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (std::string err = item(p); !err.empty()) return err;
      skip_space();
      if (i_ < s_.size()) {
        if (s_[i_] != ',')
          return at(i_, "unexpected '" + std::string(1, s_[i_]) +
                            "' after a value; separate settings with ',' (key:value,key:value)");
        ++i_;
      }
    }
  }

 private:
  std::string at(std::size_t pos, const std::string& what) const {
    return std::string(origin_) + " col " + std::to_string(pos + 1) + ": " + what;
  }

  void skip_space() {
    while (i_ < s_.size() && is_space(s_[i_])) ++i_;
  }

  // Characters up to (not including) any of `stops`, whitespace dropped.
  std::string word(std::string_view stops) {
    std::string w;
    while (i_ < s_.size() && stops.find(s_[i_]) == std::string_view::npos) {
      if (!is_space(s_[i_])) w += s_[i_];
      ++i_;
    }
    return w;
  }

  std::string item(Policy& p) {
    const std::size_t key_pos = i_;
    const std::string key = word(":=,");
    const config::KeySpec* spec = config::find_key(key);
    if (spec == nullptr) {
      if (key.empty()) return at(key_pos, "a value without a key; write key:value (e.g. max_split_size_mb:128)");
      return at(key_pos, "unknown key '" + key + "'; " + config::suggest_key(key));
    }
    if (i_ >= s_.size() || s_[i_] == ',')
      return at(key_pos, "key '" + key + "' has no value; write " + key +
                             ":VALUE (allowed: " + std::string(spec->allowed) + ")");
    ++i_;  // ':' or '='
    skip_space();
    const std::size_t value_pos = i_;
    std::string value;
    if (i_ < s_.size() && s_[i_] == '[') {
      const std::size_t close = s_.find(']', i_);
      if (close == std::string_view::npos)
        return at(value_pos,
                  "'[' without a closing ']' in the value of " + key + " (e.g. " + key + ":[256:1,512:2,>:4])");
      value = std::string(s_.substr(i_, close + 1 - i_));
      i_ = close + 1;
    } else if (i_ < s_.size() && s_[i_] == '"') {
      ++i_;
      bool closed = false;
      while (i_ < s_.size()) {
        char c = s_[i_++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\' && i_ < s_.size()) c = s_[i_++];
        value += c;
      }
      if (!closed) return at(value_pos, "unterminated quoted value of " + key + "; close it with '\"'");
    } else {
      value = word(",");
    }
    std::string origin = std::string(origin_) + " col " + std::to_string(key_pos + 1);
    if (std::string err = config::apply_setting(p, *spec, value, std::move(origin), false); !err.empty())
      return at(value_pos, err);
    // The same key twice (an alias counts as its key): the later one wins, as in PyTorch, but a
    // policy that says two things is usually a mistake worth a word.
    const std::string name(spec->alias_of.empty() ? spec->name : spec->alias_of);
    if (auto [it, fresh] = seen_.emplace(name, key_pos); !fresh && spec->ignored_because.empty()) {
      config::warn_once(p.warnings, std::string(origin_) + ": " + name + " is set twice (col " +
                                        std::to_string(it->second + 1) + " and col " + std::to_string(key_pos + 1) +
                                        "); the later value wins");
      it->second = key_pos;
    }
    return {};
  }

  std::string_view s_;
  std::string_view origin_;
  std::size_t i_ = 0;
  std::map<std::string, std::size_t> seen_;  // key -> position of its latest setting
};

}  // namespace

PolicyResult parse_conf(std::string_view text, const Policy& base, std::string_view origin_name) {
  PolicyResult r;
  Policy p = base;
  try {
    if (std::string err = ConfParser(text, origin_name).run(p); !err.empty()) {
      r.error = std::move(err);
      return r;
    }
  } catch (const std::exception& e) {  // only allocation failure can get here
    r.error = std::string(origin_name) + ": internal error while parsing: " + e.what();
    return r;
  }
  r.policy = std::move(p);
  return r;
}

}  // namespace cudapool
