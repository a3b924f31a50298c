#include "telemetry/share.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

namespace cudapool::share {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared counters must be lock-free");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared futex words must be lock-free");
static_assert(sizeof(std::atomic<std::uint32_t>) == 4, "futex words are 32 bits");

std::string shm_dir() {
  const char* d = ::secure_getenv("CUDAPOOL_SHM_DIR");
  return d != nullptr && *d != '\0' ? std::string(d) : std::string("/dev/shm");
}

std::string record_prefix(unsigned uid) { return "cudapool-" + std::to_string(uid) + "-p-"; }

std::string record_path(unsigned uid, int pid) { return shm_dir() + "/" + record_prefix(uid) + std::to_string(pid); }

std::string check_dir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return std::string("cannot be read: ") + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  // Other users must not be able to replace our files: either the directory is ours and only
  // ours to write, or it is sticky (/dev/shm, /tmp), where nobody removes another user's file.
  const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (others_write && (st.st_mode & S_ISVTX) == 0) return "is writable by other users and not sticky";
  if (st.st_uid != ::geteuid() && st.st_uid != 0) return "belongs to another user";
  return {};
}

std::uint64_t process_start_time(int pid) {
  if (pid <= 0) return 0;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from the LAST ')'. starttime is field 22, the 20th after it.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  ++p;
  for (int field = 3; field < 22; ++field) {
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
    if (*p == '\0') return 0;
  }
  while (*p == ' ') ++p;
  return std::strtoull(p, nullptr, 10);
}

std::uint64_t pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

Liveness process_liveness(int pid, std::uint64_t start_time, std::uint64_t pid_ns) {
  const std::uint64_t own = pid_namespace();
  if (pid_ns == 0 || own == 0 || pid_ns != own) return Liveness::unknown;  // its pid means nothing here
  if (pid <= 0) return Liveness::gone;  // no process ever had it: a record of nothing
  if (::kill(pid, 0) != 0 && errno == ESRCH) return Liveness::gone;
  const std::uint64_t now = process_start_time(pid);
  if (now == 0 || start_time == 0) {
    // The pid exists, or kill could not tell; /proc may be hidden (hidepid) or raced an exit;
    // or the caller knows no start time. Only a second look that finds no such process settles it.
    return ::kill(pid, 0) != 0 && errno == ESRCH ? Liveness::gone : Liveness::unknown;
  }
  return now == start_time ? Liveness::alive : Liveness::gone;
}

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

namespace {

std::string describe_mode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

const char* type_name(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "a file of unknown type";
}

}  // namespace

std::string user_name(unsigned uid) {
  // /etc/passwd alone, read as data: no name service (it may load modules or ask the network, and
  // this runs inside other programs), nothing but a regular file, a bounded read.
  const int fd = ::open("/etc/passwd", O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return {};
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_size <= (4 << 20)) {
    text.resize(static_cast<std::size_t>(st.st_size));
    const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
    text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  }
  ::close(fd);
  const std::string want = std::to_string(uid);
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    // name:password:uid:...
    const std::size_t c1 = line.find(':'), c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    const std::size_t c3 = c2 == std::string_view::npos ? c2 : line.find(':', c2 + 1);
    if (c3 == std::string_view::npos || line.substr(c2 + 1, c3 - c2 - 1) != want || c1 == 0 || c1 > 64) continue;
    const std::string_view name = line.substr(0, c1);
    bool plain = true;
    for (const char ch : name) plain = plain && ch > ' ' && ch < 0x7f;
    if (plain) return std::string(name);
  }
  return {};
}

std::string describe_file(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "gone" : std::string("cannot be examined: ") + std::strerror(errno);
  const auto uid = static_cast<unsigned>(st.st_uid);
  const std::string name = user_name(uid);
  return "owner uid " + std::to_string(uid) + (name.empty() ? std::string() : " (" + name + ")") + ", " +
         type_name(st.st_mode) + ", mode " + describe_mode(st.st_mode);
}

