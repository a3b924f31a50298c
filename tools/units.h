// Human sizes both ways: "1.50 GiB" for tables, "80GiB"/"512M"/"1024" on the command line.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
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

// Running byte totals over a trace's rows (reserved, allocated): the sizes come from an untrusted
// file, so the sums saturate at the int64 range rather than overflow.
inline std::int64_t add_bytes(std::int64_t total, std::size_t bytes) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  const auto b = bytes > static_cast<std::size_t>(kMax) ? kMax : static_cast<std::int64_t>(bytes);
  std::int64_t out = 0;
  return __builtin_add_overflow(total, b, &out) ? kMax : out;
}
inline std::int64_t sub_bytes(std::int64_t total, std::size_t bytes) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  const auto b = bytes > static_cast<std::size_t>(kMax) ? kMax : static_cast<std::int64_t>(bytes);
  std::int64_t out = 0;
  return __builtin_sub_overflow(total, b, &out) ? std::numeric_limits<std::int64_t>::min() : out;
}

}  // namespace cudapool::tools
