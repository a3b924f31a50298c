// The one table of policy keys, made from the rows of config/keys.def. The env grammar, the TOML
// loader, the error messages, describe(), to_conf_string() and the tables of docs/policy.md and
// README.md (key_table_markdown() and key_table_markdown_brief(), written by `make docs`, checked
// by a test) all read it, so a key's name, form and bounds are written down exactly once.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/policy.h"

namespace cudapool::config {

enum class ValueKind : std::uint8_t { integer, number, boolean, choice, text, roundup };

// How far setting a key reaches. A policy read from a file the tools are only given to read (a
// trace's policy row) keeps its `pool` keys alone (pool_shaping_conf(), config/policy.h): such a
// file must not choose what the tools or a program write, catch, share or log.
enum class Reach : std::uint8_t {
  pool,     // at most how the pool takes, places, keeps and gives back device memory
  files,    // names a file the process writes
  reads,    // names a file the process reads
  process,  // beyond the pool: a signal handler, logging, a group's shared memory, published stats
};

struct KeySpec {
  std::string_view name;
  ValueKind kind;
  Reach reach;
  std::string_view allowed;  // the allowed range or form, as errors and the docs print it
  std::string_view example;  // one valid value, as written after `key:`
  std::string_view help;     // one line: what it does
  // Non-empty: a PyTorch key with no meaning for a device pool; accepted (value still checked the
  // way PyTorch checks it) with one warning that says this.
  std::string_view ignored_because;
  // Sets the key in `policy` from `value`. Returns "" or why the value is refused (the caller adds
  // where, which key and the allowed form). May add warnings.
  std::string (*apply)(Policy& policy, std::string_view value, std::vector<std::string>& warnings);
  // The current value as apply() reads it back; nullptr for ignored keys.
  std::string (*format)(const Policy& policy);
  bool (*is_default)(const Policy& policy);
  // Non-empty: another spelling of that key (PyTorch reads release_lock_on_hipmalloc as
  // release_lock_on_cudamalloc on every build); the origin is recorded under that name.
  std::string_view alias_of = {};
};

std::span<const KeySpec> keys();
const KeySpec* find_key(std::string_view name);

// For an unknown key: "did you mean 'max_split_size_mb'?" when one is close, else the list of
// valid keys.
std::string suggest_key(std::string_view unknown);
// "bad value 'X' for KEY (REASON); allowed: FORM, e.g. KEY:EXAMPLE" — `toml` picks the example's syntax.
std::string bad_value_message(const KeySpec& key, std::string_view value, std::string_view reason, bool toml);
// Applies `value` to `key` in `policy`: "" on success (origin recorded, or the one "is ignored"
// warning added), else bad_value_message() without the location (the caller prefixes it).
std::string apply_setting(Policy& policy, const KeySpec& key, std::string_view value, std::string origin, bool toml);
// The Markdown table of every key (docs/policy.md embeds it verbatim; a test keeps them equal).
std::string key_table_markdown();
// The short table README.md embeds: key, default, what it does, for the keys that set something
// (not the ignored or refused PyTorch keys, not second spellings: those without `format`).
std::string key_table_markdown_brief();
// `doc` with the text between its "<!-- keys:begin -->" line and "<!-- keys:end -->" replaced by
// `table`; nullopt when the markers are missing, out of order or there twice. `make docs` writes
// the docs with it; a test checks that it changes nothing.
std::optional<std::string> with_key_table(std::string_view doc, std::string_view table);

}  // namespace cudapool::config
