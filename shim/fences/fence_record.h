// One fence of the fence layer (shim/fences/cuda_fences.h) and the slab that recycles them. A fence is
// the layer's own record, shared by its parts under the layer's lock; the pool only ever sees
// its handle.
#pragma once
#include <cstdint>
#include <vector>

#include "allocator/fence.h"
#include "allocator/types.h"
#include "shim/driver.h"

namespace cudapool::shim {

struct Fence {
  static Fence* of(FenceHandle h) noexcept { return reinterpret_cast<Fence*>(h); }
  FenceHandle handle() noexcept { return reinterpret_cast<FenceHandle>(this); }

  std::vector<CUevent> events;
  std::vector<CUstream> on;  // the stream each event was recorded on (nullptr: the whole context)
  StreamId stream = 0;
  bool device = false;
  bool deferred = false;      // taken while a capture was open: recorded at the first query after
  bool done = false;          // complete: its events, and the sweep it needs
  bool events_done = false;   // its own events have completed
  bool context_wide = false;  // its one event is cuCtxRecordEvent's: it needs no sweep
  unsigned generation = 0;
  std::uint64_t seq = 0;    // device fences: recording order (0: not recorded, or legacy record failed)
  std::uint64_t cover = 0;  // device fences: the sweep that covers the non-blocking streams (0: none needed)
  // The one event on the legacy stream, nothing else (what a stream following it runs after).
  bool legacy_only() const noexcept { return seq != 0 && events.size() == 1 && on.front() == CU_STREAM_LEGACY; }
};

// Fences made once and recycled; a generation per context lifetime: a fence of an earlier one
// (the context is gone) counts as complete and its events are never reused.
class FenceSlab {
 public:
  FenceSlab() = default;
  ~FenceSlab();  // fences still handed out are the pool's: leaked with it, as before
  FenceSlab(const FenceSlab&) = delete;
  FenceSlab& operator=(const FenceSlab&) = delete;

  Fence* make();  // a blank fence of the current generation
  void recycle(Fence* f) { free_.push_back(f); }
  bool stale(const Fence* f) const noexcept { return f->generation != generation_; }
  void next_generation() noexcept { ++generation_; }

 private:
  std::vector<Fence*> free_;
  unsigned generation_ = 0;
};

}  // namespace cudapool::shim
