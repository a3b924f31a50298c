// Parking in a group (shim/group/group_park.h): the asking side (Member::ask_park), the ledger words of
// the answering side, the published figures, and the stats record's parking fields.
#include "shim/group/group_park.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "shim/group/group.h"
#include "shim/group/group_ledger.h"
#include "shim/log.h"
#include "shim/parking/parking.h"

namespace cudapool::shim::group {

namespace {

void wait_word(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  // Not FUTEX_PRIVATE: the word lives in a mapping shared with other processes.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void wake_word(std::atomic<std::uint32_t>* word, int n) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, n, nullptr, nullptr, 0);
}

bool answered_since(std::uint32_t ack, std::uint32_t req) { return static_cast<std::int32_t>(ack - req) >= 0; }

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

std::string seconds(std::int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(std::max<std::int64_t>(ns, 0)) / 1e9);
  return buf;
}

// Stores `text` in a slot's text field, NUL-terminated (readers bound it anyway).
void put_text(char (&field)[share::kNameBytes], const std::string& text) {
  const std::size_t n = std::min(text.size(), share::kNameBytes - 1);
  std::memcpy(field, text.data(), n);
  std::memset(field + n, 0, share::kNameBytes - n);
}

const char* answer_text(std::uint32_t a) {
  switch (a) {
    case share::kParkDone: return "parked";
    case share::kParkRefused: return "refused";
    case share::kParkBusy: return "refused: it is working";
    case share::kParkHostFull: return "refused: its parked data would pass group_park_host_mb";
    case share::kParkDisabled: return "refused: its policy has group_park:off";
    default: return "gave an answer this process does not know";
  }
}

// How long an asker waits with every other member waiting too before one of them parks itself
// (share::yield_to_waiting): a member still in its idle-cache stage may get memory meanwhile.
constexpr std::int64_t kYieldAfterNs = 100'000'000;

// When nobody can be parked, others' idle cached memory (freed after this wait began) is asked
// for, waiting this long for it, at most every kCacheAskEveryNs (cache that cannot be given
// back, still fenced, must not keep the members that all wait from giving way).
constexpr std::int64_t kCacheAskNs = 200'000'000;
constexpr std::int64_t kCacheAskEveryNs = 500'000'000;

// A member that refused a request is not asked again for a second (one that cannot park now
// would otherwise be asked every round).
constexpr std::int64_t kRefusedNs = 1'000'000'000;

struct Activity {
  std::mutex mu;
  std::uint64_t seen = 0;
  std::int64_t active_ns = 0;  // 0: not sampled yet
};
Activity& activity_state() {
  static auto* a = new Activity;  // never destroyed: helper threads may run while the process exits
  return *a;
}

// The member's own slot words are written by its publisher and its park responder: one at a
// time (the text is plain bytes). Never held inside a SIGBUS guard's code (sigbus_guard.h).
std::mutex& slot_write_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}

}  // namespace

std::int64_t sample_activity() noexcept {
  Activity& a = activity_state();
  const std::uint64_t now_seen = park::activity();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.active_ns == 0 || now_seen != a.seen) {
    a.seen = now_seen;
    a.active_ns = share::monotonic_ns();
  }
  return a.active_ns;
}

std::uint32_t parkable_now(bool on, std::string* why) noexcept {
  why->clear();
  // Without group parking nobody asks: the mechanism (which looks at every pool) is not asked
  // either, four times a second in every process.
  if (!on) return share::kParkOff;
  try {
    *why = park::why_not_parkable();
  } catch (...) {
    *why = "out of host memory";
  }
  return why->empty() ? share::kParkable : share::kParkNotNow;
}

void publish_parking_of(Member& m) noexcept {
  if (m.closed() || m.broken()) return;
  const std::int64_t active = sample_activity();
  std::string why;
  const std::uint32_t code = parkable_now(m.park_settings().on, &why);
  std::lock_guard<std::mutex> lock(slot_write_mu());
  m.publish_park(park::parked(), park::parked_bytes(), code, why, active);
}

void publish_parking(const Memberships& devices) noexcept {
  for (int d = 0; d < kMaxDevices; ++d)
    if (Member* m = devices.members[d].load(); m != nullptr) publish_parking_of(*m);
}

