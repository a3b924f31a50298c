// Files that the pooled processes of one user share on one machine, in shared memory (/dev/shm):
//  * the group ledger: one per (user, GPU, group), the reserved bytes of every member process,
//    whose sum stays under the group's budget (docs/design.md, "The group ledger");
//  * the stats records: one per pooled process, its pool figures, read by `cudapool top`.
// Plain POSIX (open, fstat, mmap), no CUDA: the shim writes these files, the tools read them.
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
// <dir>/cudapool-<uid>-g-<gpu uuid>-<group>: the ledger of one group on one GPU.
std::string ledger_path(unsigned uid, std::string_view gpu_uuid, std::string_view group);
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
// The mapping's file still has at least the mapped size. Another process of the user can
// truncate the file at any time, and touching a mapped page past the end raises SIGBUS: whoever
// keeps a mapping checks this before touching it (a window remains between the check and the
// access; it is as short as a few loads and stores).
bool still_whole(const Mapping& m);

// ---- the group ledger --------------------------------------------------------------------------

inline constexpr std::uint64_t kLedgerMagic = 0x3152474c4c4f4f50ULL;  // "POOLLGR1"
inline constexpr std::uint32_t kLedgerVersion = 3;
inline constexpr std::uint32_t kLedgerSlots = 64;
inline constexpr std::size_t kNameBytes = 64;

enum SlotState : std::uint32_t { kSlotFree = 0, kSlotLive = 1 };

// One member process. Written by the member under the ledger's mutex (reserved, state, pid,
// start_time) or by itself alone (cached, allocated, heartbeat, acks); read by anyone.
struct alignas(64) LedgerSlot {
  std::atomic<std::uint32_t> state;
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint64_t> start_time;    // process_start_time(pid) when it joined
  std::atomic<std::uint64_t> pid_ns;        // pid_namespace() of the member (its pid means a process there)
  std::atomic<std::uint64_t> reserved;      // bytes this member holds from the device
  std::atomic<std::uint64_t> outside;       // its memory outside the pool, as charged (footprint budgets)
  std::atomic<std::uint64_t> cached;        // of which idle in its pool (published every ~250 ms)
  std::atomic<std::uint64_t> allocated;     // live bytes (published with cached)
  std::atomic<std::uint64_t> heartbeat_ns;  // monotonic_ns() of the last publication
  // Cooperative release: another member that needs memory adds the bytes it wants from this one
  // to release_want, increments release_req and wakes the word (futex); this member's helper
  // thread takes release_want (back to 0), gives back about that much idle cached memory, the
  // longest-cached first (all of it when release_want was 0), and stores the request it
  // answered in release_ack.
  std::atomic<std::uint32_t> release_req;
  std::atomic<std::uint32_t> release_ack;
  std::atomic<std::uint64_t> release_want;
  std::atomic<std::uint64_t> released_bytes;  // given back on request, in total
};

struct Ledger {
  std::atomic<std::uint64_t> magic;  // stored last by the creator (release)
  std::uint32_t version;
  std::uint32_t size;   // sizeof(Ledger)
  std::uint32_t slots;  // kLedgerSlots
  std::uint32_t uid;
  std::uint64_t budget;                 // bytes; set by the creator, fixed for the ledger's life
  char group[kNameBytes];               // NUL-terminated
  char gpu[kNameBytes];                 // the GPU's UUID, NUL-terminated
  pthread_mutex_t mu;                   // process-shared, robust
  std::atomic<std::uint64_t> total;     // sum of the live slots' reserved + outside (written under mu)
  std::atomic<std::uint32_t> released;  // futex word: incremented after every cooperative release
  std::uint32_t pad;
  LedgerSlot slot[kLedgerSlots];
};

// "" when the header is a ledger of this layout for (uid, gpu, group) that a creator finished
// setting up; else what is wrong ("bad magic", "version 7, expected 1", ...).
std::string validate_ledger(const Ledger& l, unsigned uid, std::string_view gpu, std::string_view group);
// Creator side: initialise a zeroed, freshly created ledger (mutex, header) and publish it.
bool init_ledger(Ledger& l, unsigned uid, std::string_view gpu, std::string_view group, std::uint64_t budget);

// A checked copy of a ledger's figures, for readers that only look (`cudapool top`).
struct SlotView {
  int slot = 0;
  int pid = 0;
  std::uint64_t start_time = 0, pid_ns = 0;
  std::uint64_t reserved = 0, outside = 0, cached = 0, allocated = 0;
};
struct LedgerView {
  std::string group, gpu;
  std::uint64_t budget = 0, total = 0;
  std::vector<SlotView> live;  // the slots in the live state, in slot order
};
// `bytes` bytes of a ledger file of `uid` (read with pread: a file that shrank reads short) into
// *out; false with *why set when they are not a whole, valid ledger of this layout (the checks of
// validate_ledger, with the names taken up to their bounds).
bool parse_ledger(const void* data, std::size_t bytes, unsigned uid, LedgerView* out, std::string* why);
// Every ledger of `uid` in shm_dir(), read with pread; files that are not valid ledgers go into
// *warnings (when given).
std::vector<LedgerView> read_ledgers(unsigned uid, std::vector<std::string>* warnings);

// ---- the per-process stats records -------------------------------------------------------------

inline constexpr std::uint64_t kRecordMagic = 0x3154535050555043ULL;  // "CUPPST1" + '1'
inline constexpr std::uint32_t kRecordVersion = 3;
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
};

// Every live process's record in shm_dir() for `uid` (and those whose liveness cannot be told,
// marked other_namespace when that is why). Records of processes that are certainly gone are
// removed when `remove_dead`; files that are not valid records go into *warnings (when given).
// Records are read with pread, not mapped: a file truncated meanwhile reads short, it cannot
// raise SIGBUS.
std::vector<ProcInfo> read_records(unsigned uid, bool remove_dead, std::vector<std::string>* warnings);
// One record's bytes as read from its file (`bytes` of them): the checked record, or false with
// *why set. `pid`: the pid its file name says. (What read_records does with every file.)
bool parse_record(const void* data, std::size_t bytes, int pid, ProcRecord* out, std::string* why);

}  // namespace cudapool::share
