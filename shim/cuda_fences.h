// The pool's FenceProvider on CUDA events, for one context.
//
// record_device: one event on the legacy stream (it waits behind every blocking stream and every
// per-thread default stream: measured on the H200) plus one on each live non-blocking stream of
// the context, which the legacy stream does not cover. record_stream: one event on that stream.
// Events are created once with CU_EVENT_DISABLE_TIMING (cheapest kind) and recycled.
//
// While a graph capture is in progress, recording on the legacy stream or on a capturing stream
// would become part of the graph (or break it), so such a fence is "deferred": it is recorded at
// the first query after every capture has ended and counts as pending until then.
#pragma once
#include <atomic>
#include <mutex>
#include <vector>

#include "allocator/fence.h"
#include "shim/driver.h"

namespace cudapool::shim {

class CudaFences final : public FenceProvider {
 public:
  CudaFences(const RealDriver& d, CUcontext ctx) : d_(d), ctx_(ctx) {}

  FenceHandle record_device() override;
  FenceHandle record_stream(StreamId stream) override;
  bool query(FenceHandle fence) override;
  void wait(FenceHandle fence) override;
  void release(FenceHandle fence) override;

  // Stream lifetime, from the stream-creation hooks.
  void add_stream(CUstream s, bool non_blocking);
  // true if the stream was created through the hooks in this context.
  bool remove_stream(CUstream s);
  bool knows_stream(CUstream s);

  // The context is gone: forget every event and stream without calling CUDA. Fences handed out
  // before stay valid handles (they count as complete) but their events are never reused.
  void abandon();

 private:
  struct Fence {
    std::vector<CUevent> events;
    StreamId stream = 0;
    bool device = false;
    bool deferred = false;
    bool done = false;
    unsigned generation = 0;
  };

  Fence* new_fence_locked();
  CUevent take_event_locked();
  bool record_on_locked(Fence* f, CUstream s);
  void record_locked(Fence* f);  // the fence's events, now (context made current by the caller)

  const RealDriver& d_;
  CUcontext ctx_;
  std::mutex mu_;
  unsigned generation_ = 0;
  std::vector<CUevent> free_events_;
  std::vector<Fence*> free_fences_;
  std::vector<CUstream> non_blocking_;
  std::vector<CUstream> streams_;
};

}  // namespace cudapool::shim