void fill_park_record(const Memberships& devices, share::ProcRecord& r) noexcept {
  bool on = false;
  for (int d = 0; d < kMaxDevices; ++d)
    if (Member* m = devices.members[d].load(); m != nullptr && !m->closed() && !m->broken())
      on = on || m->park_settings().on;
  std::string why;
  const std::uint32_t code = parkable_now(on, &why);
  const park::Counters c = park::counters();
  r.parked = park::parked() ? 1 : 0;
  r.parkable = code == share::kParkable  ? share::kRecordParkable
               : code == share::kParkOff ? share::kRecordParkOff
                                         : share::kRecordParkNotNow;
  r.parked_bytes = park::parked_bytes();
  r.parks = c.parks;
  r.unparks = c.unparks;
  r.park_bytes_out = c.bytes_out;
  r.park_bytes_in = c.bytes_in;
  r.park_ns = c.park_ns;
  r.unpark_ns = c.unpark_ns;
  put_text(r.park_why, why);
}

// ---- Member: the parking words -------------------------------------------------------------

// Every touch of the mapping first checks that the file still covers it (group_ledger.h).
template <typename Fn>
bool Member::park_touch(Fn&& fn) noexcept {
  if (!whole()) return false;
  fn();
  return true;
}

void Member::set_park(const ParkSettings& s) noexcept {
  park_ = s;
  park_touch([&] {
    share::LedgerSlot& me = l_->slot[slot_];
    me.park.ack.store(me.park.req.load(std::memory_order_relaxed), std::memory_order_relaxed);
    me.park.want.store(0, std::memory_order_relaxed);
    me.park.from.store(0, std::memory_order_relaxed);
    me.park.result.store(share::kParkNone, std::memory_order_relaxed);
    me.park.gave.store(0, std::memory_order_relaxed);
    me.parking.parked.store(0, std::memory_order_relaxed);
    me.parking.parkable.store(share::kParkOff, std::memory_order_relaxed);  // until the first publication
    me.parking.parked_bytes.store(0, std::memory_order_relaxed);
    me.parking.active_ns.store(0, std::memory_order_relaxed);
    me.parking.asking.store(0, std::memory_order_relaxed);
    me.parking.resident_ns.store(static_cast<std::uint64_t>(share::monotonic_ns()), std::memory_order_relaxed);
    put_text(me.parking.why, "");
    put_text(me.parking.refusal, "");
  });
}

std::uint32_t Member::wait_park_request(std::uint32_t last, std::int64_t timeout_ns) noexcept {
  std::uint32_t req = last;
  park_touch([&] {
    share::LedgerSlot& me = l_->slot[slot_];
    wait_word(&me.park.req, last, timeout_ns);
    req = me.park.req.load(std::memory_order_acquire);
  });
  return req;
}

std::uint32_t Member::park_acked() noexcept {
  std::uint32_t a = 0;
  park_touch([&] { a = l_->slot[slot_].park.ack.load(std::memory_order_acquire); });
  return a;
}

Member::ParkAsk Member::park_ask() noexcept {
  ParkAsk a;
  park_touch([&] {
    share::LedgerSlot& me = l_->slot[slot_];
    const std::uint64_t want = me.park.want.exchange(0, std::memory_order_acq_rel);
    a.want = want & ~share::kParkTurn;
    a.turn = (want & share::kParkTurn) != 0;
    a.from = me.park.from.load(std::memory_order_relaxed);
  });
  return a;
}

void Member::park_answered(std::uint32_t req, share::ParkAnswer answer, std::uint64_t gave,
                           const std::string& why) noexcept {
  std::lock_guard<std::mutex> lock(slot_write_mu());
  park_touch([&] {
    share::LedgerSlot& me = l_->slot[slot_];
    me.park.result.store(answer, std::memory_order_relaxed);
    me.park.gave.store(gave, std::memory_order_relaxed);
    put_text(me.parking.refusal, why);
    if (answer == share::kParkDone) {
      // At once, not at the next publication: nobody asks a parked member again.
      me.parking.parked.store(1, std::memory_order_relaxed);
      me.parking.parked_bytes.store(park::parked_bytes(), std::memory_order_relaxed);
    }
    if (gave != 0) l_->released.fetch_add(1, std::memory_order_acq_rel);
    me.park.ack.store(req, std::memory_order_release);
    wake_word(&l_->released, INT_MAX);
  });
}

