// GPU-side ordering (free_sync:gpu_wait; docs/shim.md, "GPU-side waits"): instead of waiting for a
// freed block's fences, the work issued from now on is made to run after them. Context-wide
// fences still running are ordered by one cuCtxWaitEvent on the newest of them (all work issued
// from then on, on every stream of the context, waits for it and so for everything it covers).
// The remaining, legacy-stream fences: their still-running events are JOINED on the legacy stream
// (it waits for the sweep's events still running on non-blocking streams; a sweep is begun for
// fences no sweep covers yet), one join event is recorded there, and every live non-blocking
// stream waits for it; blocking and per-thread streams follow the legacy stream by themselves.
// So k streams cost about 2k waits, not k*k. A fence that is one event on the legacy stream,
// while the context has no non-blocking stream, needs nothing at all (every stream that exists
// follows the legacy stream): it is remembered as UNJOINED instead. A non-blocking stream created
// while the newest join event, or the unjoined fence, may still run waits for it at creation.
// Not thread-safe: used under the fences' lock, with the context current (order()).
#pragma once
#include <cstddef>
#include <vector>

#include "allocator/fence.h"
#include "shim/fences/fence_recorder.h"

namespace cudapool::shim {

class GpuOrdering {
 public:
  struct Parts {  // the fence layer's parts it orders with
    FenceSlab& slab;
    FenceRecorder& recorder;
    FenceSequence& seq;
    FenceSweeps& sweeps;
    ContextWideFences& wide;
    const FenceStreams& streams;
  };
  GpuOrdering(const RealDriver& d, EventPool& events, FenceCalls& calls, const Parts& parts)
      : d_(d), events_(events), calls_(calls), parts_(parts) {}

  // All work issued from now on runs after these fences (FenceProvider::order_after).
  bool order(const FenceHandle* fences, std::size_t n);
  // order() needs no driver call now (FenceProvider::orders_for_free, without its capture check).
  bool free_now() const noexcept;
  // A new non-blocking stream waits for the joins and the unjoined fence that may still run.
  void stream_added(CUstream s);
  // f goes back to the slab (`stale`: its context is gone).
  void released(Fence* f, bool stale);
  void reset() noexcept;  // the context is gone

 private:
  // What order() found among the fences it was given.
  struct Pending {
    std::uint64_t ordered_seq = 0;   // device fences up to this one are ordered by the context-wide wait
    bool legacy_orders_all = false;  // no non-blocking stream: a legacy event orders everything
    Fence* unjoined = nullptr;       // the newest fence ordered by the legacy stream alone
    bool legacy_running = false;     // a fence's own event still runs
    bool sweep_running = false;      // a fence's sweep has not finished
  };
  Fence* newest_running_wide(const FenceHandle* fences, std::size_t n);
  bool classify(Fence* f, Pending* p);  // false: a driver call failed
  bool join(const Pending& p);          // the join on the legacy stream, and the streams' waits on it
  void prune_joins();                   // recycles the join events that have completed

  const RealDriver& d_;
  EventPool& events_;
  FenceCalls& calls_;
  const Parts parts_;
  // The join events that may still be running: non-blocking streams created later wait for them.
  // Owned here (not in the event pool): the newest join, which covers every older one, and the
  // legacy events of fences released while reused without a join (released()).
  std::vector<CUevent> joins_;
  // The newest device fence whose memory order() handed out without a join: a non-blocking
  // stream created while it may still run waits for its event. Cleared when the fence is
  // released; its event then joins joins_ unless it is known complete.
  Fence* unjoined_ = nullptr;
};

}  // namespace cudapool::shim
