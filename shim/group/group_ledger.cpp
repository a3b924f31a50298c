// A process's place in a group ledger (shim/group/group_ledger.h): the budget gate, asking for and
// answering release requests, joining.
#include "shim/group/group_ledger.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "shim/group/group.h"
#include "shim/log.h"
#include "shim/sigbus_guard.h"

namespace cudapool::shim::group {

namespace {

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  // Not FUTEX_PRIVATE: the word lives in a mapping shared with other processes.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* word, int n) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, n, nullptr, nullptr, 0);
}

bool seq_after_or_equal(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) >= 0; }

// What to do about a ledger that cannot be used: one someone else could have written, or one of
// this user's that is not a ledger of this layout.
constexpr const char* kFixForeign =
    "remove it (as its owner or root), or give this group another name (group:NAME), or point CUDAPOOL_SHM_DIR at a "
    "directory of your own";
constexpr const char* kFixOwn = "stop the group's processes and remove it, or use another group name (group:NAME)";

// The header of the ledger open at `fd`, read with pread (never through a mapping: a file
// truncated meanwhile reads short), once its creator has published it (up to a second for the
// magic); "" when it is a ledger of this layout for (uid, gpu, group), else what is wrong.
std::string checked_header(int fd, unsigned uid, const std::string& gpu, const std::string& group) {
  const std::string truncated = "was truncated by another process of this user while this process joined";
  for (int i = 0;; ++i) {
    std::uint64_t magic = 0;
    if (::pread(fd, &magic, sizeof magic, offsetof(share::Ledger, magic)) != static_cast<ssize_t>(sizeof magic))
      return truncated;
    if (magic != 0 || i >= 1000) break;
    ::usleep(1000);  // its creator is still setting it up
  }
  std::unique_ptr<share::Ledger> h(new (std::nothrow) share::Ledger);
  if (h == nullptr) return "could not be read (out of memory)";
  if (::pread(fd, static_cast<void*>(h.get()), sizeof(share::Ledger), 0) != static_cast<ssize_t>(sizeof(share::Ledger)))
    return truncated;
  if (std::string why = share::validate_ledger(*h, uid, gpu, group); !why.empty()) return "is not usable: " + why;
  return {};
}

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

}  // namespace

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

Member* Member::closed(const std::string& path, const std::string& name, int device, std::uint64_t budget,
                       std::string why) noexcept {
  auto* m = new (std::nothrow) Member(share::Mapping{}, -1, device, path, name, 0);
  if (m == nullptr) return nullptr;
  m->closed_as_.budget = budget;
  m->closed_as_.why = std::move(why);
  return m;
}

bool Member::acquire(std::size_t bytes) noexcept {
  if (closed()) {
    refuse_closed(bytes);
    return false;
  }
  bool ok = true;  // left the group (now or before): own caps only
  touch([&] { ok = acquire_locked(bytes); });
  log_unexplained();
  return ok;
}

