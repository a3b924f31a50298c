// JSON string escaping and exact doubles, for every JSON text the library and the tools write.
#include "telemetry/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace cudapool::json {

void append_string(std::string* out, std::string_view s) {
  *out += '"';
  for (char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          *out += buf;
        } else {
          *out += c;
        }
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
