// The process's memberships, one per device, and the start of the group's helper threads
// (shim/group/group.h). The ledger itself is shim/group/group_ledger.*, its layout
// shim/group/group_ledger_layout.*, the threads shim/group/group_responder.* and shim/group/group_publisher.*.
#include "shim/group/group.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "shim/group/group_ledger.h"
#include "shim/group/group_publisher.h"
#include "shim/group/group_responder.h"
#include "shim/log.h"
#include "shim/parking/parking.h"
#include "shim/sigbus_guard.h"

namespace cudapool::shim::group {

namespace {

struct State {
  std::mutex mu;
  Memberships devices;
  bool tried[kMaxDevices] = {};
  bool responders[kMaxDevices] = {};
  bool publisher = false;
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

}  // namespace

Member* member_for(const Policy& p, const RealDriver& driver, int device, std::size_t device_total) noexcept {
  if (p.group.empty() || device < 0 || device >= kMaxDevices) return nullptr;
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.tried[device]) return st.devices.members[device].load();
  st.tried[device] = true;
  std::uint64_t budget = p.group_budget != 0 ? p.group_budget : UINT64_MAX;
  if (p.group_budget_fraction > 0.0)
    budget = std::min<std::uint64_t>(budget, static_cast<std::uint64_t>(p.group_budget_fraction *
                                                                        static_cast<double>(device_total)));
  if (budget == 0 || budget == UINT64_MAX) {
    log_warn("group {}: the budget is 0 bytes on device {} (device memory unknown?); not joining", p.group, device);
    return nullptr;
  }
  const std::string gpu = gpu_name(driver, device);
  const std::string path = share::ledger_path(::geteuid(), gpu, p.group);
  Member* m = nullptr;
  try {
    m = Member::join(path, p.group, gpu, device, budget, p.group_release_wait_ms, &driver, Member::outside_setting(p),
                     p.group_outside_growth);
    if (m != nullptr && !m->closed()) {
      Member::ParkSettings park;
      park.on = p.group_park;
      park.idle_ns = static_cast<std::int64_t>(p.group_park_idle_ms) * 1'000'000;
      park.wait_ms = p.group_park_wait_ms;
      park.host_limit = p.group_park_host;
      m->set_park(park);
      // A parked process that cannot have its memory back at once waits as an allocation does.
      park::set_restore_wait(&restore_wait);
    }
  } catch (...) {
    m = nullptr;
  }
  st.devices.members[device].store(m);
  return m;
}

ReserveGate* gate_of(Member* m) noexcept { return m; }

bool ask_release(Member& m, std::int64_t start_ns, int round, std::size_t request) noexcept {
  try {
    return m.ask_release(start_ns + static_cast<std::int64_t>(m.wait_ms()) * 1'000'000, round, request);
  } catch (...) {
    return false;
  }
}

ParkWait ask_park(Member& m, std::int64_t start_ns, int round, std::size_t request) noexcept {
  try {
    (void)round;
    return m.ask_park(start_ns, start_ns + static_cast<std::int64_t>(m.park_settings().wait_ms) * 1'000'000, request);
  } catch (...) {
    return ParkWait::give_up;
  }
}

Waiting::Waiting(Member& m) noexcept : m_(m) { m_.note_asking(1); }
Waiting::~Waiting() { m_.note_asking(-1); }

bool restore_wait(int device, std::size_t bytes, std::int64_t start_ns, int round) noexcept {
  if (device < 0 || device >= kMaxDevices) return false;
  Member* m = state().devices.members[device].load();
  if (m == nullptr || m->closed() || m->broken()) return false;
  Waiting waiting(*m);
  // Idle cached memory first, for group_release_wait_ms; then, with group_park:on, others are
  // parked for it, for group_park_wait_ms (both from the restore's start).
  const std::int64_t release_end = start_ns + static_cast<std::int64_t>(m->wait_ms()) * 1'000'000;
  if (share::monotonic_ns() < release_end && ask_release(*m, start_ns, round, bytes)) return true;
  // A parked process holds nothing on the device, so it is never the one to park itself.
  return ask_park(*m, start_ns, round, bytes) == ParkWait::again;
}

std::size_t budget(Member& m) noexcept { return m.broken() ? 0 : m.budget(); }
std::size_t group_reserved(Member& m) noexcept { return m.total(); }

BudgetShares budget_shares(Member& m) noexcept {
  BudgetShares out;
  if (!m.broken()) m.shares(&out);
  return out;
}

void note_oom(int device) noexcept {
  if (device >= 0 && device < kMaxDevices) state().devices.ooms[device].fetch_add(1, std::memory_order_relaxed);
}

void on_pool_created(ProcessPools& pools, const Policy& policy, int device) noexcept {
  State& st = state();
  bool start_publisher = false, start_responder = false;
  Member* m = nullptr;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (device >= 0 && device < kMaxDevices) m = st.devices.members[device].load();
    if (!st.publisher && (policy.publish_stats || m != nullptr)) st.publisher = start_publisher = true;
    // One responder per member: the first pool of its device starts it.
    if (m != nullptr && !m->closed() && !st.responders[device]) st.responders[device] = start_responder = true;
  }
  try {
    if (start_publisher)
      start_thread([p = &pools, d = &st.devices, stats = policy.publish_stats, name = policy.group] {
        publish(*p, *d, stats, name);
      });
  } catch (...) {
    log_warn("could not start a helper thread; group release requests and `cudapool top` figures are off");
  }
  if (start_responder) start_thread([p = &pools, m] { respond(*p, *m); });
  // Park requests have a thread of their own: a park takes long, and release requests go on.
  if (start_responder && m->park_settings().on) start_thread([p = &pools, m] { respond_parks(*p, *m); });
}

void on_exit() noexcept { remove_record(); }

void on_fork_child() noexcept {
  // The parent's slots and record stay the parent's; its helper threads do not exist here. The
  // state is rebuilt in place (the parent may have held its mutex at fork).
  State& st = state();
  new (&st.mu) std::mutex;
  for (int d = 0; d < kMaxDevices; ++d) {
    st.devices.members[d].store(nullptr);
    st.tried[d] = false;
    st.responders[d] = false;
    st.devices.ooms[d].store(0, std::memory_order_relaxed);
  }
  st.publisher = false;
  forget_record_in_child();
  guards_after_fork();
}

}  // namespace cudapool::shim::group
