// Human sizes both ways: "1.50 GiB" for tables, "80GiB"/"512M"/"1024" on the command line.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace cudapool::tools {

// Bytes as PyTorch prints them: B / KiB / MiB / GiB with two decimals.
std::string format_bytes(double bytes);
// A size such as "80GiB", "80G", "512 MiB", "4096": binary units, suffix case-insensitive.
std::optional<std::size_t> parse_size(std::string_view text);
// Seconds with a unit that keeps 3-4 significant digits ("812 ms", "1.23 s").
std::string format_seconds(double seconds);

}  // namespace cudapool::tools
