#include "config/keys.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <concepts>
#include <limits>

#include "config/roundup.h"
#include "config/values.h"

namespace cudapool::config {
namespace {

using Warnings = std::vector<std::string>;
constexpr std::uint64_t kMaxMiB = kNoLimit / MiB;  // larger MiB counts clamp here, as in PyTorch
constexpr std::uint64_t kNoMaximum = std::numeric_limits<std::uint64_t>::max();

// ---- rules: how a row of config/keys.def reads, prints and compares its field ------------------
// Each rule has apply(field, value, warnings) -> "" or why the value is refused, format(field) ->
// the value as apply() reads it back, and is_default(field, the default policy's field).

// True or False, in any case (PyTorch writes True/False).
struct Flag {
  std::string apply(bool& field, std::string_view v, Warnings&) const { return parse_bool(v, field); }
  std::string format(const bool& field) const { return field ? "True" : "False"; }
  bool is_default(const bool& field, const bool& def) const { return field == def; }
};
constexpr Flag flag() { return {}; }

// A size written as a whole number of MiB and kept in bytes; counts past kMaxMiB clamp there.
struct MiBSize {
  std::uint64_t min = 0;
  std::uint64_t max = kNoMaximum;
  bool zero_means_no_limit = false;     // 0 reads as kNoLimit, which prints as "0"
  std::string_view no_limit_text = {};  // non-empty: kNoLimit prints as this

  // Each returns a copy with one setting changed (written out, not through a generic editor
  // taking a lambda: clang 14 cannot evaluate that in the table's constant expressions).
  constexpr MiBSize at_least(std::uint64_t n) const {
    MiBSize m = *this;
    m.min = n;
    return m;
  }
  constexpr MiBSize at_most(std::uint64_t n) const {
    MiBSize m = *this;
    m.max = n;
    return m;
  }
  constexpr MiBSize zero_is_no_limit() const {
    MiBSize m = *this;
    m.zero_means_no_limit = true;
    m.no_limit_text = "0";
    return m;
  }
  constexpr MiBSize no_limit_shown_as(std::string_view text) const {
    MiBSize m = *this;
    m.no_limit_text = text;
    return m;
  }

  std::string apply(std::size_t& field, std::string_view v, Warnings&) const {
    std::uint64_t n = 0;
    if (std::string why = parse_uint(v, n); !why.empty()) return why;
    if (zero_means_no_limit && n == 0) {
      field = kNoLimit;
      return {};
    }
    if (n < min) return "below the minimum " + std::to_string(min);
    if (n > max) return "above the maximum " + std::to_string(max);
    field = static_cast<std::size_t>(std::min(n, kMaxMiB)) * MiB;
    return {};
  }
  std::string format(const std::size_t& field) const {
    if (field == kNoLimit && !no_limit_text.empty()) return std::string(no_limit_text);
    return std::to_string(field / MiB);
  }
  bool is_default(const std::size_t& field, const std::size_t& def) const { return field == def; }
};
constexpr MiBSize mib() { return {}; }

// Which ends of a number's interval belong to it.
enum class Ends : std::uint8_t { closed, open, closed_open };

// A finite decimal number in an interval.
struct Between {
  double lo, hi;
  Ends ends;
  std::string_view outside;  // why a number outside is refused

  std::string apply(double& field, std::string_view v, Warnings&) const {
    double x = 0;
    if (std::string why = parse_number(v, x); !why.empty()) return why;
    const bool above_lo = ends == Ends::open ? x > lo : x >= lo;
    const bool below_hi = ends == Ends::closed ? x <= hi : x < hi;
    if (!(above_lo && below_hi)) return std::string(outside);
    field = x;
    return {};
  }
  std::string format(const double& field) const { return format_number(field); }
  bool is_default(const double& field, const double& def) const { return field == def; }
};
constexpr Between between(double lo, double hi, Ends ends, std::string_view outside) { return {lo, hi, ends, outside}; }

// A path, or the text of one: no control characters, at most max_length of them.
struct Path {
  std::size_t max_length = 0;  // 0 = any length

  constexpr Path at_most(std::size_t n) const { return Path{n}; }

