// Internal: a small per-thread, per-pool cache in front of the pool lock (thread_caches.cpp has
// the pool side, docs/design.md "Thread caches" the why). Two kinds of freed blocks live here:
//  * stream-local ones: blocks freed with free_on_stream(p, s) (reusable at once on s) or with
//    free(p) under FreeSync::immediate (reusable at once on the allocation stream). Such a block
//    may be handed straight back to the SAME stream by the SAME thread;
//  * fenced ones (FreeSync::gpu_wait, fenced): free(p) of a block lent by this cache joins the cache's own
//    batch; the batch gets ONE device fence (recorded by this thread, without the pool lock) when
//    it holds kMaxPend blocks or has been open for the pool's batch window, and once that fence
//    has completed its blocks are reusable on ANY stream (entries with any_stream set).
// Nothing else ever sees a cached block until the cache is flushed into the pool.
//
// Ownership: a block the pool handed to this thread's cache ("checked out") is in state
// BState::tcache, in no free set and not in the pool's live map. The cache knows whether it is
// lent to the program (allocated; an open-addressing table by address), free (a short list) or
// waiting in its fenced batches (reuse.h). The cache never writes a Block field (other threads
// read neighbours' fields under the pool lock); it keeps copies of what it needs in its entries
// (CachedBlock, reuse.h).
//
// Stats: the cache's operations are not applied to the pool's counters at once; the cache
// replays them as deltas (StatCounter with current = net change, peak = highest running net,
// allocated/freed = sums) when it is merged under the pool lock. Every stats view merges every
// cache first, so what stats() shows is exact for the linearization "a cache's operations run
// back to back at the moment of the merge" (each thread's program order is kept: the owner
// merges its cache whenever it takes the pool lock itself).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/reuse.h"
#include "allocator/spin_lock.h"
#include "allocator/stats_ledger.h"
#include "allocator/types.h"

namespace cudapool {
class DevicePool;
}

namespace cudapool::detail {

class ThreadBlockCache {
 public:
  static constexpr int kMaxFree = 32;                      // free blocks kept (stream-local puts)
  static constexpr int kMaxPend = CacheBatches::kMaxPend;  // fenced frees per batch
  static constexpr std::size_t kMaxFreeBytes = 8 * MiB;    // ... and their bytes
  static constexpr std::size_t kMaxBlock = 1 * MiB;        // larger blocks never enter a cache
  // Lent blocks: an open-addressing table by address (linear probing, deletion by backward
  // shift), at most 3/4 full; O(1) expected on the free path. (It was direct-mapped once: 69
  // neighbouring 4 KiB blocks hashed to only 39 distinct slots, and every collision sent a block
  // back to the pool, so a batch of frees mostly missed the cache.)
  static constexpr int kLentBits = 7;
  static constexpr int kLentSlots = 1 << kLentBits;
  static constexpr int kMaxLent = kLentSlots * 3 / 4;
  static int slot_of(std::uintptr_t p) {
    return static_cast<int>(((p >> 9) * 0x9E3779B97F4A7C15ull) >> (64 - kLentBits));
  }
  static int next_slot(int i) { return (i + 1) & (kLentSlots - 1); }
  // Check-out is only worth it while the cache hits: each hit earns kHitCredit check-outs; with
  // no credit left only one locked allocation in kProbeEvery is lent (to notice a change).
  static constexpr int kHitCredit = 8, kMaxCredit = 1024, kProbeEvery = 64;

  SpinLock mu;  // the owner's fast path vs. a flush from a thread holding the pool lock

  // ---- its pool (the registry, thread_caches.cpp) ----
  // The pool this cache belongs to; null once detached (pool destroyed or thread exited).
  // Written under the global cache registry mutex only.
  void* pool() const { return pool_.load(std::memory_order_acquire); }
  std::uint64_t pool_uid() const { return pool_uid_; }
  // `at_exit` flushes this cache into `owner` at thread exit (registry mutex held).
  void attach(void* owner, std::uint64_t uid, void (*at_exit)(ThreadBlockCache&)) {
    pool_uid_ = uid;
    exit_flush_ = at_exit;
    pool_.store(owner, std::memory_order_release);
  }
  void detach() { pool_.store(nullptr, std::memory_order_release); }
  void exit_flush() { exit_flush_(*this); }