void Member::publish_park(bool parked, std::uint64_t parked_bytes, std::uint32_t parkable, const std::string& why,
                          std::int64_t active_ns) noexcept {
  park_touch([&] {
    share::LedgerSlot& me = l_->slot[slot_];
    me.parking.parked.store(parked ? 1 : 0, std::memory_order_relaxed);
    me.parking.parked_bytes.store(parked_bytes, std::memory_order_relaxed);
    me.parking.parkable.store(parkable, std::memory_order_relaxed);
    me.parking.active_ns.store(static_cast<std::uint64_t>(active_ns), std::memory_order_relaxed);
    if (const std::int64_t restored = park::resident_since_ns(); restored != 0)
      me.parking.resident_ns.store(static_cast<std::uint64_t>(restored), std::memory_order_relaxed);
    put_text(me.parking.why, why);
  });
}

std::uint64_t Member::own_reserved() noexcept {
  std::uint64_t n = 0;
  park_touch([&] { n = l_->slot[slot_].reserved.load(std::memory_order_relaxed); });
  return n;
}

void Member::note_asking(int delta) noexcept {
  park_touch([&] {
    std::atomic<std::uint32_t>& w = l_->slot[slot_].parking.asking;
    if (delta > 0)
      w.fetch_add(1, std::memory_order_relaxed);
    else
      w.fetch_sub(1, std::memory_order_relaxed);
  });
}

bool Member::asking() noexcept {
  bool a = false;
  park_touch([&] { a = l_->slot[slot_].parking.asking.load(std::memory_order_relaxed) != 0; });
  return a;
}

std::uint64_t Member::others_parked_bytes() noexcept {
  std::uint64_t n = 0;
  park_touch([&] {
    for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
      const share::LedgerSlot& s = l_->slot[i];
      if (i == slot_ || s.state.load(std::memory_order_acquire) != share::kSlotLive) continue;
      if (s.parking.parked.load(std::memory_order_relaxed) != 0)
        n = sat_add(n, s.parking.parked_bytes.load(std::memory_order_relaxed));
    }
  });
  return n;
}

std::string Member::holders() noexcept {
  // The figures first (under the guard, no string made there: a fault jumps out of no live
  // object), then the text.
  struct Held {
    int pid = 0;
    std::uint64_t bytes = 0, parked_bytes = 0;
    bool parked = false, asking = false;
    std::uint32_t parkable = 0;
    std::int64_t active_ns = 0;
    char why[share::kNameBytes] = {};
  };
  Held held[share::kLedgerSlots];
  int n = 0;
  std::uint64_t own = 0;
  park_touch([&] {
    for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
      const share::LedgerSlot& s = l_->slot[i];
      if (s.state.load(std::memory_order_acquire) != share::kSlotLive) continue;
      const std::uint64_t bytes = sat_add(s.reserved.load(std::memory_order_relaxed),
                                          s.outside.load(std::memory_order_relaxed));
      if (i == slot_) {
        own = bytes;
        continue;
      }
      Held& h = held[n++];
      h.pid = s.pid.load(std::memory_order_relaxed);
      h.bytes = bytes;
      h.parked = s.parking.parked.load(std::memory_order_relaxed) != 0;
      h.parked_bytes = s.parking.parked_bytes.load(std::memory_order_relaxed);
      h.asking = s.parking.asking.load(std::memory_order_relaxed) != 0;
      h.parkable = s.parking.parkable.load(std::memory_order_relaxed);
      h.active_ns = static_cast<std::int64_t>(s.parking.active_ns.load(std::memory_order_relaxed));
      std::memcpy(h.why, s.parking.why, sizeof h.why);
    }
  });
  const std::int64_t now = share::monotonic_ns();
  std::string out;
  for (int k = 0; k < n; ++k) {
    const Held& h = held[k];
    out += (k == 0 ? "" : ", ") + std::string("pid ") + std::to_string(h.pid) + " holds " + mib(h.bytes) + " (";
    if (h.parked)
      out += "parked, " + mib(h.parked_bytes) + " in host memory";
    else if (h.asking)
      out += "waiting for memory itself";
    else if (h.parkable == share::kParkOff)
      out += "parking off in its policy";
    else if (h.parkable != share::kParkable)
      out += "not parkable: " + share::bounded_string(h.why, sizeof h.why);
    else if (h.active_ns <= 0)
      out += "no figures published yet";
    else
      out += "last active " + seconds(now - h.active_ns) + " ago";
    out += ")";
  }
  if (n == 0) out = "no other member";
  return out + "; this process holds " + mib(own);
}

// ---- Member: asking ------------------------------------------------------------------------

