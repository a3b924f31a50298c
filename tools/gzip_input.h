// Reading gzip-compressed traces (the project ships its GPU traces as .csv.gz): a file that
// starts with gzip's magic bytes is read through zlib, any other file as it is. Decompression
// streams, so memory follows the rows kept, not the file. A crafted file may inflate about 1032
// bytes per byte (deflate's own limit) and more through many members: the reader bounds the text
// it takes (TraceLimits, telemetry/trace.h) and drain() the rest it decompresses.
#pragma once
#include <cstdint>
#include <istream>
#include <memory>
#include <string>

namespace cudapool::tools {

// True when the file at `path` begins with gzip's two magic bytes (false when it cannot be read).
bool is_gzip_file(const std::string& path);

// An input stream over the decompressed bytes of a gzip file. After reading stops, error() says
// why when it was not the end of the data ("damaged or truncated gzip data (zlib: …)"); empty
// otherwise.
class GzipInput {
 public:
  // Opens `path` as sys/input_file.h says (anything but a regular file is not opened).
  explicit GzipInput(const std::string& path);
  // Reads the descriptor `fd` (from its current offset) and closes it when done.
  explicit GzipInput(int fd);
  ~GzipInput();
  GzipInput(const GzipInput&) = delete;
  GzipInput& operator=(const GzipInput&) = delete;
  bool opened() const;
  std::istream& stream();
  std::string error() const;
  // Decompresses what is left unread, up to `max_bytes` of it, discarding it, so that error()
  // also covers the rest (its length and CRC): damage that first shows as a malformed row is then
  // reported as damage. Beyond `max_bytes` it stops: a malformed row of a file that inflates to
  // gigabytes is reported as that row, at once.
  void drain(std::uint64_t max_bytes);

 private:
  struct Buf;
  std::unique_ptr<Buf> buf_;
  std::unique_ptr<std::istream> in_;
};

}  // namespace cudapool::tools
