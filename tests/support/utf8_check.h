// A strict UTF-8 check for tests and fuzz targets: the well-formed byte sequences of the Unicode
// standard (table 3-7), nothing else. Written from the table rather than from a decoder, so that
// it checks the JSON writer (telemetry/json.cpp) instead of repeating it.
#pragma once
#include <cstddef>
#include <string_view>

namespace cudapool::test {

// The offset of the first byte that is not part of a well-formed sequence, or npos.
inline std::size_t first_invalid_utf8(std::string_view s) {
  struct Row {
    unsigned char lo0, hi0;  // the first byte's range
    unsigned char lo1, hi1;  // the second's (the others are always 80-BF)
    std::size_t len;
  };
  static constexpr Row kTable[] = {
      {0x00, 0x7f, 0, 0, 1},       {0xc2, 0xdf, 0x80, 0xbf, 2}, {0xe0, 0xe0, 0xa0, 0xbf, 3},
      {0xe1, 0xec, 0x80, 0xbf, 3}, {0xed, 0xed, 0x80, 0x9f, 3}, {0xee, 0xef, 0x80, 0xbf, 3},
      {0xf0, 0xf0, 0x90, 0xbf, 4}, {0xf1, 0xf3, 0x80, 0xbf, 4}, {0xf4, 0xf4, 0x80, 0x8f, 4},
  };
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    const Row* row = nullptr;
    for (const Row& r : kTable)
      if (b0 >= r.lo0 && b0 <= r.hi0) row = &r;
    if (row == nullptr || s.size() - i < row->len) return i;
    for (std::size_t k = 1; k < row->len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      const unsigned char lo = k == 1 ? row->lo1 : 0x80, hi = k == 1 ? row->hi1 : 0xbf;
      if (b < lo || b > hi) return i;
    }
    i += row->len;
  }
  return std::string_view::npos;
}

inline bool valid_utf8(std::string_view s) { return first_invalid_utf8(s) == std::string_view::npos; }

}  // namespace cudapool::test
