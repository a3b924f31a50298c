// libFuzzer target: the warm-start plan parser and the plan a trace gives, on arbitrary bytes.
// Besides "never crash", it checks that a refusal names a line, that an accepted plan keeps the
// bounds a pool relies on (sizes, counts, split sums), and that it survives format -> parse.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "telemetry/warm_plan.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz check failed: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void check_plan(const cudapool::WarmPlan& p) {
  using namespace cudapool;
  if (p.segments.size() > kMaxWarmSegments) fail("more segments than the bound", std::to_string(p.segments.size()));
  for (const WarmSegment& s : p.segments) {
    if (s.device < 0 || s.device > 1023) fail("a device out of range", std::to_string(s.device));
    if (s.bytes == 0 || s.bytes > kMaxWarmSegmentBytes) fail("a segment size out of range", std::to_string(s.bytes));
    std::size_t sum = 0;
    for (std::size_t b : s.split) sum += b;
    if (!s.split.empty() && sum != s.bytes) fail("a split that does not add up", format_warm_plan(p));
    if (s.split.size() > kMaxWarmSplit) fail("a split past the bound", std::to_string(s.split.size()));
  }
  for (const WarmDevice& d : p.devices)
    if (p.bytes(d.device) > kMaxWarmDeviceBytes) fail("a device past 64 TiB", std::to_string(d.device));
  WarmPlan back;
  std::string err;
  const std::string text = format_warm_plan(p);
  if (!parse_warm_plan(text, &back, &err)) fail("a plan's own file was refused", err + "\n" + text);
  if (format_warm_plan(back) != text) fail("format -> parse changed a plan", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool;
  const std::string text(reinterpret_cast<const char*>(data), size);
  WarmPlan plan;
  std::string err;
  if (parse_warm_plan(text, &plan, &err))
    check_plan(plan);
  else if (err.rfind("line ", 0) != 0)
    fail("a plan error without a line number", err);
  std::istringstream in(text);
  if (warm_plan_from_trace(in, &plan, &err))
    check_plan(plan);
  else if (err.rfind("line ", 0) != 0)
    fail("a trace error without a line number", err);
  return 0;
}
