// The group ledger, cooperative release and the stats record (shim/group.h; docs/design.md,
// "The group ledger").
//
// Locking: the ledger's robust, process-shared mutex guards `total` and every slot's `reserved`
// and `state`; it is held for a few loads and stores (plus, only when the budget refuses, a
// liveness check of the other members). A member that dies holding it hands the next locker
// EOWNERDEAD: the total is recounted from the slots, which are only written under the lock.
// A lock that cannot be had within 2 s (a member stopped while holding it) makes this process
// leave the group and keep its own caps: nothing wedges the group for good.
// The ledger is a file another process of the user can truncate at any time; a mapped page past
// its end raises SIGBUS. Every path that touches the mapping first checks the file's size
// (share::still_whole, one fstat): a truncated ledger makes the member leave the group with a
// warning. A ledger someone else could have written (another user's, a symbolic link, a mode
// other than 0600) is never used: the member is closed, and every allocation its budget would
// gate is refused with an error naming the file, its owner and the fix (fail closed: running
// without the budget would let the group exceed it).
// Lock order: pool lock -> ledger mutex (the upstream calls the gate under the pool lock). No
// one waits for another process while holding either: the cooperative wait runs in the hook,
// after the pool returned.
#include "shim/group.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "shim/log.h"
#include "shim/runtime.h"
#include "telemetry/share.h"

namespace cudapool::shim::group {

namespace {

constexpr int kMaxDevices = static_cast<int>(share::kRecordDevices);
constexpr std::int64_t kPublishNs = 250'000'000;  // stats record and slot figures

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  // Not FUTEX_PRIVATE: the word lives in a mapping shared with other processes.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* word, int n) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, n, nullptr, nullptr, 0);
}

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// The GPU's UUID as the driver prints it (GPU-xxxxxxxx-xxxx-...), or "dev<N>" without the entry
// point.
std::string gpu_name(const RealDriver& d, int device) {
  CUuuid u{};
  const auto get_uuid = d.device_get_uuid();
  if (get_uuid == nullptr || get_uuid(&u, device) != CUDA_SUCCESS) return "dev" + std::to_string(device);
  std::string s = "GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    const auto b = static_cast<unsigned char>(u.bytes[i]);
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

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

bool seq_after_or_equal(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) >= 0; }

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

}  // namespace

class Member final : public ReserveGate {
 public:
  Member(share::Mapping map, int slot, int device, std::string path, std::string name, int wait_ms,
         const RealDriver* driver = nullptr, std::int64_t outside = -1)
      : driver_(driver),
        outside_(outside),
        map_(map),
        l_(static_cast<share::Ledger*>(map.addr)),
        slot_(slot),
        device_(device),
        path_(std::move(path)),
        group_(std::move(name)),
        wait_ms_(wait_ms) {}

  // A member that refuses everything: the ledger at `path` cannot be trusted (`why`).
  static Member* closed(const std::string& path, const std::string& name, int device, std::uint64_t budget,
                        std::string why) noexcept {
    auto* m = new (std::nothrow) Member(share::Mapping{}, -1, device, path, name, 0);
    if (m == nullptr) return nullptr;
    m->closed_budget_ = budget;
    m->closed_why_ = std::move(why);
    return m;
  }
  bool closed() const noexcept { return l_ == nullptr; }

