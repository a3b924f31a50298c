// Secure mode: a process whose environment must not be trusted. The kernel says so with
// AT_SECURE for a program that gained privileges when it started (setuid, setgid, file
// capabilities): its environment was set by a less privileged user. In such a process the library
// reads no policy from the environment, opens and creates no file (log, trace, summary, stats
// record), and logs to stderr only (docs/design.md, "Trust model"). CUDAPOOL_SECURE=1 asks for the
// same in any process, to see what a privileged program gets; it can only take away.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace cudapool {

// The decision: `at_secure` is getauxval(AT_SECURE); `forced` the value of CUDAPOOL_SECURE
// (nullptr when unset). Any value but "" and "0" forces secure mode.
bool secure_mode(unsigned long at_secure, const char* forced) noexcept;

// This process's decision.
bool secure_process() noexcept;

// The CUDAPOOL_* variables set in this process's environment, by name (not value): what secure
// mode ignores, for the message that says so.
std::vector<std::string> cudapool_variables_set();

// The one line secure mode logs about itself: why, and what it ignored (`ignored` may be empty).
std::string secure_mode_message(const std::vector<std::string>& ignored);

}  // namespace cudapool
