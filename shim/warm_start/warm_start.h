// Warm start (policy key warm_start): before a device's pool serves its first allocation, the
// segments a recorded run held at its peak (a plan from `cudapool plan`, or the trace itself;
// telemetry/warm_plan.h) are taken from the driver and handed back to the pool as free memory,
// so the program's first step finds them cached instead of growing the pool.
//
// Runs on the thread of that first allocation, in its context, through the pool's public calls
// only (allocate, then free_on_stream on the allocation's stream: memory no work ever touched is
// reusable at once there, and by other streams after the pool's usual fence). Never at load
// time, never at exit, never while a graph capture is open (it waits for a later allocation).
// What does not fit the free device memory, the pool's cap or the group budget is left out, with
// one warning that says by how much and what to change; a plan that cannot be read costs one
// warning. The program itself never fails because of a plan.
#pragma once
#include "allocator/types.h"

namespace cudapool::shim {

class Runtime;
struct ContextPool;

// Called by the allocation hook while cp.warm_pending is set (once per pool in effect).
void warm_start(Runtime& rt, ContextPool& cp, StreamId stream) noexcept;

}  // namespace cudapool::shim
