// Internal: reuse, i.e. when a freed block may be handed out again, and to whom. The pool's one
// answer, for the device pool, the threads' caches and the pinned host pool alike (docs/design.md,
// "When freed memory is reused", has the rules and the why):
//
//  1. Same stream: free_on_stream(p, s) (cudaFreeAsync), or free(p) under FreeSync::immediate,
//     makes the block local to s: reusable at once by s only (Reuse::free_local).
//  2. Any stream, behind a device fence: free(p) (cudaFree meaning) puts the block pending in the
//     open batch; ONE device fence is recorded for the whole batch when its window closes (or it
//     reaches its bounds, or on a miss); once that fence completed, the batch's blocks are shared
//     (Reuse::free, close_open, service_fences, service_miss, drain_device_batches).
//  3. Other streams, behind a stream fence: a miss on stream t records one fence on stream s
//     (at most one outstanding per stream); once it completed, s's local blocks freed before it
//     are shared (promotion: try_promote_for, promote_own, sync_own).
//  4. GPU-side waits (FreeSync::gpu_wait): recorded batches are handed out at once, the GPU made
//     to wait for their fences (FenceProvider::order_after); their pages stay hot (Block::hot)
//     until the order completed (order_device_batches, poll_ordered, settle_ordered).
//  5. Host waits: FreeSync::device and memory pressure wait for fences (wait_device_batches,
//     wait_all), every wait counted in wait_fence.
//  6. Retired streams: a dying stream's local blocks wait on a fence on it (retire); a free()
//     of a block allocated on a retired stream never becomes local to it.
//  7. Thread caches: the same rules 1 and 2 inside one thread's cache (thread_cache.h), without
//     the pool lock: a cache's fenced frees are one FencedBatch, closed by ONE device fence,
//     asked with a back-off (service_cache); a cache's blocks go back into the pool as rule 1 or
//     2 says (return_cached_free, return_cached_fenced).
//  8. Pinned host memory (host_pool.cpp): a freed host block is reusable once every fence of its
//     FenceList completed (asked plain, urgent or waited for: Ask).
//  9. Graph capture: a fence that cannot be waited for now (FenceProvider::can_wait false) is
//     never waited for: its memory stays pending until the fence can be asked.
// 10. Fresh memory: a new segment no stream has used is shared at once (Reuse::fresh_shared);
//     fresh pages of an expandable range likewise, or local to the growing stream next to its own
//     free blocks or where they alias its own pages (ExpandableRanges::add_mapped).
//
// Every change of a freed device block's state is made by Reuse (the hot path's inline below,
// the rest in reuse.cpp): pending, local, shared, retiring, and the checked-out state of a
// thread cache's blocks; BlockStore::insert_free files a block in the state given to it, and
// ExpandableRanges handles the mapping states (unmapped, draining). The pool lock guards Reuse
// and FenceBatches, as everything else in the pool; a thread cache's fenced batches are under
// the cache's own lock.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "allocator/block_store.h"
#include "allocator/blocks.h"
#include "allocator/fence.h"
#include "allocator/node_pool.h"
#include "allocator/options.h"
#include "allocator/stats_ledger.h"
#include "allocator/types.h"

namespace cudapool::detail {

class ExpandableRanges;
struct EventLog;
class ThreadBlockCache;

// ---- asking a fence ----
// How a fence of freed memory is asked.
enum class Ask : std::uint8_t {
  plain,   // the provider's ordinary query (it may learn of a completion only a while later)
  urgent,  // query_urgent: memory is wanted now, the provider finds out at once
  wait,    // the host waits until it completed (the caller checked FenceProvider::can_wait)
};
// True once `f` completed, asked as `ask` says (Ask::wait: always, after waiting).
bool fence_done(FenceProvider& fences, FenceHandle f, Ask ask);

// ---- the fenced batch ----
// Entries freed together that become reusable together: open (no fence) while it collects
// entries, closed by recording ONE fence, and reusable once that fence completed. `since`: when
// its first entry came while open (the batch window), when its fence was recorded once closed.
// The pool's device batches (entries: a chain of Blocks) and a thread cache's fenced frees
// (entries: copies, CachedRun) are this type.
template <class Entries>
class FencedBatch {
 public:
  Entries& entries() { return entries_; }
  const Entries& entries() const { return entries_; }
  std::size_t count() const { return entries_.count(); }
  std::size_t bytes() const { return entries_.bytes(); }
  FenceHandle fence() const { return fence_; }
  std::int64_t since() const { return since_; }
  void open_at(std::int64_t now) { since_ = now; }
  bool window_passed(std::int64_t now, std::int64_t window) const { return count() != 0 && now - since_ >= window; }
  void close(FenceHandle f, std::int64_t now = 0) {
    fence_ = f;
    since_ = now;
  }
  bool done(FenceProvider& fences, Ask ask) const { return fence_done(fences, fence_, ask); }
  // The fence leaves the batch (kept elsewhere, or released by the caller): 0 from now on.
  FenceHandle take_fence() { return std::exchange(fence_, 0); }