  bool acquire(std::size_t bytes) noexcept override {
    if (closed()) {
      refuse_closed(bytes);
      return false;
    }
    if (broken_.load(std::memory_order_relaxed)) return true;  // left the group: own caps only
    if (!lock()) return true;
    share::LedgerSlot& me = l_->slot[slot_];
    charge_unexplained();
    bool ok = false;
    for (int pass = 0; pass < 2 && !ok; ++pass) {
      const std::uint64_t budget = l_->budget, total = l_->total.load(std::memory_order_relaxed);
      if (bytes <= budget && total <= budget - bytes) {
        l_->total.store(total + bytes, std::memory_order_relaxed);
        me.reserved.store(me.reserved.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
        ok = true;
      } else if (pass == 0) {
        // Refused: first make sure the total is what the slots say (a hostile or broken writer
        // could have left anything there), and give back the shares of members that are gone.
        recount_if_wrong();
        reclaim_dead();
      } else {
        shortfall_.store(total > budget - std::min(bytes, budget) ? total + bytes - budget : bytes,
                         std::memory_order_relaxed);
      }
    }
    unlock();
    return ok;
  }

  void release(std::size_t bytes) noexcept override {
    if (closed() || broken_.load(std::memory_order_relaxed)) return;
    if (!lock()) return;
    share::LedgerSlot& me = l_->slot[slot_];
    const std::uint64_t held = me.reserved.load(std::memory_order_relaxed);
    const std::uint64_t n = std::min<std::uint64_t>(bytes, held);
    me.reserved.store(held - n, std::memory_order_relaxed);
    sub_total(n);
    unlock();
  }

  // One round: asks every other live member to give back idle cached memory, then waits for a
  // release, or for every asked member to have answered and then up to 10 ms more (memory that
  // becomes idle meanwhile is asked for in the next round). true: try the allocation again (a
  // release happened, or time is left); false: the deadline passed, or nobody could give.
  // The first two rounds ask only the members with the most idle memory (as last published) that
  // together cover the shortfall, each for its share, so one allocation does not empty every
  // cache of the group; later rounds ask everyone for all of it (the published figures may be up
  // to 250 ms old).
  bool ask_release(std::int64_t deadline, int round, std::size_t request) noexcept {
    if (closed() || broken_.load(std::memory_order_relaxed) || wait_ms_ == 0) return false;
    if (share::monotonic_ns() >= deadline || !whole()) return false;
    const std::uint32_t seen = l_->released.load(std::memory_order_acquire);
    std::pair<int, std::uint64_t> cand[share::kLedgerSlots];
    int nc = 0;
    for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
      share::LedgerSlot& s = l_->slot[i];
      if (i == slot_ || s.state.load(std::memory_order_acquire) != share::kSlotLive ||
          s.pid.load(std::memory_order_relaxed) <= 0)
        continue;
      cand[nc++] = {i, s.cached.load(std::memory_order_relaxed)};
    }
    if (nc == 0) return false;  // alone in the group: nobody to ask
    std::sort(cand, cand + nc, [](const auto& a, const auto& b) { return a.second > b.second; });
    // The gate sees one physical unit at a time (expandable growth maps 16 MiB units), so its
    // shortfall can be a unit where the allocation needs gigabytes: ask for the whole request's
    // excess over the budget, or members give back one unit per round until the wait runs out.
    const std::uint64_t budget = l_->budget, total = l_->total.load(std::memory_order_relaxed);
    const std::uint64_t over = total + request > budget ? total + request - budget : 0;
    const std::uint64_t need = std::max<std::uint64_t>(shortfall_.load(std::memory_order_relaxed), over);
    std::pair<int, std::uint32_t> asked[share::kLedgerSlots];
    int n = 0;
    std::uint64_t covered = 0;
    for (int k = 0; k < nc; ++k) {
      const bool covering = round <= 1;
      if (covering && k > 0 && (covered >= need || cand[k].second == 0)) break;
      share::LedgerSlot& s = l_->slot[cand[k].first];
      // What this member is asked to give: in a covering round its share of the shortfall (what
      // the members before it do not cover, at most its idle bytes as published; the whole rest
      // if it published none), later the whole shortfall (the figures may be stale).
      const std::uint64_t rest = need > covered ? need - covered : 0;
      const std::uint64_t portion = covering && cand[k].second != 0 ? std::min(rest, cand[k].second) : need;
      s.release_want.fetch_add(std::max<std::uint64_t>(portion, 1), std::memory_order_relaxed);
      const std::uint32_t req = s.release_req.fetch_add(1, std::memory_order_acq_rel) + 1;
      futex_wake(&s.release_req, 1);
      asked[n++] = {cand[k].first, req};
      covered += cand[k].second;
    }
    const std::int64_t t = share::monotonic_ns();
    std::int64_t logged = last_log_.load(std::memory_order_relaxed);
    if ((requests_.fetch_add(1, std::memory_order_relaxed) == 0 || t - logged > 1'000'000'000) &&
        last_log_.compare_exchange_strong(logged, t, std::memory_order_relaxed)) {
      log_info(
          "group {}: an allocation on device {} was refused by the budget ({} of {} reserved); asked {} "
          "other member(s) for idle cached memory",
          group_, device_, mib(l_->total.load()), mib(l_->budget), n);
    }
    std::int64_t answered_at = 0;
    for (;;) {
      if (l_->released.load(std::memory_order_acquire) != seen) return true;
      const std::int64_t now = share::monotonic_ns();
      if (now >= deadline) return false;
      if (answered_at == 0) {
        bool all = true;
        for (int k = 0; k < n && all; ++k) {
          share::LedgerSlot& s = l_->slot[asked[k].first];
          if (s.state.load(std::memory_order_acquire) == share::kSlotLive &&
              !seq_after_or_equal(s.release_ack.load(std::memory_order_acquire), asked[k].second))
            all = false;
        }
        if (all) answered_at = now;
      } else if (now - answered_at >= 10'000'000) {
        return true;  // another round: ask again
      }
      futex_wait(&l_->released, seen, std::min<std::int64_t>(deadline - now, 2'000'000));
    }
  }

  // The helper thread: waits for a release request up to `timeout_ns`; returns the request to
  // answer, or `last` when none came.
  std::uint32_t wait_request(std::uint32_t last, std::int64_t timeout_ns) noexcept {
    if (!whole()) return last;
    share::LedgerSlot& me = l_->slot[slot_];
    futex_wait(&me.release_req, last, timeout_ns);  // a truncated page: EFAULT, no signal
    if (!whole()) return last;
    return me.release_req.load(std::memory_order_acquire);
  }

  void answered(std::uint32_t req, std::size_t freed) noexcept {
    if (!whole()) return;
    share::LedgerSlot& me = l_->slot[slot_];
    if (freed != 0) {
      me.released_bytes.fetch_add(freed, std::memory_order_relaxed);
      l_->released.fetch_add(1, std::memory_order_acq_rel);
    }
    me.release_ack.store(req, std::memory_order_release);
    futex_wake(&l_->released, INT_MAX);
  }

  std::uint32_t acked() noexcept { return whole() ? l_->slot[slot_].release_ack.load(std::memory_order_acquire) : 0; }
  // The bytes the askers want back since the last call (0: asked by a member that names none).
  std::uint64_t take_want() noexcept {
    return whole() ? l_->slot[slot_].release_want.exchange(0, std::memory_order_acq_rel) : 0;
  }

  void publish(std::uint64_t cached, std::uint64_t allocated) noexcept {
    if (!whole()) return;
    share::LedgerSlot& me = l_->slot[slot_];
    me.cached.store(cached, std::memory_order_relaxed);
    me.allocated.store(allocated, std::memory_order_relaxed);
    me.heartbeat_ns.store(static_cast<std::uint64_t>(share::monotonic_ns()), std::memory_order_release);
  }

  // Joins the ledger (creating it) as a new slot. nullptr (after a warning) when it cannot.
  static Member* join(const std::string& path, const std::string& name, const std::string& gpu, int device,
                      std::uint64_t budget, int wait_ms, const RealDriver* driver, std::int64_t outside) noexcept;
  std::uint64_t own_outside() noexcept { return whole() ? l_->slot[slot_].outside.load(std::memory_order_relaxed) : 0; }
  static std::int64_t outside_setting(const Policy& p) noexcept {
    return p.group_pool_only ? kPoolOnly : p.group_outside < 0 ? kMeasure : p.group_outside;
  }

  // A closed member reports its budget as all taken (nothing can be had under it).
  std::uint64_t budget() noexcept { return closed() ? closed_budget_ : whole() ? l_->budget : 0; }
  std::uint64_t total() noexcept {
    return closed() ? closed_budget_ : whole() ? l_->total.load(std::memory_order_relaxed) : 0;
  }
  int device() const noexcept { return device_; }
  const std::string& name() const noexcept { return group_; }
  // Left the group (its ledger could not be locked, or was truncated): own caps only.
  bool broken() const noexcept { return broken_.load(std::memory_order_relaxed); }

 private:
  // The ledger's file still covers the mapping; else (truncated under us) the member leaves the
  // group, once, with a warning, and nothing touches the mapping again.
  bool whole() noexcept {
    if (closed() || broken_.load(std::memory_order_relaxed)) return false;
    if (share::still_whole(map_)) return true;
    if (!broken_.exchange(true, std::memory_order_relaxed))
      log_warn(
          "group {}: the ledger {} was truncated by another process of this user (or removed and replaced); this "
          "process leaves the group and keeps only its own caps. Stop the group's processes and remove the file",
          group_, path_);
    return false;
  }

  // The device's used memory as the driver reports it (every process on it); false when it
  // cannot be had (no context current, no entry point).
  bool device_used(std::uint64_t* used) const noexcept {
    if (driver_ == nullptr || driver_->cuMemGetInfo_v2 == nullptr) return false;
    std::size_t f = 0, t = 0;
    if (driver_->cuMemGetInfo_v2(&f, &t) != CUDA_SUCCESS || t == 0 || f > t) return false;
    *used = t - f;
    return true;
  }

  // Under the lock, with a footprint budget measured from the device (group_outside_mb:auto):
  // memory in use on the device beyond what the group has counted — a context or library
  // workspace that appeared since, allocations the pool does not serve — is charged to this
  // member as memory outside its pool, so the total the budget bounds covers what the driver
  // shows. Memory the group counted but the device does not show (reservations about to be
  // made, members about to be reclaimed) is left alone: the charge only grows, until the member
  // is gone.
  void charge_unexplained() noexcept {
    if (outside_ != kMeasure) return;
    std::uint64_t used = 0;
    if (!device_used(&used)) return;
    const std::uint64_t total = l_->total.load(std::memory_order_relaxed);
    if (used <= total) return;
    share::LedgerSlot& me = l_->slot[slot_];
    me.outside.store(sat_add(me.outside.load(std::memory_order_relaxed), used - total), std::memory_order_relaxed);
    l_->total.store(used, std::memory_order_relaxed);
  }

  void refuse_closed(std::size_t bytes) noexcept {
    const std::int64_t t = share::monotonic_ns();
    std::int64_t logged = last_log_.load(std::memory_order_relaxed);
    if ((logged == 0 || t - logged > 1'000'000'000) && last_log_.compare_exchange_strong(logged, t))
      log_warn("group {}: refused {} on device {}: the group ledger {} {}", group_, mib(bytes), device_, path_,
               closed_why_);
  }

  bool lock() noexcept {
    if (!whole()) return false;
    timespec abs{};
    clock_gettime(CLOCK_REALTIME, &abs);
    abs.tv_sec += 2;
    const int r = pthread_mutex_timedlock(&l_->mu, &abs);
    if (r == 0) return true;
    if (r == EOWNERDEAD) {
      // The owner died inside a critical section: the slots are the truth.
      recount_if_wrong();
      pthread_mutex_consistent(&l_->mu);
      log_warn("group {}: a member died holding the ledger's lock ({}); its figures were recounted", group_, path_);
      return true;
    }
    broken_.store(true, std::memory_order_relaxed);
    log_warn(
        "group {}: the ledger {} could not be locked ({}); this process leaves the group and keeps only its "
        "own caps. If a member is stopped (SIGSTOP, a debugger), resume or kill it; if no member runs, "
        "remove the file",
        group_, path_, r == ETIMEDOUT ? std::string("held for more than 2 s") : std::string(std::strerror(r)));
    return false;
  }
  void unlock() noexcept { pthread_mutex_unlock(&l_->mu); }

  // Under the lock.
  void recount_if_wrong() noexcept {
    std::uint64_t sum = 0;
    for (share::LedgerSlot& s : l_->slot) {
      if (s.state.load(std::memory_order_relaxed) != share::kSlotLive) continue;
      sum = sat_add(sat_add(sum, s.reserved.load(std::memory_order_relaxed)),
                    s.outside.load(std::memory_order_relaxed));
    }
    const std::uint64_t total = l_->total.load(std::memory_order_relaxed);
    if (sum != total) {
      log_warn("group {}: the ledger's total ({}) did not match its members' ({}); corrected", group_, mib(total),
               mib(sum));
      l_->total.store(sum, std::memory_order_relaxed);
    }
  }
  // Under the lock: the total never goes below zero, whatever the file said.
  void sub_total(std::uint64_t n) noexcept {
    const std::uint64_t total = l_->total.load(std::memory_order_relaxed);
    l_->total.store(total - std::min(n, total), std::memory_order_relaxed);
  }

  // Under the lock: frees the slots of processes that are certainly gone and returns how many.
  // A slot of another PID namespace is never reclaimed here: its pid names no process of this
  // one, and whether it lives cannot be told (share::process_liveness). A slot with this
  // process's own pid and namespace that is not ours was left by the program this process was
  // before an exec (its memory went with its CUDA context): gone too.
  int reclaim_dead() noexcept {
    int n = 0;
    const int self = static_cast<int>(::getpid());
    const std::uint64_t ns = share::pid_namespace();
    for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
      share::LedgerSlot& s = l_->slot[i];
      if (i == slot_ || s.state.load(std::memory_order_relaxed) != share::kSlotLive) continue;
      const int pid = s.pid.load(std::memory_order_relaxed);
      const std::uint64_t slot_ns = s.pid_ns.load(std::memory_order_relaxed);
      const bool own_pid = pid == self && slot_ns != 0 && slot_ns == ns;
      if (!own_pid &&
          share::process_liveness(pid, s.start_time.load(std::memory_order_relaxed), slot_ns) != share::Liveness::gone)
        continue;
      const std::uint64_t r = s.reserved.load(std::memory_order_relaxed);
      sub_total(sat_add(r, s.outside.load(std::memory_order_relaxed)));
      s.reserved.store(0, std::memory_order_relaxed);
      s.outside.store(0, std::memory_order_relaxed);
      s.cached.store(0, std::memory_order_relaxed);
      s.allocated.store(0, std::memory_order_relaxed);
      s.pid.store(0, std::memory_order_relaxed);
      s.state.store(share::kSlotFree, std::memory_order_release);
      log_info("group {}: reclaimed the slot of pid {} (gone), {} reserved", group_, pid, mib(r));
      ++n;
    }
    return n;
  }

  static constexpr std::int64_t kMeasure = -1;   // outside_: measured from the device
  static constexpr std::int64_t kPoolOnly = -2;  // outside_: the budget counts the pools only
  const RealDriver* driver_;
  std::int64_t outside_;  // bytes charged per process outside the pool, or kMeasure / kPoolOnly
  share::Mapping map_;
  share::Ledger* l_;  // null: a closed member
  std::uint64_t closed_budget_ = 0;
  std::string closed_why_;
  int slot_;
  int device_;
  std::string path_;
  std::string group_;
  int wait_ms_;
  std::atomic<bool> broken_{false};
  std::atomic<std::uint64_t> requests_{0};   // release rounds asked for
  std::atomic<std::uint64_t> shortfall_{0};  // bytes over the budget at the last refusal
  std::atomic<std::int64_t> last_log_{0};    // rounds are logged at most once a second
};

Member* Member::join(const std::string& path, const std::string& name, const std::string& gpu, int device,
                     std::uint64_t budget, int wait_ms, const RealDriver* driver, std::int64_t outside) noexcept {
  const unsigned uid = ::geteuid();
  auto refuse = [&](const std::string& why) -> Member* {
    log_warn(
        "group {}: the ledger {} {}; this process keeps only its own caps (max_reserved_mb, "
        "per_process_memory_fraction). Fix: stop the group's processes and remove the file, or use "
        "another group name",
        name, path, why);
    return nullptr;
  };
  if (std::string why = share::check_dir(share::shm_dir()); !why.empty())
    return refuse("cannot be used: its directory " + share::shm_dir() + " " + why);
  share::Mapping m = share::map_file(path, sizeof(share::Ledger), true);
  if (!m && m.foreign) {
    struct stat st {};
    const std::string owner = ::lstat(path.c_str(), &st) == 0 ? std::to_string(st.st_uid) : std::string("?");
    const std::string why = m.error + " (owner uid " + owner +
                            "): another user could have written it, so its budget "
                            "cannot be trusted. Fix: remove the file (as its owner or root), or give this group "
                            "another name (group:NAME), or point CUDAPOOL_SHM_DIR at a directory of your own";
    log_warn("group {}: allocations on device {} will be refused: the group ledger {} {}", name, device, path, why);
    return closed(path, name, device, budget, why);
  }
  if (!m) return refuse(m.error);
  auto* l = static_cast<share::Ledger*>(m.addr);
  if (m.created) {
    if (!share::init_ledger(*l, uid, gpu, name, budget)) {
      share::unmap(m);
      ::unlink(path.c_str());
      return refuse("could not be set up (robust process-shared mutexes unavailable)");
    }
  } else {
    // Its creator may still be initialising it: a moment for the magic to appear.
    for (int i = 0; i < 1000 && l->magic.load(std::memory_order_acquire) == 0; ++i) ::usleep(1000);
  }
  if (std::string why = share::validate_ledger(*l, uid, gpu, name); !why.empty()) {
    share::unmap(m);
    return refuse("is not usable: " + why);
  }
  auto* mem = new (std::nothrow) Member(m, -1, device, path, name, wait_ms, driver, outside);
  if (mem == nullptr) return nullptr;
  if (!mem->lock()) return nullptr;  // warned; the member is leaked with its mapping (rare)
  mem->reclaim_dead();
  const int pid = static_cast<int>(::getpid());
  const std::uint64_t start = share::process_start_time(pid);
  const std::uint64_t ns = share::pid_namespace();
  int live = 0, slot = -1;
  for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
    const bool free = l->slot[i].state.load(std::memory_order_relaxed) != share::kSlotLive;
    if (free && slot < 0) slot = i;
    if (!free) ++live;
  }
  if (slot < 0) {
    mem->unlock();
    return refuse("has no free slot (" + std::to_string(share::kLedgerSlots) + " live members)");
  }
  // Nobody else is in the group: the ledger outlived its members, and this policy sets the budget.
  if (live == 0 && l->budget != budget) {
    l->budget = budget;
    l->total.store(0, std::memory_order_relaxed);
  }
  if (l->budget != budget)
    log_warn(
        "group {}: the group's budget is {} (set by its first member); this process's policy says {}: "
        "the group's holds",
        name, mib(l->budget), mib(budget));
  share::LedgerSlot& s = l->slot[slot];
  s.pid.store(pid, std::memory_order_relaxed);
  s.start_time.store(start, std::memory_order_relaxed);
  s.pid_ns.store(ns, std::memory_order_relaxed);
  s.reserved.store(0, std::memory_order_relaxed);
  s.outside.store(0, std::memory_order_relaxed);
  s.cached.store(0, std::memory_order_relaxed);
  s.allocated.store(0, std::memory_order_relaxed);
  s.released_bytes.store(0, std::memory_order_relaxed);
  s.release_want.store(0, std::memory_order_relaxed);
  s.release_ack.store(s.release_req.load(std::memory_order_relaxed), std::memory_order_relaxed);
  s.heartbeat_ns.store(static_cast<std::uint64_t>(share::monotonic_ns()), std::memory_order_relaxed);
  s.state.store(share::kSlotLive, std::memory_order_release);
  mem->slot_ = slot;
  // Memory the pool cannot give back (the context, libraries loaded with it) is charged now, so
  // that a process that cannot fit is refused at its first allocation, not after it grew.
  if (outside >= 0) {
    s.outside.store(static_cast<std::uint64_t>(outside), std::memory_order_relaxed);
    l->total.store(sat_add(l->total.load(std::memory_order_relaxed), static_cast<std::uint64_t>(outside)),
                   std::memory_order_relaxed);
  } else {
    mem->charge_unexplained();
  }
  const std::uint64_t own = s.outside.load(std::memory_order_relaxed), total = l->total.load(std::memory_order_relaxed);
  mem->unlock();
  log_info("group {}: joined {} as slot {} (budget {}, {} other member(s); {} outside the pool charged)", name, path,
           slot, mib(l->budget), live, mib(own));
  if (total > l->budget)
    log_warn(
        "group {}: this process's memory outside the pool (its CUDA context and libraries: {}) brings the group to "
        "{} of its {} budget: its allocations are refused until other members give memory back. Raise "
        "group_budget_mb, run fewer processes in the group, or set group_budget_counts:pool to bound the pools "
        "only",
        name, mib(own), mib(total), mib(l->budget));
  return mem;
}

namespace {

struct State {
  std::mutex mu;
  std::atomic<Member*> members[kMaxDevices] = {};
  bool tried[kMaxDevices] = {};
  bool responders[kMaxDevices] = {};
  std::atomic<std::uint64_t> ooms[kMaxDevices] = {};
  bool publisher = false;
  share::Mapping record;
  std::string record_path;
  int record_pid = 0;
};

// Never destroyed: helper threads may run while the process exits.
State& state() {
  static State* s = new State;
  return *s;
}

// Helper threads take no signal of the program's: its handlers run on its own threads.
template <typename Fn>
void start_thread(Fn&& fn) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    std::thread(std::forward<Fn>(fn)).detach();
  } catch (...) {
    log_warn("could not start a helper thread; group release requests and `cudapool top` figures are off");
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

struct DeviceFigures {
  std::uint64_t reserved = 0, allocated = 0, inactive_split = 0, peak = 0, fence_waits = 0, external = 0;
};

DeviceFigures figures(Runtime& rt, int device) {
  DeviceFigures f;
  rt.for_each_pool([&](ContextPool& cp) {
    if (cp.device != device) return;
    const Stats s = cp.pool.stats();
    f.reserved += static_cast<std::uint64_t>(s.reserved_bytes[kAll].current);
    f.allocated += static_cast<std::uint64_t>(s.allocated_bytes[kAll].current);
    f.inactive_split += static_cast<std::uint64_t>(s.inactive_split_bytes[kAll].current);
    f.peak += static_cast<std::uint64_t>(s.reserved_bytes[kAll].peak);
    f.fence_waits += static_cast<std::uint64_t>(s.fence_waits);
    f.external += cp.pool.external_bytes();
  });
  return f;
}

// Answers release requests of one member: its device's pools give back about what was asked of
// idle cached memory, the longest-cached first (DevicePool::release_idle: whole free segments
// and units, pending memory only after its fence; never a live block).
void responder(Runtime* rt, Member* m) {
  // Requests made before this thread started are answered at once.
  std::uint32_t last = m->acked();
  // Giving back waits for the pool's fences under its lock when idle memory is not enough: a
  // request that finds no more idle memory than an answer that gave nothing left (a waiter asks
  // again every 10 ms) is answered without it.
  std::size_t left_idle = 0;
  bool gave_nothing = false;
  for (;;) {
    const std::uint32_t req = m->wait_request(last, 1'000'000'000);
    if (Runtime::exiting() || m->broken() || m->closed()) return;
    if (req == last) continue;
    std::size_t idle = 0, freed = 0;
    rt->for_each_pool([&](ContextPool& cp) {
      if (cp.device == m->device()) idle += cp.pool.cached_bytes();
    });
    const std::uint64_t want = m->take_want();
    if (idle != 0 && (!gave_nothing || idle > left_idle)) {
      idle = 0;
      rt->for_each_pool([&](ContextPool& cp) {
        if (cp.device != m->device()) return;
        if (want == 0)
          freed += cp.pool.empty_cache();
        else if (freed < want)
          freed += cp.pool.release_idle(want - freed);
        idle += cp.pool.cached_bytes();
      });
    }
    left_idle = idle;
    gave_nothing = freed == 0;
    last = req;
    m->answered(req, freed);
    if (freed != 0) log_info("group {}: gave back {} of idle cached memory on request", m->name(), mib(freed));
  }
}

// false: the record's file was truncated (by another process of the user): it is written no more.
bool write_record(Runtime& rt, State& st) {
  if (!share::still_whole(st.record)) {
    log_warn(
        "publish_stats: the stats record {} was truncated by another process; `cudapool top` will not list "
        "this process any more",
        st.record_path);
    return false;
  }
  auto* r = static_cast<share::ProcRecord*>(st.record.addr);
  int devices[kMaxDevices];
  int n = 0;
  rt.for_each_pool([&](ContextPool& cp) {
    for (int i = 0; i < n; ++i)
      if (devices[i] == cp.device) return;
    if (n < kMaxDevices) devices[n++] = cp.device;
  });
  share::RecordDevice dev[kMaxDevices] = {};
  for (int i = 0; i < n; ++i) {
    const DeviceFigures f = figures(rt, devices[i]);
    share::RecordDevice& d = dev[i];
    d.device = devices[i];
    d.reserved = f.reserved;
    d.allocated = f.allocated;
    d.cached = f.reserved > f.allocated ? f.reserved - f.allocated : 0;
    d.inactive_split = f.inactive_split;
    d.peak_reserved = f.peak;
    d.fence_waits = f.fence_waits;
    d.external = f.external;
    const int slot = devices[i] >= 0 && devices[i] < kMaxDevices ? devices[i] : -1;
    if (slot >= 0) {
      d.ooms = st.ooms[slot].load(std::memory_order_relaxed);
      if (Member* m = st.members[slot].load(); m != nullptr && !m->broken()) {
        d.group_budget = m->budget();
        d.group_reserved = m->total();
        d.outside = m->own_outside();
      }
    }
  }
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  r->seq.fetch_add(1, std::memory_order_acq_rel);  // odd: writing
  share::seqlock_fence(std::memory_order_release);
  std::memcpy(r->dev, dev, sizeof dev);
  r->devices = static_cast<std::uint32_t>(n);
  r->updated_unix_ns = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<std::uint64_t>(ts.tv_nsec);
  r->seq.fetch_add(1, std::memory_order_release);  // even: done
  return true;
}

bool open_record(Runtime& rt, State& st) {
  const int pid = static_cast<int>(::getpid());
  const std::string path = share::record_path(::geteuid(), pid);
  if (std::string why = share::check_dir(share::shm_dir()); !why.empty()) {
    log_warn("publish_stats: {} {}; `cudapool top` will not list this process", share::shm_dir(), why);
    return false;
  }
  ::unlink(path.c_str());  // a record left by a dead process that had this pid
  // Records of this user's processes that are gone (killed, or ended by _exit) go too.
  share::read_records(::geteuid(), true, nullptr);
  share::Mapping m = share::map_file(path, sizeof(share::ProcRecord), true);
  if (!m || !m.created) {
    log_warn("publish_stats: the stats record {} {}; `cudapool top` will not list this process", path,
             m ? std::string("appeared while it was being created") : m.error);
    share::unmap(m);
    return false;
  }
  auto* r = static_cast<share::ProcRecord*>(m.addr);
  r->version = share::kRecordVersion;
  r->size = sizeof(share::ProcRecord);
  r->pid = pid;
  r->start_time = share::process_start_time(pid);
  r->pid_ns = share::pid_namespace();
  const std::string cmd = own_command();
  std::snprintf(r->command, sizeof r->command, "%s", cmd.c_str());
  std::snprintf(r->group, sizeof r->group, "%s", rt.policy().group.c_str());
  share::seqlock_fence(std::memory_order_release);
  r->magic = share::kRecordMagic;
  st.record = m;
  st.record_path = path;
  st.record_pid = pid;
  return true;
}

// Every 250 ms: the stats record (publish_stats) and each member's cached/allocated figures.
void publisher(Runtime* rt) {
  State& st = state();
  bool record = false;
  if (rt->policy().publish_stats) {
    std::lock_guard<std::mutex> lock(st.mu);  // on_exit reads the record's path
    record = open_record(*rt, st);
  }
  for (;;) {
    if (Runtime::exiting()) return;
    if (record) record = write_record(*rt, st);
    for (int d = 0; d < kMaxDevices; ++d) {
      Member* m = st.members[d].load();
      if (m == nullptr || m->broken()) continue;
      const DeviceFigures f = figures(*rt, d);
      m->publish(f.reserved > f.allocated ? f.reserved - f.allocated : 0, f.allocated);
    }
    timespec ts{0, kPublishNs};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
}

}  // namespace

Member* member_for(Runtime& rt, int device, std::size_t device_total) noexcept {
  const Policy& p = rt.policy();
  if (p.group.empty() || device < 0 || device >= kMaxDevices) return nullptr;
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.tried[device]) return st.members[device].load();
  st.tried[device] = true;
  std::uint64_t budget = p.group_budget != 0 ? p.group_budget : UINT64_MAX;
  if (p.group_budget_fraction > 0.0)
    budget = std::min<std::uint64_t>(budget, static_cast<std::uint64_t>(p.group_budget_fraction *
                                                                        static_cast<double>(device_total)));
  if (budget == 0 || budget == UINT64_MAX) {
    log_warn("group {}: the budget is 0 bytes on device {} (device memory unknown?); not joining", p.group, device);
    return nullptr;
  }
  const std::string gpu = gpu_name(rt.driver(), device);
  const std::string path = share::ledger_path(::geteuid(), gpu, p.group);
  Member* m = nullptr;
  try {
    m = Member::join(path, p.group, gpu, device, budget, p.group_release_wait_ms, &rt.driver(),
                     Member::outside_setting(p));
  } catch (...) {
    m = nullptr;
  }
  st.members[device].store(m);
  return m;
}

ReserveGate* gate_of(Member* m) noexcept { return m; }

bool ask_release(Member& m, std::int64_t start_ns, int round, std::size_t request) noexcept {
  try {
    const Runtime* rt = Runtime::peek();
    const int wait_ms = rt != nullptr ? rt->policy().group_release_wait_ms : 0;
    return m.ask_release(start_ns + static_cast<std::int64_t>(wait_ms) * 1'000'000, round, request);
  } catch (...) {
    return false;
  }
}

std::size_t budget(Member& m) noexcept { return m.broken() ? 0 : m.budget(); }
std::size_t group_reserved(Member& m) noexcept { return m.total(); }

void note_oom(int device) noexcept {
  if (device >= 0 && device < kMaxDevices) state().ooms[device].fetch_add(1, std::memory_order_relaxed);
}

void on_pool_created(Runtime& rt, ContextPool& cp) noexcept {
  State& st = state();
  bool start_publisher = false, start_responder = false;
  Member* m = nullptr;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (cp.device >= 0 && cp.device < kMaxDevices) m = st.members[cp.device].load();
    if (!st.publisher && (rt.policy().publish_stats || m != nullptr)) st.publisher = start_publisher = true;
    // One responder per member: the first pool of its device starts it.
    if (m != nullptr && !m->closed() && !st.responders[cp.device]) st.responders[cp.device] = start_responder = true;
  }
  if (start_publisher) start_thread([r = &rt] { publisher(r); });
  if (start_responder) start_thread([r = &rt, m] { responder(r, m); });
}

void on_exit() noexcept {
  State& st = state();
  // Never wait at exit: a record left behind is removed by the next process that publishes one,
  // or by `cudapool top`.
  std::unique_lock<std::mutex> lock(st.mu, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (!st.record_path.empty() && st.record_pid == static_cast<int>(::getpid())) ::unlink(st.record_path.c_str());
}

void on_fork_child() noexcept {
  // The parent's slots and record stay the parent's; its helper threads do not exist here. The
  // state is rebuilt in place (the parent may have held its mutex at fork).
  State& st = state();
  new (&st.mu) std::mutex;
  for (int d = 0; d < kMaxDevices; ++d) {
    st.members[d].store(nullptr);
    st.tried[d] = false;
    st.responders[d] = false;
    st.ooms[d].store(0, std::memory_order_relaxed);
  }
  st.publisher = false;
  st.record = share::Mapping{};
  st.record_path.clear();
  st.record_pid = 0;
}

}  // namespace cudapool::shim::group
