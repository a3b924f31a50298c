// List semantics follow PyTorch 2.9+ (reference/pytorch-allocator-rules.md): a key K (MiB, a power of
// two) names bucket log2(K), clamped to the last one; the first keyed entry also fills every bucket
// below it; `>` fills every bucket after the last keyed one; buckets between keys stay 0 (off). The
// list always starts from all-off, so a list in a higher layer replaces a lower layer's completely.
#include "config/roundup.h"

#include <bit>
#include <vector>

#include "config/values.h"

namespace cudapool::config {
namespace {

std::string strip_spaces(std::string_view text) {
  std::string s;
  for (char c : text)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') s += c;
  return s;
}

std::string parse_divisions(std::string_view text, bool zero_ok, std::uint32_t& out) {
  std::uint64_t v = 0;
  if (std::string why = parse_uint(text, v); !why.empty()) return "'" + std::string(text) + "' is " + why;
  if (v == 0 && zero_ok) {
    out = 0;
    return {};
  }
  if (!is_power_of_two(v) || v > kMaxRoundupDivisions)
    return "divisions '" + std::string(text) + "' is not a power of two in [1, 2^31]";
  out = static_cast<std::uint32_t>(v);
  return {};
}

}  // namespace

std::string parse_roundup(std::string_view raw, RoundupBuckets& out) {
  const std::string text = strip_spaces(raw);
  RoundupBuckets b{};
  if (text.empty()) return "empty";
  if (text.front() != '[') {
    // Scalar: every bucket the same. PyTorch refuses 0 here; we take it as "off" so a higher layer
    // can switch off what a lower one set.
    std::uint32_t d = 0;
    if (std::string why = parse_divisions(text, true, d); !why.empty()) return why;
    b.fill(d);
    out = b;
    return {};
  }
  if (text.back() != ']') return "a list must end with ']'";
  std::string_view body(text);
  body = body.substr(1, body.size() - 2);
  bool first_keyed = true;
  std::size_t last_index = 0;
  std::size_t pos = 0;
  int entry_no = 0;
  while (pos < body.size()) {
    std::size_t comma = body.find(',', pos);
    std::string_view entry = body.substr(pos, comma == std::string_view::npos ? body.npos : comma - pos);
    pos = comma == std::string_view::npos ? body.size() : comma + 1;
    ++entry_no;
    if (entry.empty()) {
      if (pos >= body.size() && comma != std::string_view::npos) break;  // PyTorch allows "[...,]"
      return "entry " + std::to_string(entry_no) + " is empty";
    }
    std::size_t sep = entry.find_first_of(":=");
    if (sep == std::string_view::npos) return "entry '" + std::string(entry) + "' is not BOUNDARY:DIVISIONS";
    std::string_view key = entry.substr(0, sep);
    std::uint32_t d = 0;
    if (std::string why = parse_divisions(entry.substr(sep + 1), true, d); !why.empty())
      return "entry '" + std::string(entry) + "': " + why;
    if (key == ">") {
      for (std::size_t i = last_index + 1; i < b.size(); ++i) b[i] = d;
      continue;
    }
    std::uint64_t mib = 0;
    if (std::string why = parse_uint(key, mib); !why.empty() || !is_power_of_two(mib))
      return "entry '" + std::string(entry) + "': boundary '" + std::string(key) +
             "' is not a power of two (MiB) or '>'";
    std::size_t index = static_cast<std::size_t>(std::bit_width(mib) - 1);
    if (index >= b.size()) index = b.size() - 1;
    if (first_keyed) {
      for (std::size_t i = 0; i < index; ++i) b[i] = d;
      first_keyed = false;
    }
    b[index] = d;
    last_index = index;
  }
  out = b;
  return {};
}

std::string format_roundup(const RoundupBuckets& a) {
  constexpr std::size_t n = kRoundupIntervals;
  bool all_same = true;
  for (std::uint32_t v : a) all_same = all_same && v == a[0];
  if (all_same) return std::to_string(a[0]);

  auto key = [](std::size_t index) { return std::to_string(std::uint64_t{1} << index); };
  // The first entry covers buckets 0..f; `>` covers the equal tail from `tail`; entries in between
  // are written when non-zero, plus the one just before the tail (`>` starts after the last key).
  std::size_t f = 0;
  while (f + 1 < n && a[f + 1] == a[0]) ++f;
  std::size_t tail = n - 1;
  while (tail > 0 && a[tail - 1] == a[n - 1]) --tail;
  if (tail <= f) tail = f + 1;
  const bool write_tail = tail < n && a[n - 1] != 0;

  std::string s = "[" + key(f) + ":" + std::to_string(a[f]);
  for (std::size_t i = f + 1; i < tail; ++i)
    if (a[i] != 0 || (write_tail && i + 1 == tail)) s += "," + key(i) + ":" + std::to_string(a[i]);
  if (write_tail) s += ",>:" + std::to_string(a[n - 1]);
  return s + "]";
}

}  // namespace cudapool::config
