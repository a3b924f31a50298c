// The group ledger's layout (docs/design.md, "The group ledger"): one file per (user, GPU,
// group) in share::shm_dir(), shared memory that every member process maps and the tools read
// (`cudapool top`). The code that keeps it is beside it: shim/group/group_ledger.h.
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
inline constexpr std::uint32_t kLedgerVersion = 4;                    // 4: the parking words of each slot
inline constexpr std::uint32_t kLedgerSlots = 64;

enum SlotState : std::uint32_t { kSlotFree = 0, kSlotLive = 1 };

// Whether a member may be parked now (LedgerSlot::Parking::parkable); a reader takes any other value as
// "no, for a reason it does not know".
enum ParkBlock : std::uint32_t {
  kParkable = 0,
  kParkOff = 1,     // its policy does not let it be parked (group_park:off)
  kParkNotNow = 2,  // the mechanism says not now; parking.why says why (an IPC export, a capture, ...)
};
// A member's answer to a park request (LedgerSlot::ParkRequest::result).
enum ParkAnswer : std::uint32_t {
  kParkNone = 0,      // no answer yet
  kParkDone = 1,      // parked: park.gave bytes went back to the group
  kParkRefused = 2,   // the mechanism refused or failed (parking.refusal says why)
  kParkBusy = 3,      // it worked within group_park_idle_ms (its own clock)
  kParkHostFull = 4,  // the host memory parked data may take (group_park_host_mb) would be passed
  kParkDisabled = 5,  // its policy has group_park:off
};

// In park.want: the asker takes turns (every member works): park after the call in flight,
// however recently the member worked. The bytes wanted are the other bits.
inline constexpr std::uint64_t kParkTurn = std::uint64_t{1} << 63;

// One member process. Written by the member under the ledger's mutex (reserved, state, pid,
// start_time) or by itself alone (cached, allocated, heartbeat, acks); read by anyone.
struct alignas(64) LedgerSlot {
  // Cooperative release: another member that needs memory adds the bytes it wants from this one
  // to `want`, increments `req` and wakes the word (futex); this member's helper thread takes
  // `want` (back to 0), gives back about that much idle cached memory, the longest-cached first
  // (all of it when `want` was 0), and stores the request it answered in `ack`.
  struct Release {
    std::atomic<std::uint32_t> req;
    std::atomic<std::uint32_t> ack;
    std::atomic<std::uint64_t> want;
    std::atomic<std::uint64_t> given;  // given back on request, in total
  };
  // Parking (group_park). Another member that needs memory stores its pid in `from` and the
  // bytes it wants in `want`, increments `req` and wakes the word; this member's park responder
  // parks the process (all its memory goes to its own host memory, shim/parking/parking.h), stores the
  // outcome in `result` (a ParkAnswer), the bytes given back in `gave` and the request answered
  // in `ack`, increments the header's `released` when bytes came free and wakes its waiters.
  struct ParkRequest {
    std::atomic<std::uint32_t> req;
    std::atomic<std::uint32_t> ack;
    std::atomic<std::uint64_t> want;
    std::atomic<std::int32_t> from;
    std::atomic<std::uint32_t> result;
    std::atomic<std::uint64_t> gave;
  };
  // Published by the member (every ~250 ms, and at once when it parks):
  struct Parking {
    std::atomic<std::uint32_t> parked;        // 1 while its memory is parked
    std::atomic<std::uint32_t> parkable;      // a ParkBlock
    std::atomic<std::uint64_t> parked_bytes;  // its bytes held in host memory
    std::atomic<std::uint64_t> active_ns;     // monotonic_ns() when its last GPU call was seen (0: not yet)
    std::atomic<std::uint32_t> asking;        // non-zero while it waits for others to park (not asked then)
    std::atomic<std::uint32_t> pad;
    char why[kNameBytes];      // why it may not be parked now (kParkNotNow); NUL-terminated
    char refusal[kNameBytes];  // why it refused the last request, with park.result; NUL-terminated
    // monotonic_ns() since when its memory is on the device (its join, or its last restore;
    // published with `parked`). Taken from the slot's tail padding: the layout's size is
    // unchanged, and a member that does not write it reads as resident since ever (asked first in
    // a turn).
    std::atomic<std::uint64_t> resident_ns;
  };