  // ---- the owner's fast path (under mu) ----
  // A free cached block for exactly (stream, rounded) becomes lent; its address, 0 = none.
  // `evict(ptr)` makes room in a full lent table; it can only when the pool lock is held.
  // *slot_busy: an entry matched but the lent table was full (the locked path can evict).
  template <class Evict>
  std::uintptr_t take(std::size_t rounded, std::size_t requested, StreamId stream, Evict evict, bool* slot_busy)
      REQUIRES(mu) {
    for (int i = nfree_ - 1; i >= 0; --i) {  // newest first: the warmest block
      if (free_[i].rounded != rounded || (free_[i].stream != stream && !free_[i].any_stream)) continue;
      if (nlent_ >= kMaxLent && !evict(free_[i].ptr)) {
        *slot_busy = true;
        return 0;
      }
      CachedBlock e = free_[i];
      free_[i] = free_[--nfree_];
      free_bytes_ -= e.size;
      e.requested = requested;
      e.stream = stream;  // lent: the allocation stream
      e.any_stream = false;
      lent_insert(e);
      count_lent(e, +1);
      delta_.cache_hit();
      mark_dirty();
      credit_ = std::min(credit_ + kHitCredit, kMaxCredit);
      return e.ptr;
    }
    return 0;
  }
  // The block lent at p becomes free in the cache, local to `stream` (or to its allocation
  // stream when use_owner): reuse.h, rule 7. False: not lent by this cache, or no room.
  bool put(std::uintptr_t p, StreamId stream, bool use_owner) REQUIRES(mu) {
    const int i = lent_find(p);
    if (i < 0) return false;
    if (nfree_ >= kMaxFree || free_bytes_ + lent_[i].size > kMaxFreeBytes) return false;
    CachedBlock e = lent_[i];
    lent_erase(i);
    count_lent(e, -1);
    mark_dirty();
    if (!use_owner) e.stream = stream;
    e.requested = 0;
    add_free(e);
    return true;
  }
  // A locked allocation asks whether to lend its block through this cache.
  bool wants_checkout() {
    if (credit_ > 0) {
      --credit_;
      return true;
    }
    return ++probe_ % kProbeEvery == 0;
  }
  bool has_free() const { return nfree_ != 0; }
  bool empty() const { return nfree_ == 0 && nlent_ == 0 && !fenced_.any(); }
  // The owner has used free_on_stream on this pool: its allocations may be lent from now on.
  bool async_seen() const { return async_seen_; }
  void note_async() { async_seen_ = true; }

  // ---- the stat deltas ----
  // Unmerged operations exist. Set by the owner under mu, cleared by merges under mu; the owner
  // may read it without mu (it only skips a merge when its own last write was a merge).
  bool dirty() const { return dirty_.load(std::memory_order_relaxed); }
  // Under mu and the pool lock: the deltas go into the pool's ledger.
  void merge_into(StatsLedger& ledger) {
    if (!dirty()) return;
    ledger.merge(delta_);
    dirty_.store(false, std::memory_order_relaxed);
  }

  // ---- flushing (under mu and the pool lock) ----
  // Every free entry to f; the free list emptied.
  template <class F>
  void drain_free(F f) {
    for (int i = 0; i < nfree_; ++i) f(free_[i]);
    nfree_ = 0;
    free_bytes_ = 0;
  }
  // Every lent entry to f (no erase while walking: erasing shifts entries backwards); the table emptied.
  template <class F>
  void drain_lent(F f) {
    for (CachedBlock& e : lent_) {
      if (e.ptr == 0) continue;
      f(e);
      e = CachedBlock{};
    }
    nlent_ = 0;
  }
  // The fenced batches (their rules are reuse.cpp's: cache_free_fenced, service_cache).
  bool has_fenced() const { return fenced_.any(); }
  bool fenced_stale(std::int64_t now, std::int64_t stale_ns) const { return fenced_.stale(now, stale_ns); }
  // Every fenced entry to f (closed batch first); the batches emptied, their fence released.
  template <class F>
  void drain_fenced(FenceProvider& fences, F f) {
    fenced_.drain(fences, f);
  }
  // Pool teardown: everything forgotten (the blocks go back with the segments), the fence released.
  void forget(FenceProvider& fences) {
    drain_lent([](const CachedBlock&) {});
    drain_fenced(fences, [](const CachedBlock&) {});
    drain_free([](const CachedBlock&) {});
    delta_ = StatsDelta{};
    dirty_.store(false, std::memory_order_relaxed);
  }

