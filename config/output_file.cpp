#include "config/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cudapool {
namespace {

constexpr const char* kSymlinkRefused = "refusing to write through a symbolic link";

bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

std::string describe(std::string_view what, const std::string& path, const std::string& why) {
  return "cannot open " + std::string(what) + " '" + path + "': " + why;
}

}  // namespace

namespace {

// write(2) (offset < 0) or pwrite(2) until everything is written.
bool write_all(int fd, const char* data, std::size_t size, off_t offset) {
  while (size > 0) {
    const ssize_t w = offset < 0 ? ::write(fd, data, size) : ::pwrite(fd, data, size, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return false;
    }
    data += w;
    size -= static_cast<std::size_t>(w);
    if (offset >= 0) offset += w;
  }
  return true;
}

}  // namespace

bool write_all_fd(int fd, const char* data, std::size_t size) { return write_all(fd, data, size, -1); }

bool write_all_at(int fd, const void* data, std::size_t size, std::size_t offset) {
  return write_all(fd, static_cast<const char*>(data), size, static_cast<off_t>(offset));
}

int open_output_file(const std::string& path, int flags, std::string_view what, std::string* error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | flags, kOutputFileMode);
  if (fd >= 0) return fd;
  const int e = errno;
  // O_NOFOLLOW reports a link at the last component as ELOOP; say so plainly.
  if (error != nullptr)
    *error = describe(what, path, e == ELOOP && is_symlink(path) ? kSymlinkRefused : std::strerror(e));
  return -1;
}

std::string write_file_atomically(const std::string& path, std::string_view data, std::string_view what) {
  // rename() replaces a link rather than writing through it, but a link there is still refused:
  // the same rule as every other output file, and the link's owner keeps their link.
  if (is_symlink(path)) return describe(what, path, kSymlinkRefused);
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string tmpl = dir + "." + base + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const int fd = ::mkostemp(buf.data(), O_CLOEXEC);  // O_CREAT | O_EXCL, mode 0600
  if (fd < 0)
    return "cannot create a temporary file for " + std::string(what) + " '" + path +
           "' in its directory: " + std::strerror(errno);
  const std::string tmp(buf.data());
  if (!write_all_fd(fd, data.data(), data.size())) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    return "cannot write '" + tmp + "': " + why;
  }
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return "cannot write '" + tmp + "': " + why;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return "cannot rename to '" + path + "': " + why;
  }
  return "";
}

}  // namespace cudapool