// What charge_unexplained charged, at most once a second: the group's memory outside the pools
// grew after the members were admitted (kernels loaded at their first launch, library handles,
// another program), which the budget can only follow.
void Member::log_unexplained() noexcept {
  if (unexplained_.load(std::memory_order_relaxed) == 0) return;
  const std::int64_t t = share::monotonic_ns();
  std::int64_t logged = unexplained_log_.load(std::memory_order_relaxed);
  if (logged != 0 && t - logged < 1'000'000'000) return;
  if (!unexplained_log_.compare_exchange_strong(logged, t)) return;
  const std::uint64_t n = unexplained_.exchange(0, std::memory_order_relaxed);
  try {
    log_info(
        "group {}: device {} holds {} more than the group counted (memory outside the pools grew: kernels loaded "
        "at first use, library handles, other programs); charged to this process, the group counts {} of {}",
        group_, device_, mib(n), mib(total()), mib(budget()));
  } catch (...) {
  }
}

// Under the guard.
bool Member::acquire_locked(std::size_t bytes) noexcept {
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

void Member::release(std::size_t bytes) noexcept {
  touch([&] {
    if (!lock()) return;
    share::LedgerSlot& me = l_->slot[slot_];
    const std::uint64_t held = me.reserved.load(std::memory_order_relaxed);
    const std::uint64_t n = std::min<std::uint64_t>(bytes, held);
    me.reserved.store(held - n, std::memory_order_relaxed);
    sub_total(n);
    unlock();
  });
}

// One round: asks every other live member to give back idle cached memory, then waits for a
// release, or for every asked member to have answered and then up to 10 ms more (memory that
// becomes idle meanwhile is asked for in the next round). true: try the allocation again (a
// release happened, or time is left); false: the deadline passed, or nobody could give.
// The first two rounds ask only the members with the most idle memory (as last published) that
// together cover the shortfall, each for its share, so one allocation does not empty every
// cache of the group; later rounds ask everyone for all of it. The published figures may be up
// to 250 ms old, and one taken while a member's blocks were still live is too low: the last
// member a round asks is asked for the whole rest, not its published share, so a stale figure
// costs no extra round (a member never gives more than it has idle).
bool Member::ask_release(std::int64_t deadline, int round, std::size_t request) noexcept {
  if (closed() || broken_.load(std::memory_order_relaxed) || wait_ms_ == 0) return false;
  if (share::monotonic_ns() >= deadline) return false;
  bool again = false;
  touch([&] { again = ask_round(deadline, round, request); });
  return again;
}

// Under the guard: the other live members, most idle memory (as last published) first.
int Member::release_candidates(Candidate* cand) noexcept {
  int nc = 0;
  for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
    share::LedgerSlot& s = l_->slot[i];
    if (i == slot_ || s.state.load(std::memory_order_acquire) != share::kSlotLive ||
        s.pid.load(std::memory_order_relaxed) <= 0)
      continue;
    cand[nc++] = {i, s.cached.load(std::memory_order_relaxed)};
  }
  std::sort(cand, cand + nc, [](const auto& a, const auto& b) { return a.second > b.second; });
  return nc;
}

// Under the guard: the bytes to ask for. The gate sees one physical unit at a time (expandable
// growth maps 16 MiB units), so its shortfall can be a unit where the allocation needs
// gigabytes: ask for the whole request's excess over the budget, or members give back one unit
// per round until the wait runs out.
std::uint64_t Member::release_need(std::size_t request) noexcept {
  const std::uint64_t budget = l_->budget, total = l_->total.load(std::memory_order_relaxed);
  const std::uint64_t over = total + request > budget ? total + request - budget : 0;
  return std::max<std::uint64_t>(shortfall_.load(std::memory_order_relaxed), over);
}

// Under the guard: asks the candidates of this round (ask_release says whom, and for how much)
// and wakes them; returns how many were asked, each in `asked` with its request number.
int Member::ask_members(const Candidate* cand, int nc, int round, std::uint64_t need, Asked* asked) noexcept {
  int n = 0;
  std::uint64_t covered = 0;
  for (int k = 0; k < nc; ++k) {
    const bool covering = round <= 1;
    if (covering && k > 0 && (covered >= need || cand[k].second == 0)) break;
    share::LedgerSlot& s = l_->slot[cand[k].first];
    // What this member is asked to give: in a covering round its share of the shortfall (what
    // the members before it do not cover, at most its idle bytes as published; the whole rest
    // if it is the last one asked), later the whole shortfall.
    const std::uint64_t rest = need > covered ? need - covered : 0;
    const bool last = k + 1 == nc || sat_add(covered, cand[k].second) >= need || cand[k + 1].second == 0;
    const std::uint64_t portion = !covering ? need : last ? rest : std::min(rest, cand[k].second);
    s.release.want.fetch_add(std::max<std::uint64_t>(portion, 1), std::memory_order_relaxed);
    const std::uint32_t req = s.release.req.fetch_add(1, std::memory_order_acq_rel) + 1;
    futex_wake(&s.release.req, 1);
    asked[n++] = {cand[k].first, req};
    covered = sat_add(covered, cand[k].second);
  }
  return n;
}

// Under the guard: the first round, and then at most one a second, is logged.
void Member::log_round(int asked) noexcept {
  const std::int64_t t = share::monotonic_ns();
  std::int64_t logged = log_.last_ns.load(std::memory_order_relaxed);
  if ((log_.rounds.fetch_add(1, std::memory_order_relaxed) == 0 || t - logged > 1'000'000'000) &&
      log_.last_ns.compare_exchange_strong(logged, t, std::memory_order_relaxed)) {
    // The figures are loaded before any text is made: a fault jumps out of no live string.
    const std::uint64_t now_total = l_->total.load(), now_budget = l_->budget;
    log_info(
        "group {}: an allocation on device {} was refused by the budget ({} of {} reserved); asked {} "
        "other member(s) for idle cached memory",
        group_, device_, mib(now_total), mib(now_budget), asked);
  }
}

// Under the guard: waits for a release (true) or the deadline (false); once every asked member
// has answered, up to 10 ms more before another round (true).
bool Member::wait_answers(std::int64_t deadline, std::uint32_t seen, const Asked* asked, int n) noexcept {
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
            !seq_after_or_equal(s.release.ack.load(std::memory_order_acquire), asked[k].second))
          all = false;
      }
      if (all) answered_at = now;
    } else if (now - answered_at >= 10'000'000) {
      return true;  // another round: ask again
    }
    futex_wait(&l_->released, seen, std::min<std::int64_t>(deadline - now, 2'000'000));
  }
}

