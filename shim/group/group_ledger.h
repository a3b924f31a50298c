// A process's place in a group ledger (docs/design.md, "The group ledger"; the layout is
// shim/group/group_ledger_layout.h): the gate of one device's upstreams that keeps the group's bytes
// under its budget, the asking side of cooperative release, the ledger words the answering side
// (shim/group/group_responder.cpp) and the publisher (shim/group/group_publisher.cpp) use.
//
// Locking: the ledger's robust, process-shared mutex guards `total` and every slot's `reserved`
// and `state`; it is held for a few loads and stores (plus, only when the budget refuses, a
// liveness check of the other members). A member that dies holding it hands the next locker
// EOWNERDEAD: the total is recounted from the slots, which are only written under the lock.
// A lock that cannot be had within 2 s (a member stopped while holding it) makes this process
// leave the group and keep its own caps: nothing wedges the group for good. It is taken by
// polling (trylock and short pauses), never by a wait in the kernel (see lock_result).
// The ledger is a file another process of the user can truncate at any time; a mapped page past
// its end raises SIGBUS. Joining reads the header with pread from the descriptor (never through
// the mapping) until it validated; after that every path that touches the mapping first checks
// the file's size (share::still_whole, one fstat) and runs under a SIGBUS guard
// (shim/sigbus_guard.h), so a truncation between the check and the access cuts the access short
// instead of killing the process. A ledger truncated during the join fails closed (below); one
// truncated later makes the member leave the group with a warning.
// A ledger that cannot be opened or checked — another user's, a symbolic link, a directory or any
// other non-regular file, a mode other than 0600, one this process may not open, a file that is
// not a ledger of this layout, one truncated while this process joined — is never used and never
// run without: the member is closed, and every allocation its budget would gate is refused with an
// error naming the file, its owner, its type and mode, and the fix (fail closed: running without
// the budget would let the group exceed it).
// Lock order: pool lock -> ledger mutex (the upstream calls the gate under the pool lock). No
// one waits for another process while holding either: the cooperative wait runs in the hook,
// after the pool returned.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "config/policy.h"
#include "shim/driver.h"
#include "shim/group/group.h"
#include "shim/group/group_ledger_layout.h"
#include "shim/sigbus_guard.h"
#include "shim/upstream/cuda_upstream.h"

namespace cudapool::shim::group {

struct BudgetShares;

// "12.5 MiB": sizes in the group's messages.
std::string mib(std::uint64_t bytes);

class Member final : public ReserveGate {
 public:
  // What the member charges as its memory outside the pool: bytes (group_outside_mb), or:
  static constexpr std::int64_t kMeasure = -1;   // measured from the device (group_outside_mb:auto)
  static constexpr std::int64_t kPoolOnly = -2;  // nothing: the budget counts the pools only
  static std::int64_t outside_setting(const Policy& p) noexcept;

  // Joins the ledger at `path` (creating it) as a new slot. A closed member (below, after a
  // warning) when the ledger cannot be opened, checked or trusted, or has no free slot; nullptr
  // (after a warning) only when its lock is held past the timeout (a stopped member) or memory
  // runs out.
  static Member* join(const std::string& path, const std::string& name, const std::string& gpu, int device,
                      std::uint64_t budget, int wait_ms, const RealDriver* driver, std::int64_t outside,
                      std::uint64_t growth = 0) noexcept;
  // A member that refuses everything: the ledger at `path` cannot be trusted (`why`).
  static Member* closed(const std::string& path, const std::string& name, int device, std::uint64_t budget,
                        std::string why) noexcept;
  bool closed() const noexcept { return l_ == nullptr; }

  // The gate: `bytes` more for this member, if the group's total stays under the budget.
  bool acquire(std::size_t bytes) noexcept override;
  void release(std::size_t bytes) noexcept override;

  // One round of asking the other members for idle cached memory (group::ask_release).
  bool ask_release(std::int64_t deadline, int round, std::size_t request) noexcept;

  // The answering side, for the responder thread: waits up to `timeout_ns` for a release request
  // and returns the one to answer, or `last` when none came.
  std::uint32_t wait_request(std::uint32_t last, std::int64_t timeout_ns) noexcept;
  // Request `req` was answered, `freed` bytes given back.
  void answered(std::uint32_t req, std::size_t freed) noexcept;
  std::uint32_t acked() noexcept;
  // The bytes the askers want back since the last call (0: asked by a member that names none).
  std::uint64_t take_want() noexcept;

  // The member's idle and live bytes, for the others' choice of whom to ask (every ~250 ms).
  void publish(std::uint64_t cached, std::uint64_t allocated) noexcept;
  std::uint64_t own_outside() noexcept;
  // A closed member reports its budget as all taken (nothing can be had under it).
  std::uint64_t budget() noexcept;
  std::uint64_t total() noexcept;
  // Who holds the budget now (group::budget_shares): read without the lock.
  void shares(BudgetShares* out) noexcept;

