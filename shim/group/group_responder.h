// The answering side of cooperative release (shim/group/group.h): one thread per group member.
#pragma once
#include "shim/group/group.h"
#include "shim/group/group_ledger.h"

namespace cudapool::shim::group {

// Answers `m`'s release requests for as long as the process runs: its device's pools give back
// about what was asked of idle cached memory, the longest-cached first (DevicePool::release_idle:
// whole free segments and units, pending memory only after its fence; never a live block). Runs
// on its own thread; returns when the process exits or the member leaves the group.
void respond(ProcessPools& pools, Member& m);

// Answers `m`'s park requests (group_park:on) for as long as the process runs, on its own thread:
// refused when the process worked within group_park_idle_ms (by its own clock) or its parked
// data would pass group_park_host_mb, else the whole process is parked (park::park, Mode::copy:
// calls in flight finish first) and the bytes its slot gave back are the answer.
void respond_parks(ProcessPools& pools, Member& m);

}  // namespace cudapool::shim::group