// Under the guard.
bool Member::ask_round(std::int64_t deadline, int round, std::size_t request) noexcept {
  const std::uint32_t seen = l_->released.load(std::memory_order_acquire);
  Candidate cand[share::kLedgerSlots];
  const int nc = release_candidates(cand);
  if (nc == 0) return false;  // alone in the group: nobody to ask
  Asked asked[share::kLedgerSlots];
  const int n = ask_members(cand, nc, round, release_need(request), asked);
  log_round(n);
  return wait_answers(deadline, seen, asked, n);
}

// The helper thread: waits for a release request up to `timeout_ns`; returns the request to
// answer, or `last` when none came.
std::uint32_t Member::wait_request(std::uint32_t last, std::int64_t timeout_ns) noexcept {
  std::uint32_t req = last;
  touch([&] {
    share::LedgerSlot& me = l_->slot[slot_];
    futex_wait(&me.release.req, last, timeout_ns);  // a truncated page: EFAULT, no signal
    req = me.release.req.load(std::memory_order_acquire);
  });
  return req;
}

void Member::answered(std::uint32_t req, std::size_t freed) noexcept {
  touch([&] {
    share::LedgerSlot& me = l_->slot[slot_];
    if (freed != 0) {
      me.release.given.fetch_add(freed, std::memory_order_relaxed);
      l_->released.fetch_add(1, std::memory_order_acq_rel);
    }
    me.release.ack.store(req, std::memory_order_release);
    futex_wake(&l_->released, INT_MAX);
  });
}

std::uint32_t Member::acked() noexcept {
  std::uint32_t a = 0;
  touch([&] { a = l_->slot[slot_].release.ack.load(std::memory_order_acquire); });
  return a;
}

// The bytes the askers want back since the last call (0: asked by a member that names none).
std::uint64_t Member::take_want() noexcept {
  std::uint64_t want = 0;
  touch([&] { want = l_->slot[slot_].release.want.exchange(0, std::memory_order_acq_rel); });
  return want;
}

void Member::publish(std::uint64_t cached, std::uint64_t allocated) noexcept {
  touch([&] {
    share::LedgerSlot& me = l_->slot[slot_];
    me.cached.store(cached, std::memory_order_relaxed);
    me.allocated.store(allocated, std::memory_order_relaxed);
    me.heartbeat_ns.store(static_cast<std::uint64_t>(share::monotonic_ns()), std::memory_order_release);
  });
}

std::uint64_t Member::own_outside() noexcept {
  std::uint64_t n = 0;
  touch([&] { n = l_->slot[slot_].outside.load(std::memory_order_relaxed); });
  return n;
}

std::uint64_t Member::budget() noexcept {
  if (closed()) return closed_as_.budget;
  std::uint64_t b = 0;
  touch([&] { b = l_->budget; });
  return b;
}

std::int64_t Member::outside_setting(const Policy& p) noexcept {
  return p.group_pool_only ? kPoolOnly : p.group_outside < 0 ? kMeasure : p.group_outside;
}

std::uint64_t Member::total() noexcept {
  if (closed()) return closed_as_.budget;
  std::uint64_t t = 0;
  touch([&] { t = l_->total.load(std::memory_order_relaxed); });
  return t;
}

// The ledger's file still covers the mapping; else (truncated under us) the member leaves the
// group, once, with a warning, and nothing touches the mapping again.
bool Member::whole() noexcept {
  if (closed() || broken_.load(std::memory_order_relaxed)) return false;
  if (share::still_whole(map_)) return true;
  lost();
  return false;
}