 private:
  Entries entries_;
  FenceHandle fence_ = 0;
  std::int64_t since_ = 0;
};

// A device batch's entries: blocks linked through Block::link, newest first.
class BlockChain {
 public:
  void push(Block* b) {
    b->link = head_;
    head_ = b;
    ++count_;
    bytes_ += b->size;
  }
  Block* head() const { return head_; }
  std::size_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }
  void clear() { *this = BlockChain{}; }
  template <class F>
  void for_each(F f) const {
    for (Block* x = head_; x != nullptr; x = x->link) f(x);
  }

 private:
  Block* head_ = nullptr;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

// A thread cache's entries (it never writes a Block field): up to N copies.
template <class Entry, std::size_t N>
class CachedRun {
 public:
  bool full() const { return static_cast<std::size_t>(n_) == N; }
  std::size_t count() const { return static_cast<std::size_t>(n_); }
  void push(const Entry& e) { items_[n_++] = e; }
  const Entry& operator[](int i) const { return items_[i]; }
  int size() const { return n_; }
  void clear() { n_ = 0; }
  void take_from(CachedRun& other) {
    for (int i = 0; i < other.n_; ++i) items_[i] = other.items_[i];
    n_ = other.n_;
    other.n_ = 0;
  }

 private:
  Entry items_[N];
  int n_ = 0;
};

// One device batch: a fenced batch of blocks, in one of FenceBatches' lists.
struct Batch : FencedBatch<BlockChain> {
  StreamId stream = 0;  // retire batches: the stream the fence was recorded on
  Batch* next = nullptr;
};

// ---- a thread cache's entries and fenced frees (rule 7) ----
// A block as a thread cache knows it (thread_cache.h): lent to the program, free in the cache,
// or waiting in one of its fenced batches. The cache never writes a Block field (other threads
// read neighbours' fields under the pool lock); it keeps copies of what it needs here.
struct CachedBlock {
  Block* block = nullptr;
  std::uintptr_t ptr = 0;
  std::size_t size = 0;       // the block's size (what the stats count)
  std::size_t rounded = 0;    // the rounded request it serves (the cache key with stream)
  std::size_t requested = 0;  // lent: what the caller asked for
  StreamId stream = 0;        // lent: allocation stream; free: the stream it is local to
  bool small = false;
  bool split = false;       // counted in inactive_split while free (never changes while cached)
  bool any_stream = false;  // free: its device fence completed, so it serves any stream
};

// A cache's fenced frees: the open batch (no fence yet) and the closed one, waiting for its
// fence, which is asked at most once per kQueryGapNs. Under the cache's mu; the cache's fence is
// the pool's to release. service_cache (reuse.cpp) moves them on.
class CacheBatches {
 public:
  static constexpr int kMaxPend = 32;                 // fenced frees per batch
  static constexpr std::int64_t kQueryGapNs = 2'000;  // the closed batch is asked at most this often
  using Run = CachedRun<CachedBlock, static_cast<std::size_t>(kMaxPend)>;

  bool any() const { return open_.count() != 0 || closed_.count() != 0; }
  bool open_full() const { return open_.entries().full(); }
  // e joins the open batch (not full); the open batch's count after it.
  std::size_t add(const CachedBlock& e) {
    open_.entries().push(e);
    return open_.count();
  }
  void opened_at(std::int64_t now) { open_.open_at(now); }  // its first entry came: the window starts
  // The closed batch waits for its fence and was not asked within kQueryGapNs.
  bool closed_due(std::int64_t now) const { return closed_.fence() != 0 && now - last_query_ >= kQueryGapNs; }
  int closed_size() const { return closed_.entries().size(); }
  // Asks the closed batch's fence now; true (the fence released) when it completed.
  bool ask_closed(FenceProvider& fences, std::int64_t now) {
    last_query_ = now;
    if (!closed_.done(fences, Ask::plain)) return false;
    fences.release(closed_.take_fence());
    return true;
  }
  // Every entry of the closed batch (its fence completed) to f; the closed slot empty again.
  template <class F>
  void take_closed(F f) {
    for (int i = 0; i < closed_.entries().size(); ++i) f(closed_.entries()[i]);
    closed_.entries().clear();
  }
  // The open batch may be closed: no closed one waits, and it is full or older than `window`.
  bool may_close(std::int64_t now, std::int64_t window) const {
    return closed_.fence() == 0 && open_.count() > 0 && (open_full() || now - open_.since() >= window);
  }
  // The open batch becomes the closed one, fenced by `f` (recorded now); the next miss may ask
  // it at once: an idle GPU is done already.
  void close(FenceHandle f, std::int64_t now) {
    closed_.entries().take_from(open_.entries());
    closed_.close(f, now);
    last_query_ = now - kQueryGapNs;
  }
  // Untouched for `stale` ns: the open batch opened and the closed one was recorded that long ago.
  bool stale(std::int64_t now, std::int64_t stale_ns) const {
    return (open_.count() == 0 || now - open_.since() >= stale_ns) &&
           (closed_.count() == 0 || now - closed_.since() >= stale_ns);
  }
  // Every entry, the closed batch's first, then the batches are empty; their fence is released.
  template <class F>
  void drain(FenceProvider& fences, F f) {
    for (int i = 0; i < closed_.entries().size(); ++i) f(closed_.entries()[i]);
    for (int i = 0; i < open_.entries().size(); ++i) f(open_.entries()[i]);
    closed_.entries().clear();
    open_.entries().clear();
    if (closed_.fence() != 0) fences.release(closed_.take_fence());
  }

