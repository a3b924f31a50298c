// JSON string escaping and exact doubles, for every JSON text the library and the tools write.
#include "telemetry/json.h"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace cudapool::json {

namespace {

constexpr char kHex[] = "0123456789abcdef";
// U+FFFD REPLACEMENT CHARACTER, in UTF-8.
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

void append_u(std::string* out, std::uint32_t cp) {
  *out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) *out += kHex[(cp >> shift) & 0xfu];
}

// Code points written as \uXXXX although JSON allows them raw: the C1 controls (some terminals
// obey them as CSI and friends), the line and paragraph separators (which end a line in
// JavaScript) and the bidirectional controls (which reorder the text a reader is shown).
bool escaped_code_point(std::uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x2028 && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

// The UTF-8 sequence at the start of `s` (its first byte is 0x80 or above). Returns its length
// with *cp set when it is well formed, else 0 with *bad = the bytes that one U+FFFD replaces:
// Unicode's "maximal subpart", the longest start of a well-formed sequence, at least one byte.
// Overlong forms, surrogates and values above U+10FFFF are never well formed: the second byte's
// range excludes them.
std::size_t utf8_sequence(std::string_view s, std::uint32_t* cp, std::size_t* bad) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    if (b0 == 0xe0) lo = 0xa0;  // below: overlong
    if (b0 == 0xed) hi = 0x9f;  // above: UTF-16 surrogates
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    if (b0 == 0xf0) lo = 0x90;  // below: overlong
    if (b0 == 0xf4) hi = 0x8f;  // above: beyond U+10FFFF
  } else {
    *bad = 1;  // a continuation byte, C0/C1 (overlong two-byte forms) or F5-FF: never a start
    return 0;
  }
  std::uint32_t v = b0 & (n == 2 ? 0x1fu : n == 3 ? 0x0fu : 0x07u);
  for (std::size_t i = 1; i < n; ++i) {
    if (i == 2) lo = 0x80, hi = 0xbf;  // the third and fourth bytes: any continuation byte
    const unsigned char b = i < s.size() ? static_cast<unsigned char>(s[i]) : 0;
    if (b < lo || b > hi) {  // also at the end of `s` (b = 0)
      *bad = i;
      return 0;
    }
    v = (v << 6) | (b & 0x3fu);
  }
  *cp = v;
  return n;
}

}  // namespace

void append_string(std::string* out, std::string_view s) {
  out->reserve(out->size() + s.size() + 2);
  *out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {  // printable ASCII
      if (c == '"' || c == '\\') *out += '\\';
      *out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (c < 0x80) {  // C0 controls and DEL
      switch (c) {
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        default: append_u(out, c);
      }
      ++i;
      continue;
    }
    std::uint32_t cp = 0;
    std::size_t bad = 0;
    const std::size_t n = utf8_sequence(s.substr(i), &cp, &bad);
    if (n == 0) {
      *out += kReplacement;
      i += bad;
    } else {
      if (escaped_code_point(cp)) {
        append_u(out, cp);
      } else {
        out->append(s.substr(i, n));
      }
      i += n;
    }
  }
  *out += '"';
}

void append_double(std::string* out, double d) {
  if (!std::isfinite(d)) {
    *out += "null";
    return;
  }
  char buf[32];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d);  // shortest round-trip form
  std::string_view s(buf, static_cast<std::size_t>(p - buf));
  *out += s;
  // Keep doubles recognisable as non-integers when read back ("2" → "2.0").
  if (s.find_first_of(".eE") == std::string_view::npos) *out += ".0";
}

}  // namespace cudapool::json