  std::atomic<std::uint32_t> state;
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint64_t> start_time;    // process_start_time(pid) when it joined
  std::atomic<std::uint64_t> pid_ns;        // pid_namespace() of the member (its pid means a process there)
  std::atomic<std::uint64_t> reserved;      // bytes this member holds from the device
  std::atomic<std::uint64_t> outside;       // its memory outside the pool, as charged (footprint budgets)
  std::atomic<std::uint64_t> cached;        // of which idle in its pool (published every ~250 ms)
  std::atomic<std::uint64_t> allocated;     // live bytes (published with cached)
  std::atomic<std::uint64_t> heartbeat_ns;  // monotonic_ns() of the last publication
  Release release;
  ParkRequest park;
  Parking parking;
  // Of `outside`, the bytes held for what the member's context may still grow by after it joined
  // (group_outside_growth_mb: kernels loaded at their first launch, library handles): growth the
  // device shows is taken from these first (any member's), so the group's total covers it before
  // it happens. From the slot's tail padding, like parking.resident_ns.
  std::atomic<std::uint64_t> growth_left;
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
  bool parked = false;
  std::uint32_t parkable = kParkOff;  // a ParkBlock (unknown values kept as read)
  std::uint64_t parked_bytes = 0;
  std::string park_why;  // bounded, as read: print it only through printable()
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

// ---- whom to park --------------------------------------------------------------------------

// One other member as a park request would see it (from its slot; every figure another
// process's, so only compared, never trusted to be sane).
struct ParkCandidate {
  int slot = 0;
  bool live = false;           // its slot is live with a pid
  bool parked = false;         // already parked
  bool asking = false;         // waiting for others to park itself
  bool pending = false;        // a park request to it is not answered yet
  bool refused = false;        // it refused this process's request a moment ago
  std::uint32_t parkable = 0;  // a ParkBlock
  // What a park of it would give back: its bytes in the ledger (exact, where its published live
  // bytes may be 250 ms old; a park gives its idle cache back too).
  std::uint64_t reserved = 0;
  std::uint64_t parked_bytes = 0;  // as published, while parked
  std::int64_t active_ns = 0;      // its last GPU call seen (0: never published)
  std::int64_t heartbeat_ns = 0;
  std::int64_t resident_ns = 0;  // since when its memory is on the device (0: unknown)
};
// Why a member was passed over, for the log when nobody could be parked.
enum class Passed { chosen, spare, parked, busy_asking, pending, refused, not_parkable, not_idle, silent, empty };
// Picks whom to park for `need` bytes at `now_ns`: the members that may be parked (live, not
// parked, not asking, not already asked, not just refused, parkable, published within the last 2 s, idle at least
// `idle_ns`, holding memory), the least recently active first, until their bytes cover `need`
// (all of them when they do not). Writes the chosen slots to `chosen` in that order and returns
// how many; `passed[i]` (when given, one per candidate) says what became of each.
int choose_to_park(const ParkCandidate* c, int n, std::uint64_t need, std::int64_t now_ns, std::int64_t idle_ns,
                   int* chosen, Passed* passed = nullptr);
// Taking turns, when every member works and none has been idle for `idle_ns`: the asker, after
// waiting `idle_ns` itself, picks among the members passed over as not idle those whose memory
// has been on the device for at least `idle_ns` (their turn is over), the one resident longest
// first, until their bytes cover `need`. Such a member finishes the call in flight, then parks.
// Same outputs as choose_to_park; `passed` marks the chosen and the spare among the not idle.
int choose_turn(const ParkCandidate* c, int n, std::uint64_t need, std::int64_t now_ns, std::int64_t idle_ns,
                int* chosen, Passed* passed);
// Members that all wait for memory wait for each other until their deadlines (none can be asked
// to park: each is inside a CUDA call). When every other member is parked, holds nothing or waits
// itself, the waiting member resident longest (then the lower slot) that holds memory and may be
// parked parks itself, so that the others can go on. true when that member is `self` (this
// process, which waits too). `c`, `n` and `passed` as choose_to_park left them.
bool yield_to_waiting(const ParkCandidate* c, int n, const Passed* passed, const ParkCandidate& self,
                      std::int64_t now_ns);
// Whether a member passed over this time could still be parked later (it becomes idle, publishes,
// answers, stops waiting, or was restored and its figures lag): false for members that are gone,
// parked, hold nothing, or keep parking off.
bool may_park_later(const ParkCandidate& c, Passed passed);

}  // namespace cudapool::share
