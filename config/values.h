// Small value parsers shared by the env grammar and the TOML loader. Each returns an empty string on
// success, else the reason the text is not a valid value (the caller adds key, value and the form).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cudapool::config {

// A non-negative whole number in decimal ("128"); no sign, no suffix.
std::string parse_uint(std::string_view text, std::uint64_t& out);
// A finite decimal number ("0.8", "1e-1"); no nan/inf.
std::string parse_number(std::string_view text, double& out);
// true/false in any case (PyTorch writes True/False).
std::string parse_bool(std::string_view text, bool& out);

bool is_power_of_two(std::uint64_t v);
std::string lower(std::string_view text);
// The shortest decimal text that reads back as exactly `v`.
std::string format_number(double v);
// Appends `message` unless it is already there: a key repeated in several layers warns once.
void warn_once(std::vector<std::string>& warnings, std::string message);

}  // namespace cudapool::config
