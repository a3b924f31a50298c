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
// lent to the program (allocated; a direct-mapped table by address) or free (a short list). The cache never writes a Block field (other threads
// read neighbours' fields under the pool lock); it keeps copies of what it needs in its entries.
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

#include "allocator/fence.h"
#include "allocator/fence_batches.h"
#include "allocator/spin_lock.h"
#include "allocator/stats_ledger.h"
#include "allocator/types.h"

namespace cudapool {
class DevicePool;
}

namespace cudapool::detail {

struct Block;

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

struct ThreadBlockCache {
  static constexpr int kMaxFree = 32;                    // free blocks kept (stream-local puts)
  static constexpr int kMaxPend = 32;                    // fenced frees per batch
  static constexpr std::size_t kMaxFreeBytes = 8 * MiB;  // ... and their bytes
  static constexpr std::size_t kMaxBlock = 1 * MiB;      // larger blocks never enter a cache
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
  // The pool this cache belongs to; null once detached (pool destroyed or thread exited).
  // Written under the global cache registry mutex only.
  std::atomic<void*> pool{nullptr};
  std::uint64_t pool_uid = 0;
  // Set by the pool: flushes this cache into it at thread exit (registry mutex held).
  void (*exit_flush)(ThreadBlockCache&) = nullptr;

  // ---- everything below: under mu ----
  // Room for a completed fenced batch on top of kMaxFree stream-local entries, so completing a
  // batch never needs the pool lock.
  CachedBlock free_[kMaxFree + kMaxPend];
  int nfree = 0;
  std::size_t free_bytes = 0;
  // Fenced frees: the open batch (no fence yet, opened at pend_since) and the closed one,
  // waiting for `fence` (0: none closed). The cache's FenceHandle is the pool's to release.
  CachedBlock pend[kMaxPend];
  int npend = 0;
  std::int64_t pend_since = 0;
  CachedBlock closed[kMaxPend];
  int nclosed = 0;
  std::int64_t closed_since = 0;  // when `fence` was recorded
  std::uint64_t fence = 0;
  std::int64_t last_query = 0;   // when `fence` was last asked (queries are rate-limited)
  CachedBlock lent[kLentSlots];  // ptr == 0: empty slot
  int nlent = 0;
  int credit = kProbeEvery;
  unsigned probe = 0;
  StatsDelta delta;  // the same operations the pool's StatsLedger applies
  // delta holds unmerged operations. Set by the owner under mu, cleared by merges under mu; the
  // owner may read it without mu (it only skips a merge when its own last write was a merge).
  std::atomic<bool> dirty{false};
  bool async_seen = false;  // the owner has used free_on_stream on this pool

  bool empty() const { return nfree == 0 && nlent == 0 && npend == 0 && nclosed == 0; }

  // ---- the lent table (under mu) ----
  // Index of the entry lent at exactly p, or -1.
  int lent_find(std::uintptr_t p) const {
    if (p == 0) return -1;
    for (int i = slot_of(p), k = 0; k < kLentSlots; ++k, i = next_slot(i)) {
      if (lent[i].ptr == p) return i;
      if (lent[i].ptr == 0) return -1;
    }
    return -1;
  }
  // Stores e (the table must not be full: nlent < kMaxLent); returns its index.
  int lent_insert(const CachedBlock& e) {
    int i = slot_of(e.ptr);
    while (lent[i].ptr != 0) i = next_slot(i);
    lent[i] = e;
    ++nlent;
    return i;
  }
  // Removes entry i, moving later entries of its probe run back so every lookup still finds them.
  void lent_erase(int i) {
    for (int j = next_slot(i);; j = next_slot(j)) {
      if (lent[j].ptr == 0) break;
      const int home = slot_of(lent[j].ptr);
      // j's entry may fill the hole at i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (stays) continue;
      lent[i] = lent[j];
      i = j;
    }
    lent[i] = CachedBlock{};
    --nlent;
  }
  // Index of some lent entry (the first at or after p's home slot); the table must not be empty.
  int lent_any(std::uintptr_t p) const {
    int i = slot_of(p);
    while (lent[i].ptr == 0) i = next_slot(i);
    return i;
  }
  // ---- the owner's fast path (no pool lock: fence calls need none, FenceProvider is
  // thread-safe); defined below, inline ----
  template <class Evict>
  std::uintptr_t take(std::size_t rounded, std::size_t requested, StreamId stream, Evict evict, bool* slot_busy)
      REQUIRES(mu);
  bool put(std::uintptr_t p, StreamId stream, bool use_owner) REQUIRES(mu);
  bool put_pending(std::uintptr_t p) REQUIRES(mu);
  static constexpr std::int64_t kQueryGapNs = 2'000;  // the closed batch's fence is asked at most this often
  bool service(FenceProvider& fences) REQUIRES(mu);

