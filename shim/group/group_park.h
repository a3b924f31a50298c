// Parking in a group (docs/design.md, "Parking in a group"): the policy around the mechanism of
// shim/parking/parking.h. An allocation the group's budget still refuses after the idle-cache release
// asks the least recently active members that may be parked to park, and waits for their bytes
// (Member::ask_park, shim/group/group_ledger.h); each member answers on its park responder thread
// (shim/group/group_responder.h); its publisher says how long it has been idle and whether it may be
// parked (below). A parked member that wants its memory back waits the same way
// (group::restore_wait, shim/group/group.h).
#pragma once
#include <cstdint>
#include <string>

#include "shim/group/group_publisher.h"
#include "telemetry/share.h"

namespace cudapool::shim::group {

// When this process last made a call that can make the GPU touch memory, as monotonic_ns(): the
// time of the first sample of park::activity() that found it changed (the process's start counts
// as activity). Samples now; the publisher calls it every round, so the figure is at most one
// round (250 ms) late.
std::int64_t sample_activity() noexcept;

// For the publisher, every round: each member's parking words in its ledger (parked, parked
// bytes, whether it may be parked and why not, when it was last active).
void publish_parking(const Memberships& devices) noexcept;
// The same for one member, now (the park responder, when a parked process was restored).
void publish_parking_of(Member& m) noexcept;
// The stats record's parking fields (the process as a whole).
void fill_park_record(const Memberships& devices, share::ProcRecord& r) noexcept;

// Whether the process may be parked now, as a ParkBlock: kParkOff without group parking (`on`
// false; the mechanism is not asked), else the mechanism's answer, its reason in *why.
std::uint32_t parkable_now(bool on, std::string* why) noexcept;

}  // namespace cudapool::shim::group
