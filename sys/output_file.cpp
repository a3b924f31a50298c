#include "sys/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "sys/input_file.h"

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

std::string foreign_owner(unsigned owner) {
  return "owned by uid " + std::to_string(owner) + ", not by this process's user (uid " + std::to_string(::geteuid()) +
         "): remove it or choose another path";
}

int open_output_file(const std::string& path, int flags, std::string_view what, std::string* error) {
  // O_TRUNC waits until the file is known to be ours: truncating another user's file would be a
  // write to it.
  const int base = O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (flags & ~O_TRUNC);
  std::string why;
  // A few rounds: the file may be removed between the two opens (then it is created again).
  for (int round = 0; round < 4 && why.empty(); ++round) {
    int fd = ::open(path.c_str(), base | O_CREAT | O_EXCL, kOutputFileMode);
    const bool created = fd >= 0;
    if (!created) {
      if (errno != EEXIST) {
        why = std::strerror(errno);
        break;
      }
      fd = ::open(path.c_str(), base);
      if (fd < 0) {
        const int e = errno;
        if (e == ENOENT) continue;
        struct stat st {};
        if (e == ELOOP && is_symlink(path))
          why = kSymlinkRefused;
        else if ((e == ENXIO || e == EISDIR) && ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
          why = not_a_regular_file(st.st_mode);  // ENXIO: a FIFO with no reader, or a device with none
        else
          why = std::strerror(e);
        break;
      }
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0)
      why = std::strerror(errno);
    else if (!S_ISREG(st.st_mode))
      why = not_a_regular_file(st.st_mode);
    else if (!created && st.st_uid != ::geteuid())  // one created here is ours whatever st_uid says
      why = foreign_owner(st.st_uid);
    else if (!created && (flags & O_TRUNC) != 0 && st.st_size != 0 && ::ftruncate(fd, 0) != 0)
      why = std::strerror(errno);
    else if (const int fl = ::fcntl(fd, F_GETFL); fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
      why = std::strerror(errno);
    if (why.empty()) return fd;
    ::close(fd);
  }
  if (why.empty()) why = "it was removed each time it was opened; try again";
  if (error != nullptr) *error = describe(what, path, why);
  return -1;
}

std::string write_file_atomically(const std::string& path, std::string_view data, std::string_view what) {
  // rename() replaces what is at the path rather than writing into it, but only this user's
  // regular file is replaced: a link, a FIFO or another user's file stays as it is, the same
  // rule as every other output file (and in a sticky directory the rename would fail anyway,
  // after all the work, unless this process may replace anyone's file there).
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return describe(what, path, kSymlinkRefused);
    if (!S_ISREG(st.st_mode)) return describe(what, path, not_a_regular_file(st.st_mode));
    if (st.st_uid != ::geteuid()) return describe(what, path, foreign_owner(st.st_uid));
  }
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