  std::string apply(std::string& field, std::string_view v, Warnings&) const {
    for (char c : v)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "contains a control character";
    if (max_length != 0 && v.size() > max_length) return "longer than " + std::to_string(max_length) + " characters";
    field = v;
    return {};
  }
  std::string format(const std::string& field) const { return field; }
  bool is_default(const std::string& field, const std::string& def) const { return field == def; }
};
constexpr Path path() { return {}; }

// A whole number of milliseconds up to max. A zero refused is refused after the field took it.
struct Millis {
  std::uint64_t max;
  std::string_view zero_refused = {};  // non-empty: why 0 is refused

  constexpr Millis refusing_zero(std::string_view why) const { return Millis{max, why}; }

  std::string apply(int& field, std::string_view v, Warnings&) const {
    std::uint64_t n = 0;
    if (std::string why = parse_uint(v, n); !why.empty()) return why;
    if (n > max) return "above the maximum " + std::to_string(max);
    field = static_cast<int>(n);
    if (field == 0 && !zero_refused.empty()) return std::string(zero_refused);
    return {};
  }
  std::string format(const int& field) const { return std::to_string(field); }
  bool is_default(const int& field, const int& def) const { return field == def; }
};
constexpr Millis millis(std::uint64_t max) { return {max}; }

// auto (kept as -1, and any negative reads back as auto) or a whole number of MiB, kept in bytes.
struct AutoOrMiB {
  std::string_view zero_refused = {};  // non-empty: why 0 MiB is refused

  constexpr AutoOrMiB refusing_zero(std::string_view why) const { return AutoOrMiB{why}; }

  std::string apply(std::int64_t& field, std::string_view v, Warnings&) const {
    if (lower(v) == "auto") {
      field = -1;
      return {};
    }
    std::uint64_t n = 0;
    if (std::string why = parse_uint(v, n); !why.empty()) return why + " (or auto)";
    if (n == 0 && !zero_refused.empty()) return std::string(zero_refused);
    field = static_cast<std::int64_t>(std::min(n, kMaxMiB) * MiB);
    return {};
  }
  std::string format(const std::int64_t& field) const {
    return field < 0 ? "auto" : std::to_string(static_cast<std::uint64_t>(field) / MiB);
  }
  bool is_default(const std::int64_t& field, const std::int64_t&) const { return field < 0; }
};
constexpr AutoOrMiB auto_or_mib() { return {}; }

// One of a few names, in any case. A value prints as the first name that reads as it, and a value
// no name reads as prints as the first name.
template <class T>
struct Named {
  std::string_view name;
  T value;
};
template <class T, std::size_t N>
struct OneOf {
  std::array<Named<T>, N> names;
  std::string_view refused;  // why any other text is refused

  std::string apply(T& field, std::string_view v, Warnings&) const {
    const std::string l = lower(v);
    for (const Named<T>& n : names)
      if (n.name == l) {
        field = n.value;
        return {};
      }
    return std::string(refused);
  }
  std::string format(const T& field) const {
    for (const Named<T>& n : names)
      if (n.value == field) return std::string(n.name);
    return std::string(names[0].name);
  }
  bool is_default(const T& field, const T& def) const { return field == def; }
};
template <class T, std::size_t N>
constexpr OneOf<T, N> one_of(const Named<T> (&names)[N], std::string_view refused) {
  OneOf<T, N> rule{{}, refused};
  for (std::size_t i = 0; i < N; ++i) rule.names[i] = names[i];
  return rule;
}

// A key whose value no rule above reads: named functions that read and print it. The default
// check is `field == default` unless one is given.
template <class T>
struct Custom {
  std::string (*read)(T& field, std::string_view v, Warnings& warnings);
  std::string (*print)(const T& field);
  bool (*holds_default)(const T& field, const T& def) = nullptr;