  // A locked allocation asks whether to lend its block through this cache.
  bool wants_checkout() {
    if (credit > 0) {
      --credit;
      return true;
    }
    return ++probe % kProbeEvery == 0;
  }
};

// A free cached entry is lent (+1): the pool's take() of it, or a lent entry is freed
// stream-locally (-1): the pool's unallocate() and make_local(), in the ledger's terms.
inline void count_lent(StatsDelta& d, const CachedBlock& e, int sign) {
  if (sign > 0) {
    if (e.split) d.inactive_split_changed(e.small, e.size, -1);
    d.block_allocated(e.small, e.size, e.requested);
  } else {
    d.block_unallocated(e.small, e.size);
    d.block_deactivated(e.small, e.size, e.requested);
    if (e.split) d.inactive_split_changed(e.small, e.size, +1);
  }
}

// A fenced free of a lent entry: no longer allocated, still active (its fence is pending).
inline void count_pend(StatsDelta& d, const CachedBlock& e) {
  d.block_unallocated(e.small, e.size);
  d.pending_added(e.size);
}

// A fenced entry's fence completed: inactive now (the rest of count_lent(-1)).
inline void count_fence_done(StatsDelta& d, const CachedBlock& e) {
  d.block_deactivated(e.small, e.size, e.requested);
  if (e.split) d.inactive_split_changed(e.small, e.size, +1);
  d.pending_removed(e.size);
}

// Under mu: a free cached block for exactly (stream, rounded) becomes lent. 0 = none.
// `evict(ptr)` makes room in a full lent table; it can only when the pool lock is held.
// *slot_busy: an entry matched but the lent table was full (the locked path can evict).
template <class Evict>
std::uintptr_t ThreadBlockCache::take(std::size_t rounded, std::size_t requested, StreamId stream, Evict evict,
                                      bool* slot_busy) {
  for (int i = nfree - 1; i >= 0; --i) {  // newest first: the warmest block
    if (free_[i].rounded != rounded || (free_[i].stream != stream && !free_[i].any_stream)) continue;
    if (nlent >= ThreadBlockCache::kMaxLent && !evict(free_[i].ptr)) {
      *slot_busy = true;
      return 0;
    }
    CachedBlock e = free_[i];
    free_[i] = free_[--nfree];
    free_bytes -= e.size;
    e.requested = requested;
    e.stream = stream;  // lent: the allocation stream
    e.any_stream = false;
    lent_insert(e);
    count_lent(delta, e, +1);
    delta.cache_hit();
    dirty.store(true, std::memory_order_relaxed);
    credit = std::min(credit + ThreadBlockCache::kHitCredit, ThreadBlockCache::kMaxCredit);
    return e.ptr;
  }
  return 0;
}

// Under mu: the block lent at p becomes free in the cache, local to `stream` (or to its
// allocation stream when use_owner). False: not lent by this cache, or no room.
inline bool ThreadBlockCache::put(std::uintptr_t p, StreamId stream, bool use_owner) {
  const int i = lent_find(p);
  if (i < 0) return false;
  if (nfree >= ThreadBlockCache::kMaxFree || free_bytes + lent[i].size > ThreadBlockCache::kMaxFreeBytes) return false;
  CachedBlock e = lent[i];
  lent_erase(i);
  count_lent(delta, e, -1);
  dirty.store(true, std::memory_order_relaxed);
  if (!use_owner) e.stream = stream;
  e.requested = 0;
  free_[nfree++] = e;
  free_bytes += e.size;
  return true;
}

// Under mu: a fenced free(p) of the block lent at p joins the cache's open batch. False: not
// lent by this cache, or the open batch is full (its fence waits for the closed one's).
inline bool ThreadBlockCache::put_pending(std::uintptr_t p) {
  if (npend == ThreadBlockCache::kMaxPend) return false;
  const int i = lent_find(p);
  if (i < 0) return false;
  CachedBlock e = lent[i];
  lent_erase(i);
  count_pend(delta, e);
  dirty.store(true, std::memory_order_relaxed);
  pend[npend++] = e;
  return true;
}

// Under mu only (fence calls need no pool lock: FenceProvider is thread-safe). The cache's
// fenced batches move on: the closed batch's fence is asked (at most once per kQueryGapNs, a
// query costs ~0.3 us on an H200) and once complete its blocks become free for any stream; the
// open batch is closed (its fence recorded) when the closed slot is empty and the batch is full
// or older than the pool's batch window. True if blocks became free.
inline bool ThreadBlockCache::service(FenceProvider& fences) {
  bool freed = false;
  const std::int64_t now = FenceBatches::clock_ns();
  if (fence != 0 && now - last_query >= kQueryGapNs &&
      nfree + nclosed <= ThreadBlockCache::kMaxFree + ThreadBlockCache::kMaxPend) {
    last_query = now;
    if (fences.query(fence)) {
      fences.release(fence);
      fence = 0;
      for (int i = 0; i < nclosed; ++i) {
        CachedBlock e = closed[i];
        count_fence_done(delta, e);
        e.any_stream = true;
        e.requested = 0;
        free_[nfree++] = e;
        free_bytes += e.size;
      }
      freed = nclosed > 0;
      nclosed = 0;
      dirty.store(true, std::memory_order_relaxed);
    }
  }
  if (fence == 0 && npend > 0 &&
      (npend == ThreadBlockCache::kMaxPend || now - pend_since >= FenceBatches::kBatchWindowNs)) {
    fence = fences.record_device();
    delta.fence_recorded();
    dirty.store(true, std::memory_order_relaxed);
    for (int i = 0; i < npend; ++i) closed[i] = pend[i];
    nclosed = npend;
    npend = 0;
    last_query = now - kQueryGapNs;  // the next miss may ask at once: an idle GPU is done already
    closed_since = now;
  }
  return freed;
}

}  // namespace cudapool::detail
