// The group ledger's layout: names, setting up, checking and reading (group_ledger_layout.h).
#include "shim/group/group_ledger_layout.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

namespace cudapool::share {

std::string ledger_path(unsigned uid, std::string_view gpu_uuid, std::string_view group) {
  return shm_dir() + "/cudapool-" + std::to_string(uid) + "-g-" + std::string(gpu_uuid) + "-" + std::string(group);
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

bool parse_ledger(const void* data, std::size_t bytes, unsigned uid, LedgerView* out, std::string* why) {
  if (bytes != sizeof(Ledger)) {
    *why = std::to_string(bytes) + " bytes, not the " + std::to_string(sizeof(Ledger)) + " of this version's layout";
    return false;
  }
  // A copy: the bytes need not be aligned, and nothing here touches the mutex.
  auto l = std::make_unique<Ledger>();
  std::memcpy(static_cast<void*>(l.get()), data, sizeof(Ledger));
  const std::string group = bounded_string(l->group, sizeof l->group), gpu = bounded_string(l->gpu, sizeof l->gpu);
  if (std::string w = validate_ledger(*l, uid, gpu, group); !w.empty()) {
    *why = w;
    return false;
  }
  out->group = group;
  out->gpu = gpu;
  out->budget = l->budget;
  out->total = l->total.load(std::memory_order_relaxed);
  out->live.clear();
  for (std::uint32_t i = 0; i < kLedgerSlots; ++i) {
    const LedgerSlot& sl = l->slot[i];
    if (sl.state.load(std::memory_order_relaxed) != kSlotLive) continue;
    SlotView v;
    v.slot = static_cast<int>(i);
    v.pid = sl.pid.load(std::memory_order_relaxed);
    v.start_time = sl.start_time.load(std::memory_order_relaxed);
    v.pid_ns = sl.pid_ns.load(std::memory_order_relaxed);
    v.reserved = sl.reserved.load(std::memory_order_relaxed);
    v.outside = sl.outside.load(std::memory_order_relaxed);
    v.cached = sl.cached.load(std::memory_order_relaxed);
    v.allocated = sl.allocated.load(std::memory_order_relaxed);
    v.parked = sl.parking.parked.load(std::memory_order_relaxed) != 0;
    v.parkable = sl.parking.parkable.load(std::memory_order_relaxed);
    v.parked_bytes = sl.parking.parked_bytes.load(std::memory_order_relaxed);
    v.park_why = bounded_string(sl.parking.why, sizeof sl.parking.why);
    out->live.push_back(v);
  }
  return true;
}

std::vector<LedgerView> read_ledgers(unsigned uid, std::vector<std::string>* warnings) {
  std::vector<LedgerView> out;
  const std::string dir = shm_dir(), prefix = "cudapool-" + std::to_string(uid) + "-g-";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string path = dir + "/" + name;
    Mapping m = open_file(path, sizeof(Ledger), false, 0);
    if (m.fd < 0) {
      if (warnings != nullptr) warnings->push_back(path + " " + m.error + "; skipped");
      continue;
    }
    auto buf = std::make_unique<unsigned char[]>(sizeof(Ledger));
    const ssize_t n = ::pread(m.fd, buf.get(), sizeof(Ledger), 0);
    unmap(m);
    LedgerView v;
    std::string why;
    if (!parse_ledger(buf.get(), n > 0 ? static_cast<std::size_t>(n) : 0, uid, &v, &why)) {
      if (warnings != nullptr) warnings->push_back(path + " is not a valid group ledger (" + why + "); skipped");
      continue;
    }
    out.push_back(std::move(v));
  }
  ::closedir(d);
  return out;
}

// The slot's fields after the parking words live in what was its tail padding: a change that
// moves the file's size is a new layout version.
static_assert(sizeof(LedgerSlot) == 320 && sizeof(Ledger) == 20736, "the ledger's size changed: bump kLedgerVersion");
// Every field keeps its offset in the file: the first fields of each group, and the last one.
static_assert(offsetof(LedgerSlot, heartbeat_ns) == 56, "the ledger's layout changed: bump kLedgerVersion");
static_assert(offsetof(LedgerSlot, release.req) == 64 && offsetof(LedgerSlot, release.ack) == 68 &&
                  offsetof(LedgerSlot, release.want) == 72 && offsetof(LedgerSlot, release.given) == 80,
              "the ledger's layout changed: bump kLedgerVersion");
static_assert(offsetof(LedgerSlot, park.req) == 88 && offsetof(LedgerSlot, park.ack) == 92 &&
                  offsetof(LedgerSlot, park.want) == 96 && offsetof(LedgerSlot, park.from) == 104 &&
                  offsetof(LedgerSlot, park.gave) == 112,
              "the ledger's layout changed: bump kLedgerVersion");
static_assert(offsetof(LedgerSlot, parking.parked) == 120 && offsetof(LedgerSlot, parking.parkable) == 124 &&
                  offsetof(LedgerSlot, parking.parked_bytes) == 128 && offsetof(LedgerSlot, parking.why) == 152 &&
                  offsetof(LedgerSlot, parking.refusal) == 216 && offsetof(LedgerSlot, parking.resident_ns) == 280,
              "the ledger's layout changed: bump kLedgerVersion");
static_assert(offsetof(LedgerSlot, growth_left) == 288, "the ledger's layout changed: bump kLedgerVersion");

namespace {

// The first of `m` ordered candidates (indices into c) whose reserved bytes cover `need`: writes
// their slots to `chosen` and returns how many; the rest are marked spare.
int take_until_covered(const ParkCandidate* c, const int* order, int m, std::uint64_t need, int* chosen,
                       Passed* passed) {
  int k = 0;
  std::uint64_t covered = 0;
  for (; k < m && (k == 0 || covered < need); ++k) {
    chosen[k] = c[order[k]].slot;
    covered = covered + c[order[k]].reserved < covered ? UINT64_MAX : covered + c[order[k]].reserved;
  }
  if (passed != nullptr)
    for (int j = k; j < m; ++j) passed[order[j]] = Passed::spare;  // the need was covered without them
  return k;
}

}  // namespace

int choose_to_park(const ParkCandidate* c, int n, std::uint64_t need, std::int64_t now_ns, std::int64_t idle_ns,
                   int* chosen, Passed* passed) {
  constexpr std::int64_t kSilentNs = 2'000'000'000;  // no publication for this long: stopped or stuck
  int order[kLedgerSlots];
  int m = 0;
  for (int i = 0; i < n && i < static_cast<int>(kLedgerSlots); ++i) {
    const ParkCandidate& k = c[i];
    Passed p = Passed::chosen;
    if (!k.live || k.parked)
      p = Passed::parked;
    else if (k.asking)
      p = Passed::busy_asking;
    else if (k.pending)
      p = Passed::pending;
    else if (k.refused)
      p = Passed::refused;
    else if (k.parkable != kParkable)
      p = Passed::not_parkable;
    else if (k.active_ns <= 0 || k.heartbeat_ns <= 0 || now_ns - k.heartbeat_ns > kSilentNs)
      p = Passed::silent;
    else if (now_ns - k.active_ns < idle_ns)
      p = Passed::not_idle;
    else if (k.reserved == 0)
      p = Passed::empty;
    else
      order[m++] = i;
    if (passed != nullptr) passed[i] = p;
  }
  // The least recently active first; ties by slot, so the choice does not depend on the order given.
  std::sort(order, order + m, [&](int a, int b) {
    return c[a].active_ns != c[b].active_ns ? c[a].active_ns < c[b].active_ns : c[a].slot < c[b].slot;
  });
  return take_until_covered(c, order, m, need, chosen, passed);
}

int choose_turn(const ParkCandidate* c, int n, std::uint64_t need, std::int64_t now_ns, std::int64_t idle_ns,
                int* chosen, Passed* passed) {
  int order[kLedgerSlots];
  int m = 0;
  for (int i = 0; i < n && i < static_cast<int>(kLedgerSlots); ++i) {
    if (passed[i] != Passed::not_idle || c[i].reserved == 0) continue;
    // A value past the clock reads as resident since ever.
    const std::int64_t since = c[i].resident_ns > now_ns ? 0 : c[i].resident_ns;
    if (now_ns - since < idle_ns) continue;  // restored a moment ago: its turn has just begun
    order[m++] = i;
  }
  std::sort(order, order + m, [&](int a, int b) {
    const std::int64_t ra = c[a].resident_ns > now_ns ? 0 : c[a].resident_ns;
    const std::int64_t rb = c[b].resident_ns > now_ns ? 0 : c[b].resident_ns;
    return ra != rb ? ra < rb : c[a].slot < c[b].slot;
  });
  for (int j = 0; j < m; ++j) passed[order[j]] = Passed::chosen;
  return take_until_covered(c, order, m, need, chosen, passed);
}

bool yield_to_waiting(const ParkCandidate* c, int n, const Passed* passed, const ParkCandidate& self,
                      std::int64_t now_ns) {
  if (!self.live || self.parked || self.reserved == 0 || self.parkable != kParkable) return false;
  // A value past the clock reads as resident since ever, as in choose_turn.
  auto since = [now_ns](const ParkCandidate& k) { return k.resident_ns > now_ns ? 0 : k.resident_ns; };
  for (int i = 0; i < n && i < static_cast<int>(kLedgerSlots); ++i) {
    switch (passed[i]) {
      case Passed::parked:
      case Passed::empty: continue;
      case Passed::busy_asking:
        if (c[i].reserved != 0 && c[i].parkable == kParkable &&
            (since(c[i]) < since(self) || (since(c[i]) == since(self) && c[i].slot < self.slot)))
          return false;  // another waiting member goes first
        continue;
      default: return false;  // someone works, or will answer: no deadlock
    }
  }
  return true;
}

bool may_park_later(const ParkCandidate& c, Passed passed) {
  switch (passed) {
    case Passed::chosen:
    case Passed::spare:
    case Passed::busy_asking:
    case Passed::pending:
    case Passed::refused:
    case Passed::not_idle:
    case Passed::silent: return c.live;
    case Passed::not_parkable: return c.live && c.parkable != kParkOff;
    // A parked member whose bytes are back in the ledger was restored; its flag is cleared soon.
    case Passed::parked: return c.live && c.reserved != 0 && c.reserved >= c.parked_bytes;
    case Passed::empty: return false;
  }
  return false;
}

}  // namespace cudapool::share