  std::string apply(T& field, std::string_view v, Warnings& w) const { return read(field, v, w); }
  std::string format(const T& field) const { return print(field); }
  bool is_default(const T& field, const T& def) const {
    if constexpr (std::equality_comparable<T>)
      if (holds_default == nullptr) return field == def;
    return holds_default(field, def);
  }
};
template <class T>
constexpr Custom<T> custom(std::string (*read)(T&, std::string_view, Warnings&), std::string (*print)(const T&),
                           bool (*holds_default)(const T&, const T&) = nullptr) {
  return {read, print, holds_default};
}

// ---- the values read by named functions (the rows' custom(...)) --------------------------------

std::string format_text(const std::string& field) { return field; }
std::string format_decimal(const int& field) { return std::to_string(field); }

std::string apply_roundup(RoundupBuckets& field, std::string_view v, Warnings&) { return parse_roundup(v, field); }

std::string apply_backend(Backend& field, std::string_view v, Warnings& w) {
  const std::string l = lower(v);
  if (l == "native")
    field = Backend::native;
  else if (l == "passthrough")
    field = Backend::passthrough;
  else if (l == "cudamallocasync")
    warn_once(w,
              "backend:cudaMallocAsync is ignored: cudapool serves allocations from its own pool "
              "(backend stays " +
                  std::string(field == Backend::native ? "native" : "passthrough") +
                  "; use backend:passthrough to hand every call to CUDA untouched)");
  else
    return "not a backend";
  return {};
}
std::string format_backend(const Backend& field) { return field == Backend::native ? "native" : "passthrough"; }

// Set, the size holds for every unit; unset, units scale with the pool up to the default.
std::string apply_expandable_unit(PoolOptions& pool, std::string_view v, Warnings& w) {
  if (std::string why = mib().at_most(1024).apply(pool.expandable_max_unit, v, w); !why.empty()) return why;
  pool.expandable_unit_share = 0;
  return {};
}
std::string format_expandable_unit(const PoolOptions& pool) { return std::to_string(pool.expandable_max_unit / MiB); }
bool default_expandable_unit(const PoolOptions& pool, const PoolOptions& def) {
  return pool.expandable_max_unit == def.expandable_max_unit && pool.expandable_unit_share == def.expandable_unit_share;
}

std::string apply_log_level(std::string& field, std::string_view v, Warnings&) {
  // spdlog's names, plus its aliases "warning" and "err", stored in the canonical spelling.
  const std::string l = lower(v);
  static constexpr std::array<std::string_view, 7> names{"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (l == "warning")
    field = "warn";
  else if (l == "err")
    field = "error";
  else if (std::find(names.begin(), names.end(), l) != names.end())
    field = l;
  else
    return "not a log level";
  return {};
}

// A group name is part of a shared-memory file name: letters, digits, '_', '-', '.', at most 48.
std::string apply_group(std::string& field, std::string_view v, Warnings&) {
  if (v.size() > 48) return "longer than 48 characters";
  for (char c : v)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
      return "contains a character other than letters, digits, '_', '-' and '.'";
  if (v == "." || v == "..") return "not a name";
  field = v;
  return {};
}

std::string apply_register_threads(int& field, std::string_view v, Warnings&) {
  std::uint64_t n = 0;
  if (std::string why = parse_uint(v, n); !why.empty()) return why;
  if (!is_power_of_two(n) || n > 128) return "not a power of two <= 128";
  field = static_cast<int>(n);
  return {};
}

// By name (SIGUSR1/USR1, SIGUSR2/USR2, any case) or number. Signals whose default action or
// meaning the program relies on for errors and job control are refused: catching them to dump
// would hide a crash or break the shell.
constexpr int kSigUsr1 = 10, kSigUsr2 = 12;  // Linux numbering (x86-64, arm64)

std::string apply_dump_signal(int& field, std::string_view v, Warnings&) {
  std::string l = lower(v);
  if (l.starts_with("sig")) l.erase(0, 3);
  if (l == "off" || l == "none" || l == "0" || l == "false")
    field = 0;
  else if (l == "usr1")
    field = kSigUsr1;
  else if (l == "usr2")
    field = kSigUsr2;
  else {
    std::uint64_t n = 0;
    if (!parse_uint(v, n).empty()) return "not a signal name or number";
    // SIGKILL 9 and SIGSTOP 19 cannot be caught; SIGILL 4, SIGTRAP 5, SIGABRT 6, SIGBUS 7,
    // SIGFPE 8, SIGSEGV 11 report faults; SIGCHLD 17 and SIGTSTP/TTIN/TTOU 20-22 are job control.
    static constexpr std::array<std::uint64_t, 12> refused{4, 5, 6, 7, 8, 9, 11, 17, 19, 20, 21, 22};
    if (n < 1 || n > 64 || std::find(refused.begin(), refused.end(), n) != refused.end())
      return "a signal that cannot be caught or that reports faults or job control";
    field = static_cast<int>(n);
  }
  return {};
}
std::string format_dump_signal(const int& field) {
  if (field == 0) return "off";
  if (field == kSigUsr1) return "SIGUSR1";
  if (field == kSigUsr2) return "SIGUSR2";
  return std::to_string(field);
}

// ---- the rows ----------------------------------------------------------------------------------

// A policy whose fields hold the defaults, the one each row's is_default() compares against;
// never destroyed, so a check made while the process exits still finds it.
const Policy& default_policy() {
  static const Policy* const defaults = new Policy();
  return *defaults;
}

// One type per CUDAPOOL_KEY row: its rule and its field.
namespace row {
#define CUDAPOOL_KEY(name, kind, reach, field, rule, allowed, example, help) \
  struct name {                                                              \
    static constexpr auto kRule = rule;                                      \
    static auto& of(Policy& p) { return p.field; }                           \
    static const auto& of(const Policy& p) { return p.field; }               \
  };
#include "config/keys.def"
}  // namespace row

template <class Row>
std::string apply_row(Policy& p, std::string_view v, Warnings& w) {
  return Row::kRule.apply(Row::of(p), v, w);
}
template <class Row>
std::string format_row(const Policy& p) {
  return Row::kRule.format(Row::of(p));
}
template <class Row>
bool default_row(const Policy& p) {
  return Row::kRule.is_default(Row::of(p), Row::of(default_policy()));
}

// Checked the way PyTorch checks it (so a string PyTorch refuses is refused here too), then dropped.
std::string ignore_bool(Policy&, std::string_view v, Warnings&) {
  bool b = false;
  return parse_bool(v, b);
}

std::string refuse(Policy&, std::string_view, Warnings&) {
  return "cudapool does not implement it: segments for requests under 10 MiB are always 20 MiB; "
         "remove the key";
}

using K = ValueKind;
constexpr KeySpec kKeys[] = {
#define CUDAPOOL_KEY(name, kind, reach, field, rule, allowed, example, help) \
  {#name,                                                                    \
   K::kind,                                                                  \
   Reach::reach,                                                             \
   allowed,                                                                  \
   example,                                                                  \
   help,                                                                     \
   {},                                                                       \
   apply_row<row::name>,                                                     \
   format_row<row::name>,                                                    \
   default_row<row::name>},
#define CUDAPOOL_IGNORED_KEY(name, kind, reach, allowed, example, help, because) \
  {#name, K::kind, Reach::reach, allowed, example, help, because, ignore_bool, nullptr, nullptr},
#define CUDAPOOL_REFUSED_KEY(name, kind, reach, allowed, example, help) \
  {#name, K::kind, Reach::reach, allowed, example, help, {}, refuse, nullptr, nullptr},
#define CUDAPOOL_KEY_ALIAS(name, kind, reach, allowed, example, help, of) \
  {#name, K::kind, Reach::reach, allowed, example, help, {}, apply_row<row::of>, nullptr, nullptr, #of},
#include "config/keys.def"
};

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      std::size_t best = diag + (a[i - 1] == b[j - 1] ? 0 : 1);
      if (row[j] + 1 < best) best = row[j] + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[b.size()];
}

std::string_view kind_name(ValueKind k) {
  switch (k) {
    case K::integer: return "integer";
    case K::number: return "number";
    case K::boolean: return "boolean";
    case K::choice: return "choice";
    case K::text: return "path";
    case K::roundup: return "integer or list";
  }
  return "";
}

}  // namespace

std::span<const KeySpec> keys() { return kKeys; }

const KeySpec* find_key(std::string_view name) {
  for (const KeySpec& k : kKeys)
    if (k.name == name) return &k;
  return nullptr;
}

std::string suggest_key(std::string_view unknown) {
  const std::string u = lower(unknown);
  const KeySpec* best = nullptr;
  std::size_t best_d = ~std::size_t{0};
  for (const KeySpec& k : kKeys) {
    // A key cut short or with something appended ("max_split", "expandable_segments_on") is close
    // whatever its edit distance.
    const bool prefix = u.size() >= 4 && (k.name.starts_with(u) || std::string_view(u).starts_with(k.name));
    // The length difference bounds the distance from below: skip keys that cannot beat the best.
    const std::size_t floor = u.size() > k.name.size() ? u.size() - k.name.size() : k.name.size() - u.size();
    if (!prefix && floor >= best_d) continue;
    std::size_t d = prefix ? 1 : edit_distance(u, k.name);
    if (d < best_d) best_d = d, best = &k;
  }
  if (best != nullptr && (best_d <= 2 || best_d * 4 <= best->name.size()))
    return "did you mean '" + std::string(best->name) + "'?";
  std::string list;
  for (const KeySpec& k : kKeys) {
    if (!k.ignored_because.empty() || k.format == nullptr) continue;
    list += list.empty() ? "" : ", ";
    list += k.name;
  }
  return "valid keys: " + list + " (and a few PyTorch keys, accepted and ignored)";
}

std::string bad_value_message(const KeySpec& key, std::string_view value, std::string_view reason, bool toml) {
  std::string example;
  if (toml) {
    const bool quoted = key.kind == K::choice || key.kind == K::text ||
                        (key.kind == K::roundup && key.example.starts_with('['));
    std::string ex(key.example);
    if (key.kind == K::boolean) ex = lower(ex);
    example = std::string(key.name) + " = " + (quoted ? "\"" + ex + "\"" : ex);
  } else {
    example = std::string(key.name) + ":" + std::string(key.example);
  }
  std::string msg = "bad value '" + std::string(value) + "' for " + std::string(key.name);
  if (!reason.empty()) msg += " (" + std::string(reason) + ")";
  return msg + "; allowed: " + std::string(key.allowed) + ", e.g. " + example;
}

std::string apply_setting(Policy& policy, const KeySpec& key, std::string_view value, std::string origin, bool toml) {
  if (std::string why = key.apply(policy, value, policy.warnings); !why.empty())
    return bad_value_message(key, value, why, toml);
  if (!key.ignored_because.empty())
    warn_once(policy.warnings, std::string(key.name) + " is ignored: " + std::string(key.ignored_because));
  else
    policy.origin[std::string(key.alias_of.empty() ? key.name : key.alias_of)] = std::move(origin);
  return {};
}

namespace {

// A key's default as the tables print it: `value`, (empty), or — for an ignored key.
std::string default_cell(const KeySpec& k, const Policy& defaults) {
  if (k.format == nullptr) return "—";
  const std::string def = k.format(defaults);
  return def.empty() ? "(empty)" : "`" + def + "`";
}

}  // namespace

std::string key_table_markdown() {
  const Policy defaults;
  std::string s =
      "| key | type | allowed | default | what it does |\n"
      "| --- | --- | --- | --- | --- |\n";
  for (const KeySpec& k : kKeys) {
    std::string help(k.help);
    if (!k.ignored_because.empty()) help += "; **ignored**: " + std::string(k.ignored_because);
    s += "| `" + std::string(k.name) + "` | " + std::string(kind_name(k.kind)) + " | " + std::string(k.allowed) +
         " | " + default_cell(k, defaults) + " | " + help + " |\n";
  }
  return s;
}

std::string key_table_markdown_brief() {
  const Policy defaults;
  std::string s =
      "| key | default | what it does |\n"
      "| --- | --- | --- |\n";
  for (const KeySpec& k : kKeys) {
    if (k.format == nullptr) continue;  // ignored, refused or a second spelling: sets nothing itself
    s += "| `" + std::string(k.name) + "` | " + default_cell(k, defaults) + " | " + std::string(k.help) + " |\n";
  }
  return s;
}

std::optional<std::string> with_key_table(std::string_view doc, std::string_view table) {
  constexpr std::string_view kBegin = "<!-- keys:begin -->\n", kEnd = "<!-- keys:end -->";
  const auto b = doc.find(kBegin);
  if (b == std::string_view::npos) return std::nullopt;
  const auto e = doc.find(kEnd, b + kBegin.size());
  if (e == std::string_view::npos || doc.find(kBegin, e) != std::string_view::npos) return std::nullopt;
  std::string out(doc.substr(0, b + kBegin.size()));
  out += table;
  out += doc.substr(e);
  return out;
}

}  // namespace cudapool::config
