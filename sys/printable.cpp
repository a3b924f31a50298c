#include "sys/printable.h"

#include <cstdint>

namespace cudapool {
namespace {

void escape_byte(std::string& out, unsigned char c) {
  constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 0xf];
}

// The length of the well-formed UTF-8 sequence at `s` (2 to 4) and its code point, or 0 when
// the bytes there are not one (overlong forms, surrogates and values above U+10FFFF included).
std::size_t utf8_sequence(std::string_view s, std::uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  std::size_t n;
  std::uint32_t v;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2, v = b0 & 0x1fu;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3, v = b0 & 0x0fu;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4, v = b0 & 0x07u;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (std::size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3fu);
  }
  if ((n == 3 && v < 0x800) || (n == 4 && v < 0x10000) || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  *cp = v;
  return n;
}

bool harmless(std::uint32_t cp) {
  if (cp >= 0x80 && cp <= 0x9f) return false;      // C1 controls
  if (cp == 0x2028 || cp == 0x2029) return false;  // line and paragraph separators
  if (cp >= 0x202a && cp <= 0x202e) return false;  // bidirectional embeddings and overrides
  if (cp >= 0x2066 && cp <= 0x2069) return false;  // bidirectional isolates
  return true;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    std::uint32_t cp = 0;
    const std::size_t n = c >= 0x80 ? utf8_sequence(text.substr(i), &cp) : 0;
    if (n != 0 && harmless(cp)) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    // One byte at a time: a malformed sequence's later bytes get their own look.
    const std::size_t k = n != 0 ? n : 1;
    for (std::size_t j = 0; j < k; ++j) escape_byte(out, static_cast<unsigned char>(text[i + j]));
    i += k;
  }
  return out;
}

}  // namespace cudapool
