// Internal: what waits on which fence (docs/design.md, "Streams and fences", "The batch window",
// "GPU-side waits"). FenceBatches owns
//  * the open batch: blocks free()d since its last fence, with the clock when it opened;
//  * the recorded device batches, oldest first (device fences complete in recording order);
//  * the retire batches: blocks of retired streams, each on a fence on its stream;
//  * the promotion list: streams whose local blocks have an outstanding promotion fence
//    (StreamFree::promo_*);
//  * the GPU-side waits still running (`ordered`, with order_seq / order_done), which keep the
//    memory they handed out from going back to the upstream (Block::hot), and the stream fences
//    of pages a stream's growth aliased from its own free blocks (Reclaim::order_stream);
//  * the query back-off of service_fences() and the Batch objects themselves.
// Its operations only move batches and fences between these lists. What a completed batch or
// promotion does to blocks (they become shared free blocks, merged with their neighbours) needs
// the free sets and the stats, so it is Reclaim's (reclaim.cpp: complete_batch,
// complete_promo and the policies built on them). Under the pool lock, as the rest of the pool.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "allocator/blocks.h"
#include "allocator/fence.h"
#include "allocator/node_pool.h"
#include "allocator/types.h"

namespace cudapool::detail {

// Blocks waiting on one fence, linked through Block::link.
struct Batch {
  FenceHandle fence = 0;
  StreamId stream = 0;  // retire batches: the stream the fence was recorded on
  Block* head = nullptr;
  std::size_t count = 0;
  std::size_t bytes = 0;
  Batch* next = nullptr;
  void push(Block* b) {
    b->link = head;
    head = b;
    ++count;
    bytes += b->size;
  }
};

class FenceBatches {
 public:
  // The open batch gets its device fence once it has been open this long, or holds this many
  // blocks / bytes, or on a miss, or before anything waits for pending memory. 20 us: about 25x
  // the cost of one record+query pair on an H200 (~0.8 us), so a tight alloc/free loop pays
  // the fence at most ~4% of the time, yet short enough that freed memory comes back to the
  // shared pool after a few tens of microseconds (well under a typical kernel's run time, so it
  // is not what keeps memory pending).
  static constexpr std::int64_t kBatchWindowNs = 20'000;
  // Where ordering is free (FenceProvider::orders_for_free, FreeSync::gpu_wait), closing a batch
  // early gains nothing: a miss closes it and hands its blocks out under one GPU-side wait at
  // once, so memory waiting in the open batch is never kept from a request. Closing it costs a
  // record and a wait (and the next launch ~0.3 us more, on an H100); a CPU-bound program that
  // frees a tensor every few tens of microseconds (eager ResNet-50 inference) closed a batch
  // every ~4 frees with the short window. With 1 ms the replays of the shipped ResNet-50
  // inference and GPT-2 traces record 3.1x and 6.8x fewer fences; their peaks move by -3 % and
  // +0.7 %.
  static constexpr std::int64_t kOrderedBatchWindowNs = 1'000'000;
  // After a query found a fence still running, service_fences() waits this long to ask again.
  static constexpr std::int64_t kFenceQueryGapNs = 4'000;
  // service_fences() asks the fences of GPU-side waits at most this often. Nothing needs their
  // answer soon: memory handed out under them is in use again already, and what must know (growth
  // that recycles pages, releases) asks or waits itself. Where ordering is free (orders_for_free)
  // every fence becomes such a wait when it is recorded; on an H200 a query of a fence costs
  // ~1.4 us (against ~0.25 us for its record) in a program that synchronises with the GPU every
  // iteration, so asking each one would make the queries the largest part of the pool's cost.
  static constexpr std::int64_t kOrderedPollGapNs = 1'000'000;
  // ... or as soon as this many more are outstanding than after the last time they were asked,
  // so that a program that frees often (a fence every window) keeps few of the provider's events
  // in flight while the GPU keeps up.
  static constexpr std::size_t kOrderedPollCount = 8;
  // Bounds on what one open batch may hold, so the memory that waits for a late fence stays a
  // small part of the pool: 256 blocks, and 64 MiB or a quarter of the reserved bytes, whichever
  // is larger. The byte bound scales with the pool because a flat one made every free of a block
  // >= 64 MiB record its own fence (~0.5 us each on an H200: bursts of 100 frees of 128 MiB
  // blocks cost 0.6 us per pair); with a quarter, a burst needs at most ~4 fences whatever the
  // block size. A miss closes the batch anyway, so the bound never keeps memory from a request.
  static constexpr std::size_t kBatchMaxBlocks = 256;
  static constexpr std::size_t kBatchMinMaxBytes = 64 * MiB;
  static std::size_t batch_max_bytes(std::size_t reserved) { return std::max(kBatchMinMaxBytes, reserved / 4); }

