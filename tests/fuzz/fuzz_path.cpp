// libFuzzer target: the path patterns (config/path_pattern.h) and printable() on arbitrary bytes.
// The input is split at its first NUL into a pattern and a host name.
#include <string>
#include <string_view>

#include "config/path_pattern.h"
#include "sys/printable.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = in.find('\0');
  const std::string_view pattern = in.substr(0, nul);
  const std::string_view host = nul == std::string_view::npos ? "h" : in.substr(nul + 1);
  const std::string out = expand_path_pattern(pattern, 4242, host, 1700000000);
  if (pattern.find('%') == std::string_view::npos && out != pattern) fuzz::fail("a plain path changed", out);
  // Each pattern character yields at most the longest expansion (the host, or 10 digits).
  if (out.size() > pattern.size() * (host.size() + 10) + 1) fuzz::fail("an expansion out of proportion", out);
  const std::string own = per_process_pattern(pattern);
  if (per_process_pattern(own) != own) fuzz::fail("per_process_pattern is not idempotent", own);
  if (expand_path_pattern(own, 4242, "h", 1).find("4242") == std::string::npos)
    fuzz::fail("a per-process pattern without the pid", own);
  const std::string shown = printable(in);
  for (char c : shown)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fuzz::fail("printable() kept a control character", shown);
  if (printable(shown) != shown) fuzz::fail("printable() output is not printable", shown);
  return 0;
}