  // ---- Parking (shim/group/group_park.cpp; docs/design.md, "Parking in a group") ------------------
  struct ParkSettings {
    bool on = false;               // group_park
    std::int64_t idle_ns = 0;      // group_park_idle_ms
    int wait_ms = 0;               // group_park_wait_ms
    std::int64_t host_limit = -1;  // group_park_host_mb in bytes; -1: half of MemAvailable per park
  };
  // Right after joining, before anyone uses the member: its settings, and its slot's parking
  // words made its own (a slot may carry a dead member's).
  void set_park(const ParkSettings& s) noexcept;
  const ParkSettings& park_settings() const noexcept { return park_; }
  // One round of asking idle members to park (group::ask_park), for a wait that began at
  // `start_ns` and ends at `deadline`.
  ParkWait ask_park(std::int64_t start_ns, std::int64_t deadline, std::size_t request) noexcept;
  // After this process parked itself for the others (group::park_self): waits, until `until` at
  // most, while every other resident member still waits for memory, so that the bytes it gave up
  // go to them rather than straight back to its own restore. Not bounded by a shorter time: a
  // slow machine must not let the restore win that race (members that stay waiting give way in
  // turn, and a parked one no longer counts).
  void let_others_go(std::int64_t until) noexcept;
  // The answering side, for the park responder thread.
  std::uint32_t wait_park_request(std::uint32_t last, std::int64_t timeout_ns) noexcept;
  std::uint32_t park_acked() noexcept;
  struct ParkAsk {
    std::uint64_t want = 0;  // the bytes the asker is short of
    int from = 0;            // its pid
    bool turn = false;       // everyone works: park after the call in flight, idle or not
  };
  ParkAsk park_ask() noexcept;
  void park_answered(std::uint32_t req, share::ParkAnswer answer, std::uint64_t gave, const std::string& why) noexcept;
  // The member's parking figures for the others' choice (every ~250 ms, and at once after a park).
  void publish_park(bool parked, std::uint64_t parked_bytes, std::uint32_t parkable, const std::string& why,
                    std::int64_t active_ns) noexcept;
  std::uint64_t own_reserved() noexcept;
  // A thread of this process waits for memory (+1 at the start, -1 at the end): the others do
  // not ask it to park meanwhile, and it refuses if asked (its thread is inside a CUDA call).
  void note_asking(int delta) noexcept;
  bool asking() noexcept;
  // The bytes the other live members hold parked (for group_park_host_mb).
  std::uint64_t others_parked_bytes() noexcept;
  // "pid 12 holds 60.0 MiB (parked), pid 34 holds 20.0 MiB (active 0.1 s ago), ...": for the
  // log line of an allocation or restore that nothing could make room for.
  std::string holders() noexcept;
  int device() const noexcept { return device_; }
  const std::string& name() const noexcept { return group_; }
  int wait_ms() const noexcept { return wait_ms_; }  // group_release_wait_ms
  // Left the group (its ledger could not be locked, or was truncated): own caps only.
  bool broken() const noexcept { return broken_.load(std::memory_order_relaxed); }

 private:
  Member(share::Mapping map, int slot, int device, std::string path, std::string name, int wait_ms,
         const RealDriver* driver = nullptr, std::int64_t outside = kMeasure, std::uint64_t growth = 0)
      : outside_{driver, outside, growth},
        map_(map),
        l_(static_cast<share::Ledger*>(map.addr)),
        slot_(slot),
        device_(device),
        path_(std::move(path)),
        group_(std::move(name)),
        wait_ms_(wait_ms) {}

  // What joining found under the ledger's lock (join logs it once the mapping is left).
  struct Joined {
    bool truncated = false;  // the file was cut short during the join
    int lock_error = 0;      // the lock could not be had (ETIMEDOUT: held past the timeout)
    bool no_slot = false;
    int slot = -1, others = 0;
    std::uint64_t budget = 0, own_outside = 0, total = 0;
  };
  static Member* refused(const std::string& path, const std::string& name, int device, std::uint64_t budget,
                         const std::string& what, const std::string& described, const std::string& fix) noexcept;
  // Where and as what a process joins (join's arguments), for the steps of the join.
  struct JoinAt {
    const std::string& path;
    const std::string& name;
    const std::string& gpu;
    int device;
    std::uint64_t budget;
  };
  static Member* refused(const JoinAt& at, const std::string& what, const std::string& described,
                         const std::string& fix) noexcept {
    return refused(at.path, at.name, at.device, at.budget, what, described, fix);
  }
  static bool open_ledger(const JoinAt& at, share::Mapping* m, Member** refusal) noexcept;
  static bool set_up_ledger(const JoinAt& at, share::Mapping& m, unsigned uid, Member** refusal) noexcept;
  void take_slot(std::uint64_t budget, std::int64_t outside, Joined* j) noexcept;
  static Member* not_joined(const JoinAt& at, Member* mem, share::Mapping& m, bool whole, const Joined& j) noexcept;
  static void log_joined(const JoinAt& at, const Joined& j) noexcept;

