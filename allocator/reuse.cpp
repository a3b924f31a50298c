// Reuse's rules (reuse.h has them in one list): a freed block's every change of state, the
// device batches and promotions completing into free blocks, service_fences, the waits
// (wait_all, device / stream fences), the GPU-side waits (order_device_batches), retiring a
// stream; the fence lists' own operations (FenceBatches); a thread cache's fenced batches
// (service_cache); the host pool's fence lists (FenceList).
#include "allocator/reuse.h"

#include <algorithm>

#include "allocator/block_store.h"
#include "allocator/events.h"
#include "allocator/expandable_ranges.h"
#include "allocator/pool_clock.h"
#include "allocator/stats_ledger.h"
#include "allocator/thread_cache.h"

namespace cudapool::detail {

// ---- asking a fence ----

bool fence_done(FenceProvider& fences, FenceHandle f, Ask ask) {
  switch (ask) {
    case Ask::plain: return fences.query(f);
    case Ask::urgent: return fences.query_urgent(f);
    case Ask::wait: fences.wait(f); return true;
  }
  return false;
}

// ---- thread caches ----

void Reuse::return_cached_free(const CachedBlock& e) {
  Block* b = e.block;
  // Already counted inactive (and in inactive_split) by the merged deltas; insert_free
  // recounts the split after merging with neighbours.
  if (e.split) store_.count_inactive_split(b, -1);
  b->requested = 0;
  if (e.any_stream) {  // its device fence completed
    become_shared(b);
    return;
  }
  StreamFree* stream_free = store_.stream_get(e.stream);
  b->epoch = store_.next_epoch();  // freed "now" as far as promotion fences go: later is only safer
  store_.insert_free(b, BState::local, e.stream, stream_free->sets[kind_index(e.small)]);
}

void Reuse::return_cached_fenced(const CachedBlock& e) {
  Block* b = e.block;
  b->state = BState::pending;
  b->requested = e.requested;
  b->owner = e.stream;
  add_pending(b);  // already counted pending by the cache's merged deltas
}

namespace {

// A fenced free of a lent entry: no longer allocated, still active (its fence is pending).
void count_pend(StatsDelta& d, const CachedBlock& e) {
  d.block_unallocated(e.small, e.size);
  d.pending_added(e.size);
}

// A fenced entry's fence completed: inactive now (the rest of a stream-local free's count).
void count_fence_done(StatsDelta& d, const CachedBlock& e) {
  d.block_deactivated(e.small, e.size, e.requested);
  if (e.split) d.inactive_split_changed(e.small, e.size, +1);
  d.pending_removed(e.size);
}

}  // namespace

bool cache_free_fenced(ThreadBlockCache& cache, std::uintptr_t p, FenceProvider& fences) {
  CacheBatches& fb = cache.fenced_;
  if (fb.open_full()) return false;
  const int i = cache.lent_find(p);
  if (i < 0) return false;
  CachedBlock e = cache.lent_[i];
  cache.lent_erase(i);
  count_pend(cache.delta_, e);
  cache.mark_dirty();
  const std::size_t n = fb.add(e);
  if (n == 1)
    fb.opened_at(Reuse::clock_ns());  // the cache's batch opens: its window starts
  else if (fb.open_full())
    service_cache(cache, fences);  // full: recorded now unless the previous batch still waits
  return true;
}

bool service_cache(ThreadBlockCache& cache, FenceProvider& fences) {
  CacheBatches& fb = cache.fenced_;
  bool freed = false;
  const std::int64_t now = Reuse::clock_ns();
  const int room = ThreadBlockCache::kMaxFree + CacheBatches::kMaxPend;
  if (fb.closed_due(now) && cache.nfree_ + fb.closed_size() <= room && fb.ask_closed(fences, now)) {
    fb.take_closed([&](CachedBlock e) {
      count_fence_done(cache.delta_, e);
      e.any_stream = true;
      e.requested = 0;
      cache.add_free(e);
      freed = true;
    });
    cache.mark_dirty();
  }
  if (fb.may_close(now, FenceBatches::kBatchWindowNs)) {
    const FenceHandle f = fences.record_device();
    cache.delta_.fence_recorded();
    cache.mark_dirty();
    fb.close(f, now);
  }
  return freed;
}

// ---- the host pool's fences ----

bool FenceList::done(FenceProvider& fences, Ask ask, FenceWaitCounts& counts) {
  if (ask == Ask::wait && !fences_.empty()) {
    // A fence that cannot be completed now (a graph capture is open) is not waited for.
    for (FenceHandle f : fences_)
      if (!fences.can_wait(f)) return false;
    ++counts.bound_waits;
  }
  for (std::size_t i = 0; i < fences_.size();) {
    const FenceHandle f = fences_[i];
    if (ask == Ask::wait) ++counts.fence_waits;
    if (!fence_done(fences, f, ask)) return false;
    fences.release(f);
    fences_[i] = fences_.back();
    fences_.pop_back();
  }
  return true;
}

void FenceList::wait_all(FenceProvider& fences, FenceWaitCounts& counts) {
  for (FenceHandle f : fences_) {
    ++counts.fence_waits;
    fences.wait(f);
  }
}

void FenceList::release(FenceProvider& fences) {
  for (FenceHandle f : fences_) fences.release(f);
  fences_.clear();
}

// ---- the fence lists (FenceBatches) ----
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
  std::size_t n = open_->count();
  for (const Batch* b = dev_head_; b != nullptr; b = b->next) n += b->count();
  return n;
}