  static std::int64_t clock_ns();  // the (injectable) monotonic clock of the batch window

  FenceBatches();
  FenceBatches(const FenceBatches&) = delete;
  FenceBatches& operator=(const FenceBatches&) = delete;

  // Any fence work at all (allocate() services fences only then).
  bool has_work() const {
    return open_->count != 0 || dev_head_ != nullptr || retire_head_ != nullptr || !promo_.empty() || !ordered_.empty();
  }

  // ---- the open batch ----
  const Batch& open() const { return *open_; }
  // b (pending) joins the open batch. True: the batch reached its bounds and must be closed now.
  bool add_open(Block* b, std::size_t reserved) {
    open_->push(b);
    if (open_->count >= kBatchMaxBlocks || open_->bytes >= batch_max_bytes(reserved)) return true;
    if (open_->count == 1) {  // the batch opens: its window starts, the short one
      open_since_ = clock_ns();
      open_window_ = kBatchWindowNs;
    }
    return false;
  }
  bool window_passed(std::int64_t now) const { return open_->count != 0 && now - open_since_ >= open_window_; }
  // The open batch's window becomes kOrderedBatchWindowNs, counted from its opening.
  void lengthen_window() { open_window_ = kOrderedBatchWindowNs; }
  // The open batch, fenced by `f` (recorded now), becomes the newest device batch.
  void seal_open(FenceHandle f) {
    open_->fence = f;
    if (dev_tail_ != nullptr)
      dev_tail_->next = open_;
    else
      dev_head_ = open_;
    dev_tail_ = open_;
    open_ = batches_.get();
  }

  // ---- recorded device batches, oldest first ----
  Batch* device_head() const { return dev_head_; }
  // The oldest device batch leaves the list (it must not be empty).
  Batch* pop_device() {
    Batch* b = dev_head_;
    dev_head_ = b->next;
    if (dev_head_ == nullptr) dev_tail_ = nullptr;
    return b;
  }

  // ---- retire batches (unordered) ----
  Batch* retire_head() const { return retire_head_; }
  void add_retire(Batch* b) {
    b->next = retire_head_;
    retire_head_ = b;
  }
  Batch* pop_retire() {
    Batch* b = retire_head_;
    retire_head_ = b->next;
    return b;
  }
  // Every retire batch whose fence has completed leaves the list and goes to complete(b), in
  // list order. Returns true if some fence still runs.
  template <class Complete>
  bool sweep_retire(FenceProvider& fences, Complete complete) {
    bool running = false;
    for (Batch** pp = &retire_head_; *pp != nullptr;) {
      Batch* b = *pp;
      if (fences.query(b->fence)) {
        *pp = b->next;
        complete(b);
      } else {
        pp = &b->next;
        running = true;
      }
    }
    return running;
  }

  // ---- Batch objects ----
  Batch* new_batch() { return batches_.get(); }
  void recycle(Batch* b) { batches_.put(b); }

  // ---- streams with an outstanding promotion fence ----
  const std::vector<StreamFree*>& promos() const { return promo_; }
  void promo_add(StreamFree* stream_free) { promo_.push_back(stream_free); }
  void promo_remove(StreamFree* stream_free);

