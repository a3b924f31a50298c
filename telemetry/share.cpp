#include "telemetry/share.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cudapool::share {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared counters must be lock-free");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared futex words must be lock-free");
static_assert(sizeof(std::atomic<std::uint32_t>) == 4, "futex words are 32 bits");

std::string shm_dir() {
  const char* d = ::secure_getenv("CUDAPOOL_SHM_DIR");
  return d != nullptr && *d != '\0' ? std::string(d) : std::string("/dev/shm");
}

std::string ledger_path(unsigned uid, std::string_view gpu_uuid, std::string_view group) {
  return shm_dir() + "/cudapool-" + std::to_string(uid) + "-g-" + std::string(gpu_uuid) + "-" + std::string(group);
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

bool process_alive(int pid, std::uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  const std::uint64_t now = process_start_time(pid);
  return now != 0 && now == start_time;
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

}  // namespace

Mapping map_file(const std::string& path, std::size_t size, bool create, int wait_ms) {
  Mapping m;
  int fd = -1;
  if (create) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      // The umask may have taken bits away; the file is ours alone whatever it says.
      if (::fchmod(fd, 0600) != 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
        m.error = std::string("cannot set up: ") + std::strerror(errno);
        ::close(fd);
        ::unlink(path.c_str());
        return m;
      }
      m.created = true;
    } else if (errno != EEXIST) {
      m.error = errno == ELOOP ? "is a symbolic link" : std::string("cannot be created: ") + std::strerror(errno);
      return m;
    }
  }
  if (fd < 0) {
    fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      m.error = errno == ELOOP ? "is a symbolic link" : std::string("cannot be opened: ") + std::strerror(errno);
      return m;
    }
  }
  struct stat st {};
  for (int waited = 0;; ++waited) {
    if (::fstat(fd, &st) != 0) {
      m.error = std::string("cannot be examined: ") + std::strerror(errno);
      ::close(fd);
      return m;
    }
    if (!S_ISREG(st.st_mode))
      m.error = "is not a regular file";
    else if (st.st_uid != ::geteuid())
      m.error = "belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
                std::to_string(::geteuid()) + ")";
    else if ((st.st_mode & 07777) != 0600)
      m.error = "has mode " + describe_mode(st.st_mode) + ", not 0600";
    if (!m.error.empty()) {
      ::close(fd);
      return m;
    }
    if (static_cast<std::size_t>(st.st_size) == size) break;
    // A size of 0: its creator has not truncated it yet. Anything else is another layout.
    if (st.st_size != 0 || waited >= wait_ms) {
      m.error = "has " + std::to_string(st.st_size) + " bytes, not the " + std::to_string(size) +
                " bytes of this version's layout";
      ::close(fd);
      return m;
    }
    ::usleep(1000);
  }
  void* a = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (a == MAP_FAILED) {
    m.error = std::string("cannot be mapped: ") + std::strerror(errno);
    ::close(fd);
    return m;
  }
  m.addr = a;
  m.size = size;
  m.fd = fd;
  return m;
}

void unmap(Mapping& m) {
  if (m.addr != nullptr) ::munmap(m.addr, m.size);
  if (m.fd >= 0) ::close(m.fd);
  m.addr = nullptr;
  m.fd = -1;
}

namespace {

bool bounded_equal(const char (&field)[kNameBytes], std::string_view want) {
  const void* nul = std::memchr(field, '\0', kNameBytes);
  if (nul == nullptr) return false;
  return std::string_view(field) == want;
}

void copy_name(char (&field)[kNameBytes], std::string_view s) {
  const std::size_t n = std::min(s.size(), kNameBytes - 1);
  std::memcpy(field, s.data(), n);
  field[n] = '\0';
}

}  // namespace

std::string validate_ledger(const Ledger& l, unsigned uid, std::string_view gpu, std::string_view group) {
  const std::uint64_t magic = l.magic.load(std::memory_order_acquire);
  if (magic != kLedgerMagic) return "bad magic (not a cudapool group ledger, or its creator died setting it up)";
  if (l.version != kLedgerVersion)
    return "layout version " + std::to_string(l.version) + ", this library reads version " +
           std::to_string(kLedgerVersion);
  if (l.size != sizeof(Ledger))
    return "header says " + std::to_string(l.size) + " bytes, expected " + std::to_string(sizeof(Ledger));
  if (l.slots != kLedgerSlots)
    return "header says " + std::to_string(l.slots) + " slots, expected " + std::to_string(kLedgerSlots);
  if (l.uid != uid) return "header names uid " + std::to_string(l.uid);
  if (l.budget == 0) return "budget 0";
  if (!bounded_equal(l.group, group)) return "header names another group";
  if (!bounded_equal(l.gpu, gpu)) return "header names another GPU";
  return {};
}

