// The group ledger's layout (docs/design.md, "The group ledger"): one file per (user, GPU,
// group) in share::shm_dir(), shared memory that every member process maps and the tools read
// (`cudapool top`). The code that keeps it is beside it: shim/group_ledger.h.
//
// Everything read from a ledger may have been written by a crashed or hostile process of the
// same user: readers validate the header (magic, version, sizes, slot count, owner, names up to
// their bounds) before using anything, read with pread rather than mapping (a file truncated
// meanwhile reads short instead of raising SIGBUS), and opening goes through share::open_file
// and share::map_file (O_NOFOLLOW, a regular file of this user with mode 0600, the exact size).
// Plain POSIX, no CUDA.
#pragma once
#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "telemetry/share.h"

namespace cudapool::share {

// <dir>/cudapool-<uid>-g-<gpu uuid>-<group>: the ledger of one group on one GPU.
std::string ledger_path(unsigned uid, std::string_view gpu_uuid, std::string_view group);

// ---- the group ledger --------------------------------------------------------------------------

inline constexpr std::uint64_t kLedgerMagic = 0x3152474c4c4f4f50ULL;  // "POOLLGR1"
inline constexpr std::uint32_t kLedgerVersion = 3;
inline constexpr std::uint32_t kLedgerSlots = 64;

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

}  // namespace cudapool::share
