#include "config/toml_loader.h"

#include <fnmatch.h>

#include <algorithm>
#include <array>
#include <vector>

#include <stdexcept>

// toml++ 3.3 checks some of its parser's assumptions with assert(), and an input it does not expect
// ("[[[x]]]" as a table header) trips one: the process would abort, or with NDEBUG run on into
// undefined behaviour (the check becomes __builtin_assume). A policy file must never do either to a
// CUDA program, so here a failed check throws; the parser already unwinds safely from the
// parse_error it throws for every other syntax error. Only this file includes toml++.
namespace cudapool::config {
struct TomlCheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace cudapool::config
// Where a check sits in a noexcept function the throw still ends the process (as assert did); all
// checks that depend on the input are in the parser, which is not noexcept.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wterminate"
#endif
#pragma push_macro("NDEBUG")
#undef NDEBUG
#undef TOML_ASSERT
#define TOML_ASSERT(expr) \
  ((expr) ? static_cast<void>(0) : throw ::cudapool::config::TomlCheckFailed(#expr))
#include <toml++/toml.h>
#pragma pop_macro("NDEBUG")

#include "config/keys.h"
#include "config/values.h"

namespace cudapool::config {
namespace {

// [log] spells four policy keys shorter.
constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kLogKeys{{
    {"level", "log_level"}, {"file", "log_file"}, {"trace_file", "trace_file"}, {"stats_file", "stats_file"}}};

std::string_view type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

class Loader {
 public:
  Loader(const std::string& path, std::string_view command_line)
      : path_(path), command_line_(command_line) {}

  std::string run(std::string_view text, std::string_view profile, Policy& p) {
    toml::table doc;
    try {
      doc = toml::parse(text, path_);
    } catch (const toml::parse_error& e) {
      const auto& b = e.source().begin;
      return path_ + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
             ": TOML syntax error: " + std::string(e.description()) + "; fix the file or unset CUDAPOOL_CONFIG";
    } catch (const TomlCheckFailed& e) {
      return path_ + ": TOML syntax error the parser could not place (its check '" + std::string(e.what()) +
             "' failed); look for a malformed table header such as [[[name]]] or [=]";
    }
    for (auto&& [k, node] : doc) {
      const std::string_view name = k.str();
      if (name == "policy" || name == "log" || name == "profiles") {
        if (!node.is_table())
          return where(node) + ": '" + std::string(name) + "' must be a table ([" + std::string(name) +
                 "]), not " + std::string(type_name(node));
        continue;
      }
      if (find_key(name) != nullptr)
        return where(node) + ": key '" + std::string(name) +
               "' is outside any table; put it under [policy] or a [profiles.NAME] table";
      return where(node) + ": unknown table '" + std::string(name) +
             "'; a policy file has [policy], [log] and [profiles.NAME]";
    }
    if (const toml::table* t = doc["policy"].as_table())
      if (std::string e = section(*t, "[policy]", [&](const toml::node& n) { return "file " + where(n); }, p); !e.empty())
        return e;
    if (const toml::table* t = doc["log"].as_table())
      if (std::string e = log_section(*t, "[log]", [&](const toml::node& n) { return "file " + where(n); }, p); !e.empty())
        return e;
    return profiles(doc["profiles"].as_table(), profile, p);
  }

 private:
  std::string where(const toml::node& n) const {
    return path_ + ":" + std::to_string(n.source().begin.line);
  }

  // A TOML value as the text the key's parser reads (the same parser the env string uses).
  std::string text_of(const KeySpec& key, const toml::node& n, std::string& value) const {
    if (const auto* v = n.as_string()) { value = v->get(); return {}; }
    if (const auto* v = n.as_boolean()) { value = v->get() ? "true" : "false"; return {}; }
    if (const auto* v = n.as_integer()) { value = std::to_string(v->get()); return {}; }
    if (const auto* v = n.as_floating_point()) { value = format_number(v->get()); return {}; }
    if (const auto* t = n.as_table(); t != nullptr && key.kind == ValueKind::roundup) {
      // {256 = 1, 512 = 2, ">" = 4}: TOML tables have no order, so entries go by boundary, '>' last.
      std::vector<std::pair<std::string, std::string>> entries;
      for (auto&& [bk, bv] : *t) {
        const auto* d = bv.as_integer();
        if (d == nullptr)
          return where(bv) + ": " + bad_value_message(key, std::string(bk.str()), "divisions must be an integer", true);
        entries.emplace_back(std::string(bk.str()), std::to_string(d->get()));
      }
      auto rank = [](const std::string& k) {
        std::uint64_t v = 0;
        if (k == ">") return ~std::uint64_t{0};
        return parse_uint(k, v).empty() ? v : 0;
      };
      std::stable_sort(entries.begin(), entries.end(),
                       [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
      value = "[";
      for (const auto& [bk, dv] : entries) value += (value.size() > 1 ? "," : "") + bk + ":" + dv;
      value += "]";
      return {};
    }
    return where(n) + ": " + bad_value_message(key, std::string(type_name(n)), "wrong TOML type", true);
  }

  template <class Origin>
  std::string set(const KeySpec& key, const toml::node& n, Origin origin, Policy& p) const {
    std::string value;
    if (std::string e = text_of(key, n, value); !e.empty()) return e;
    if (std::string e = apply_setting(p, key, value, origin(n), true); !e.empty()) return where(n) + ": " + e;
    return {};
  }

  // A [policy] or [profiles.NAME] table; `match` (profiles only) has been read by the caller.
  template <class Origin>
  std::string section(const toml::table& t, std::string_view label, Origin origin, Policy& p,
                      bool profile = false) const {
    for (auto&& [k, node] : t) {
      const std::string_view name = k.str();
      if (profile && name == "match") continue;
      if (profile && name == "log" && node.is_table()) {
        if (std::string e = log_section(*node.as_table(), std::string(label) + ".log", origin, p); !e.empty())
          return e;
        continue;
      }
      const KeySpec* key = find_key(name);
      if (key == nullptr)
        return where(node) + ": unknown key '" + std::string(name) + "' in " + std::string(label) + "; " +
               suggest_key(name);
      if (std::string e = set(*key, node, origin, p); !e.empty()) return e;
    }
    return {};
  }

  template <class Origin>
  std::string log_section(const toml::table& t, std::string_view label, Origin origin, Policy& p) const {
    for (auto&& [k, node] : t) {
      const std::string_view name = k.str();  // clang 14 cannot capture a structured binding
      auto it = std::find_if(kLogKeys.begin(), kLogKeys.end(), [&](const auto& e) { return e.first == name; });
      if (it == kLogKeys.end())
        return where(node) + ": unknown key '" + std::string(name) + "' in " + std::string(label) +
               "; it takes level, file, trace_file and stats_file";
      if (std::string e = set(*find_key(it->second), node, origin, p); !e.empty()) return e;
    }
    return {};
  }

  // The `match` globs of one profile; "" or an error.
  std::string globs(const toml::table& t, std::vector<std::string>& out) const {
    const toml::node* m = t.get("match");
    if (m == nullptr) return {};
    if (const auto* s = m->as_string()) { out.push_back(s->get()); return {}; }
    if (const auto* a = m->as_array()) {
      for (const toml::node& g : *a) {
        const auto* s = g.as_string();
        if (s == nullptr)
          return where(g) + ": match globs must be strings, not " + std::string(type_name(g)) +
                 " (e.g. match = [\"*train.py*\"])";
        out.push_back(s->get());
      }
      return {};
    }
    return where(*m) + ": match must be a string or an array of strings (e.g. match = [\"*train.py*\"]), not " +
           std::string(type_name(*m));
  }

  bool matches(const std::vector<std::string>& gs) const {
    const std::string cmd(command_line_);
    for (const std::string& g : gs)
      if (fnmatch(g.c_str(), cmd.c_str(), 0) == 0) return true;
    return false;
  }

  std::string profiles(const toml::table* all, std::string_view chosen, Policy& p) const {
    std::vector<std::string> names, matched;
    if (all != nullptr) {
      for (auto&& [k, node] : *all) {
        const std::string name(k.str());
        const std::string label = "[profiles." + name + "]";
        const toml::table* t = node.as_table();
        if (t == nullptr)
          return where(node) + ": profile '" + name + "' must be a table (" + label + "), not " +
                 std::string(type_name(node));
        std::vector<std::string> gs;
        if (std::string e = globs(*t, gs); !e.empty()) return e;
        // Check every profile, chosen or not: a typo should fail `cudapool check`, not a later job.
        Policy scratch = p;
        if (std::string e = section(*t, label, [](const toml::node&) { return std::string(); }, scratch, true); !e.empty())
          return e;
        names.push_back(name);
        if (!gs.empty() && matches(gs)) matched.push_back(name);
      }
    }
    std::string pick;
    if (!chosen.empty()) {
      if (std::find(names.begin(), names.end(), chosen) == names.end()) {
        std::string msg = "profile '" + std::string(chosen) + "' (CUDAPOOL_PROFILE) is not in " + path_ + "; ";
        if (names.empty()) return msg + "it has no [profiles.NAME] tables; add one or unset CUDAPOOL_PROFILE";
        msg += "profiles there: ";
        for (std::size_t i = 0; i < names.size(); ++i) msg += (i ? ", " : "") + names[i];
        return msg;
      }
      pick = chosen;
    } else if (matched.size() > 1) {
      std::string msg = "profiles ";
      for (std::size_t i = 0; i < matched.size(); ++i)
        msg += (i == 0 ? "'" : i + 1 == matched.size() ? "' and '" : "', '") + matched[i];
      return msg + "' in " + path_ + " all match the command line '" + std::string(command_line_) +
             "'; choose one with CUDAPOOL_PROFILE=NAME or make their match globs narrower";
    } else if (matched.size() == 1) {
      pick = matched.front();
    }
    if (pick.empty()) return {};
    const toml::table& t = *(*all)[pick].as_table();
    const std::string label = "[profiles." + pick + "]";
    return section(t, label, [&](const toml::node& n) { return "profile " + pick + " (" + where(n) + ")"; }, p, true);
  }

  const std::string& path_;
  std::string_view command_line_;
};

}  // namespace

std::string apply_toml(std::string_view text, const std::string& path, std::string_view profile,
                       std::string_view command_line, Policy& p) {
  try {
    return Loader(path, command_line).run(text, profile, p);
  } catch (const std::exception& e) {  // allocation failure; toml++'s own errors are caught above
    return path + ": internal error while reading the policy file: " + e.what();
  }
}

}  // namespace cudapool::config
