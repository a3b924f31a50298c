#include "tools/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace cudapool::tools {

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", v);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string format_seconds(double s) {
  char buf[48];
  double a = std::fabs(s);
  if (a == 0)
    std::snprintf(buf, sizeof buf, "0 s");
  else if (a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (a < 1.0)
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

std::optional<std::size_t> parse_size(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t start = i;
  bool dot = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || (text[i] == '.' && !dot))) {
    dot |= text[i] == '.';
    ++i;
  }
  if (i == start) return std::nullopt;
  double number = std::stod(std::string(text.substr(start, i - start)));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string suffix;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return std::nullopt;
  double scale;
  if (suffix.empty() || suffix == "b")
    scale = 1;
  else if (suffix == "k" || suffix == "kb" || suffix == "kib")
    scale = 1024.0;
  else if (suffix == "m" || suffix == "mb" || suffix == "mib")
    scale = 1024.0 * 1024;
  else if (suffix == "g" || suffix == "gb" || suffix == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (suffix == "t" || suffix == "tb" || suffix == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    return std::nullopt;
  double bytes = number * scale;
  if (!(bytes >= 0) || bytes > 1.8e19) return std::nullopt;
  return static_cast<std::size_t>(std::llround(bytes));
}

}  // namespace cudapool::tools