std::size_t FenceBatches::retiring_count() const {
  std::size_t n = 0;
  for (const Batch* b = retire_head_; b != nullptr; b = b->next) n += b->count();
  return n;
}

void FenceBatches::release_all(FenceProvider& fences) {
  auto drop_list = [&](Batch* b) {
    while (b != nullptr) {
      Batch* next = b->next;
      fences.release(b->fence());
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

// ---- the rules (Reuse) ----

void Reuse::close_open() {
  if (batches_.open().count() == 0) return;
  const FenceHandle f = fences_.record_device();
  ledger_.fence_recorded();
  batches_.seal_open(f);
}

// Blocks of a completed batch (pending or retiring) become shared free blocks.
void Reuse::complete_batch(Batch* batch) {
  for (Block* b = batch->entries().head(); b != nullptr;) {
    Block* next = b->link;
    b->link = nullptr;
    if (b->state == BState::pending) {
      ledger_.pending_removed(b->size);
      store_.deactivate(b);
      // Its own fence covers whatever an older GPU-side wait covered. (order_device_batches sets
      // hot again after this for the batches it orders.)
      if (batch->fence() != 0) b->hot = 0;
    } else if (b->is_split()) {
      store_.count_inactive_split(b, -1);  // retiring blocks were counted; insert_free recounts
    }
    become_shared(b);
    b = next;
  }
  if (batch->fence() != 0) fences_.release(batch->fence());
  batches_.recycle(batch);
}

// The stream's promotion fence completed: its local blocks freed before it became shared.
void Reuse::complete_promo(StreamFree* stream_free) {
  std::vector<Block*> covered;
  for (FreeSet& set : stream_free->sets)
    for (Block* b : set)
      if (b->epoch <= stream_free->promo_epoch) covered.push_back(b);
  for (Block* b : covered) {
    erase_block(stream_free->sets[kind_index(b->seg->small)], b);
    if (b->is_split()) store_.count_inactive_split(b, -1);
    become_shared(b);
  }
  drop_promo(stream_free);
}

void Reuse::drop_promo(StreamFree* stream_free) {
  if (stream_free->promo_fence == 0) return;
  fences_.release(stream_free->promo_fence);
  stream_free->promo_fence = 0;
  batches_.promo_remove(stream_free);
}

// Called by allocate() only when some fence work exists. The open batch stays open (no fence
// yet) until its window has passed. Back-off: once a query found a fence still running, no
// fence is asked again for kFenceQueryGapNs. A query costs ~0.3 us on an H200 and a just-recorded
// fence takes a few microseconds to complete even on an idle GPU, so asking on every allocation
// made the queries themselves the main cost of a fenced tight loop (0.55-0.66 us per pair
// against 0.25 us for immediate frees on an H200). A miss (service_miss) always asks at once.
void Reuse::service_fences() {
  const std::int64_t now = clock_ns();
  if (batches_.window_passed(now)) {
    // Where ordering is free the open batch keeps its blocks for the long window (asked at most
    // twice per batch: orders_for_free takes the provider's lock).
    if (ordering_free()) batches_.lengthen_window();
    if (batches_.window_passed(now)) close_open();
  }
  // Where ordering costs no driver call, a recorded batch is reusable at once: no query.
  if (batches_.device_head() != nullptr && ordering_free()) order_recorded_batches();
  if (!batches_.query_due(now)) return;
  drain_device_batches();
  bool running = batches_.device_head() != nullptr;
  auto complete = [&](Batch* b) { complete_batch(b); };
  if (batches_.sweep_retire(fences_, complete)) running = true;
  const std::vector<StreamFree*>& promos = batches_.promos();
  for (std::size_t i = 0; i < promos.size();) {
    StreamFree* stream_free = promos[i];
    if (fences_.query(stream_free->promo_fence)) {
      complete_promo(stream_free);  // removes promos[i]
    } else {
      ++i;
      running = true;
    }
  }
  if (batches_.has_ordered() && batches_.ordered_poll_due(now)) {
    poll_ordered();
    batches_.ordered_polled(now);
  }
  if (ranges_.has_draining()) ranges_.reclaim_drained();
  batches_.queried(now, running);
}

// allocate() missed: close the open batch now (record its fence) and query the device fences;
// where ordering is free (service_fences), order them instead: a query costs a driver call that
// a free/allocate loop would pay on every pair. Returns true if some batch completed (the caller
// searches again).
bool Reuse::service_miss() {
  if (batches_.open().count() == 0) return false;
  close_open();
  if (ordering_free() && order_recorded_batches()) return true;
  return drain_device_batches(true);
}

// Device fences complete in recording order: complete batches from the oldest and stop at the
// first one still running (urgent: asked as memory wanted now, FenceProvider::query_urgent).
// Returns true if any batch completed.
bool Reuse::drain_device_batches(bool urgent) {
  bool completed = false;
  auto done = [&](FenceHandle f) { return urgent ? fences_.query_urgent(f) : fences_.query(f); };
  while (batches_.device_head() != nullptr && done(batches_.device_head()->fence())) {
    complete_batch(batches_.pop_device());
    completed = true;
  }
  return completed;
}

// stream_free's promotion fence, recorded now on its stream: it covers the local blocks freed so far.
void Reuse::record_promo(StreamFree* stream_free, StreamId stream) {
  stream_free->promo_fence = fences_.record_stream(stream);
  stream_free->promo_miss = slow_calls_;
  stream_free->promo_epoch = store_.epoch();
  ledger_.fence_recorded();
  batches_.promo_add(stream_free);
}

// A miss on `stream`: other streams' local blocks that could serve `rounded` get a fence on
// their stream (one outstanding per stream). Returns true if anything was promoted now.
bool Reuse::try_promote_for(std::size_t rounded, StreamId stream) {
  const int k = kind_index(is_small(rounded));
  bool promoted = false;
  store_.for_each_stream([&](StreamId sid, StreamFree* stream_free) {
    if (sid == stream || stream_free->sets[k].empty()) return;
    if ((*stream_free->sets[k].rbegin())->size < rounded) return;  // nothing there could serve it
    if (stream_free->promo_fence == 0) record_promo(stream_free, sid);
    if (fences_.query(stream_free->promo_fence)) {
      complete_promo(stream_free);
      promoted = true;
    }
  });
  return promoted;
}

// FreeSync::device: block on the fences of free()d memory. Returns true if there was any.
bool Reuse::wait_device_batches() {
  close_open();
  if (batches_.device_head() == nullptr) return false;
  bool any = false;
  // Oldest first: stop at one that cannot be waited for.
  while (batches_.device_head() != nullptr && wait_fence(batches_.device_head()->fence(), 0)) {
    complete_batch(batches_.pop_device());
    any = true;
  }
  return any;
}

// FreeSync::gpu_wait: instead of growing the pool (or blocking the host, or recycling pages) while
// memory freed with free() waits for its fence, hand that memory out now and let the GPU wait.
// All recorded batches go together: one order_after call covers them all, and the newest fence
// is what the GPU has to reach anyway.
bool Reuse::order_device_batches(std::size_t need, bool small, bool expandable_only) {
  close_open();
  // Batches already complete need no wait (and their blocks stay cold): what they freed may be
  // enough; the caller searches again.
  const bool drained = drain_device_batches(true);
  if (batches_.device_head() == nullptr) return drained;
  std::size_t bytes = 0;
  std::vector<FenceHandle>& order_scratch = batches_.order_scratch();
  order_scratch.clear();
  for (Batch* b = batches_.device_head(); b != nullptr; b = b->next) {
    order_scratch.push_back(b->fence());
    b->entries().for_each([&](const Block* x) {
      if (x->seg->small == small && (!expandable_only || x->seg->expandable)) bytes += x->size;
    });
  }
  // Too little to serve the request: the wait would cost the GPU overlap and gain nothing.
  if (bytes < need || bytes == 0) return drained;
  return order_scratch_batches() || drained;
}

// Every recorded device batch is handed out under a GPU-side wait, without asking its fence
// first: for contexts where ordering is free (FenceProvider::orders_for_free).
bool Reuse::order_recorded_batches() {
  std::vector<FenceHandle>& order_scratch = batches_.order_scratch();
  order_scratch.clear();
  for (Batch* b = batches_.device_head(); b != nullptr; b = b->next) order_scratch.push_back(b->fence());
  return order_scratch_batches();
}

// The device batches, whose fences are in order_scratch, are ordered after (order_after) and
// become shared free blocks marked hot with the order's number. False: the provider refused.
bool Reuse::order_scratch_batches() {
  std::vector<FenceHandle>& order_scratch = batches_.order_scratch();
  if (!fences_.order_after(order_scratch.data(), order_scratch.size())) return false;
  std::size_t bytes = 0;
  for (Batch* b = batches_.device_head(); b != nullptr; b = b->next) bytes += b->bytes();
  ledger_.gpu_wait();
  events_.emit(EventKind::gpu_wait, 0, bytes, 0, 0);
  const std::uint64_t seq = batches_.new_order();
  while (batches_.device_head() != nullptr) {
    Batch* b = batches_.pop_device();
    batches_.add_ordered(b->take_fence(), seq);  // kept in the ordered list, not released with the batch
    b->entries().for_each([&](Block* x) { x->hot = seq; });
    complete_batch(b);
  }
  return true;
}

std::uint64_t Reuse::order_stream(StreamId stream) {
  const FenceHandle f = fences_.record_stream(stream);
  ledger_.fence_recorded();
  const std::uint64_t seq = batches_.new_order();
  batches_.add_ordered(f, seq);
  return seq;
}

void Reuse::poll_ordered() {
  batches_.poll_ordered(fences_);
  if (ranges_.has_draining()) ranges_.drop_aliases(batches_.order_done());
}

void Reuse::settle_ordered() {
  batches_.settle_ordered(fences_, [&](FenceHandle f) { return wait_fence(f, 0); });
  if (ranges_.has_draining()) ranges_.drop_aliases(batches_.order_done());
}

// Bytes of expandable-range blocks in the recorded device batches, oldest first, until `need`
// is reached; *last = the batch that reaches it (null if all of them together do not).
std::size_t Reuse::pending_expandable_bytes(std::size_t need, Batch** last) const {
  *last = nullptr;
  std::size_t bytes = 0;
  for (Batch* b = batches_.device_head(); b != nullptr; b = b->next) {
    b->entries().for_each([&](const Block* x) {
      if (x->seg->expandable) bytes += x->size;
    });
    if (bytes >= need) {
      *last = b;
      break;
    }
  }
  return bytes;
}

// Expandable growth would raise the mapped total to a new peak: wait for the OLDEST device fence
// whose batch (with every batch before it) holds at least `need` bytes of the ranges, not for
// every fence. Device fences complete in recording order, so the batches before it are done
// too. Returns true if it waited. Nothing is waited for when all of them would not be enough.
bool Reuse::wait_device_batches_for(std::size_t need) {
  Batch* last = nullptr;
  pending_expandable_bytes(need, &last);
  if (last == nullptr || !wait_fence(last->fence(), 0)) return false;
  for (;;) {
    Batch* b = batches_.pop_device();
    complete_batch(b);  // b goes back to the Batch objects: compared by address only below
    if (b == last) break;
  }
  return true;
}

bool Reuse::promote_own(StreamId stream, std::size_t need, bool may_wait) {
  StreamFree* stream_free = store_.stream_find(stream);
  if (stream_free == nullptr || stream_free->empty()) return false;
  if (stream_free->promo_fence == 0) {
    // Recorded now, it will have passed by a later growth; waiting on it now would be a stream
    // synchronize, which this path never does.
    record_promo(stream_free, stream);
    return false;
  }
  if (fences_.query(stream_free->promo_fence)) {
    complete_promo(stream_free);
    return true;
  }
  if (!may_wait || stream_free->promo_miss == slow_calls_) return false;  // recorded by this very miss
  std::size_t covered = 0;
  for (const FreeSet& set : stream_free->sets)
    for (const Block* b : set)
      if (b->seg->expandable && b->epoch <= stream_free->promo_epoch) covered += b->size;
  if (covered < need || !wait_fence(stream_free->promo_fence, stream)) return false;
  complete_promo(stream_free);
  return true;
}

// The last resort before growing past the peak: if this stream's own local blocks of the ranges
// cover at least half of `need`, a fence on the stream recorded now is waited for (a stream
// synchronize: what PyTorch does before every unmap of expandable pages) and they all become
// shared, so the growth maps at most half the new pages it would have. With less, one wait saves
// too little: the growth maps new pages instead. (Asking for the whole of `need` left GPT-2's
// stream-ordered frees 6 % above the same program's cudaFree replay: docs/design.md.)
bool Reuse::sync_own(StreamId stream, std::size_t need) {
  StreamFree* stream_free = store_.stream_find(stream);
  if (stream_free == nullptr || stream_free->empty()) return false;
  std::size_t local = 0;
  for (const FreeSet& set : stream_free->sets)
    for (const Block* b : set)
      if (b->seg->expandable) local += b->size;
  if (local == 0 || 2 * local < need) return false;
  return promote_all_now(stream_free, stream);
}

// Every local block of the stream becomes shared: its promotion fence, recorded now unless the
// outstanding one already covers them all, is waited for.
bool Reuse::promote_all_now(StreamFree* stream_free, StreamId stream) {
  if (stream_free->promo_fence != 0 && stream_free->promo_epoch != store_.epoch())
    drop_promo(stream_free);  // too old to cover all
  if (stream_free->promo_fence == 0) record_promo(stream_free, stream);
  if (!wait_fence(stream_free->promo_fence, stream)) return false;
  complete_promo(stream_free);
  return true;
}

// Memory pressure: every block that waits on a fence, and every local block, becomes shared.
void Reuse::wait_all() {
  ledger_.sync_all_streams();
  wait_device_batches();
  while (batches_.retire_head() != nullptr && wait_fence(batches_.retire_head()->fence(), 0))
    complete_batch(batches_.pop_retire());
  store_.for_each_stream([&](StreamId sid, StreamFree* stream_free) {
    if (stream_free->empty()) {
      drop_promo(stream_free);
      return;
    }
    promote_all_now(stream_free, sid);
  });
}

bool Reuse::wait_fence(FenceHandle f, StreamId stream) {
  if (!fences_.can_wait(f)) return false;
  const std::int64_t t0 = events_.sink != nullptr ? now_ns() : 0;
  fences_.wait(f);
  ledger_.fence_wait();
  if (events_.sink != nullptr) events_.emit(EventKind::fence_wait, 0, 0, 0, stream, now_ns() - t0);
  return true;
}

void Reuse::retire(StreamId stream) {
  close_open();  // the open batch gets its fence before anything is waited on or retired
  store_.mark_retired(stream);
  StreamFree* stream_free = store_.stream_lookup(stream);
  if (stream_free == nullptr) return;
  if (!stream_free->empty()) {
    Batch* batch = batches_.new_batch();
    batch->stream = stream;
    batch->close(fences_.record_stream(stream));
    ledger_.fence_recorded();
    for (FreeSet& set : stream_free->sets) {
      for (Block* b : set) {
        b->state = BState::retiring;  // stays inactive (and counted so) but in no set
        batch->entries().push(b);
      }
      set.clear();
    }
    batches_.add_retire(batch);
  }
  drop_promo(stream_free);
  store_.erase_stream(stream);
}

}  // namespace cudapool::detail