// The ledger was truncated under the member (seen by its size, or by a fault the guard caught):
// it leaves the group, once, with a warning. The mapping is kept as it is (sigbus_guard.h).
void Member::lost() noexcept {
  if (!broken_.exchange(true, std::memory_order_relaxed))
    log_warn(
        "group {}: the ledger {} was truncated by another process of this user (or removed and replaced); this "
        "process leaves the group and keeps only its own caps. Stop the group's processes and remove the file",
        group_, path_);
}

// The device's used memory as the driver reports it (every process on it); false when it
// cannot be had (no context current, no entry point).
bool Member::device_used(std::uint64_t* used) const noexcept {
  const RealDriver* d = outside_.driver;
  if (d == nullptr || d->cuMemGetInfo_v2 == nullptr) return false;
  std::size_t f = 0, t = 0;
  if (d->cuMemGetInfo_v2(&f, &t) != CUDA_SUCCESS || t == 0 || f > t) return false;
  *used = t - f;
  return true;
}

// Under the lock, with a footprint budget measured from the device (group_outside_mb:auto):
// memory in use on the device beyond what the group has counted — a context or library
// workspace that appeared since, allocations the pool does not serve — is charged to this
// member as memory outside its pool, so the total the budget bounds covers what the driver
// shows. Memory the group counted but the device does not show (reservations about to be
// made, members about to be reclaimed) is left alone: the charge only grows, until the member
// is gone. The members' growth allowances (group_outside_growth_mb) are counted already but not
// in use yet: growth is taken from them first, and only what passes them is charged anew.
void Member::charge_unexplained(bool consume) noexcept {
  if (outside_.setting != kMeasure) return;
  std::uint64_t used = 0;
  if (!device_used(&used)) return;
  const std::uint64_t total = l_->total.load(std::memory_order_relaxed);
  // Held for growth, not in use: never what explains the device's memory.
  std::uint64_t allowed = 0;
  for (const share::LedgerSlot& s : l_->slot)
    if (s.state.load(std::memory_order_acquire) == share::kSlotLive)
      allowed = sat_add(allowed, s.growth_left.load(std::memory_order_relaxed));
  const std::uint64_t explained = total > allowed ? total - allowed : 0;
  if (used <= explained) return;
  const std::uint64_t rest = consume ? take_growth(used - explained) : used - explained;
  if (rest == 0) return;
  share::LedgerSlot& me = l_->slot[slot_];
  me.outside.store(sat_add(me.outside.load(std::memory_order_relaxed), rest), std::memory_order_relaxed);
  l_->total.store(sat_add(total, rest), std::memory_order_relaxed);
  // At join the charge is the joining context, which the join's own line reports.
  if (consume) unexplained_.fetch_add(rest, std::memory_order_relaxed);
}

// Under the lock: `bytes` of growth taken from the live members' allowances, this member's
// first (the bytes stay in their `outside`, now in use); returns what the allowances did not cover.
std::uint64_t Member::take_growth(std::uint64_t bytes) noexcept {
  for (int k = -1; k < static_cast<int>(share::kLedgerSlots) && bytes != 0; ++k) {
    const int i = k < 0 ? slot_ : k;
    if (k == slot_) continue;
    share::LedgerSlot& s = l_->slot[i];
    if (s.state.load(std::memory_order_acquire) != share::kSlotLive) continue;
    const std::uint64_t left = s.growth_left.load(std::memory_order_relaxed);
    const std::uint64_t t = std::min(left, bytes);
    s.growth_left.store(left - t, std::memory_order_relaxed);
    bytes -= t;
  }
  return bytes;
}

