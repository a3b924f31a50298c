#include "config/path_pattern.h"

#include <unistd.h>

#include <ctime>

namespace cudapool {

std::string expand_path_pattern(std::string_view pattern, long pid, std::string_view host, long long unix_time) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char c = pattern[++i];
    if (c == 'p')
      out += std::to_string(pid);
    else if (c == 'h')
      out += host;
    else if (c == 't')
      out += std::to_string(unix_time);
    else if (c == '%')
      out += '%';
    else {
      out += '%';
      out += c;
    }
  }
  return out;
}

std::string expand_path_pattern(std::string_view pattern) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return expand_path_pattern(pattern, static_cast<long>(::getpid()), host[0] != '\0' ? host : "unknown-host",
                             static_cast<long long>(std::time(nullptr)));
}

std::string per_process_pattern(std::string_view pattern) {
  for (std::size_t i = 0; i + 1 < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (pattern[i + 1] == 'p') return std::string(pattern);
    ++i;  // "%%" and any other "%x" are one unit: "%%p" is a literal "%p", not the pid
  }
  const std::size_t slash = pattern.find_last_of('/');
  const std::size_t name = slash == std::string_view::npos ? 0 : slash + 1;
  std::size_t dot = pattern.find_last_of('.');
  // No extension: no dot in the last component, or only a leading one (".cudapool").
  if (dot == std::string_view::npos || dot <= name) dot = pattern.size();
  return std::string(pattern.substr(0, dot)) + ".%p" + std::string(pattern.substr(dot));
}

}  // namespace cudapool