ParkWait Member::ask_park(std::int64_t start_ns, std::int64_t deadline, std::size_t request) noexcept {
  if (closed() || broken_.load(std::memory_order_relaxed) || !park_.on) return ParkWait::give_up;
  int again = 0;
  if (share::monotonic_ns() < deadline) {
    // Whether this process could park itself, asked before the guard (it makes strings).
    std::string why;
    const bool self_parkable = parkable_now(true, &why) == share::kParkable;
    note_asking(1);
    park_touch([&] { again = park_round(start_ns, deadline, request, self_parkable); });
    note_asking(-1);
  }
  if (again == 2) return ParkWait::park_self;
  // Memory others freed while this process waited is asked for before anyone is parked for it.
  if (again == 3) {
    ask_release(share::monotonic_ns() + kCacheAskNs, 0, request);
    return ParkWait::again;
  }
  if (again > 0) return ParkWait::again;
  // Giving up: say who holds the budget (at most once a second).
  const std::int64_t t = share::monotonic_ns();
  std::int64_t logged = park_log_.load(std::memory_order_relaxed);
  if ((logged == 0 || t - logged > 1'000'000'000) && park_log_.compare_exchange_strong(logged, t)) {
    try {
      log_warn("group {}: no room for {} under the budget of {} on device {}{}; who holds it: {}", group_, mib(request),
               mib(budget()), device_,
               again < 0 ? ": no other member can be parked"
                         : " within group_park_wait_ms (" + std::to_string(park_.wait_ms) + " ms)",
               holders());
    } catch (...) {
    }
  }
  return ParkWait::give_up;
}

// Under the guard: this process as another member's park request would see it.
share::ParkCandidate Member::self_candidate(bool parkable) const noexcept {
  const share::LedgerSlot& me = l_->slot[slot_];
  share::ParkCandidate c;
  c.slot = slot_;
  c.live = true;
  c.parked = me.parking.parked.load(std::memory_order_relaxed) != 0;
  c.asking = true;
  c.parkable = parkable ? share::kParkable : share::kParkNotNow;
  c.reserved = me.reserved.load(std::memory_order_relaxed);
  const std::uint64_t r = me.parking.resident_ns.load(std::memory_order_relaxed);
  c.resident_ns = r > static_cast<std::uint64_t>(INT64_MAX) ? 0 : static_cast<std::int64_t>(r);
  return c;
}

void Member::let_others_go(std::int64_t until) noexcept {
  park_touch([&] {
    for (;;) {
      const std::uint32_t seen = l_->released.load(std::memory_order_acquire);
      int waiting = 0, others = 0;
      for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
        const share::LedgerSlot& s = l_->slot[i];
        if (i == slot_ || s.state.load(std::memory_order_acquire) != share::kSlotLive ||
            s.pid.load(std::memory_order_relaxed) <= 0 || s.parking.parked.load(std::memory_order_relaxed) != 0)
          continue;
        ++others;
        waiting += s.parking.asking.load(std::memory_order_relaxed) != 0 ? 1 : 0;
      }
      const std::int64_t t = share::monotonic_ns();
      if (others == 0 || waiting < others || t >= until) return;
      wait_word(&l_->released, seen, std::min<std::int64_t>(until - t, 20'000'000));
    }
  });
}

bool park_self(Member& m, std::size_t request, std::int64_t start_ns) noexcept {
  if (share::monotonic_ns() - start_ns >= static_cast<std::int64_t>(m.park_settings().wait_ms) * 1'000'000) {
    log_info("group {}: every member waits for memory; group_park_wait_ms passed, so this process stops waiting",
             m.name());
    return false;
  }
  try {
    const std::string reason = "group " + m.name() + ": every member waits for memory; this process, resident " +
                               "longest, parks so that the others can go on (it needs " + mib(request) + " more)";
    std::string why;
    if (park::park(park::Mode::copy, reason.c_str(), &why)) {
      publish_parking_of(m);  // at once: nobody asks a parked member, nor counts it as waiting
      m.let_others_go(start_ns + static_cast<std::int64_t>(m.park_settings().wait_ms) * 1'000'000);
      return true;
    }
    log_info("group {}: every member waits for memory, but this process could not park itself: {}", m.name(), why);
  } catch (...) {
  }
  return false;
}

