#include "tools/gzip_input.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <streambuf>

#include "sys/input_file.h"

namespace cudapool::tools {

bool is_gzip_file(const std::string& path) {
  const int fd = open_input_file(path, nullptr);
  if (fd < 0) return false;
  unsigned char magic[2] = {0, 0};
  const ssize_t n = ::read(fd, magic, sizeof magic);
  ::close(fd);
  return n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

// zlib's gzread behind a std::streambuf: each underflow decompresses the next 64 KiB.
struct GzipInput::Buf : std::streambuf {
  gzFile file = nullptr;
  std::array<char, 64 * 1024> data{};
  std::string error;

  explicit Buf(int fd) {
    if (fd < 0) return;
    file = gzdopen(fd, "rb");  // owns fd from here
    if (file == nullptr) ::close(fd);
  }
  ~Buf() override {
    if (file != nullptr) gzclose(file);
  }
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (file == nullptr || !error.empty()) return traits_type::eof();
    const int n = gzread(file, data.data(), static_cast<unsigned>(data.size()));
    if (n <= 0) {
      int code = Z_OK;
      const char* what = gzerror(file, &code);
      if (n < 0 || code != Z_OK) {
        std::string msg = what != nullptr ? what : "";
        if (msg.rfind("<fd:", 0) == 0 && msg.find(": ") != std::string::npos)
          msg = msg.substr(msg.find(": ") + 2);  // zlib names the descriptor gzdopen got
        error = "damaged or truncated gzip data (zlib: " + msg + ")";
      }
      return traits_type::eof();
    }
    setg(data.data(), data.data(), data.data() + n);
    return traits_type::to_int_type(*gptr());
  }
};

GzipInput::GzipInput(const std::string& path) : GzipInput(open_input_file(path, nullptr)) {}
GzipInput::GzipInput(int fd) : buf_(std::make_unique<Buf>(fd)), in_(std::make_unique<std::istream>(buf_.get())) {}
GzipInput::~GzipInput() = default;
bool GzipInput::opened() const { return buf_->file != nullptr; }
std::istream& GzipInput::stream() { return *in_; }
std::string GzipInput::error() const { return buf_->error; }
void GzipInput::drain(std::uint64_t max_bytes) {
  in_->clear();
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::streamsize>::max());
  in_->ignore(static_cast<std::streamsize>(std::min(max_bytes, kMax)));
}

}  // namespace cudapool::tools
