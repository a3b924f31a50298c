// Recording a fence's events, and deferring it while a graph capture is open. A device fence is
// one context-wide event where those are in use and needed (shim/fences/context_wide_fences.h), else one
// event on the legacy stream (which waits behind every blocking and per-thread default stream)
// plus the sweep that must cover the non-blocking streams (shim/fences/fence_sweeps.h); a stream fence
// is one event on its stream. While a capture is in progress, recording on the legacy stream or
// on a capturing stream would become part of the graph (or break it), so such a fence is
// DEFERRED: recorded at the first query after every capture has ended, pending until then.
// Not thread-safe: used under the fences' lock.
#pragma once
#include "shim/fences/context_wide_fences.h"
#include "shim/fences/fence_sequence.h"
#include "shim/fences/fence_sweeps.h"

namespace cudapool::shim {

class FenceRecorder {
 public:
  FenceRecorder(FenceContext& context, EventPool& events, ContextWideFences& wide, FenceSequence& seq,
                FenceSweeps& sweeps, const FenceStreams& streams)
      : context_(context), events_(events), wide_(wide), seq_(seq), sweeps_(sweeps), streams_(streams) {}

  // A new fence: recorded now, or deferred while a capture is open.
  void take(Fence* f);
  // The fence's events, now (the context current: the caller's).
  void record(Fence* f);
  // A deferred fence is recorded now if no capture is open; false: it stays deferred.
  bool settle(Fence* f) { return !f->deferred || settle_deferred(f); }
  // Before a host wait: a deferred fence is recorded, or, while a capture is still open, left to
  // the sweep of the non-blocking streams alone (the legacy stream would break the capture).
  void settle_for_wait(Fence* f);

 private:
  bool settle_deferred(Fence* f);
  void record_now(Fence* f);  // record() with the context made current if needed
  bool record_on(Fence* f, CUstream s);

  FenceContext& context_;
  EventPool& events_;
  ContextWideFences& wide_;
  FenceSequence& seq_;
  FenceSweeps& sweeps_;
  const FenceStreams& streams_;
};

}  // namespace cudapool::shim