  // Runs fn on the mapping when the file still covers it, under the SIGBUS guard; false (the
  // member has left the group) when it does not or was truncated during fn. Every access to the
  // mapping after the join goes through here; fn holds nothing a jump would leave behind
  // (shim/sigbus_guard.h) and calls no other touch.
  template <typename Fn>
  bool touch(Fn&& fn) noexcept {
    if (!whole()) return false;
    if (guarded(map_.addr, map_.size, fn)) return true;
    lost();
    return false;
  }
  bool whole() noexcept;
  void lost() noexcept;
  bool ask_round(std::int64_t deadline, int round, std::size_t request) noexcept;
  // The steps of a round (under the guard): (slot, idle bytes as published) of the members to
  // ask, and (slot, request number) of those asked.
  using Candidate = std::pair<int, std::uint64_t>;
  using Asked = std::pair<int, std::uint32_t>;
  int release_candidates(Candidate* cand) noexcept;
  std::uint64_t release_need(std::size_t request) noexcept;
  int ask_members(const Candidate* cand, int nc, int round, std::uint64_t need, Asked* asked) noexcept;
  void log_round(int asked) noexcept;
  bool wait_answers(std::int64_t deadline, std::uint32_t seen, const Asked* asked, int n) noexcept;
  bool acquire_locked(std::size_t bytes) noexcept;
  bool device_used(std::uint64_t* used) const noexcept;
  // `consume`: growth is taken from the members' growth allowances first (false at join: the
  // joining process's own context is not growth of the others).
  void charge_unexplained(bool consume = true) noexcept;
  std::uint64_t take_growth(std::uint64_t bytes) noexcept;
  void charge_outside_at_join(share::LedgerSlot& s, std::int64_t outside) noexcept;
  void log_unexplained() noexcept;
  void refuse_closed(std::size_t bytes) noexcept;
  int lock_result() noexcept;  // 0, or why the lock could not be had
  bool lock() noexcept;
  void lock_failed(int r) noexcept;
  void unlock() noexcept { pthread_mutex_unlock(&l_->mu); }
  void recount_if_wrong() noexcept;
  void sub_total(std::uint64_t n) noexcept;
  int reclaim_dead() noexcept;
  template <typename Fn>
  bool park_touch(Fn&& fn) noexcept;  // touch() for shim/group/group_park.cpp
  // 1: try again; 0: the deadline passed; -1: nobody could ever be parked for it; 2: park this
  // process (`self_parkable`: it may be parked now); 3: others hold idle cached memory, ask for it.
  int park_round(std::int64_t start_ns, std::int64_t deadline, std::size_t request, bool self_parkable) noexcept;
  share::ParkCandidate self_candidate(bool parkable) const noexcept;

  // How the member's memory outside the pool is charged.
  struct OutsideCharge {
    const RealDriver* driver;  // measures the device (kMeasure)
    std::int64_t setting;      // bytes charged per process outside the pool, or kMeasure / kPoolOnly
    std::uint64_t growth;      // kMeasure: held at join for the context's growth (group_outside_growth_mb)
  };
  // What a closed member answers with.
  struct ClosedLedger {
    std::uint64_t budget = 0;
    std::string why;
  };
  // What the member logged lately: lines of one kind at most once a second.
  struct LogPace {
    std::atomic<std::uint64_t> rounds{0};  // release rounds asked for
    std::atomic<std::int64_t> last_ns{0};  // the last round or refusal logged
  };

  OutsideCharge outside_;
  share::Mapping map_;
  share::Ledger* l_;  // null: a closed member
  ClosedLedger closed_as_;
  int slot_;
  int device_;
  std::string path_;
  std::string group_;
  int wait_ms_;
  std::atomic<bool> broken_{false};
  std::atomic<std::uint64_t> shortfall_{0};  // bytes over the budget at the last refusal
  LogPace log_;
  ParkSettings park_;
  std::atomic<std::int64_t> park_log_{0};  // giving up is logged at most once a second
  // Bytes charge_unexplained charged since the last line about it (logged outside the guard,
  // at most once a second).
  std::atomic<std::uint64_t> unexplained_{0};
  std::atomic<std::int64_t> unexplained_log_{0};
  // When a park round last sent this process to ask for others' idle cache (monotonic_ns).
  std::atomic<std::int64_t> cache_asked_ns_{0};
  // Members that refused a park request: not asked again before this time (monotonic_ns), by slot.
  std::atomic<std::int64_t> park_refused_[share::kLedgerSlots] = {};
};

}  // namespace cudapool::shim::group