namespace {

// A time another process wrote: only compared, and a value past any sane clock reads as never.
std::int64_t their_time(const std::atomic<std::uint64_t>& word) {
  const std::uint64_t v = word.load(std::memory_order_relaxed);
  return v > static_cast<std::uint64_t>(INT64_MAX) ? 0 : static_cast<std::int64_t>(v);
}

// One request sent: the slot asked and the request number its answer must reach.
struct ParkAsked {
  int slot;
  std::uint32_t req;
  int pid;
  std::uint64_t held, live;
  std::int64_t idle_ns, resident_ns;
  bool gone;  // its process ended before it answered
};

// Under the guard: stores the request in each chosen member's slot and wakes its responder.
void send_park_requests(share::Ledger& l, const int* chosen, int k, std::uint64_t want, bool turn,
                        const share::ParkCandidate* cand, int n, std::int64_t now, ParkAsked* asked) {
  const int pid = static_cast<int>(::getpid());
  for (int j = 0; j < k; ++j) {
    share::LedgerSlot& s = l.slot[chosen[j]];
    s.park.want.store(turn ? want | share::kParkTurn : want & ~share::kParkTurn, std::memory_order_relaxed);
    s.park.from.store(pid, std::memory_order_relaxed);
    const std::uint32_t req = s.park.req.fetch_add(1, std::memory_order_acq_rel) + 1;
    wake_word(&s.park.req, 1);
    ParkAsked& a = asked[j];
    a = ParkAsked{};
    a.slot = chosen[j];
    a.req = req;
    a.pid = s.pid.load(std::memory_order_relaxed);
    a.live = s.allocated.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i)
      if (cand[i].slot == chosen[j])
        a.held = cand[i].reserved, a.idle_ns = now - cand[i].active_ns,
        a.resident_ns = now - std::min(cand[i].resident_ns, now);
  }
}

// Under the guard: true when every asked member that is still live has answered. One whose
// process ended never will (it died, or exited while asked): it counts as answered, marked
// `gone`, and its charge goes back at the next refusal (Member::reclaim_dead).
bool all_answered(const share::Ledger& l, ParkAsked* asked, int k) {
  for (int j = 0; j < k; ++j) {
    const share::LedgerSlot& s = l.slot[asked[j].slot];
    if (asked[j].gone || s.state.load(std::memory_order_acquire) != share::kSlotLive ||
        answered_since(s.park.ack.load(std::memory_order_acquire), asked[j].req))
      continue;
    if (share::process_liveness(s.pid.load(std::memory_order_relaxed), s.start_time.load(std::memory_order_relaxed),
                                s.pid_ns.load(std::memory_order_relaxed)) == share::Liveness::gone) {
      asked[j].gone = true;
      continue;
    }
    return false;
  }
  return true;
}

// Under the guard: every other live member as a park request sees it, into `cand`; returns how many.
int park_candidates(const share::Ledger& l, int self, const std::atomic<std::int64_t>* refused_until, std::int64_t now,
                    share::ParkCandidate* cand) {
  int n = 0;
  for (int i = 0; i < static_cast<int>(share::kLedgerSlots); ++i) {
    const share::LedgerSlot& s = l.slot[i];
    if (i == self || s.state.load(std::memory_order_acquire) != share::kSlotLive) continue;
    share::ParkCandidate& c = cand[n++];
    c.slot = i;
    c.live = s.pid.load(std::memory_order_relaxed) > 0;
    c.parked = s.parking.parked.load(std::memory_order_relaxed) != 0;
    c.asking = s.parking.asking.load(std::memory_order_relaxed) != 0;
    c.pending = !answered_since(s.park.ack.load(std::memory_order_acquire), s.park.req.load(std::memory_order_acquire));
    c.refused = now < refused_until[i].load(std::memory_order_relaxed);
    c.parkable = s.parking.parkable.load(std::memory_order_relaxed);
    c.reserved = s.reserved.load(std::memory_order_relaxed);
    c.parked_bytes = s.parking.parked_bytes.load(std::memory_order_relaxed);
    c.active_ns = their_time(s.parking.active_ns);
    c.heartbeat_ns = their_time(s.heartbeat_ns);
    c.resident_ns = their_time(s.parking.resident_ns);
  }
  return n;
}

// Under the guard: every asked member answered and nothing came free: says why, and does not
// ask them again for a while.
void note_refusals(const share::Ledger& l, const ParkAsked* asked, int k, std::atomic<std::int64_t>* refused_until,
                   const std::string& group) {
  for (int j = 0; j < k; ++j) {
    const share::LedgerSlot& s = l.slot[asked[j].slot];
    if (asked[j].gone) {
      log_info("group {}: pid {} ended before it answered; its share comes back when its slot is reclaimed", group,
               asked[j].pid);
      continue;
    }
    const std::uint32_t a = s.park.result.load(std::memory_order_relaxed);
    char why[share::kNameBytes];
    std::memcpy(why, s.parking.refusal, sizeof why);
    if (a == share::kParkDone) continue;
    refused_until[asked[j].slot].store(share::monotonic_ns() + kRefusedNs, std::memory_order_relaxed);
    const std::string text = share::bounded_string(why, sizeof why);
    log_info("group {}: pid {} {}{}{}", group, asked[j].pid, answer_text(a), text.empty() ? "" : ": ", text);
  }
}

}  // namespace

