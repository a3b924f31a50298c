// Recycled CUDA events for the fence layer: created once with CU_EVENT_DISABLE_TIMING (the
// cheapest kind), handed back after use and recorded again (a record overwrites what the event
// marked, so one whose work still runs may be recycled). The driver calls on them are counted.
// Not thread-safe: used under the fences' lock.
#pragma once
#include <vector>

#include "shim/driver.h"
#include "shim/fences/fence_calls.h"

namespace cudapool::shim {

class EventPool {
 public:
  EventPool(const RealDriver& d, FenceCalls& calls) : d_(d), calls_(calls) {}

  // A recycled event, else a new one; nullptr when none can be made.
  CUevent take();
  void put(CUevent e) { free_.push_back(e); }
  template <class It>
  void put(It first, It last) {
    free_.insert(free_.end(), first, last);
  }
  // cuEventRecord of `e` on `s`, counted.
  bool record(CUevent e, CUstream s);
  // An event taken and recorded on `s`; nullptr (nothing kept) when either failed.
  CUevent record_new(CUstream s);
  // cuEventQuery, counted: false only for "not ready" (any other answer ends a wait: a sticky
  // error means nothing will ever complete, and holding memory back would only leak it).
  bool completed(CUevent e);
  // cuEventSynchronize, counted.
  void sync(CUevent e);
  // The context is gone: its events are dropped without a driver call (never reused).
  void forget() { free_.clear(); }
  std::size_t recycled() const noexcept { return free_.size(); }

 private:
  const RealDriver& d_;
  FenceCalls& calls_;
  std::vector<CUevent> free_;
};

}  // namespace cudapool::shim
