// Reclaim's rules (reclaim.h has the model): completing batches and promotions into free
// blocks, service_fences, the waits (wait_all, device / stream fences), the GPU-side waits
// (order_device_batches), retiring a stream. The lists themselves are FenceBatches'.
#include <algorithm>

#include "allocator/reclaim.h"

namespace cudapool::detail {

void Reclaim::close_open() {
  if (batches.open().count == 0) return;
  const FenceHandle f = fences_.record_device();
  ledger_.fence_recorded();
  batches.seal_open(f);
}

// Blocks of a completed batch (pending or retiring) become shared free blocks.
void Reclaim::complete_batch(Batch* batch) {
  for (Block* b = batch->head; b != nullptr;) {
    Block* next = b->link;
    b->link = nullptr;
    if (b->state == BState::pending) {
      ledger_.pending_removed(b->size);
      store_.deactivate(b);
      // Its own fence covers whatever an older GPU-side wait covered. (order_device_batches sets
      // hot again after this for the batches it orders.)
      if (batch->fence != 0) b->hot = 0;
    } else if (b->is_split()) {
      store_.count_inactive_split(b, -1);  // retiring blocks were counted; insert_free recounts
    }
    store_.insert_free(b, BState::shared, 0, store_.shared[kind_index(b->seg->small)]);
    b = next;
  }
  if (batch->fence != 0) fences_.release(batch->fence);
  batches.recycle(batch);
}

// The stream's promotion fence completed: its local blocks freed before it became shared.
void Reclaim::complete_promo(StreamFree* stream_free) {
  std::vector<Block*> covered;
  for (FreeSet& set : stream_free->sets)
    for (Block* b : set)
      if (b->epoch <= stream_free->promo_epoch) covered.push_back(b);
  for (Block* b : covered) {
    erase_block(stream_free->sets[kind_index(b->seg->small)], b);
    if (b->is_split()) store_.count_inactive_split(b, -1);
    store_.insert_free(b, BState::shared, 0, store_.shared[kind_index(b->seg->small)]);
  }
  drop_promo(stream_free);
}

void Reclaim::drop_promo(StreamFree* stream_free) {
  if (stream_free->promo_fence == 0) return;
  fences_.release(stream_free->promo_fence);
  stream_free->promo_fence = 0;
  batches.promo_remove(stream_free);
}

// Called by allocate() only when some fence work exists. The open batch stays open (no fence
// yet) until its window has passed. Back-off: once a query found a fence still running, no
// fence is asked again for kFenceQueryGapNs. A query costs ~0.3 us on an H200 and a just-recorded
// fence takes a few microseconds to complete even on an idle GPU, so asking on every allocation
// made the queries themselves the main cost of a fenced tight loop (0.55-0.66 us per pair
// against 0.25 us for immediate frees on an H200). A miss (service_miss) always asks at once.
void Reclaim::service_fences() {
  const std::int64_t now = clock_ns();
  if (batches.window_passed(now)) {
    // Where ordering is free the open batch keeps its blocks for the long window (asked at most
    // twice per batch: orders_for_free takes the provider's lock).
    if (ordering_free()) batches.lengthen_window();
    if (batches.window_passed(now)) close_open();
  }
  // Where ordering costs no driver call, a recorded batch is reusable at once: no query.
  if (batches.device_head() != nullptr && ordering_free()) order_recorded_batches();
  if (!batches.query_due(now)) return;
  drain_device_batches();
  bool running = batches.device_head() != nullptr;
  auto complete = [&](Batch* b) { complete_batch(b); };
  if (batches.sweep_retire(fences_, complete)) running = true;
  const std::vector<StreamFree*>& promos = batches.promos();
  for (std::size_t i = 0; i < promos.size();) {
    StreamFree* stream_free = promos[i];
    if (fences_.query(stream_free->promo_fence)) {
      complete_promo(stream_free);  // removes promos[i]
    } else {
      ++i;
      running = true;
    }
  }
  if (batches.has_ordered() && batches.ordered_poll_due(now)) {
    poll_ordered();
    batches.ordered_polled(now);
  }
  if (!ranges_.draining.empty()) ranges_.reclaim_drained();
  batches.queried(now, running);
}

// allocate() missed: close the open batch now (record its fence) and query the device fences;
// where ordering is free (service_fences), order them instead: a query costs a driver call that
// a free/allocate loop would pay on every pair. Returns true if some batch completed (the caller
// searches again).
bool Reclaim::service_miss() {
  if (batches.open().count == 0) return false;
  close_open();
  if (ordering_free() && order_recorded_batches()) return true;
  return drain_device_batches(true);
}

// Device fences complete in recording order: complete batches from the oldest and stop at the
// first one still running (urgent: asked as memory wanted now, FenceProvider::query_urgent).
// Returns true if any batch completed.
bool Reclaim::drain_device_batches(bool urgent) {
  bool completed = false;
  auto done = [&](FenceHandle f) { return urgent ? fences_.query_urgent(f) : fences_.query(f); };
  while (batches.device_head() != nullptr && done(batches.device_head()->fence)) {
    complete_batch(batches.pop_device());
    completed = true;
  }
  return completed;
}

// stream_free's promotion fence, recorded now on its stream: it covers the local blocks freed so far.
void Reclaim::record_promo(StreamFree* stream_free, StreamId stream) {
  stream_free->promo_fence = fences_.record_stream(stream);
  stream_free->promo_miss = slow_calls;
  stream_free->promo_epoch = store_.epoch;
  ledger_.fence_recorded();
  batches.promo_add(stream_free);
}

// A miss on `stream`: other streams' local blocks that could serve `rounded` get a fence on
// their stream (one outstanding per stream). Returns true if anything was promoted now.
bool Reclaim::try_promote_for(std::size_t rounded, StreamId stream) {
  const int k = kind_index(is_small(rounded));
  bool promoted = false;
  for (auto& [sid, owned] : store_.streams) {
    StreamFree* stream_free = owned.get();
    if (sid == stream || stream_free->sets[k].empty()) continue;
    if ((*stream_free->sets[k].rbegin())->size < rounded) continue;  // nothing there could serve it
    if (stream_free->promo_fence == 0) record_promo(stream_free, sid);
    if (fences_.query(stream_free->promo_fence)) {
      complete_promo(stream_free);
      promoted = true;
    }
  }
  return promoted;
}

// FreeSync::device: block on the fences of free()d memory. Returns true if there was any.
bool Reclaim::wait_device_batches() {
  close_open();
  if (batches.device_head() == nullptr) return false;
  bool any = false;
  // Oldest first: stop at one that cannot be waited for.
  while (batches.device_head() != nullptr && wait_fence(batches.device_head()->fence, 0)) {
    complete_batch(batches.pop_device());
    any = true;
  }
  return any;
}

// FreeSync::gpu_wait: instead of growing the pool (or blocking the host, or recycling pages) while
// memory freed with free() waits for its fence, hand that memory out now and let the GPU wait.
// All recorded batches go together: one order_after call covers them all, and the newest fence
// is what the GPU has to reach anyway.
bool Reclaim::order_device_batches(std::size_t need, bool small, bool expandable_only) {
  close_open();
  // Batches already complete need no wait (and their blocks stay cold): what they freed may be
  // enough; the caller searches again.
  const bool drained = drain_device_batches(true);
  if (batches.device_head() == nullptr) return drained;
  std::size_t bytes = 0;
  std::vector<FenceHandle>& order_scratch = batches.order_scratch();
  order_scratch.clear();
  for (Batch* b = batches.device_head(); b != nullptr; b = b->next) {
    order_scratch.push_back(b->fence);
    for (Block* x = b->head; x != nullptr; x = x->link)
      if (x->seg->small == small && (!expandable_only || x->seg->expandable)) bytes += x->size;
  }
  // Too little to serve the request: the wait would cost the GPU overlap and gain nothing.
  if (bytes < need || bytes == 0) return drained;
  return order_scratch_batches() || drained;
}

// Every recorded device batch is handed out under a GPU-side wait, without asking its fence
// first: for contexts where ordering is free (FenceProvider::orders_for_free).
bool Reclaim::order_recorded_batches() {
  std::vector<FenceHandle>& order_scratch = batches.order_scratch();
  order_scratch.clear();
  for (Batch* b = batches.device_head(); b != nullptr; b = b->next) order_scratch.push_back(b->fence);
  return order_scratch_batches();
}

// The device batches, whose fences are in order_scratch, are ordered after (order_after) and
// become shared free blocks marked hot with the order's number. False: the provider refused.
bool Reclaim::order_scratch_batches() {
  std::vector<FenceHandle>& order_scratch = batches.order_scratch();
  if (!fences_.order_after(order_scratch.data(), order_scratch.size())) return false;
  std::size_t bytes = 0;
  for (Batch* b = batches.device_head(); b != nullptr; b = b->next) bytes += b->bytes;
  ledger_.gpu_wait();
  events_.emit(EventKind::gpu_wait, 0, bytes, 0, 0);
  const std::uint64_t seq = batches.new_order();
  while (batches.device_head() != nullptr) {
    Batch* b = batches.pop_device();
    batches.add_ordered(b->fence, seq);
    b->fence = 0;  // kept in the ordered list, not released with the batch
    for (Block* x = b->head; x != nullptr; x = x->link) x->hot = seq;
    complete_batch(b);
  }
  return true;
}

std::uint64_t Reclaim::order_stream(StreamId stream) {
  const FenceHandle f = fences_.record_stream(stream);
  ledger_.fence_recorded();
  const std::uint64_t seq = batches.new_order();
  batches.add_ordered(f, seq);
  return seq;
}

void Reclaim::poll_ordered() {
  batches.poll_ordered(fences_);
  if (!ranges_.draining.empty()) ranges_.drop_aliases(batches.order_done());
}

void Reclaim::settle_ordered() {
  batches.settle_ordered(fences_, [&](FenceHandle f) { return wait_fence(f, 0); });
  if (!ranges_.draining.empty()) ranges_.drop_aliases(batches.order_done());
}

// Bytes of expandable-range blocks in the recorded device batches, oldest first, until `need`
// is reached; *last = the batch that reaches it (null if all of them together do not).
std::size_t Reclaim::pending_expandable_bytes(std::size_t need, Batch** last) const {
  *last = nullptr;
  std::size_t bytes = 0;
  for (Batch* b = batches.device_head(); b != nullptr; b = b->next) {
    for (Block* x = b->head; x != nullptr; x = x->link)
      if (x->seg->expandable) bytes += x->size;
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
bool Reclaim::wait_device_batches_for(std::size_t need) {
  Batch* last = nullptr;
  pending_expandable_bytes(need, &last);
  if (last == nullptr || !wait_fence(last->fence, 0)) return false;
  for (;;) {
    Batch* b = batches.pop_device();
    complete_batch(b);  // b goes back to the Batch objects: compared by address only below
    if (b == last) break;
  }
  return true;
}

bool Reclaim::promote_own(StreamId stream, std::size_t need, bool may_wait) {
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
  if (!may_wait || stream_free->promo_miss == slow_calls) return false;  // recorded by this very miss
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
bool Reclaim::sync_own(StreamId stream, std::size_t need) {
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
bool Reclaim::promote_all_now(StreamFree* stream_free, StreamId stream) {
  if (stream_free->promo_fence != 0 && stream_free->promo_epoch != store_.epoch)
    drop_promo(stream_free);  // too old to cover all
  if (stream_free->promo_fence == 0) record_promo(stream_free, stream);
  if (!wait_fence(stream_free->promo_fence, stream)) return false;
  complete_promo(stream_free);
  return true;
}

// Memory pressure: every block that waits on a fence, and every local block, becomes shared.
void Reclaim::wait_all() {
  ledger_.sync_all_streams();
  wait_device_batches();
  while (batches.retire_head() != nullptr && wait_fence(batches.retire_head()->fence, 0))
    complete_batch(batches.pop_retire());
  for (auto& [sid, owned] : store_.streams) {
    StreamFree* stream_free = owned.get();
    if (stream_free->empty()) {
      drop_promo(stream_free);
      continue;
    }
    promote_all_now(stream_free, sid);
  }
}

bool Reclaim::wait_fence(FenceHandle f, StreamId stream) {
  if (!fences_.can_wait(f)) return false;
  const std::int64_t t0 = events_.sink != nullptr ? now_ns() : 0;
  fences_.wait(f);
  ledger_.fence_wait();
  if (events_.sink != nullptr) events_.emit(EventKind::fence_wait, 0, 0, 0, stream, now_ns() - t0);
  return true;
}

void Reclaim::retire(StreamId stream) {
  close_open();  // the open batch gets its fence before anything is waited on or retired
  store_.retired.insert(stream);
  auto it = store_.streams.find(stream);
  if (it == store_.streams.end()) return;
  StreamFree* stream_free = it->second.get();
  if (!stream_free->empty()) {
    Batch* batch = batches.new_batch();
    batch->stream = stream;
    batch->fence = fences_.record_stream(stream);
    ledger_.fence_recorded();
    for (FreeSet& set : stream_free->sets) {
      for (Block* b : set) {
        b->state = BState::retiring;  // stays inactive (and counted so) but in no set
        batch->push(b);
      }
      set.clear();
    }
    batches.add_retire(batch);
  }
  drop_promo(stream_free);
  store_.erase_stream(stream);
}

}  // namespace cudapool::detail
