// libFuzzer target: a gzip-compressed trace, read as `cudapool` reads one (tools/trace_input.cpp):
// zlib through GzipInput, the strict trace reader, and on a malformed row the rest drained for
// damage. Besides "never crash" and "never hang" (the reader's bounds, telemetry/trace.h, and
// drain's): a refused trace says why, and damage is only ever reported in one form, with
// zlib's reason. The input goes to a memfd, as the tools read from a file descriptor.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "telemetry/trace.h"
#include "tools/gzip_input.h"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool;
  const int fd = ::memfd_create("trace.csv.gz", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  for (std::size_t off = 0; off < size;) {
    const ssize_t n = ::write(fd, data + off, size - off);
    if (n <= 0) std::abort();
    off += static_cast<std::size_t>(n);
  }
  if (::lseek(fd, 0, SEEK_SET) != 0) std::abort();
  tools::GzipInput gz(fd);
  if (!gz.opened()) std::abort();  // gzdopen of a readable descriptor does not fail
  std::vector<TraceRow> rows;
  std::string error;
  TraceMeta meta;
  const bool read = read_trace_stream(gz.stream(), "f", &rows, &error, &meta);
  if (!read) {
    if (error.empty()) std::abort();    // a refusal says why
    gz.drain(std::uint64_t{64} << 20);  // as tools/trace_input.cpp does
  }
  const std::string damage = gz.error();
  if (!damage.empty() && damage.rfind("damaged or truncated gzip data (zlib: ", 0) != 0) {
    std::fprintf(stderr, "unexpected gzip error text: %s\n", damage.c_str());
    std::abort();
  }
  return 0;
}
