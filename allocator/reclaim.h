// Internal: reclaim, i.e. when freed memory becomes reusable by whom (docs/design.md, "Streams
// and fences"). Reclaim owns what waits on which fence (FenceBatches: the open batch, recorded
// device batches, retire batches, promotions, GPU-side waits) and the rules that turn it into
// free blocks (reclaim.cpp):
//  * free() puts blocks in the open batch; ONE device fence is recorded for the whole batch when
//    its window closes; completed batches turn into shared free blocks;
//  * blocks freed on a stream are local to it; a miss on another stream records one fence on that
//    stream (at most one outstanding per stream) and promotes the blocks it covers once complete;
//  * FreeSync::gpu_wait: pending memory is handed out at once with the GPU made to wait for its
//    fences (order_device_batches); FreeSync::device: the host waits (wait_device_batches);
//  * memory pressure: every fence is waited for (wait_all).
// The order in which a path needing memory tries these is the pool's make_room (pool_miss.cpp).
// The pool lock guards it, as everything else in the pool.
#pragma once
#include <cstddef>
#include <cstdint>

#include "allocator/block_store.h"
#include "allocator/events.h"
#include "allocator/expandable_ranges.h"
#include "allocator/fence.h"
#include "allocator/fence_batches.h"
#include "allocator/options.h"
#include "allocator/stats_ledger.h"

namespace cudapool::detail {

class Reclaim {
 public:
  Reclaim(const PoolOptions& opt, FenceProvider& fences, BlockStore& store, StatsLedger& ledger, EventLog& events,
          ExpandableRanges& ranges)
      : opt_(opt), fences_(fences), store_(store), ledger_(ledger), events_(events), ranges_(ranges) {}
  Reclaim(const Reclaim&) = delete;
  Reclaim& operator=(const Reclaim&) = delete;

  FenceBatches batches;          // what waits on which fence (fence_batches.h)
  std::uint64_t slow_calls = 0;  // misses so far (promote_own: "recorded just now")

  static std::int64_t clock_ns() { return FenceBatches::clock_ns(); }
  // free(): block b (already pending) joins the open batch; closes it at the size bounds.
  void add_pending(Block* b) {
    ledger_.pending_added(b->size);
    add_pending_counted(b);
  }
  // The same for a block already counted in pending_bytes (a thread cache's fenced frees).
  void add_pending_counted(Block* b) {
    if (batches.add_open(b, ledger_.reserved_bytes())) close_open();
  }
  void close_open();

  // ---- asked on allocation (the batch window, back-off) and on a miss ----
  void service_fences();
  bool service_miss();
  bool drain_device_batches(bool urgent = false);

  // ---- the steps of make_room ----
  bool try_promote_for(std::size_t rounded, StreamId stream);
  bool wait_device_batches();
  // Expandable growth: the wait for the oldest batch that (with all before it) frees at least
  // `need` bytes of the ranges.
  bool wait_device_batches_for(std::size_t need);
  // Stream `stream`'s own local blocks (freed with cudaFreeAsync or under immediate) become
  // shared once a fence on that stream completes: query (or record) its promotion fence, and
  // when `may_wait` and an outstanding fence covers >= need bytes of expandable blocks, wait on
  // it. Returns true if blocks were promoted.
  bool promote_own(StreamId stream, std::size_t need, bool may_wait);
  // The stream's local blocks of expandable ranges cover at least half of `need`: promote_all_now.
  // Only where the upstream cannot alias: otherwise growth aliases those blocks' pages instead.
  bool sync_own(StreamId stream, std::size_t need);
  // Memory pressure: every pending, retiring and local block becomes shared (host waits). The
  // threads' caches are flushed first by the caller.
  void wait_all();
  // FreeSync::gpu_wait (docs/design.md, "GPU-side waits"). When recorded device batches hold at
  // least `need` bytes of blocks of pool kind `small` (of the expandable ranges only, when
  // `expandable_only`), the GPU is made to wait for all their fences (FenceProvider::order_after)
  // and every batch becomes shared free memory at once. Their fences move to the ordered list
  // (FenceBatches::add_ordered). Returns true if anything became free.
  bool order_device_batches(std::size_t need, bool small, bool expandable_only);
  // Expandable growth aliases pages of `stream`'s own free blocks: an order whose fence is one
  // recorded on that stream now (no GPU-side wait: only the stream's own work follows). Returns
  // its number; the pages' old mapping drains until it completed.
  std::uint64_t order_stream(StreamId stream);
  // Both also unalias the draining ranges whose order completed (drop_aliases).
  void poll_ordered();    // release the completed ones (oldest first, stop at a running one)
  void settle_ordered();  // host-wait for every one of them (before memory goes back)

  // A stream is about to be destroyed: its local blocks wait on a fence recorded on it now.
  void retire(StreamId stream);

 private:
  void complete_batch(Batch* b);
  void complete_promo(StreamFree* stream_free);
  void drop_promo(StreamFree* stream_free);
  // Wait for a fence covering all of the stream's local blocks (recorded now unless the
  // outstanding one does), then they become shared. False when it cannot be waited for.
  bool promote_all_now(StreamFree* stream_free, StreamId stream);
  // stream_free->promo_fence = a fence recorded on `stream` now.
  void record_promo(StreamFree* stream_free, StreamId stream);
  // The bytes of expandable-range blocks in recorded device batches until `need`; *last = the
  // batch that reaches it.
  std::size_t pending_expandable_bytes(std::size_t need, Batch** last) const;
  // The default (FreeSync::gpu_wait) in a context where ordering is free
  // (FenceProvider::orders_for_free): recorded batches are handed out under a GPU-side wait
  // without being asked, and the open batch has the long window.
  bool ordering_free() const { return opt_.free_sync == FreeSync::gpu_wait && fences_.orders_for_free(); }
  // Where ordering is free (FenceProvider::orders_for_free): every recorded device batch is
  // ordered after, with no query of its fence first (service_fences, after each record).
  bool order_recorded_batches();
  bool order_scratch_batches();  // the common tail: order the fences in order_scratch
  // Every host wait on a fence goes through here: counted, and traced with its duration, since
  // a wait is where the pool can cost a program its CPU/GPU overlap. False, without waiting,
  // when the fence cannot be waited for now (FenceProvider::can_wait): its memory stays pending.
  [[nodiscard]] bool wait_fence(FenceHandle f, StreamId stream);

  const PoolOptions& opt_;
  FenceProvider& fences_;
  BlockStore& store_;
  StatsLedger& ledger_;
  EventLog& events_;
  ExpandableRanges& ranges_;
};

}  // namespace cudapool::detail