namespace {

// Creates `path` (O_EXCL) at `size` bytes, mode 0600: its descriptor; -1 with m.error set when it
// cannot be, -1 with no error when something is there already.
int create_exclusive(const std::string& path, std::size_t size, Mapping& m) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  if (fd >= 0) {
    // The umask may have taken bits away; the file is ours alone whatever it says.
    if (::fchmod(fd, 0600) != 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      m.error = std::string("cannot set up: ") + std::strerror(errno);
      ::close(fd);
      ::unlink(path.c_str());
      return -1;
    }
    m.created = true;
    return fd;
  }
  if (errno != EEXIST) {
    m.foreign = errno == ELOOP;
    m.error = errno == ELOOP ? "is a symbolic link" : std::string("cannot be created: ") + std::strerror(errno);
  }
  return -1;
}

// Opens what is at `path`: its descriptor; -1 with m.error set when it cannot be, -1 with no error
// when it was removed meanwhile and `again` (it may be created again). Nothing but a regular file
// is ever opened: a FIFO or a device at the name could block the open or act on it (the
// descriptor is checked again afterwards).
int open_existing(const std::string& path, bool again, uid_t uid, Mapping& m) {
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno == ENOENT && again) return -1;
    m.error = std::string("cannot be examined: ") + std::strerror(errno);
    return -1;
  }
  if (!S_ISREG(lst.st_mode)) {
    m.foreign = true;
    m.error = S_ISLNK(lst.st_mode) ? std::string("is a symbolic link")
                                   : std::string("is not a regular file (") + type_name(lst.st_mode) + ")";
    return -1;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT && again) return -1;
    // Not ours to open (another owner, another mode) or replaced by a link meanwhile: someone
    // else could have written it.
    m.foreign = errno == ELOOP || lst.st_uid != uid || (lst.st_mode & 07777) != 0600;
    m.error = errno == ELOOP ? "is a symbolic link" : std::string("cannot be opened: ") + std::strerror(errno);
    return -1;
  }
  return fd;
}

// The file's descriptor, created first when `create`; -1 with m.error set. A file removed between
// a failed O_EXCL and the open that follows is created again (twice at most: a third
// disappearance is someone's doing).
int open_or_create(const std::string& path, std::size_t size, bool create, uid_t uid, Mapping& m) {
  for (int attempt = 0;; ++attempt) {
    if (create) {
      const int fd = create_exclusive(path, size, m);
      if (fd >= 0 || !m.error.empty()) return fd;
    }
    const int fd = open_existing(path, create && attempt < 2, uid, m);
    if (fd >= 0 || !m.error.empty()) return fd;
  }
}

// Why an opened file is not this user's private regular file, or "".
std::string not_private(const struct stat& st, uid_t uid) {
  if (!S_ISREG(st.st_mode)) return std::string("is not a regular file (") + type_name(st.st_mode) + ")";
  if (st.st_uid != uid)
    return "belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " + std::to_string(uid) + ")";
  if ((st.st_mode & 07777) != 0600)
    return "has mode " + describe_mode(st.st_mode) + ", not 0600 (other users could write it)";
  return {};
}

// Whether the open file `fd` is this user's private regular file of `size` bytes, waiting up to
// wait_ms for its creator to size it; if not, `fd` is closed and m.error says why.
bool has_layout(int fd, std::size_t size, int wait_ms, uid_t uid, Mapping& m) {
  struct stat st {};
  for (int waited = 0;; ++waited) {
    if (::fstat(fd, &st) != 0) {
      m.error = std::string("cannot be examined: ") + std::strerror(errno);
      ::close(fd);
      return false;
    }
    m.error = not_private(st, uid);
    if (!m.error.empty()) {
      m.foreign = true;
      ::close(fd);
      return false;
    }
    if (static_cast<std::size_t>(st.st_size) == size) return true;
    // A size of 0: its creator has not truncated it yet. Anything else is another layout.
    if (st.st_size != 0 || waited >= wait_ms) {
      m.error = "has " + std::to_string(st.st_size) + " bytes, not the " + std::to_string(size) +
                " bytes of this version's layout";
      ::close(fd);
      return false;
    }
    ::usleep(1000);
  }
}

}  // namespace

Mapping open_file(const std::string& path, std::size_t size, bool create, int wait_ms, long owner) {
  Mapping m;
  const auto uid = static_cast<uid_t>(owner == kEffectiveUid ? static_cast<long>(::geteuid()) : owner);
  const int fd = open_or_create(path, size, create, uid, m);
  if (fd < 0 || !has_layout(fd, size, wait_ms, uid, m)) return m;
  m.fd = fd;
  m.size = size;
  return m;
}

