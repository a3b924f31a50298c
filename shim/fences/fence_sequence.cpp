#include "shim/fences/fence_sequence.h"

#include "allocator/pool_clock.h"

namespace cudapool::shim {

void FenceSequence::recorded(Fence* f) {
  f->seq = next_seq_++;
  if (f->context_wide) last_context_seq_ = f->seq;
  newest_ = f;
}

bool FenceSequence::known_complete(const Fence* f) const noexcept {
  return f->seq != 0 && f->seq <= (f->context_wide ? completed_all_seq_ : completed_seq_);
}

void FenceSequence::note_complete(const Fence* f) {
  if (f->seq > completed_seq_) completed_seq_ = f->seq;
  if (f->context_wide && f->seq > completed_all_seq_) completed_all_seq_ = f->seq;
}

bool FenceSequence::query_events(Fence* f) {
  for (CUevent e : f->events)
    if (!events_.completed(e)) return false;
  note_complete(f);
  return f->events_done = true;
}

bool FenceSequence::newest_asked_lately() const {
  return newest_ != nullptr && newest_->seq == newest_running_seq_ &&
         cudapool::detail::pool_clock_ns() - newest_running_ns_ < kNewestRecheckNs;
}

bool FenceSequence::newest_completed_for(const Fence* f) {
  if (f->seq == 0 || newest_ == nullptr || newest_ == f || newest_->events_done || newest_->seq <= f->seq ||
      (!newest_->context_wide && f->context_wide))
    return false;
  if (newest_asked_lately()) return false;
  if (query_events(newest_)) return true;
  newest_running_seq_ = newest_->seq;
  newest_running_ns_ = cudapool::detail::pool_clock_ns();
  return false;
}

bool FenceSequence::events_complete(Fence* f) {
  if (f->events_done) return true;
  if (known_complete(f)) return f->events_done = true;
  if (f == newest_ && newest_asked_lately()) return false;  // found running just now
  if (newest_completed_for(f)) return f->events_done = true;
  return query_events(f);
}

void FenceSequence::reset() noexcept {
  newest_ = nullptr;
  completed_seq_ = completed_all_seq_ = last_context_seq_ = 0;
  newest_running_seq_ = 0;
}

}  // namespace cudapool::shim