 private:
  FencedBatch<Run> open_;
  FencedBatch<Run> closed_;
  std::int64_t last_query_ = 0;  // when the closed batch's fence was last asked
};

// ---- the host pool's fences ----
// A freed pinned host block waits for the device fence of its free and, merged with free
// neighbours, for theirs: reusable once every one of them completed (HostPool).
struct FenceWaitCounts {
  std::int64_t fence_waits = 0;  // host waits on a fence
  std::int64_t bound_waits = 0;  // blocks waited for (Ask::wait) rather than new memory mapped
};
class FenceList {
 public:
  bool empty() const { return fences_.empty(); }
  void add(FenceHandle f) { fences_.push_back(f); }
  void absorb(const FenceList& other) { fences_.insert(fences_.end(), other.fences_.begin(), other.fences_.end()); }
  // True once every fence completed, asked as `ask` says; each completed one is released. Ask::wait
  // waits only when every fence can be waited for (else false, nothing waited for).
  bool done(FenceProvider& fences, Ask ask, FenceWaitCounts& counts);
  // Waits for every fence (counted); they stay in the list until release().
  void wait_all(FenceProvider& fences, FenceWaitCounts& counts);
  void release(FenceProvider& fences);

 private:
  std::vector<FenceHandle> fences_;
};

// ---- what waits on which fence (the device pool) ----
// FenceBatches owns
//  * the open batch: blocks free()d since its last fence, with the clock when it opened;
//  * the recorded device batches, oldest first (device fences complete in recording order);
//  * the retire batches: blocks of retired streams, each on a fence on its stream;
//  * the promotion list: streams whose local blocks have an outstanding promotion fence
//    (StreamFree::promo_*);
//  * the GPU-side waits still running (`ordered`, with order_seq / order_done), which keep the
//    memory they handed out from going back to the upstream (Block::hot), and the stream fences
//    of pages a stream's growth aliased from its own free blocks (Reuse::order_stream);
//  * the query back-off of service_fences() and the Batch objects themselves.
// Its operations only move batches and fences between these lists; what a completed batch or
// promotion does to blocks is Reuse's.
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
    return open_->count() != 0 || dev_head_ != nullptr || retire_head_ != nullptr || !promo_.empty() ||
           !ordered_.empty();
  }

  // ---- the open batch ----
  const Batch& open() const { return *open_; }
  // b (pending) joins the open batch. True: the batch reached its bounds and must be closed now.
  bool add_open(Block* b, std::size_t reserved) {
    open_->entries().push(b);
    if (open_->count() >= kBatchMaxBlocks || open_->bytes() >= batch_max_bytes(reserved)) return true;
    if (open_->count() == 1) {  // the batch opens: its window starts, the short one
      open_->open_at(clock_ns());
      open_window_ = kBatchWindowNs;
    }
    return false;
  }
  bool window_passed(std::int64_t now) const { return open_->window_passed(now, open_window_); }
  // The open batch's window becomes kOrderedBatchWindowNs, counted from its opening.
  void lengthen_window() { open_window_ = kOrderedBatchWindowNs; }
  // The open batch, fenced by `f` (recorded now), becomes the newest device batch.
  void seal_open(FenceHandle f) {
    open_->close(f);
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
      if (b->done(fences, Ask::plain)) {
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
  // reuse.cpp).
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

// ---- the rules (the device pool) ----
// Reuse owns what waits on which fence (FenceBatches) and turns it into free blocks. The order
// in which a path needing memory tries its steps is the pool's make_room (pool_miss.cpp).
class Reuse {
 public:
  Reuse(const PoolOptions& opt, FenceProvider& fences, BlockStore& store, StatsLedger& ledger, EventLog& events,
        ExpandableRanges& ranges)
      : opt_(opt), fences_(fences), store_(store), ledger_(ledger), events_(events), ranges_(ranges) {}
  Reuse(const Reuse&) = delete;
  Reuse& operator=(const Reuse&) = delete;

  static std::int64_t clock_ns() { return FenceBatches::clock_ns(); }

  // ---- a block is freed (rules 1, 2, 6; inline: the hot path) ----
  // free() of allocated block b (already unallocated): local to its allocation stream under
  // FreeSync::immediate unless that stream was retired, else pending in the open batch.
  void free(Block* b) {
    if (opt_.free_sync == FreeSync::immediate && !store_.is_retired(b->owner)) {
      free_local(b, b->owner);
      return;
    }
    // cudaFree meaning: nobody may reuse it before a device fence recorded after this point.
    // The fence is recorded once for the whole batch, when its window closes (add_pending).
    b->state = BState::pending;
    ledger_.pending_added(b->size);
    add_pending(b);
  }
  // free_on_stream(): b becomes free and local to `stream`.
  void free_local(Block* b, StreamId stream) {
    StreamFree* stream_free = store_.stream_get(stream);
    store_.deactivate(b);
    b->epoch = store_.next_epoch();
    store_.insert_free(b, BState::local, stream, stream_free->sets[kind_index(b->seg->small)]);
  }
  // Fresh memory no stream has used: a shared free block at once.
  void fresh_shared(Block* b) { become_shared(b); }

  // ---- thread caches (rule 7; the cache's fast path: service_cache, cache_free_fenced) ----
  // An allocated block (just taken) is checked out to a thread cache: in no set, not in `live`.
  void lend_to_cache(Block* b) {
    store_.take_live(b->ptr);
    b->state = BState::tcache;
  }
  // A cache's lent entry is an ordinary allocated block again.
  void unlend(const CachedBlock& e) {
    Block* b = e.block;
    b->state = BState::allocated;
    b->owner = e.stream;
    b->requested = e.requested;
    store_.put_live(b);
  }
  // A cache's free entry goes back: shared when its cache fence completed, else local to its stream.
  void return_cached_free(const CachedBlock& e);
  // A cache's fenced entry (open or closed batch) joins the pool's open batch: its fence is
  // recorded later than the cache's own would have been, which is only safer.
  void return_cached_fenced(const CachedBlock& e);

  // ---- asked on allocation (the batch window, back-off) and on a miss ----
  bool has_work() const { return batches_.has_work(); }
  void service_fences();
  bool service_miss();
  bool drain_device_batches(bool urgent = false);
  void note_miss() { ++slow_calls_; }

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
  bool has_ordered() const { return batches_.has_ordered(); }
  std::uint64_t order_done() const { return batches_.order_done(); }

  // A stream is about to be destroyed: its local blocks wait on a fence recorded on it now.
  void retire(StreamId stream);

  // ---- whole state ----
  std::size_t pending_count() const { return batches_.pending_count(); }
  std::size_t retiring_count() const { return batches_.retiring_count(); }
  void release_all() { batches_.release_all(fences_); }  // teardown
  void forget_all() { batches_.forget_all(); }           // the context is gone

 private:
  // b (pending, counted) joins the open batch.
  void add_pending(Block* b) {
    if (batches_.add_open(b, ledger_.reserved_bytes())) close_open();
  }
  void close_open();
  // An inactive block in no set and not counted in inactive_split becomes shared.
  void become_shared(Block* b) { store_.insert_free(b, BState::shared, 0, store_.shared_set(b->seg->small)); }
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
  FenceBatches batches_;          // what waits on which fence
  std::uint64_t slow_calls_ = 0;  // misses so far (promote_own: "recorded just now")
};

// ---- a thread cache's fenced frees (rule 7; under the cache's mu, no pool lock) ----
// The cache's fenced free of its lent entry at p joins its open batch. False: not lent by this
// cache, or the open batch is full (its fence waits for the closed one's).
bool cache_free_fenced(ThreadBlockCache& cache, std::uintptr_t p, FenceProvider& fences);
// The cache's batches move on: the closed batch's fence is asked (at most once per
// kCacheQueryGapNs) and once complete its entries become free for any stream; the open batch is
// closed (its fence recorded) when the closed slot is empty and the batch is full or older than
// the pool's batch window. True if entries became free.
bool service_cache(ThreadBlockCache& cache, FenceProvider& fences);

}  // namespace cudapool::detail
