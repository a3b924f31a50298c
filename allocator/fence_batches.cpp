// The fence lists' own operations (fence_batches.h).
#include "allocator/fence_batches.h"

#include <algorithm>

#include "allocator/pool_clock.h"

namespace cudapool {

namespace detail {

std::int64_t FenceBatches::clock_ns() { return pool_clock_ns(); }

FenceBatches::FenceBatches() {
  open_ = batches_.get();
  promo_.reserve(16);
}

void FenceBatches::promo_remove(StreamFree* stream_free) {
  promo_.erase(std::find(promo_.begin(), promo_.end(), stream_free));
}

// The ordered fences are device fences, which complete in recording order: rather than asking
// each one that completed since the last poll, the newest complete one is found by bisection
// (one query when the oldest still runs; about log2(n) + 2 otherwise), assuming that order. Every
// fence older than the one found is still asked before it is released, so a provider that does
// not complete in order loses nothing; the shim answers those from its completion watermarks
// without a driver call.
void FenceBatches::poll_ordered(FenceProvider& fences) {
  const std::size_t n = ordered_.size();
  std::size_t complete = 0;  // ordered_[0, complete) are presumed complete
  if (n != 0 && fences.query(ordered_.front().first)) {
    complete = 1;
    std::size_t running = n;  // the oldest index known to run (n: none)
    if (n > 1) {
      if (fences.query(ordered_.back().first)) {
        complete = n;
      } else {
        running = n - 1;
      }
    }
    while (complete < running) {
      const std::size_t mid = complete + (running - complete) / 2;
      if (fences.query(ordered_[mid].first)) {
        complete = mid + 1;
      } else {
        running = mid;
      }
    }
  }
  std::size_t done = 0;
  if (complete != 0) fences.release(ordered_[done++].first);  // asked just now
  while (done < complete && fences.query(ordered_[done].first)) fences.release(ordered_[done++].first);
  ordered_.erase(ordered_.begin(), ordered_.begin() + static_cast<std::ptrdiff_t>(done));
  order_done_ = ordered_.empty() ? order_seq_ : ordered_.front().second - 1;
}

std::size_t FenceBatches::pending_count() const {
  std::size_t n = open_->count;
  for (const Batch* b = dev_head_; b != nullptr; b = b->next) n += b->count;
  return n;
}

std::size_t FenceBatches::retiring_count() const {
  std::size_t n = 0;
  for (const Batch* b = retire_head_; b != nullptr; b = b->next) n += b->count;
  return n;
}

void FenceBatches::release_all(FenceProvider& fences) {
  auto drop_list = [&](Batch* b) {
    while (b != nullptr) {
      Batch* next = b->next;
      fences.release(b->fence);
      b = next;
    }
  };
  drop_list(dev_head_);
  drop_list(retire_head_);
  for (StreamFree* stream_free : promo_) fences.release(stream_free->promo_fence);
  for (const auto& [f, seq] : ordered_) fences.release(f);
}

void FenceBatches::forget_all() {
  promo_.clear();
  ordered_.clear();
  order_done_ = order_seq_;
  for (Batch* list : {dev_head_, retire_head_}) {
    for (Batch* b = list; b != nullptr;) {
      Batch* next = b->next;
      batches_.put(b);
      b = next;
    }
  }
  dev_head_ = dev_tail_ = retire_head_ = nullptr;
  *open_ = Batch{};
}

}  // namespace detail
}  // namespace cudapool