Mapping map_file(const std::string& path, std::size_t size, bool create, int wait_ms, long owner) {
  Mapping m = open_file(path, size, create, wait_ms, owner);
  if (m.fd < 0) return m;
  void* a = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
  if (a == MAP_FAILED) {
    m.error = std::string("cannot be mapped: ") + std::strerror(errno);
    ::close(m.fd);
    m.fd = -1;
    return m;
  }
  m.addr = a;
  return m;
}

bool still_whole(const Mapping& m) {
  struct stat st {};
  return m.fd >= 0 && ::fstat(m.fd, &st) == 0 && st.st_size >= 0 && static_cast<std::size_t>(st.st_size) >= m.size;
}

void unmap(Mapping& m) {
  if (m.addr != nullptr) ::munmap(m.addr, m.size);
  if (m.fd >= 0) ::close(m.fd);
  m.addr = nullptr;
  m.fd = -1;
}

std::string bounded_string(const char* field, std::size_t n) {
  const void* nul = std::memchr(field, '\0', n);
  return std::string(field, nul != nullptr ? static_cast<std::size_t>(static_cast<const char*>(nul) - field) : n);
}

namespace {

// A consistent copy of the record in `fd` (the owner may be writing): the seqlock's even value
// before and after the copy must match. false after a few tries (a writer that died mid-update),
// or when the file reads short (truncated).
bool read_record(int fd, unsigned char (&buf)[sizeof(ProcRecord)]) {
  constexpr std::size_t kSeqAt = offsetof(ProcRecord, seq);
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (::pread(fd, buf, sizeof buf, 0) != static_cast<ssize_t>(sizeof buf)) return false;
    std::uint32_t s1 = 0, s2 = 0;
    std::memcpy(&s1, buf + kSeqAt, sizeof s1);
    if ((s1 & 1) == 0) {
      seqlock_fence(std::memory_order_acquire);
      if (::pread(fd, &s2, sizeof s2, static_cast<off_t>(kSeqAt)) != static_cast<ssize_t>(sizeof s2)) return false;
      if (s1 == s2) return true;
    }
    ::usleep(200);
  }
  return false;
}

}  // namespace

bool parse_record(const void* data, std::size_t bytes, int pid, ProcRecord* out, std::string* why) {
  if (bytes != sizeof(ProcRecord)) {
    *why = std::to_string(bytes) + " bytes, not " + std::to_string(sizeof(ProcRecord));
    return false;
  }
  std::memcpy(static_cast<void*>(out), data, sizeof *out);
  if (out->magic != kRecordMagic)
    *why = "bad magic";
  else if (out->version != kRecordVersion)
    *why = "layout version " + std::to_string(out->version) + ", this program reads version " +
           std::to_string(kRecordVersion);
  else if (out->size != sizeof(ProcRecord))
    *why = "header says " + std::to_string(out->size) + " bytes";
  else if (out->pid != pid)
    *why = "names pid " + std::to_string(out->pid);
  else if (out->devices > kRecordDevices)
    *why = std::to_string(out->devices) + " devices (at most " + std::to_string(kRecordDevices) + ")";
  else
    return true;
  return false;
}

