#include "sys/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cudapool {

const char* file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "an unknown kind of file";
  }
}

std::string not_a_regular_file(unsigned mode) {
  return std::string("not a regular file (") + file_kind(mode) + "): give the path of a regular file";
}

int open_input_file(const std::string& path, std::string* why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    if (why != nullptr) *why = std::strerror(e);
    errno = e;
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    if (why != nullptr) *why = std::strerror(e);
    errno = e;
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    if (why != nullptr) *why = not_a_regular_file(st.st_mode);
    errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int e = errno;
    ::close(fd);
    if (why != nullptr) *why = std::strerror(e);
    errno = e;
    return -1;
  }
  return fd;
}

InputFileBuf::~InputFileBuf() {
  if (fd_ >= 0) ::close(fd_);
}

InputFileBuf::int_type InputFileBuf::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  if (fd_ < 0 || error_ != 0) return traits_type::eof();
  ssize_t n;
  do {
    n = ::read(fd_, buf_, sizeof buf_);
  } while (n < 0 && errno == EINTR);
  if (n < 0) error_ = errno;
  if (n <= 0) return traits_type::eof();
  setg(buf_, buf_, buf_ + n);
  return traits_type::to_int_type(*gptr());
}

}  // namespace cudapool