  // ---- the lent table (under mu) ----
  // Index of the entry lent at exactly p, or -1.
  int lent_find(std::uintptr_t p) const {
    if (p == 0) return -1;
    for (int i = slot_of(p), k = 0; k < kLentSlots; ++k, i = next_slot(i)) {
      if (lent_[i].ptr == p) return i;
      if (lent_[i].ptr == 0) return -1;
    }
    return -1;
  }
  // Index of the entry whose block contains p (any address inside), searched from p's home
  // slot (p is usually a start), or -1.
  int lent_containing(std::uintptr_t p) const {
    const int home = slot_of(p);
    for (int k = 0; k < kLentSlots; ++k) {
      const int i = (home + k) % kLentSlots;
      const CachedBlock& e = lent_[i];
      if (e.ptr != 0 && p >= e.ptr && p < e.ptr + e.size) return i;
    }
    return -1;
  }
  const CachedBlock& lent_at(int i) const { return lent_[i]; }
  int lent_count() const { return nlent_; }
  // Stores e (the table must not be full: lent_count() < kMaxLent); returns its index.
  int lent_insert(const CachedBlock& e) {
    int i = slot_of(e.ptr);
    while (lent_[i].ptr != 0) i = next_slot(i);
    lent_[i] = e;
    ++nlent_;
    return i;
  }
  // Removes entry i, moving later entries of its probe run back so every lookup still finds them.
  void lent_erase(int i) {
    for (int j = next_slot(i);; j = next_slot(j)) {
      if (lent_[j].ptr == 0) break;
      const int home = slot_of(lent_[j].ptr);
      // j's entry may fill the hole at i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (stays) continue;
      lent_[i] = lent_[j];
      i = j;
    }
    lent_[i] = CachedBlock{};
    --nlent_;
  }
  // Index of some lent entry (the first at or after p's home slot); the table must not be empty.
  int lent_any(std::uintptr_t p) const {
    int i = slot_of(p);
    while (lent_[i].ptr == 0) i = next_slot(i);
    return i;
  }

 private:
  // The fenced batches' rules (reuse.cpp) move entries between the lent table, the batches and
  // the free list.
  friend bool cache_free_fenced(ThreadBlockCache& cache, std::uintptr_t p, FenceProvider& fences);
  friend bool service_cache(ThreadBlockCache& cache, FenceProvider& fences);

  void mark_dirty() { dirty_.store(true, std::memory_order_relaxed); }
  void add_free(const CachedBlock& e) {
    free_[nfree_++] = e;
    free_bytes_ += e.size;
  }
  // A free cached entry is lent (+1): the pool's take() of it, or a lent entry is freed
  // stream-locally (-1): the pool's unallocate() and a stream-local free, in the ledger's terms.
  void count_lent(const CachedBlock& e, int sign) {
    if (sign > 0) {
      if (e.split) delta_.inactive_split_changed(e.small, e.size, -1);
      delta_.block_allocated(e.small, e.size, e.requested);
    } else {
      delta_.block_unallocated(e.small, e.size);
      delta_.block_deactivated(e.small, e.size, e.requested);
      if (e.split) delta_.inactive_split_changed(e.small, e.size, +1);
    }
  }

  std::atomic<void*> pool_{nullptr};
  std::uint64_t pool_uid_ = 0;
  void (*exit_flush_)(ThreadBlockCache&) = nullptr;
  // ---- everything below: under mu ----
  // Room for a completed fenced batch on top of kMaxFree stream-local entries, so completing a
  // batch never needs the pool lock.
  CachedBlock free_[kMaxFree + kMaxPend];
  int nfree_ = 0;
  std::size_t free_bytes_ = 0;
  CacheBatches fenced_;           // the open batch and the closed one waiting for its fence (reuse.h, rule 7)
  CachedBlock lent_[kLentSlots];  // ptr == 0: empty slot
  int nlent_ = 0;
  int credit_ = kProbeEvery;
  unsigned probe_ = 0;
  StatsDelta delta_;  // the same operations the pool's StatsLedger applies
  std::atomic<bool> dirty_{false};
  bool async_seen_ = false;
};

}  // namespace cudapool::detail
