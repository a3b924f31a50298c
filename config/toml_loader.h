// The policy file: [policy], [log] and [profiles.NAME] tables of a TOML document (toml++).
#pragma once
#include <string>
#include <string_view>

#include "config/policy.h"

namespace cudapool::config {

// Applies the TOML document `text` (read from `path`, which messages name) over `p`: first
// [policy], then [log], then the profile named by `profile` or, when that is empty, the one whose
// `match` globs match `command_line`. Every profile is checked, chosen or not. Returns "" or the
// error (file:line[:column] first). Never throws: toml++'s parse_error is caught here.
// Sets p.profile and p.profile_reason. A key set twice in the file's base ([policy] and [log],
// or a key and its alias) warns with both lines. `profile_name` and `config_name` are how
// messages name the two settings (the variables, or `cudapool`'s flags).
std::string apply_toml(std::string_view text, const std::string& path, std::string_view profile,
                       std::string_view command_line, Policy& p, std::string_view profile_name = "CUDAPOOL_PROFILE",
                       std::string_view config_name = "CUDAPOOL_CONFIG");

}  // namespace cudapool::config