void Member::refuse_closed(std::size_t bytes) noexcept {
  const std::int64_t t = share::monotonic_ns();
  std::int64_t logged = log_.last_ns.load(std::memory_order_relaxed);
  if ((logged == 0 || t - logged > 1'000'000'000) && log_.last_ns.compare_exchange_strong(logged, t))
    log_warn("group {}: refused {} on device {}: the group ledger {} {}", group_, mib(bytes), device_, path_,
             closed_as_.why);
}

// Under the guard: 0 when the lock is held, else why it could not be had (ETIMEDOUT: held for
// more than 2 s). The lock is taken by polling pthread_mutex_trylock, never by a wait in the
// kernel: glibc ends the process when a futex wait fails with EFAULT, which a truncation of the
// file during the wait causes, where a poll's access only faults (and the guard catches that).
// Critical sections are a few loads and stores, so the pauses (20 us, doubling up to 1 ms) are
// rarely taken.
int Member::lock_result() noexcept {
  const std::int64_t deadline = share::monotonic_ns() + 2'000'000'000;
  long pause_ns = 20'000;
  for (;;) {
    const int r = pthread_mutex_trylock(&l_->mu);
    if (r == EOWNERDEAD) {
      // The owner died inside a critical section: the slots are the truth.
      recount_if_wrong();
      pthread_mutex_consistent(&l_->mu);
      log_warn("group {}: a member died holding the ledger's lock ({}); its figures were recounted", group_, path_);
      return 0;
    }
    if (r != EBUSY) return r;
    if (share::monotonic_ns() >= deadline) return ETIMEDOUT;
    timespec pause{0, pause_ns};
    ::nanosleep(&pause, nullptr);
    pause_ns = std::min(pause_ns * 2, 1'000'000L);
  }
}

// Under the guard.
bool Member::lock() noexcept {
  const int r = lock_result();
  if (r == 0) return true;
  lock_failed(r);
  return false;
}

// The lock could not be had (`r`): the member leaves the group with a warning.
void Member::lock_failed(int r) noexcept {
  broken_.store(true, std::memory_order_relaxed);
  log_warn(
      "group {}: the ledger {} could not be locked ({}); this process leaves the group and keeps only its "
      "own caps. If a member is stopped (SIGSTOP, a debugger), resume or kill it; if no member runs, "
      "remove the file",
      group_, path_, r == ETIMEDOUT ? std::string("held for more than 2 s") : std::string(std::strerror(r)));
}

// Under the lock.
void Member::recount_if_wrong() noexcept {
  std::uint64_t sum = 0;
  for (share::LedgerSlot& s : l_->slot) {
    if (s.state.load(std::memory_order_relaxed) != share::kSlotLive) continue;
    sum = sat_add(sat_add(sum, s.reserved.load(std::memory_order_relaxed)), s.outside.load(std::memory_order_relaxed));
  }
  const std::uint64_t total = l_->total.load(std::memory_order_relaxed);
  if (sum != total) {
    log_warn("group {}: the ledger's total ({}) did not match its members' ({}); corrected", group_, mib(total),
             mib(sum));
    l_->total.store(sum, std::memory_order_relaxed);
  }
}

// Under the lock: the total never goes below zero, whatever the file said.
void Member::sub_total(std::uint64_t n) noexcept {
  const std::uint64_t total = l_->total.load(std::memory_order_relaxed);
  l_->total.store(total - std::min(n, total), std::memory_order_relaxed);
}

// Under the lock: frees the slots of processes that are certainly gone and returns how many.
// A slot of another PID namespace is never reclaimed here: its pid names no process of this
// one, and whether it lives cannot be told (share::process_liveness). A slot with this
// process's own pid and namespace that is not ours was left by the program this process was
// before an exec (its memory went with its CUDA context): gone too.
int Member::reclaim_dead() noexcept {
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

void Member::shares(BudgetShares* out) noexcept {
  if (closed()) {
    out->budget = closed_as_.budget;
    return;
  }
  // A moment's view for a message: a truncation midway leaves it partial (and the member out).
  touch([&] {
    out->budget = l_->budget;
    for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
      const share::LedgerSlot& s = l_->slot[i];
      if (s.state.load(std::memory_order_acquire) != share::kSlotLive) continue;
      const std::uint64_t held = sat_add(s.reserved.load(std::memory_order_relaxed),
                                         s.outside.load(std::memory_order_relaxed));
      if (i == slot_) {
        out->own = held;
      } else if (share::process_liveness(s.pid.load(std::memory_order_relaxed),
                                         s.start_time.load(std::memory_order_relaxed),
                                         s.pid_ns.load(std::memory_order_relaxed)) == share::Liveness::gone) {
        out->exited = sat_add(out->exited, held);
        ++out->exited_members;
      } else {
        out->others = sat_add(out->others, held);
        ++out->other_members;
      }
    }
  });
}

// The ledger at `path` cannot be used: a closed member, with a warning that says what is wrong
// (`what`), what is at `described` (the file or its directory: owner, type, mode) and the fix.
Member* Member::refused(const std::string& path, const std::string& name, int device, std::uint64_t budget,
                        const std::string& what, const std::string& described, const std::string& fix) noexcept {
  try {
    std::string why = what;
    if (!described.empty()) why += " [" + described + ": " + share::describe_file(described) + "]";
    why += "; without it the group's budget cannot be kept. Fix: " + fix;
    log_warn("group {}: allocations on device {} will be refused: the group ledger {} {}", name, device, path, why);
    return closed(path, name, device, budget, std::move(why));
  } catch (...) {
    return closed(path, name, device, budget, "cannot be used");
  }
}

// Under the lock, at join: what the new member holds outside its pool (fixed, or measured from
// the device, plus what its context may still grow by).
void Member::charge_outside_at_join(share::LedgerSlot& s, std::int64_t outside) noexcept {
  share::Ledger* l = l_;
  s.growth_left.store(0, std::memory_order_relaxed);
  if (outside >= 0) {
    s.outside.store(static_cast<std::uint64_t>(outside), std::memory_order_relaxed);
    l->total.store(sat_add(l->total.load(std::memory_order_relaxed), static_cast<std::uint64_t>(outside)),
                   std::memory_order_relaxed);
  } else if (outside == kMeasure) {
    charge_unexplained(false);
    // What the context may still grow by is held for it from now on.
    const std::uint64_t g = outside_.growth;
    s.growth_left.store(g, std::memory_order_relaxed);
    s.outside.store(sat_add(s.outside.load(std::memory_order_relaxed), g), std::memory_order_relaxed);
    l->total.store(sat_add(l->total.load(std::memory_order_relaxed), g), std::memory_order_relaxed);
  }
}

// Under the guard: takes the lock and a free slot, and charges what the process has outside
// the pool. Nothing is logged here but what the lock's recovery and the reclaim say.
void Member::take_slot(std::uint64_t budget, std::int64_t outside, Joined* j) noexcept {
  if (!share::still_whole(map_)) {
    j->truncated = true;
    return;
  }
  j->lock_error = lock_result();
  if (j->lock_error != 0) return;
  share::Ledger* l = l_;
  reclaim_dead();
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
    unlock();
    j->no_slot = true;
    return;
  }
  // Nobody else is in the group: the ledger outlived its members, and this policy sets the budget.
  if (live == 0 && l->budget != budget) {
    l->budget = budget;
    l->total.store(0, std::memory_order_relaxed);
  }
  share::LedgerSlot& s = l->slot[slot];
  s.pid.store(pid, std::memory_order_relaxed);
  s.start_time.store(start, std::memory_order_relaxed);
  s.pid_ns.store(ns, std::memory_order_relaxed);
  s.reserved.store(0, std::memory_order_relaxed);
  s.outside.store(0, std::memory_order_relaxed);
  s.cached.store(0, std::memory_order_relaxed);
  s.allocated.store(0, std::memory_order_relaxed);
  s.release.given.store(0, std::memory_order_relaxed);
  s.release.want.store(0, std::memory_order_relaxed);
  s.release.ack.store(s.release.req.load(std::memory_order_relaxed), std::memory_order_relaxed);
  s.heartbeat_ns.store(static_cast<std::uint64_t>(share::monotonic_ns()), std::memory_order_relaxed);
  s.state.store(share::kSlotLive, std::memory_order_release);
  slot_ = slot;
  // Memory the pool cannot give back (the context, libraries loaded with it) is charged now, so
  // that a process that cannot fit is refused at its first allocation, not after it grew.
  charge_outside_at_join(s, outside);
  j->slot = slot;
  j->others = live;
  j->budget = l->budget;
  j->own_outside = s.outside.load(std::memory_order_relaxed);
  j->total = l->total.load(std::memory_order_relaxed);
  unlock();
}

// Opens the ledger at at.path (creating it) and checks it; true: *m maps a ledger this process
// can join. Every way it can fail to be opened or checked fails closed (false, *refusal the
// member that stands for it): running on without the budget would let the group exceed it.
bool Member::open_ledger(const JoinAt& at, share::Mapping* m, Member** refusal) noexcept {
  const unsigned uid = ::geteuid();
  const std::string dir = share::shm_dir();
  if (std::string why = share::check_dir(dir); !why.empty()) {
    *refusal = refused(at, "cannot be kept: its directory " + dir + " " + why, dir,
                       "point CUDAPOOL_SHM_DIR at a directory of your own (mode 0700)");
    return false;
  }
  *m = share::map_file(at.path, sizeof(share::Ledger), true);
  if (!*m) {
    *refusal = refused(at, m->error, at.path, m->foreign ? kFixForeign : kFixOwn);
    return false;
  }
  if (m->created) return set_up_ledger(at, *m, uid, refusal);
  if (std::string why = checked_header(m->fd, uid, at.gpu, at.name); !why.empty()) {
    share::unmap(*m);  // never touched through the mapping
    *refusal = refused(at, why, at.path, kFixOwn);
    return false;
  }
  return true;
}

// A ledger this process just created: its header written under the SIGBUS guard (another
// process of the user can truncate the file meanwhile). As open_ledger.
bool Member::set_up_ledger(const JoinAt& at, share::Mapping& m, unsigned uid, Member** refusal) noexcept {
  auto* l = static_cast<share::Ledger*>(m.addr);
  bool set_up = false;
  const bool whole = guarded(m.addr, m.size, [&] { set_up = share::init_ledger(*l, uid, at.gpu, at.name, at.budget); });
  if (!whole) {
    ::close(m.fd);  // the mapping stays (sigbus_guard.h)
    *refusal = refused(at, "was truncated by another process of this user while this process set it up", at.path,
                       kFixOwn);
    return false;
  }
  if (!set_up) {
    share::unmap(m);
    ::unlink(at.path.c_str());
    *refusal = refused(at, "could not be set up (this system has no robust process-shared mutexes)", "",
                       "remove `group` from the policy: the group budget cannot work here");
    return false;
  }
  return true;
}

// take_slot gave `mem` no slot (`whole`: the guard saw no fault; `j`: what it found): the member
// that never joined is dropped, and what stands for it returned (nullptr when the lock could not
// be had).
Member* Member::not_joined(const JoinAt& at, Member* mem, share::Mapping& m, bool whole, const Joined& j) noexcept {
  if (!whole || j.truncated) {
    // The mapping stays as it is (a fault may have left the ledger's lock in this thread's robust
    // list: sigbus_guard.h); the member that never joined is dropped.
    delete mem;
    if (whole) {
      share::unmap(m);
    } else {
      ::close(m.fd);
    }
    return refused(at, "was truncated by another process of this user while this process joined", at.path, kFixOwn);
  }
  if (j.lock_error != 0) {
    mem->lock_failed(j.lock_error);
    return nullptr;  // the member is leaked with its mapping (rare)
  }
  delete mem;
  share::unmap(m);
  return refused(at, "has no free slot (" + std::to_string(share::kLedgerSlots) + " live members)", "",
                 "at most " + std::to_string(share::kLedgerSlots) +
                     " processes share a group: give some of them another group name (group:NAME)");
}

// The join is done: where the member stands in the group.
void Member::log_joined(const JoinAt& at, const Joined& j) noexcept {
  log_info("group {}: joined {} as slot {} (budget {}, {} other member(s); {} outside the pool charged)", at.name,
           at.path, j.slot, mib(j.budget), j.others, mib(j.own_outside));
  if (j.budget != at.budget)
    log_warn(
        "group {}: the group's budget is {} (set by its first member); this process's policy says {}: "
        "the group's holds",
        at.name, mib(j.budget), mib(at.budget));
  if (j.total > j.budget)
    log_warn(
        "group {}: this process's memory outside the pool (its CUDA context and libraries: {}) brings the group to "
        "{} of its {} budget: its allocations are refused until other members give memory back. Raise "
        "group_budget_mb, run fewer processes in the group, or set group_budget_counts:pool to bound the pools "
        "only",
        at.name, mib(j.own_outside), mib(j.total), mib(j.budget));
}

Member* Member::join(const std::string& path, const std::string& name, const std::string& gpu, int device,
                     std::uint64_t budget, int wait_ms, const RealDriver* driver, std::int64_t outside,
                     std::uint64_t growth) noexcept {
  const JoinAt at{path, name, gpu, device, budget};
  share::Mapping m;
  Member* refusal = nullptr;
  if (!open_ledger(at, &m, &refusal)) return refusal;
  auto* mem = new (std::nothrow) Member(m, -1, device, path, name, wait_ms, driver, outside, growth);
  if (mem == nullptr) {
    share::unmap(m);
    return nullptr;
  }
  Joined j;
  const bool whole = guarded(m.addr, m.size, [&] { mem->take_slot(budget, outside, &j); });
  if (!whole || j.truncated || j.lock_error != 0 || j.no_slot) return not_joined(at, mem, m, whole, j);
  log_joined(at, j);
  return mem;
}

}  // namespace cudapool::shim::group
