// Context-wide fences (cuCtxRecordEvent, CUDA 12.5): one event that covers the work issued so far
// on every stream of the context, the legacy one included, and one cuCtxWaitEvent that orders
// all later work of the context after it. Used only while no capture ever began in the process
// (on a context with a capturing stream the driver refuses them and invalidates the capture;
// shim/fences/streams.h, context_wide_begin), and only where they are needed (the caller asks only
// then: a non-blocking stream alive, or an earlier context-wide fence not yet seen complete). The driver
// lacking them or a refusal turns them off for the context (legacy events and sweeps from then
// on). Not thread-safe: used under the fences' lock.
#pragma once
#include "shim/fences/event_pool.h"
#include "shim/fences/fence_record.h"

namespace cudapool::shim {

class ContextWideFences {
 public:
  ContextWideFences(const RealDriver& d, CUcontext ctx, EventPool& events, FenceCalls& calls)
      : d_(d), ctx_(ctx), events_(events), calls_(calls) {}

  // Records f as one context-wide event where they are in use; false: not recorded (the caller
  // records a legacy event instead). Sets f->context_wide; numbering is the caller's.
  bool record(Fence* f);
  // cuCtxWaitEvent on f's event: all work issued from now on waits for it.
  bool wait(const Fence* f);
  // They can be relied on now (the driver has them, none was refused, no capture ever began).
  bool usable() const noexcept;
  void reset() noexcept { enabled_ = true; }  // the context is gone: a new one may have them

 private:
  bool available();  // the driver has them and none was refused (turns them off if not)

  const RealDriver& d_;
  const CUcontext ctx_;
  EventPool& events_;
  FenceCalls& calls_;
  bool enabled_ = true;  // until the driver lacks or refuses them
};

}  // namespace cudapool::shim
