// Helpers shared by the telemetry tests: temp files and whole-file reads.
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace cudapool::testing {

// A fresh path under $TMPDIR (or /tmp), removed when the object goes out of scope.
class TempPath {
 public:
  explicit TempPath(const std::string& suffix = ".csv") {
    const char* dir = std::getenv("TMPDIR");
    std::string templ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/cudapool_telemetry_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    int fd = ::mkstemp(buf.data());
    if (fd >= 0) ::close(fd);
    base_ = buf.data();
    path_ = base_ + suffix;
    ::unlink(base_.c_str());
  }
  ~TempPath() { std::remove(path_.c_str()); }
  const std::string& str() const { return path_; }

 private:
  std::string base_, path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A file that a writer must never change, to which tests plant symbolic links.
class Victim {
 public:
  static constexpr const char* kText = "precious contents\n";
  Victim() : path_(".victim") { std::ofstream(path_.str(), std::ios::binary) << kText; }
  const std::string& str() const { return path_.str(); }
  bool untouched() const { return read_file(path_.str()) == kText; }

 private:
  TempPath path_;
};

// A file another user left writable by everyone where a writer will look: kText, mode 0666, owned
// by uid 65534. given() is false where this process may not give a file away (not root).
class ForeignFile {
 public:
  static constexpr const char* kText = "another user's file\n";
  explicit ForeignFile(const std::string& suffix) : path_(suffix) {
    std::ofstream(path_.str(), std::ios::binary) << kText;
    given_ = ::chmod(path_.str().c_str(), 0666) == 0 && ::chown(path_.str().c_str(), 65534, 65534) == 0;
  }
  const std::string& str() const { return path_.str(); }
  bool given() const { return given_; }
  bool untouched() const {
    struct stat st {};
    return read_file(path_.str()) == kText && ::lstat(path_.str().c_str(), &st) == 0 && st.st_uid == 65534;
  }

 private:
  TempPath path_;
  bool given_ = false;
};

inline bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// The permission bits of `path` (not following a link); -1 if it does not exist.
inline int file_mode(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

// Whether this process's descriptor open on `path` is close-on-exec: 1 yes, 0 no, -1 when no
// descriptor is open on it.
inline int cloexec_of_open_file(const std::string& path) {
  int result = -1;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return result;
  while (dirent* e = ::readdir(d)) {
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    char target[4096];
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0 || std::string(target, static_cast<std::size_t>(n)) != path) continue;
    const int flags = ::fcntl(std::atoi(e->d_name), F_GETFD);
    if (flags >= 0) result = (flags & FD_CLOEXEC) != 0 ? 1 : 0;
  }
  ::closedir(d);
  return result;
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

}  // namespace cudapool::testing