namespace {

// The pid a record's file name ends with (prefix, then 1 to 9 digits), or -1.
int record_pid(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return -1;
  const std::string rest = name.substr(prefix.size());
  if (rest.empty() || rest.size() > 9 || rest.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::atoi(rest.c_str());
}

// What `cudapool top` shows of a valid record.
ProcInfo proc_info(const ProcRecord& r, int pid, std::uint64_t own_ns) {
  ProcInfo p;
  p.pid = pid;
  p.other_namespace = r.pid_ns != own_ns;
  p.command = bounded_string(r.command, sizeof r.command);
  p.group = bounded_string(r.group, sizeof r.group);
  p.updated_unix_ns = static_cast<std::int64_t>(r.updated_unix_ns);
  p.devices.assign(r.dev, r.dev + r.devices);
  p.parking.parked = r.parked != 0;
  p.parking.parkable = r.parkable;
  p.parking.parked_bytes = r.parked_bytes;
  p.parking.parks = r.parks;
  p.parking.unparks = r.unparks;
  p.parking.bytes_out = r.park_bytes_out;
  p.parking.bytes_in = r.park_bytes_in;
  p.parking.park_ns = r.park_ns;
  p.parking.unpark_ns = r.unpark_ns;
  p.parking.why = bounded_string(r.park_why, sizeof r.park_why);
  return p;
}

// One pass over the records of a user: what it reads, the dead records it removes, what it warns of.
struct RecordScan {
  unsigned uid;
  bool remove_dead;
  std::vector<std::string>* warnings;
  std::uint64_t own_ns = pid_namespace();
  timespec now = [] {
    timespec t{};
    clock_gettime(CLOCK_REALTIME, &t);
    return t;
  }();
  int swept = 0;

  void sweep(const std::string& path) {
    if (::unlink(path.c_str()) == 0) ++swept;
  }
  void warn(std::string message) const {
    if (warnings != nullptr) warnings->push_back(std::move(message));
  }

  // The record of process `pid` at `path`, when there is one to show: none when it is gone, being
  // created, invalid or its process has ended (then removed, if asked and old enough).
  std::optional<ProcInfo> read(const std::string& path, int pid) {
    // What is there, looked at without opening it. Only a regular file of this user is ever
    // removed (another user may put anything at one of our names in a sticky directory). Its
    // age is its last write: a record's creator sizes it and writes it within microseconds of
    // creating it, and a live owner rewrites it every 250 ms.
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return std::nullopt;  // gone meanwhile
    const bool own = S_ISREG(st.st_mode) && st.st_uid == uid;
    const bool old = own && now.tv_sec - st.st_mtim.tv_sec > kStaleRecordS;
    if (own && st.st_size == 0) {
      // Created and never sized: its creator ended (or was killed) in between. A young one may
      // be being created right now.
      if (remove_dead && old) sweep(path);
      return std::nullopt;
    }
    Mapping m = open_file(path, sizeof(ProcRecord), false, 0);
    if (m.fd < 0) {
      if (remove_dead && old && process_liveness(pid, 0, own_ns) == Liveness::gone)
        sweep(path);
      else
        warn(path + " " + m.error + "; skipped (remove it if no cudapool process uses it)");
      return std::nullopt;
    }
    ProcRecord r;
    if (!valid_record(m, path, pid, old, r)) return std::nullopt;
    if (process_liveness(pid, r.start_time, r.pid_ns) == Liveness::gone) {
      if (remove_dead) sweep(path);
      return std::nullopt;
    }
    return proc_info(r, pid, own_ns);
  }

  // Whether the open file `m` (unmapped here) holds a valid record of process `pid`, copied to `r`.
  bool valid_record(Mapping& m, const std::string& path, int pid, bool old, ProcRecord& r) {
    alignas(ProcRecord) unsigned char buf[sizeof(ProcRecord)];
    const bool copied = read_record(m.fd, buf);
    unmap(m);
    std::string why = copied ? "" : "changing or truncated while read";
    if (copied && parse_record(buf, sizeof buf, pid, &r, &why)) return true;
    // A record its creator has not finished (magic 0) is skipped quietly while it is young: it
    // is a few microseconds old, or its creator died setting it up, which its age tells later.
    // Its start time is unknown: only a pid that no process has any more settles that.
    const bool unfinished = copied && r.magic == 0;
    if (remove_dead && old && (unfinished || process_liveness(pid, 0, own_ns) == Liveness::gone))
      sweep(path);
    else if (!unfinished)
      warn(path + " is not a valid stats record (" + why + "); skipped");
    return false;
  }
};

}  // namespace

std::vector<ProcInfo> read_records(unsigned uid, bool remove_dead, std::vector<std::string>* warnings, int* removed) {
  std::vector<ProcInfo> out;
  const std::string dir = shm_dir(), prefix = record_prefix(uid);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (warnings != nullptr) warnings->push_back(dir + ": " + std::strerror(errno));
    return out;
  }
  RecordScan scan{uid, remove_dead, warnings};
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const int pid = record_pid(name, prefix);
    if (pid < 0) continue;
    if (std::optional<ProcInfo> p = scan.read(dir + "/" + name, pid)) out.push_back(std::move(*p));
  }
  ::closedir(d);
  if (removed != nullptr) *removed = scan.swept;
  return out;
}

}  // namespace cudapool::share
