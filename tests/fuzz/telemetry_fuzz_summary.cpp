// libFuzzer target: the JSON summary reader on arbitrary bytes. An accepted summary must be a
// fixed point of to_json → from_json, what to_json writes valid UTF-8 whatever bytes the strings
// it was read with hold, and a refusal must say why.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "telemetry/summary_reader.h"
#include "tests/support/utf8_check.h"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool;
  Summary s;
  std::string err;
  if (!from_json(std::string_view(reinterpret_cast<const char*>(data), size), &s, &err)) {
    if (err.empty()) {
      std::fprintf(stderr, "refused without a reason\n");
      std::abort();
    }
    return 0;
  }
  const std::string once = to_json(s);
  if (!test::valid_utf8(once)) {
    std::fprintf(stderr, "to_json wrote invalid UTF-8 at byte %zu:\n%s\n", test::first_invalid_utf8(once),
                 once.c_str());
    std::abort();
  }
  Summary back;
  if (!from_json(once, &back, &err)) {
    std::fprintf(stderr, "own output refused: %s\n%s\n", err.c_str(), once.c_str());
    std::abort();
  }
  if (to_json(back) != once) {
    std::fprintf(stderr, "to_json is not a fixed point:\n%s\n", once.c_str());
    std::abort();
  }
  return 0;
}
