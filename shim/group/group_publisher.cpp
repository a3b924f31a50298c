// The stats record and the members' published figures (shim/group/group_publisher.h).
#include "shim/group/group_publisher.h"

#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "shim/group/group_park.h"
#include "shim/log.h"
#include "shim/parking/parking.h"
#include "sys/output_file.h"
#include "sys/timed_lock.h"

namespace cudapool::shim::group {

namespace {

constexpr std::int64_t kPublishNs = 250'000'000;  // stats record and slot figures

// The record of this process, under `mu` (remove_record reads the path at exit). The file is
// written with pwrite from `image`, never mapped: another process of the user may truncate it at
// any moment, and a store to a truncated mapping raises SIGBUS, where a write only extends the
// file again. Readers copy it with pread under the seqlock (share::read_records).
// The record is created under `mu` only while the process is not exiting (g_exiting): exit removes
// the record, or makes sure none is created after it looked. A process that ends while its
// publisher thread is creating the file (a short-lived program, a forked child that logs its
// summary at exit) would otherwise leave an empty or unfinished record behind.
struct Record {
  std::timed_mutex mu;
  share::Mapping file;  // the open descriptor and the record's size; nothing mapped
  share::ProcRecord image{};
  std::string path;
  int pid = 0;
};

// Made by the publisher thread when it starts, never destroyed (it may run while the process
// exits). An atomic pointer rather than a function-local static: a fork while the publisher
// thread was initialising one would leave the child's fork handler waiting on its guard.
std::atomic<Record*> g_record{nullptr};
// Set by remove_record at exit (sequentially consistent with g_record: see publish).
std::atomic<bool> g_exiting{false};

std::string own_command() {
  std::string out;
  if (FILE* f = std::fopen("/proc/self/cmdline", "r")) {
    int c;
    while ((c = std::fgetc(f)) != EOF && out.size() < 1024) out += c == '\0' ? ' ' : static_cast<char>(c);
    std::fclose(f);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

struct DeviceFigures {
  std::uint64_t reserved = 0, allocated = 0, inactive_split = 0, peak = 0, fence_waits = 0, external = 0;
};

DeviceFigures figures(ProcessPools& pools, int device) {
  DeviceFigures f;
  pools.for_each([&](int pool_device, DevicePool& pool) {
    if (pool_device != device) return;
    const Stats s = pool.stats();
    f.reserved += static_cast<std::uint64_t>(s.reserved_bytes[kAll].current);
    f.allocated += static_cast<std::uint64_t>(s.allocated_bytes[kAll].current);
    f.inactive_split += static_cast<std::uint64_t>(s.inactive_split_bytes[kAll].current);
    f.peak += static_cast<std::uint64_t>(s.reserved_bytes[kAll].peak);
    f.fence_waits += static_cast<std::uint64_t>(s.fence_waits);
    f.external += pool.external_bytes();
  });
  return f;
}

// A new record's contents, then its magic: a reader never takes a half-written record for a
// whole one. false: errno says why.
bool write_first(int fd, share::ProcRecord& r) {
  r.magic = 0;
  if (!write_all_at(fd, &r, sizeof r, 0)) return false;
  r.magic = share::kRecordMagic;
  return write_all_at(fd, &r.magic, sizeof r.magic, offsetof(share::ProcRecord, magic));
}

// Before the record is created (outside `mu`): the directory is usable, and the records of this
// user's processes that are gone go (a record left by a dead process that had this pid; those of
// processes killed, ended by _exit, or that died creating theirs). false: no record.
bool prepare_record() {
  if (std::string why = share::check_dir(share::shm_dir()); !why.empty()) {
    log_warn("publish_stats: {} {}; `cudapool top` will not list this process", share::shm_dir(), why);
    return false;
  }
  ::unlink(share::record_path(::geteuid(), static_cast<int>(::getpid())).c_str());
  int removed = 0;
  share::read_records(::geteuid(), true, nullptr, &removed);
  if (removed > 0)
    log_info("publish_stats: removed {} stale stats record(s) of this user's processes that are gone", removed);
  return true;
}

// Under `mu`, not exiting.
bool open_record(Record& rec, const std::string& group) {
  const int pid = static_cast<int>(::getpid());
  const std::string path = share::record_path(::geteuid(), pid);
  share::ProcRecord& r = rec.image;
  r.version = share::kRecordVersion;
  r.size = sizeof(share::ProcRecord);
  r.pid = pid;
  r.start_time = share::process_start_time(pid);
  r.pid_ns = share::pid_namespace();
  std::snprintf(r.command, sizeof r.command, "%s", own_command().c_str());
  std::snprintf(r.group, sizeof r.group, "%s", group.c_str());
  share::Mapping f = share::open_file(path, sizeof(share::ProcRecord), true);
  std::string why = f.fd < 0     ? f.error
                    : !f.created ? std::string("appeared while it was being created")
                                 : std::string();
  if (why.empty() && !write_first(f.fd, r)) why = std::string("cannot be written: ") + std::strerror(errno);
  if (!why.empty()) {
    log_warn("publish_stats: the stats record {} {}; `cudapool top` will not list this process", path, why);
    if (f.created) ::unlink(path.c_str());
    share::unmap(f);
    return false;
  }
  rec.file = f;
  rec.path = path;
  rec.pid = pid;
  return true;
}

bool write_failed(const Record& rec) {
  log_warn(
      "publish_stats: the stats record {} cannot be written ({}); `cudapool top` will not list this process any "
      "more",
      rec.path, std::strerror(errno));
  return false;
}

// false: the record's file was truncated (by another process of the user): it is written no more.
bool write_record(ProcessPools& pools, const Memberships& devices, Record& rec) {
  int listed[kMaxDevices];
  int n = 0;
  pools.for_each([&](int device, DevicePool&) {
    for (int i = 0; i < n; ++i)
      if (listed[i] == device) return;
    if (n < kMaxDevices) listed[n++] = device;
  });
  share::RecordDevice dev[kMaxDevices] = {};
  for (int i = 0; i < n; ++i) {
    const DeviceFigures f = figures(pools, listed[i]);
    share::RecordDevice& d = dev[i];
    d.device = listed[i];
    d.reserved = f.reserved;
    d.allocated = f.allocated;
    d.cached = f.reserved > f.allocated ? f.reserved - f.allocated : 0;
    d.inactive_split = f.inactive_split;
    d.peak_reserved = f.peak;
    d.fence_waits = f.fence_waits;
    d.external = f.external;
    const int slot = listed[i] >= 0 && listed[i] < kMaxDevices ? listed[i] : -1;
    if (slot >= 0) {
      d.ooms = devices.ooms[slot].load(std::memory_order_relaxed);
      if (Member* m = devices.members[slot].load(); m != nullptr && !m->broken()) {
        d.group_budget = m->budget();
        d.group_reserved = m->total();
        d.outside = m->own_outside();
      }
    }
  }
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  // A record someone truncated stays as they left it (truncated between this check and the
  // writes, the writes extend it again: no harm either way).
  if (!share::still_whole(rec.file)) {
    log_warn(
        "publish_stats: the stats record {} was truncated by another process; `cudapool top` will not list "
        "this process any more",
        rec.path);
    return false;
  }
  // The seqlock through the file: the counter odd, the whole image, the counter even. Each write
  // is done before the next begins, so a reader that copied an even counter and finds it
  // unchanged after its copy saw no write.
  share::ProcRecord& r = rec.image;
  constexpr std::size_t kSeqAt = offsetof(share::ProcRecord, seq);
  r.seq.store(r.seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // odd: writing
  if (!write_all_at(rec.file.fd, &r.seq, sizeof r.seq, kSeqAt)) return write_failed(rec);
  std::memcpy(r.dev, dev, sizeof dev);
  r.devices = static_cast<std::uint32_t>(n);
  r.updated_unix_ns = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<std::uint64_t>(ts.tv_nsec);
  fill_park_record(devices, r);
  if (!write_all_at(rec.file.fd, &r, sizeof r, 0)) return write_failed(rec);
  r.seq.store(r.seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // even: done
  if (!write_all_at(rec.file.fd, &r.seq, sizeof r.seq, kSeqAt)) return write_failed(rec);
  return true;
}

}  // namespace

void publish(ProcessPools& pools, const Memberships& devices, bool publish_stats, const std::string& group) {
  auto* made = new (std::nothrow) Record;
  if (made == nullptr) return;
  g_record.store(made);  // sequentially consistent: see below
  Record& rec = *made;
  bool writing = false;
  if (publish_stats && prepare_record()) {
    std::lock_guard<std::timed_mutex> lock(rec.mu);
    // remove_record sets g_exiting before it reads g_record; this thread stored g_record before
    // it reads g_exiting (both sequentially consistent). So either exit finds the record and
    // waits for `mu`, or this thread sees it exiting and creates nothing.
    if (g_exiting.load()) return;
    writing = open_record(rec, group);
  }
  for (;;) {
    if (pools.exiting()) return;
    if (writing) writing = write_record(pools, devices, rec);
    for (int d = 0; d < kMaxDevices; ++d) {
      Member* m = devices.members[d].load();
      if (m == nullptr || m->broken()) continue;
      const DeviceFigures f = figures(pools, d);
      m->publish(f.reserved > f.allocated ? f.reserved - f.allocated : 0, f.allocated);
    }
    publish_parking(devices);
    if (!pools.exiting()) park::release_spares();  // CUDA calls: never once exit has begun
    timespec ts{0, kPublishNs};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
}

void remove_record() noexcept {
  g_exiting.store(true);
  Record* rec = g_record.load();
  if (rec == nullptr) return;  // no publisher yet: it will see g_exiting and create nothing
  // The publisher holds `mu` only while it creates the record (a few system calls); a creation
  // stuck longer leaves its file to the sweeps of `cudapool top` and the next process.
  // lock_within: a timed wait ThreadSanitizer follows (sys/timed_lock.h).
  try {
    if (!lock_within(rec->mu, std::chrono::milliseconds(100))) return;
  } catch (...) {
    return;
  }
  std::unique_lock<std::timed_mutex> lock(rec->mu, std::adopt_lock);
  if (!rec->path.empty() && rec->pid == static_cast<int>(::getpid())) ::unlink(rec->path.c_str());
}

void forget_record_in_child() noexcept {
  // The parent's record object is left as it was (its mutex may have been held at fork); a
  // publisher the child starts makes its own.
  g_record.store(nullptr, std::memory_order_relaxed);
  g_exiting.store(false, std::memory_order_relaxed);
}

}  // namespace cudapool::shim::group
