// Internal: a small per-thread, per-pool cache in front of the pool lock (pool_tcache.cpp has
// the pool side, docs/design.md "Thread caches" the why). Only for memory whose reuse is
// stream-local anyway: blocks freed with free_on_stream(p, s) (reusable at once on s) or with
// free(p) under FreeSync::immediate (reusable at once on the allocation stream). Such a block may
// be handed straight back to the SAME stream by the SAME thread; nothing else ever sees it until
// the cache is flushed into the pool.
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

#include "allocator/spin_lock.h"
#include "allocator/stats.h"
#include "allocator/types.h"

namespace cudapool {
class DevicePool;
}

namespace cudapool::detail {

struct Block;

struct TcEntry {
  Block* block = nullptr;
  std::uintptr_t ptr = 0;
  std::size_t size = 0;       // the block's size (what the stats count)
  std::size_t rounded = 0;    // the rounded request it serves (the cache key with stream)
  std::size_t requested = 0;  // lent: what the caller asked for
  StreamId stream = 0;        // lent: allocation stream; free: the stream it is local to
  bool small = false;
  bool split = false;         // counted in inactive_split while free (never changes while cached)
};

// The stat families a cached operation touches.
struct TcDelta {
  StatArray allocation{}, allocated_bytes{}, active{}, active_bytes{}, requested_bytes{};
  StatArray inactive_split{}, inactive_split_bytes{};
  std::int64_t cache_hits = 0;
};

struct ThreadCache {
  static constexpr int kMaxFree = 32;                 // free blocks kept
  static constexpr std::size_t kMaxFreeBytes = 8 * MiB;  // ... and their bytes
  static constexpr std::size_t kMaxBlock = 1 * MiB;   // larger blocks never enter a cache
  // Lent blocks: a direct-mapped table by address (O(1) on the free path); a collision sends
  // the older block back to the pool as an ordinary allocated block.
  static constexpr int kLentBits = 7;
  static constexpr int kLentSlots = 1 << kLentBits;
  static int slot_of(std::uintptr_t p) {
    return static_cast<int>(((p >> 9) * 0x9E3779B97F4A7C15ull) >> (64 - kLentBits));
  }
  // Check-out is only worth it while the cache hits: each hit earns kHitCredit check-outs; with
  // no credit left only one locked allocation in kProbeEvery is lent (to notice a change).
  static constexpr int kHitCredit = 8, kMaxCredit = 1024, kProbeEvery = 64;

  SpinLock mu;  // the owner's fast path vs. a flush from a thread holding the pool lock
  // The pool this cache belongs to; null once detached (pool destroyed or thread exited).
  // Written under the global cache registry mutex only.
  std::atomic<void*> pool{nullptr};
  std::uint64_t pool_uid = 0;
  // Set by the pool: flushes this cache into it at thread exit (registry mutex held).
  void (*exit_flush)(ThreadCache&) = nullptr;

  // ---- everything below: under mu ----
  TcEntry free_[kMaxFree];
  int nfree = 0;
  std::size_t free_bytes = 0;
  TcEntry lent[kLentSlots];  // ptr == 0: empty slot
  int nlent = 0;
  int credit = kProbeEvery;
  unsigned probe = 0;
  TcDelta delta;
  // delta holds unmerged operations. Set by the owner under mu, cleared by merges under mu; the
  // owner may read it without mu (it only skips a merge when its own last write was a merge).
  std::atomic<bool> dirty{false};
  bool async_seen = false;  // the owner has used free_on_stream on this pool

  bool empty() const { return nfree == 0 && nlent == 0; }
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
