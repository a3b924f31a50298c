// Sharing one GPU between processes (docs/design.md, "The group ledger"):
//  * a group budget: the processes of one user on one GPU with the same `group` keep their
//    reserved bytes, and (group_budget_counts:footprint, the default) their memory outside the
//    pool as the device shows it, in a ledger in shared memory, and the sum stays under the
//    budget (group::Member in shim/group/group_ledger.h, the ReserveGate of every upstream of that
//    device; the ledger's layout in shim/group/group_ledger_layout.h);
//  * cooperative release: an allocation the budget refuses asks the other members to give back
//    idle cached memory and waits a bounded time (ask_release), each member answering from its
//    responder thread with its pools' own release_idle (shim/group/group_responder.cpp);
//  * the per-process stats record that `cudapool top` reads (publish_stats), and each member's
//    published figures (shim/group/group_publisher.cpp).
// This file is what the runtime and the hooks call: the process's memberships, one per device,
// and the helper threads' start. Nothing here runs before the first pool of the process is
// created, and nothing here knows the runtime: the pools come through ProcessPools.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "allocator/pool.h"
#include "config/policy.h"
#include "shim/driver.h"
#include "shim/upstream/cuda_upstream.h"

namespace cudapool::shim::group {

class Member;

// What one round of asking others to park tells an allocation the budget refused: try it again,
// give up (out of memory), or park this process first (every member waits for memory and this
// one was resident longest: share::yield_to_waiting), then try again.
enum class ParkWait { again, give_up, park_self };

// What the group's helper threads need of the process's pools (the runtime gives it).
class ProcessPools {
 public:
  // fn(device, pool) for every live pool of the process.
  virtual void for_each(const std::function<void(int device, DevicePool& pool)>& fn) = 0;
  // The process is exiting: helper threads stop touching the pools.
  virtual bool exiting() const noexcept = 0;

 protected:
  ~ProcessPools() = default;
};

// The member for `device` in the policy's group, joining the ledger on first use; nullptr when
// the policy has no group or the ledger cannot be used (a warning says why; the pool then keeps
// only its own caps). `device_total`: the device's memory, for group_budget_fraction. `driver`
// names the GPU (its UUID) and measures memory outside the pool.
Member* member_for(const Policy& policy, const RealDriver& driver, int device, std::size_t device_total) noexcept;
// The member as its upstreams' gate.
ReserveGate* gate_of(Member* m) noexcept;

// An allocation on the member's device was refused by the budget: one round of asking the
// other members for idle cached memory (round 0: the fewest that cover the shortfall, by the
// idle bytes they last published; later rounds: everyone) and waiting until they answered,
// something was released, or the policy's group_release_wait_ms passed since `start_ns`
// (share::monotonic_ns). `request`: the bytes of the allocation refused, so the members are
// asked for all of its excess over the budget at once. true: try the allocation again.
bool ask_release(Member& m, std::int64_t start_ns, int round, std::size_t request) noexcept;

// With group_park:on, after ask_release gave up: one round of asking the least recently active
// members that may be parked (idle for group_park_idle_ms, not parked, parkable) and whose live
// bytes cover the shortfall to park, and waiting for their bytes, until group_park_wait_ms has
// passed since `start_ns` (shim/group/group_park.h). give_up: parking is off, the wait is over, or
// no other member can ever be parked for it (a warning then names who holds the budget);
// park_self: every member waits for memory, and this one is to park (park_self below, outside
// any CUDA call) before it tries again.
ParkWait ask_park(Member& m, std::int64_t start_ns, int round, std::size_t request) noexcept;
// Parks this process for the other members that wait for memory (ask_park said park_self), unless
// group_park_wait_ms has passed since `start_ns` (when the allocation first gave way); false,
// logged, when it did not.
bool park_self(Member& m, std::size_t request, std::int64_t start_ns) noexcept;
// While alive, this process waits for memory on `m`'s device: the others do not ask it to park
// (it could not: its thread is inside a CUDA call), and it refuses if asked.
class Waiting {
 public:
  explicit Waiting(Member& m) noexcept;
  ~Waiting();
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  Member& m_;
};
// The restore path's wait (park::set_restore_wait): a parked process whose memory the budget does
// not let back asks for idle cache, then parks others, as an allocation does, from `start_ns`.
bool restore_wait(int device, std::size_t bytes, std::int64_t start_ns, int round) noexcept;

// An out-of-memory answer went to the program on `device` (`cudapool top` shows the count).
void note_oom(int device) noexcept;
// Who holds a member's group budget, for the out-of-memory message of a refusal: each live slot's
// reserved + outside bytes, read without the ledger's lock (a moment's view). Members that
// exited keep their charge until the next join or refusal reclaims it. All zero once the member
// left its group.
struct BudgetShares {
  std::uint64_t budget = 0;
  std::uint64_t own = 0;     // this process
  std::uint64_t others = 0;  // the other members that may still live
  std::uint64_t exited = 0;  // members whose process is gone, not yet reclaimed
  int other_members = 0, exited_members = 0;
};
BudgetShares budget_shares(Member& m) noexcept;

// What cuMemGetInfo reports for a member: the group's budget (0 once it left the group) and
// the bytes all members reserve together (the whole budget for a member whose ledger cannot be
// trusted: nothing can be had under it).
std::size_t budget(Member& m) noexcept;
std::size_t group_reserved(Member& m) noexcept;

// Starts the helper threads with the first pool of `device` (the publisher: stats record and
// members' figures; one responder per group member to answer release requests). Called by the
// runtime after the pool is registered, so `pools` already lists it. `pools` lives as long as
// the process.
void on_pool_created(ProcessPools& pools, const Policy& policy, int device) noexcept;

// At exit (no CUDA): the stats record goes away. After fork in the child: forget everything
// the parent had (its slots, its threads), without touching the shared files.
void on_exit() noexcept;
void on_fork_child() noexcept;

}  // namespace cudapool::shim::group
