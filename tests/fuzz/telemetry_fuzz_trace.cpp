// libFuzzer target: the strict trace reader on arbitrary bytes. Besides "never crash", it checks
// that a refusal names a line and that every accepted cudapool row survives format → parse.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "telemetry/trace.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz check failed: %s\n%s\n", what, detail.c_str());
  std::abort();
}

bool same(const cudapool::TraceRow& a, const cudapool::TraceRow& b) {
  return a.thread == b.thread && a.time_ns == b.time_ns && a.action == b.action && a.ptr == b.ptr && a.size == b.size &&
         a.stream == b.stream && a.device == b.device && a.requested == b.requested && a.duration_ns == b.duration_ns;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  TraceReader reader(in);
  TraceRow row;
  while (reader.next(&row)) {
    if (reader.rmm_only()) continue;  // RMM rows have no time_ns column to round-trip
    std::istringstream again(std::string(trace_header()) + "\n" + format_trace_row(row) + "\n");
    TraceReader r2(again);
    TraceRow back;
    if (!r2.next(&back)) fail("a row read back from its own formatting was refused", r2.error());
    if (!same(row, back)) fail("format → parse changed a row", format_trace_row(row));
  }
  if (!reader.error().empty() && reader.error().rfind("line ", 0) != 0)
    fail("an error without a line number", reader.error());
  return 0;
}
