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

struct ThreadBlockCache {
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
  // Fenced frees: the open batch and the closed one waiting for its fence (reuse.h, rule 7).
  CacheBatches fenced;
  CachedBlock lent[kLentSlots];  // ptr == 0: empty slot
  int nlent = 0;
  int credit = kProbeEvery;
  unsigned probe = 0;
  StatsDelta delta;  // the same operations the pool's StatsLedger applies
  // delta holds unmerged operations. Set by the owner under mu, cleared by merges under mu; the
  // owner may read it without mu (it only skips a merge when its own last write was a merge).
  std::atomic<bool> dirty{false};
  bool async_seen = false;  // the owner has used free_on_stream on this pool

  bool empty() const { return nfree == 0 && nlent == 0 && !fenced.any(); }

  // ---- the fenced batches (under mu; their rules are reuse.cpp's: cache_free_fenced, service_cache) ----
  bool has_fenced() const { return fenced.any(); }
  bool fenced_stale(std::int64_t now, std::int64_t stale_ns) const { return fenced.stale(now, stale_ns); }
  // Every fenced entry to f (closed batch first); the batches emptied, their fence released.
  template <class F>
  void drain_fenced(FenceProvider& fences, F f) {
    fenced.drain(fences, f);
  }

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
  // A locked allocation asks whether to lend its block through this cache.
  bool wants_checkout() {
    if (credit > 0) {
      --credit;
      return true;
    }
    return ++probe % kProbeEvery == 0;
  }
};

}  // namespace cudapool::detail
