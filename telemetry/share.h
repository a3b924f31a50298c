// Files that the pooled processes of one user share on one machine, in shared memory (/dev/shm):
//  * the group ledger: one per (user, GPU, group), the reserved bytes of every member process,
//    whose sum stays under the group's budget; its layout is beside the code that keeps it,
//    shim/group/group_ledger_layout.h (docs/design.md, "The group ledger");
//  * the stats records: one per pooled process, its pool figures, read by `cudapool top`.
// This file has their names, the checks every opener makes, process liveness and the stats
// record's layout. Plain POSIX (open, fstat, mmap), no CUDA: the shim writes these files, the
// tools read them.
//
// Everything read from these files may have been written by a crashed or hostile process of the
// same user: readers validate every field (magic, version, sizes, slot indices, string bounds)
// and never trust a size they did not check.
#pragma once
#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cudapool::share {

// ---- names -------------------------------------------------------------------------------------

// The directory of the files: $CUDAPOOL_SHM_DIR when set (tests, or a private directory), else
// /dev/shm.
std::string shm_dir();
// "cudapool-<uid>-p-": the stats records of one user are the files of shm_dir() with this prefix
// followed by the process id.
std::string record_prefix(unsigned uid);
std::string record_path(unsigned uid, int pid);
// "is not a directory", "is writable by other users and not sticky", ... for a bad shm_dir(); ""
// when it is usable.
std::string check_dir(const std::string& dir);

// ---- processes ---------------------------------------------------------------------------------

// The start time of `pid` (field 22 of /proc/<pid>/stat, clock ticks since boot); 0 when there
// is no such process, or it cannot be read. Together with the pid it names one process: pids
// are reused, start times of one pid are not.
std::uint64_t process_start_time(int pid);
// This process's PID namespace: the inode of /proc/self/ns/pid (0 when it cannot be read). A pid
// means a process only in the namespace it was taken in; processes sharing these files may run
// in several (containers sharing /dev/shm).
std::uint64_t pid_namespace();
// What can be said of the process `pid` that started at `start_time`, as seen from PID namespace
// `pid_ns`: gone only when that is certain (same namespace, and no such pid, or the pid now names
// a process with another start time); unknown when it cannot be told (another or an unknown
// namespace, /proc hidden); a record is reclaimed only when gone.
enum class Liveness { alive, gone, unknown };
Liveness process_liveness(int pid, std::uint64_t start_time, std::uint64_t pid_ns);
std::int64_t monotonic_ns();

// NUL-terminated names in these files (a group's, a GPU's) have this many bytes at most,
// the NUL included.
inline constexpr std::size_t kNameBytes = 64;
// The characters of a name field up to its NUL, or all `n` when it has none (a reader never
// trusts a writer to have terminated it).
std::string bounded_string(const char* field, std::size_t n);

// ---- opening -----------------------------------------------------------------------------------

struct Mapping {
  void* addr = nullptr;
  std::size_t size = 0;
  int fd = -1;
  bool created = false;  // this call created the file (the caller initialises it)
  bool foreign = false;  // refused because someone else could have written it (see map_file)
  std::string error;     // set when addr is null: what is wrong with the file, for a warning
  explicit operator bool() const { return addr != nullptr; }
};

// Maps the file at `path` read-write, `size` bytes. With `create`, creates it (mode 0600) when it
// does not exist; created files are truncated to `size` and come back zeroed with created=true.
// Refuses (error set, nothing mapped): a size other than `size` (an existing file gets up to
// `wait_ms` to reach it: its creator may still be setting it up), and, with foreign set, a
// symbolic link (opened with O_NOFOLLOW), anything but a regular file, a file not owned by
// `owner` (the effective uid unless given), a mode other than 0600.
inline constexpr long kEffectiveUid = -1;
Mapping map_file(const std::string& path, std::size_t size, bool create, int wait_ms = 1000,
                 long owner = kEffectiveUid);
// The same checks without mapping: the open descriptor in fd (addr stays null; close it).
Mapping open_file(const std::string& path, std::size_t size, bool create, int wait_ms = 1000,
                  long owner = kEffectiveUid);
void unmap(Mapping& m);
// "owner uid 65534 (nobody), a regular file, mode 0644": what is at `path` (not followed), for
// the messages that refuse it; "gone" when nothing is.
std::string describe_file(const std::string& path);
// The name /etc/passwd gives `uid` ("" when it names none): read as data, no name service.
std::string user_name(unsigned uid);
// The mapping's file still has at least the mapped size. Another process of the user can
// truncate the file at any time, and touching a mapped page past the end raises SIGBUS: whoever
// keeps a mapping checks this before touching it (a window remains between the check and the
// access; it is as short as a few loads and stores).
bool still_whole(const Mapping& m);