  // ---- service_fences()' query back-off ----
  bool query_due(std::int64_t now) const { return now >= query_after_; }
  void queried(std::int64_t now, bool running) { query_after_ = running ? now + kFenceQueryGapNs : INT64_MIN; }

  // ---- GPU-side waits (FreeSync::gpu_wait) ----
  // Fences of memory handed out under a GPU-side wait that may still be running, with the order's
  // sequence number (Block::hot). Memory they covered is only given back to the upstream
  // (released, unmapped, moved) after they completed: the driver's unmap does not wait for
  // kernels that still use the pages. Recycling skips such blocks; the rare release paths (GC,
  // empty_cache, out of memory) wait for all of them first.
  bool has_ordered() const { return !ordered_.empty(); }
  // service_fences()' back-off for asking them (kOrderedPollGapNs, kOrderedPollCount).
  bool ordered_poll_due(std::int64_t now) const {
    return now >= ordered_poll_after_ || ordered_.size() >= ordered_after_poll_ + kOrderedPollCount;
  }
  void ordered_polled(std::int64_t now) {
    ordered_poll_after_ = now + kOrderedPollGapNs;
    ordered_after_poll_ = ordered_.size();
  }
  // An order was made (a GPU-side wait, or a stream's own pages aliased): its number. The first
  // one outstanding starts service_fences()' back-off: asked after kOrderedPollGapNs, not at once.
  std::uint64_t new_order() {
    if (ordered_.empty()) ordered_polled(clock_ns());
    return ++order_seq_;
  }
  void add_ordered(FenceHandle f, std::uint64_t seq) { ordered_.emplace_back(f, seq); }
  std::uint64_t order_done() const { return order_done_; }  // every order up to this one completed
  bool is_hot(const Block* b) const { return b->hot > order_done_; }
  std::vector<FenceHandle>& order_scratch() { return order_scratch_; }  // reused handle list
  // Release the completed orders, oldest first, stopping at a running one (found by bisection:
  // fence_batches.cpp).
  void poll_ordered(FenceProvider& fences);
  // Host-wait for every order (before memory goes back): wait(f) is the pool's counted wait,
  // false when it could not wait; the provider is waited on then anyway.
  template <class Wait>
  void settle_ordered(FenceProvider& fences, Wait wait) {
    for (const auto& [f, seq] : ordered_) {
      // order_after recorded every device fence here (it refuses while a capture is open), so each
      // can be waited for; what follows gives memory back, so a provider that refuses is waited on
      // anyway.
      if (!fences.query(f) && !wait(f)) fences.wait(f);
      fences.release(f);
    }
    ordered_.clear();
    order_done_ = order_seq_;
  }

  // ---- whole-state operations ----
  std::size_t pending_count() const;        // blocks in the open and the device batches
  std::size_t retiring_count() const;       // blocks in the retire batches
  void release_all(FenceProvider& fences);  // teardown: every outstanding fence handed back
  void forget_all();                        // the context is gone: every list emptied, no fence touched

 private:
  ObjectPool<Batch> batches_;
  Batch* open_ = nullptr;                      // free()d blocks since the last fence record
  std::int64_t open_since_ = 0;                // clock when the open batch got its first block (ns)
  std::int64_t open_window_ = kBatchWindowNs;  // how long it stays open (ns): short, or lengthened
  std::int64_t query_after_ = INT64_MIN;       // service_fences() asks no fence before this (ns)
  Batch* dev_head_ = nullptr;                  // recorded device batches, oldest first
  Batch* dev_tail_ = nullptr;
  Batch* retire_head_ = nullptr;
  std::vector<StreamFree*> promo_;
  std::vector<std::pair<FenceHandle, std::uint64_t>> ordered_;
  std::int64_t ordered_poll_after_ = INT64_MIN;  // service_fences() asks no GPU-side wait's fence before this (ns)
  std::size_t ordered_after_poll_ = 0;           // ordered_.size() when they were last asked
  std::uint64_t order_seq_ = 0;                  // orders made so far
  std::uint64_t order_done_ = 0;
  std::vector<FenceHandle> order_scratch_;
};

}  // namespace cudapool::detail
