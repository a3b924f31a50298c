// Opening the files the library and the tools write and read (sys/output_file.h,
// sys/input_file.h): nothing at a path blocks the open, anything but a regular file is
// refused, and a file another user owns is never written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sys/input_file.h"
#include "sys/output_file.h"
#include "tests/unit/bounded_child.h"

namespace cudapool {
namespace {

constexpr uid_t kOtherUid = 65534;  // "nobody": any uid but this process's

bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// A fresh directory under $TMPDIR (or /tmp), removed with what is in it.
class TempDir {
 public:
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string templ = std::string(t != nullptr && *t != '\0' ? t : "/tmp") + "/cudapool_files_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// A file that another user made writable by everyone: `text`, mode 0666, owned by kOtherUid.
// false where this process may not give a file away (not root).
bool plant_foreign_file(const std::string& path, const std::string& text) {
  write_text(path, text);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool given = ::fchmod(fd, 0666) == 0 && ::fchown(fd, kOtherUid, kOtherUid) == 0;
  ::close(fd);
  return given;
}

// What open_output_file says for `path`, run where a blocking open fails the test instead of
// hanging it; "opened" if it gave a descriptor.
testing::BoundedRun open_output_bounded(const std::string& path, int flags) {
  return testing::run_bounded([&] {
    std::string err;
    const int fd = open_output_file(path, flags, "trace file", &err);
    if (fd < 0) return err;
    ::close(fd);
    return std::string("opened");
  });
}

TEST(OutputFile, FifoIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir / "out.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (int flags : {O_TRUNC, O_APPEND}) {
    const testing::BoundedRun r = open_output_bounded(fifo, flags);
    ASSERT_TRUE(r.finished) << r.describe();
    EXPECT_EQ(r.answer,
              "cannot open trace file '" + fifo + "': not a regular file (a FIFO): give the path of a regular file");
  }
}

TEST(OutputFile, FifoWithAReaderIsRefusedAndGetsNothing) {
  TempDir dir;
  const std::string fifo = dir / "out.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  std::string err;
  const int fd = open_output_file(fifo, O_TRUNC, "output file", &err);
  if (fd >= 0) ::close(fd);
  EXPECT_LT(fd, 0);
  EXPECT_TRUE(has(err, "not a regular file (a FIFO)")) << err;
  char c;
  EXPECT_EQ(::read(reader, &c, 1), 0);  // no writer left and nothing written
  ::close(reader);
}

TEST(OutputFile, DevicesAndDirectoriesAreRefused) {
  TempDir dir;
  std::string err;
  EXPECT_LT(open_output_file("/dev/null", O_APPEND, "log file", &err), 0);
  EXPECT_EQ(err,
            "cannot open log file '/dev/null': not a regular file (a character device): give the path of a "
            "regular file");
  EXPECT_LT(open_output_file(dir.str(), O_TRUNC, "log file", &err), 0);
  EXPECT_TRUE(has(err, "not a regular file (a directory)")) << err;
}

TEST(OutputFile, AnotherUsersFileIsNeverWritten) {
  TempDir dir;
  ASSERT_EQ(::chmod(dir.str().c_str(), 01777), 0);  // a shared directory, as /tmp
  const std::string path = dir / "trace.csv";
  if (!plant_foreign_file(path, "theirs\n")) GTEST_SKIP() << "cannot give a file to uid 65534 (needs root)";
  for (int flags : {O_TRUNC, O_APPEND}) {
    std::string err;
    const int fd = open_output_file(path, flags, "trace file", &err);
    if (fd >= 0) ::close(fd);
    EXPECT_LT(fd, 0);
    EXPECT_EQ(err, "cannot open trace file '" + path + "': owned by uid 65534, not by this process's user (uid " +
                       std::to_string(::geteuid()) + "): remove it or choose another path");
    EXPECT_EQ(read_all(path), "theirs\n");
  }
  // Replacing it as a whole is refused the same way, and it stays.
  EXPECT_TRUE(has(write_file_atomically(path, "ours\n", "summary file"), "owned by uid 65534")) << path;
  EXPECT_EQ(read_all(path), "theirs\n");
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kOtherUid);
}

TEST(OutputFile, NewFileIsCreatedAndOwnFileIsReused) {
  TempDir dir;
  const std::string path = dir / "log.txt";
  std::string err;
  int fd = open_output_file(path, O_APPEND, "log file", &err);
  ASSERT_GE(fd, 0) << err;
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);  // ordinary blocking writes
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  ASSERT_TRUE(write_all_fd(fd, "abc", 3));
  ::close(fd);
  fd = open_output_file(path, O_APPEND, "log file", &err);
  ASSERT_GE(fd, 0) << err;
  ASSERT_TRUE(write_all_fd(fd, "def", 3));
  ::close(fd);
  EXPECT_EQ(read_all(path), "abcdef");
  fd = open_output_file(path, O_TRUNC, "log file", &err);
  ASSERT_GE(fd, 0) << err;
  ASSERT_TRUE(write_all_fd(fd, "g", 1));
  ::close(fd);
  EXPECT_EQ(read_all(path), "g");
}

TEST(OutputFile, AtomicWriteLeavesWhatIsNotARegularFile) {
  TempDir dir;
  const std::string fifo = dir / "summary.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(write_file_atomically(fifo, "{}\n", "summary file"),
            "cannot open summary file '" + fifo + "': not a regular file (a FIFO): give the path of a regular file");
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(std::system(("test -z \"$(ls -A '" + dir.str() + "' | grep -v '^summary.json$')\"").c_str()), 0)
      << "a temporary file was left";
  // This user's own file is replaced.
  const std::string own = dir / "own.json";
  write_text(own, "old\n");
  EXPECT_EQ(write_file_atomically(own, "new\n", "summary file"), "");
  EXPECT_EQ(read_all(own), "new\n");
}

TEST(InputFile, OnlyARegularFileIsOpenedAndNothingBlocks) {
  TempDir dir;
  const std::string fifo = dir / "in.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const testing::BoundedRun r = testing::run_bounded([&] {
    std::string why;
    const int fd = open_input_file(fifo, &why);
    if (fd >= 0) ::close(fd);
    return std::to_string(fd) + " " + std::to_string(errno) + " " + why;
  });
  ASSERT_TRUE(r.finished) << r.describe();
  EXPECT_EQ(r.answer, "-1 " + std::to_string(EINVAL) + " not a regular file (a FIFO): give the path of a regular file");
  std::string why;
  EXPECT_LT(open_input_file("/dev/null", &why), 0);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(why, "not a regular file (a character device): give the path of a regular file");
  EXPECT_LT(open_input_file(dir.str(), &why), 0);
  EXPECT_EQ(errno, EISDIR);
  EXPECT_LT(open_input_file(dir / "missing", &why), 0);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(why, std::strerror(ENOENT));
  // A regular file: blocking reads, not inherited by a program it starts, read whole through
  // the stream buffer.
  const std::string file = dir / "in.txt";
  write_text(file, "line 1\nline 2\n");
  const int fd = open_input_file(file, &why);
  ASSERT_GE(fd, 0) << why;
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  InputFileBuf buf(fd);
  std::istream in(&buf);
  std::string a, b, c;
  EXPECT_TRUE(std::getline(in, a) && std::getline(in, b));
  EXPECT_FALSE(std::getline(in, c));
  EXPECT_EQ(a + "|" + b, "line 1|line 2");
  EXPECT_FALSE(buf.failed());
}

}  // namespace
}  // namespace cudapool
