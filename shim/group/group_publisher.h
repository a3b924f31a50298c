// The publisher (shim/group/group.h): every 250 ms, on its own thread, the process's stats record that
// `cudapool top` reads (publish_stats; its layout is share::ProcRecord, telemetry/share.h) and
// each group member's idle and live bytes in its ledger, by which askers choose whom to ask.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

#include "shim/group/group.h"
#include "shim/group/group_ledger.h"
#include "telemetry/share.h"

namespace cudapool::shim::group {

// Devices a process keeps group state for (ordinals 0 .. kMaxDevices-1): those its record holds.
inline constexpr int kMaxDevices = static_cast<int>(share::kRecordDevices);

// The process's memberships and out-of-memory counts by device (shim/group/group.cpp keeps them; the
// publisher reads them).
struct Memberships {
  std::atomic<Member*> members[kMaxDevices] = {};
  std::atomic<std::uint64_t> ooms[kMaxDevices] = {};
};

// Publishes until the process exits: the stats record when `publish_stats` (it names `group`),
// and the figures of every member in `devices`. Runs on its own thread.
void publish(ProcessPools& pools, const Memberships& devices, bool publish_stats, const std::string& group);

// At exit: the stats record goes (never waits: a record left behind is removed by the next
// process that publishes one, or by `cudapool top`).
void remove_record() noexcept;
// After fork in the child: the parent's record stays the parent's (nothing touched).
void forget_record_in_child() noexcept;

}  // namespace cudapool::shim::group
