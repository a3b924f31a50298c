// Helpers shared by the telemetry tests: temp files and whole-file reads.
#pragma once
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
