#include "sys/secure.h"

#include <sys/auxv.h>

#include <cstdlib>
#include <cstring>

extern char** environ;

namespace cudapool {

bool secure_mode(unsigned long at_secure, const char* forced) noexcept {
  if (at_secure != 0) return true;
  return forced != nullptr && forced[0] != '\0' && std::strcmp(forced, "0") != 0;
}

bool secure_process() noexcept {
  // secure_getenv: in a process that really is secure it answers nullptr, but AT_SECURE already
  // decided there.
  return secure_mode(::getauxval(AT_SECURE), ::secure_getenv("CUDAPOOL_SECURE"));
}

std::vector<std::string> cudapool_variables_set() {
  std::vector<std::string> out;
  constexpr std::string_view kPrefix = "CUDAPOOL_";
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv = *e;
    const std::size_t eq = kv.find('=');
    if (eq == std::string_view::npos || kv.substr(0, kPrefix.size()) != kPrefix) continue;
    const std::string_view name = kv.substr(0, eq);
    if (name == "CUDAPOOL_SECURE") continue;
    // A name is printed: only the characters a variable name is made of.
    if (name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") !=
        std::string_view::npos)
      continue;
    out.emplace_back(name);
  }
  return out;
}

std::string secure_mode_message(const std::vector<std::string>& ignored) {
  std::string s =
      "secure mode (a setuid, setgid or file-capability program, or CUDAPOOL_SECURE): the policy is the "
      "default and comes from nowhere else, no file is written (log, trace, summary, stats record) and the "
      "log goes to stderr";
  if (!ignored.empty()) {
    s += "; ignored:";
    for (std::size_t i = 0; i < ignored.size(); ++i) s += (i == 0 ? " " : ", ") + ignored[i];
  }
  return s;
}

}  // namespace cudapool