// ---- the per-process stats records -------------------------------------------------------------

inline constexpr std::uint64_t kRecordMagic = 0x3154535050555043ULL;  // "CUPPST1" + '1'
inline constexpr std::uint32_t kRecordVersion = 4;                    // 4: parking
inline constexpr std::uint32_t kRecordDevices = 8;

struct RecordDevice {
  std::int32_t device;
  std::uint32_t pad;
  std::uint64_t reserved;
  std::uint64_t allocated;
  std::uint64_t cached;          // reserved - allocated
  std::uint64_t inactive_split;  // free bytes inside segments that also hold live blocks
  std::uint64_t peak_reserved;
  std::uint64_t ooms;            // out-of-memory answers the program got
  std::uint64_t fence_waits;     // host waits on fences
  std::uint64_t group_budget;    // 0: not in a group on this device
  std::uint64_t group_reserved;  // the group ledger's total at the last update
  std::uint64_t external;        // device memory the program mapped itself (cuMemCreate), counted under caps
  std::uint64_t outside;         // memory outside the pool charged to it by the group's budget
};

struct ProcRecord {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t size;  // sizeof(ProcRecord)
  std::int32_t pid;
  std::uint32_t devices;  // entries of dev[] in use (<= kRecordDevices)
  std::uint64_t start_time;
  std::uint64_t pid_ns;            // pid_namespace() of the process
  std::atomic<std::uint32_t> seq;  // odd while the owner writes (a seqlock)
  std::uint32_t pad;
  std::uint64_t updated_unix_ns;
  char command[160];  // NUL-terminated
  char group[kNameBytes];
  RecordDevice dev[kRecordDevices];
  // Parking (shim/parking/parking.h), the process as a whole: whether its memory is parked now, whether
  // it may be (a RecordParkable; park_why says why not), and what parking has cost it so far.
  std::uint32_t parked;
  std::uint32_t parkable;
  std::uint64_t parked_bytes;  // held in host memory now
  std::uint64_t parks, unparks;
  std::uint64_t park_bytes_out, park_bytes_in;  // copied out by parks, back by restores
  std::uint64_t park_ns, unpark_ns;             // time the parks and the restores took, in total
  char park_why[kNameBytes];                    // NUL-terminated
};
enum RecordParkable : std::uint32_t {
  kRecordParkOff = 0,  // not in a group with group_park:on (it can still park itself: cudapool_park)
  kRecordParkable = 1,
  kRecordParkNotNow = 2,  // park_why says why
};

// The fence of a seqlock between the counter and the data (the record's writer and readers are
// in different processes). ThreadSanitizer does not model fences; there the counter's own
// acquire/release orders stand alone.
inline void seqlock_fence(std::memory_order order) {
#if defined(__SANITIZE_THREAD__)
  (void)order;
#else
  std::atomic_thread_fence(order);
#endif
}

struct ProcInfo {
  int pid = 0;
  bool other_namespace = false;  // the process runs in another PID namespace: its pid means nothing here
  std::string command;
  std::string group;
  std::int64_t updated_unix_ns = 0;
  std::vector<RecordDevice> devices;
  struct Parking {
    bool parked = false;
    std::uint32_t parkable = kRecordParkOff;  // as read (an unknown value means "no, for some reason")
    std::uint64_t parked_bytes = 0, parks = 0, unparks = 0, bytes_out = 0, bytes_in = 0, park_ns = 0, unpark_ns = 0;
    std::string why;  // another process's text: print it only through printable()
  } parking;
};

// Every live process's record in shm_dir() for `uid` (and those whose liveness cannot be told,
// marked other_namespace when that is why). With `remove_dead`, stale records go, counted in
// *removed (when given): valid records of processes that are certainly gone, and records that
// are not valid and have not been written for kStaleRecordS seconds (by their mtime) when they
// are empty or unfinished (no magic: their creator died setting them up) or their pid is
// certainly gone. A file of another owner is never removed, whatever its name. Other files that
// are not valid records go into *warnings (when given); an empty or unfinished one younger than
// that is skipped quietly (it may be being created). Records are read with pread, not mapped: a
// file truncated meanwhile reads short, it cannot raise SIGBUS.
inline constexpr int kStaleRecordS = 5;
std::vector<ProcInfo> read_records(unsigned uid, bool remove_dead, std::vector<std::string>* warnings,
                                   int* removed = nullptr);
// One record's bytes as read from its file (`bytes` of them): the checked record, or false with
// *why set. `pid`: the pid its file name says. (What read_records does with every file.)
bool parse_record(const void* data, std::size_t bytes, int pid, ProcRecord* out, std::string* why);

}  // namespace cudapool::share
