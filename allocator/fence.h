// Stream safety, abstracted. A fence is a point in the GPU's timeline: "all work issued so far"
// on one stream or on the whole device. The pool records fences when memory is freed and only
// reuses that memory once the fence has completed. The shim builds fences from CUDA events;
// tests complete them by hand.
#pragma once
#include <cstddef>
#include <cstdint>

#include "allocator/types.h"

namespace cudapool {

using FenceHandle = std::uint64_t;  // 0 is never a valid fence

class FenceProvider {
 public:
  virtual ~FenceProvider() = default;
  // A fence covering all work issued so far on every stream of the device/context.
  virtual FenceHandle record_device() = 0;
  // A fence covering all work issued so far on one stream.
  virtual FenceHandle record_stream(StreamId stream) = 0;
  // true once the fence has completed. Must be cheap: called on the allocation path.
  virtual bool query(FenceHandle fence) = 0;
  // query() when memory is wanted now (the pool missed and would otherwise grow or wait): a
  // provider may spend more to answer (the shim asks its non-blocking streams at once instead of
  // at most once a millisecond). The default is query().
  virtual bool query_urgent(FenceHandle fence) { return query(fence); }
  // Block the calling thread until the fence has completed.
  virtual void wait(FenceHandle fence) = 0;
  // false when a wait now could return before all the work the fence stands for has finished
  // (the shim: a fence taken while a graph capture is open, which cannot be recorded on every
  // stream until the capture ends). The pool then never waits on it: the memory stays pending.
  virtual bool can_wait(FenceHandle /*fence*/) { return true; }
  // The pool no longer needs the fence.
  virtual void release(FenceHandle fence) = 0;
  // Make the GPU, not the host, wait: every piece of work issued from now on, on any stream that
  // can touch the pool's memory (streams created later included), runs only after the `n` device
  // fences have completed. Afterwards the pool may hand their memory out at once; the fences stay
  // the pool's (it still queries, waits on and releases them). Returns false when that cannot be
  // done now (a graph capture is open, the driver refused, or the provider has no such means):
  // the memory then stays pending. The default has no such means.
  virtual bool order_after(const FenceHandle* /*fences*/, std::size_t /*n*/) { return false; }
  // true when order_after() on device fences would now succeed without making any driver call:
  // every stream that can touch the pool's memory already runs behind the stream device fences
  // are recorded on (the shim: a context with no non-blocking stream and no capture open). The
  // pool then hands free()d memory out again as soon as its fence is recorded, without asking
  // whether the fence completed. The default has no such means.
  virtual bool orders_for_free() { return false; }
};

}  // namespace cudapool