// Under the guard. One round: asks the least recently active members that may be parked, and
// whose live bytes cover what is missing, to park; waits until bytes came free, every asked
// member answered, or the deadline. When nobody is idle and this process has waited
// group_park_idle_ms itself, members take turns (share::choose_turn): the one whose memory has
// been on the device longest is asked to park after the call it is in. When nobody can be asked
// now it waits a little (a member becomes idle, publishes its figures, or an earlier park
// finishes) unless nobody ever could; when every other member waits for memory too, the one
// resident longest parks itself (2: when that is this process).
int Member::park_round(std::int64_t start_ns, std::int64_t deadline, std::size_t request, bool self_parkable) noexcept {
  const std::uint32_t seen = l_->released.load(std::memory_order_acquire);
  const std::uint64_t budget = l_->budget, total = l_->total.load(std::memory_order_relaxed);
  const std::uint64_t over = sat_add(total, request) > budget ? sat_add(total, request) - budget : 0;
  const std::uint64_t need = std::max<std::uint64_t>(shortfall_.load(std::memory_order_relaxed), over);
  if (need == 0) return 1;  // room appeared meanwhile: try again
  const std::int64_t now = share::monotonic_ns();
  share::ParkCandidate cand[share::kLedgerSlots];
  share::Passed passed[share::kLedgerSlots];
  const int n = park_candidates(*l_, slot_, park_refused_, now, cand);
  int chosen[share::kLedgerSlots];
  int k = share::choose_to_park(cand, n, need, now, park_.idle_ns, chosen, passed);
  const bool turn = k == 0 && now - start_ns >= park_.idle_ns;
  if (turn) k = share::choose_turn(cand, n, need, now, park_.idle_ns, chosen, passed);
  if (k == 0) {
    // Nobody to ask now. Wait for something to change, unless nothing can: every other member
    // is parked already, keeps parking off, or holds no live memory.
    bool hope = false;
    std::uint64_t cached = 0;
    for (int i = 0; i < n; ++i) {
      hope = hope || share::may_park_later(cand[i], passed[i]);
      cached = sat_add(cached, l_->slot[cand[i].slot].cached.load(std::memory_order_relaxed));
    }
    if (cached != 0 && now - cache_asked_ns_.load(std::memory_order_relaxed) >= kCacheAskEveryNs) {
      cache_asked_ns_.store(now, std::memory_order_relaxed);
      return 3;
    }
    if (!hope) return -1;
    // Every other member waits for memory too (or is parked, or holds nothing): one must give way.
    if (now - start_ns >= kYieldAfterNs && share::yield_to_waiting(cand, n, passed, self_candidate(self_parkable), now))
      return 2;
    wait_word(&l_->released, seen, std::min<std::int64_t>(deadline - now, 20'000'000));
    return 1;
  }
  ParkAsked asked[share::kLedgerSlots];
  send_park_requests(*l_, chosen, k, need, turn, cand, n, now, asked);
  // Logged after the requests went out (a fault in a string jumps out of nothing live: the
  // figures were copied first).
  for (int j = 0; j < k; ++j)
    log_info(
        "group {}: asking pid {} ({}, holding {}, {} of it live) to park: {} more for this process on device {} "
        "would be {} over the budget of {}",
        group_, asked[j].pid,
        turn ? "in turn: every member works; its memory has been on the device for " + seconds(asked[j].resident_ns)
             : "idle " + seconds(asked[j].idle_ns),
        mib(asked[j].held), mib(asked[j].live), mib(request), device_, mib(need), mib(budget));
  for (;;) {
    const std::int64_t t = share::monotonic_ns();
    if (l_->released.load(std::memory_order_acquire) != seen) return 1;
    if (all_answered(*l_, asked, k)) break;
    if (t >= deadline) return 0;
    wait_word(&l_->released, seen, std::min<std::int64_t>(deadline - t, 20'000'000));
  }
  note_refusals(*l_, asked, k, park_refused_, group_);
  return 1;
}

}  // namespace cudapool::shim::group
