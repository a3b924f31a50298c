// The order of a context's device fences, and what is known complete without asking the driver.
// Device fences carry a sequence number; once one is seen complete, every older one is complete
// too as far as the newer one covers (a legacy event: the legacy stream's work, which completes
// in order; a context-wide event: everything), so older ones are answered without a driver call.
// With several fences outstanding (the pool asks oldest first), the newest is asked once on an
// older one's behalf; found running, it is not asked again for another within kNewestRecheckNs.
// Not thread-safe: used under the fences' lock.
#pragma once
#include <cstdint>

#include "shim/fences/event_pool.h"
#include "shim/fences/fence_record.h"

namespace cudapool::shim {

class FenceSequence {
 public:
  explicit FenceSequence(EventPool& events) : events_(events) {}

  // f was just recorded (its events in place): it becomes the newest device fence.
  void recorded(Fence* f);
  // A newer context-wide fence completed: it covered everything f needs.
  bool all_complete(const Fence* f) const noexcept { return f->seq != 0 && f->seq <= completed_all_seq_; }
  // A newer fence that covers what f does was seen complete (no driver call).
  bool known_complete(const Fence* f) const noexcept;
  // Only the legacy stream's part of f is known complete (a legacy fence older than one seen done).
  bool legacy_complete(const Fence* f) const noexcept { return f->seq <= completed_seq_; }
  // f's events completed: the shortcuts first, then the newest fence on f's behalf, then f's own.
  bool events_complete(Fence* f);
  // Asks the driver about f's events; notes completion.
  bool query_events(Fence* f);
  void note_complete(const Fence* f);
  // A context-wide fence may still run (a legacy event recorded now would not cover what it does).
  bool context_wide_running() const noexcept { return last_context_seq_ > completed_all_seq_; }
  void released(const Fence* f) noexcept {
    if (newest_ == f) newest_ = nullptr;
  }
  void reset() noexcept;  // the context is gone (the numbering goes on)

 private:
  // Within this time after the newest fence was asked for an older one and found running, it is
  // not asked again for another (a poll asking several fences in a row would pay it each time).
  // Timed by the pool's clock (allocator/pool_clock.h), which a test drives.
  static constexpr std::int64_t kNewestRecheckNs = 50'000;
  bool newest_asked_lately() const;
  // Asks the newest fence on f's behalf (f is older and covered by it): true if it completed.
  bool newest_completed_for(const Fence* f);

  EventPool& events_;
  std::uint64_t next_seq_ = 1;
  Fence* newest_ = nullptr;  // the newest recorded device fence, until released
  // Every device fence with seq <= completed_seq_ has its legacy event complete (a context-wide
  // fence: its event covers the legacy stream's work too); every one with seq <= completed_all_seq_
  // is complete, whatever it needed (a context-wide fence completed after it).
  std::uint64_t completed_seq_ = 0;
  std::uint64_t completed_all_seq_ = 0;
  std::uint64_t last_context_seq_ = 0;  // the newest context-wide fence's seq
  // The newest fence, as last asked on behalf of an older one and found running, and when.
  std::uint64_t newest_running_seq_ = 0;
  std::int64_t newest_running_ns_ = 0;
};

}  // namespace cudapool::shim