bool init_ledger(Ledger& l, unsigned uid, std::string_view gpu, std::string_view group, std::uint64_t budget) {
  l.version = kLedgerVersion;
  l.size = sizeof(Ledger);
  l.slots = kLedgerSlots;
  l.uid = uid;
  l.budget = budget;
  copy_name(l.group, group);
  copy_name(l.gpu, gpu);
  pthread_mutexattr_t a;
  if (pthread_mutexattr_init(&a) != 0) return false;
  bool ok = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED) == 0 &&
            pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) == 0 && pthread_mutex_init(&l.mu, &a) == 0;
  pthread_mutexattr_destroy(&a);
  if (!ok) return false;
  l.total.store(0, std::memory_order_relaxed);
  l.magic.store(kLedgerMagic, std::memory_order_release);
  return true;
}

namespace {

// A consistent copy of a record (the owner may be writing): the seqlock's even value before and
// after the copy must match. false after a few tries (a writer that died mid-update).
bool copy_record(const ProcRecord* src, ProcRecord* out) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const std::uint32_t s1 = src->seq.load(std::memory_order_acquire);
    if ((s1 & 1) == 0) {
      std::memcpy(static_cast<void*>(out), static_cast<const void*>(src), sizeof *out);
      seqlock_fence(std::memory_order_acquire);
      if (src->seq.load(std::memory_order_relaxed) == s1) return true;
    }
    ::usleep(200);
  }
  return false;
}

std::string bounded_string(const char* field, std::size_t n) {
  const void* nul = std::memchr(field, '\0', n);
  return std::string(field, nul != nullptr ? static_cast<std::size_t>(static_cast<const char*>(nul) - field) : n);
}

}  // namespace

std::vector<ProcInfo> read_records(unsigned uid, bool remove_dead, std::vector<std::string>* warnings) {
  std::vector<ProcInfo> out;
  const std::string dir = shm_dir(), prefix = record_prefix(uid);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (warnings != nullptr) warnings->push_back(dir + ": " + std::strerror(errno));
    return out;
  }
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    if (rest.empty() || rest.size() > 9 || rest.find_first_not_of("0123456789") != std::string::npos) continue;
    const int pid = std::atoi(rest.c_str());
    const std::string path = dir + "/" + name;
    Mapping m = map_file(path, sizeof(ProcRecord), false, 0);
    if (!m) {
      if (warnings != nullptr)
        warnings->push_back(path + " " + m.error + "; skipped (remove it if no cudapool process uses it)");
      continue;
    }
    ProcRecord r;
    const bool copied = copy_record(static_cast<const ProcRecord*>(m.addr), &r);
    unmap(m);
    const bool valid = copied && r.magic == kRecordMagic && r.version == kRecordVersion &&
                       r.size == sizeof(ProcRecord) && r.pid == pid && r.devices <= kRecordDevices;
    if (!valid) {
      // A record its creator has not finished (magic 0) is skipped quietly: it is a few
      // microseconds old, or its creator died, which the liveness check below will find.
      if (r.magic != 0 && warnings != nullptr) warnings->push_back(path + " is not a valid stats record; skipped");
      if (!process_alive(pid, process_start_time(pid)) && remove_dead) ::unlink(path.c_str());
      continue;
    }
    if (!process_alive(pid, r.start_time)) {
      if (remove_dead) ::unlink(path.c_str());
      continue;
    }
    ProcInfo p;
    p.pid = pid;
    p.command = bounded_string(r.command, sizeof r.command);
    p.group = bounded_string(r.group, sizeof r.group);
    p.updated_unix_ns = static_cast<std::int64_t>(r.updated_unix_ns);
    p.devices.assign(r.dev, r.dev + r.devices);
    out.push_back(std::move(p));
  }
  ::closedir(d);
  return out;
}

}  // namespace cudapool::share
