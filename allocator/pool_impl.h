// Internal: DevicePool::Impl, the composition behind the pool's front (pool.cpp). Not
// installed, not for other modules. Each concept owns its state in its own type and file:
//   store    (block_store.h)       blocks, segments, free sets, the pointer map, streams' sets;
//   ledger   (stats_ledger.h)      every statistics counter;
//   limits   (limits.h)            the reserve limit and the device facts it needs;
//   ranges   (expandable_ranges.h) expandable segments: plan, recycle, map, alias, release;
//   reuse    (reuse.h)             when a freed block may be reused: fences, batches, promotions;
//   caches   (thread_caches.h)     the threads' block caches (thread_cache.h: one cache);
//   events   (events.h)            the event sink.
// Impl itself holds the lock and the order of the slow paths: the miss path, make_room and
// growth (pool_miss.cpp), giving memory back (pool_release.cpp). The lock guards every concept
// as a whole (GUARDED_BY below); the concepts' own code knows nothing of it, and only Impl drops
// it (around upstream calls). docs/design.md has the picture and the why.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "allocator/block_store.h"
#include "allocator/blocks.h"
#include "allocator/expandable_ranges.h"
#include "allocator/limits.h"
#include "allocator/node_pool.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/reuse.h"
#include "allocator/spin_lock.h"
#include "allocator/stats_ledger.h"
#include "allocator/thread_caches.h"

namespace cudapool {

struct DevicePool::Impl {
  using Block = detail::Block;
  using Segment = detail::Segment;
  using FreeSet = detail::FreeSet;
  using StreamFree = detail::StreamFree;
  using Fit = detail::Fit;
  using Detached = detail::Detached;
  using BState = detail::BState;
  using Lock = detail::SpinUniqueLock;
  using Guard = detail::SpinGuard;

  Impl(int device, const PoolOptions& options, Upstream& upstream, FenceProvider& fences, EventSink* sink);
  ~Impl();

  // ---- configuration (immutable after construction) ----
  const int device;
  const PoolOptions opt;
  Upstream& up;
  FenceProvider& fences;
  detail::EventLog events GUARDED_BY(mu);  // the event sink (events.h)

  // On its own cache line: waiters spin on it without disturbing the data the owner works on.
  alignas(64) mutable detail::SpinLock mu;

  // From the next cache line on: what the owner writes on every call stays off the lock's line.
  alignas(64) detail::StatsLedger ledger GUARDED_BY(mu){opt.max_split_size};  // every counter (stats_ledger.h)
  detail::BlockStore store GUARDED_BY(mu){opt, ledger};  // blocks, segments, free sets (block_store.h)

  detail::Limits limits GUARDED_BY(mu);  // the reserve limit and the device facts it needs (limits.h)
  detail::ExpandableRanges ranges GUARDED_BY(mu){opt, up, limits, store, ledger, events};  // (expandable_ranges.h)
  detail::Reuse reuse GUARDED_BY(mu){opt, fences, store, ledger, events, ranges};          // reuse rules (reuse.h)
  // This pool's key in every thread's cache list (never reused); read without the lock.
  const std::uint64_t uid = detail::new_pool_uid();
  detail::ThreadCaches caches GUARDED_BY(mu){uid, mu, opt, fences, ledger, reuse, events};  // (thread_caches.h)

  // ---- fast-path primitives (inline: used by every translation unit of the pool) ----
  bool has_fence_work() const REQUIRES(mu) { return reuse.has_work() || ranges.has_draining(); }
  // A free's block: the live block at p, also when a thread cache had lent it; null when p is
  // no live block of this pool.
  Block* take_live(std::uintptr_t p) REQUIRES(mu) {
    if (p == 0) return nullptr;
    Block* b = store.take_live(p);
    if (b == nullptr && !caches.empty() && caches.reclaim_lent(p)) b = store.take_live(p);
    return b;
  }
  // After a locked allocation: lend block b through this thread's cache (pool.cpp, inline there).
  void lend(detail::ThreadBlockCache* cache, Block* b, std::size_t rounded) REQUIRES(mu);

  // ---- the miss path (pool_miss.cpp) ----
  // One request for memory on a slow path: what it asks for, how far make_room has gone for
  // it, and why it was refused (AllocResult).
  struct Request {
    std::size_t size = 0;  // what the caller asked for
    std::size_t rounded = 0;
    bool small = false;
    StreamId stream = 0;
    bool prefill = false;   // a warm start's growth (DevicePool::prefill): maps, recycles nothing
    int reuse_step = 0;     // make_room's next step for Room::reuse
    int upstream_step = 0;  // ... and for Room::upstream
    // Room::pages: bytes of hot free pages the growth could alias (aliasing on) or move after a
    // wait (off), and (aliasing on) of the stream's own free pages it could alias.
    std::size_t hot_bytes = 0;
    std::size_t own_bytes = 0;
    std::size_t released = 0;  // Room::idle: bytes given back
    Refusal refusal = Refusal::none;
    int upstream_error = 0;
    std::size_t asked = 0;  // what the last refused growth asked for
    // A refusal of a growth of `bytes`; the group budget's sticks (it says other processes may
    // give memory back).
    void refused(Refusal why, std::size_t bytes, int error_code = 0) {
      if (refusal == Refusal::budget && why != Refusal::budget) return;  // the budget's account stands
      if (why != refusal) upstream_error = 0;                            // the code goes with the refusal reported
      refusal = why;
      if (error_code != 0) upstream_error = error_code;
      asked = bytes;
    }
    void refused(const UpstreamStatus& us, std::size_t bytes) {
      refused(us.budget ? Refusal::budget : Refusal::device, bytes, us.error_code);
    }
  };
  // What a path needs memory for (make_room):
  //  reuse:    a free block that fits `bytes`, from memory that fences or other streams hold back;
  //  pages:    expandable growth past its cap: `bytes` of free pages of the ranges;
  //  upstream: the upstream (or the limit) refused a growth: cached memory goes back;
  //  idle:     `bytes` of idle cached memory given back (release_idle, reserve_external).
  enum class Room : std::uint8_t { reuse, pages, upstream, idle };
  // What make_room did: nothing more to do, free blocks to search again, memory given back to grow again.
  enum class Made : std::uint8_t { nothing, blocks_freed, memory_released };
  // The one way every path makes room, cheapest first; each call takes the next step that
  // changes something (the steps in pool_miss.cpp). `may_wait`: the host may wait for a fence.
  Made make_room(Lock& lk, Request& req, std::size_t bytes, Room kind, bool may_wait) REQUIRES(mu);
  bool reuse_step(Request& req) REQUIRES(mu);
  Made upstream_step(Lock& lk, Request& req) REQUIRES(mu);
  bool free_pages(Request& req, std::size_t bytes, bool may_wait) REQUIRES(mu);
  AllocResult allocate_slow(Lock& lk, std::size_t size, std::size_t rounded, StreamId stream) REQUIRES(mu);
  Block* serve(Fit fit, std::size_t rounded, std::size_t size, StreamId stream) REQUIRES(mu);
  // A fresh block for req: expandable growth, else a classic segment.
  UpstreamStatus grow(Lock& lk, Request& req, bool may_wait, Block** out) REQUIRES(mu);
  UpstreamStatus new_segment(Lock& lk, Request& req, std::size_t seg_size, Block** out) REQUIRES(mu);

  // ---- giving memory back: GC, release_idle, empty_cache, the OOM path (pool_release.cpp) ----
  std::size_t release_segments(Lock& lk, std::vector<Detached>& list) REQUIRES(mu);
  bool release_oversize(Lock& lk, std::size_t rounded) REQUIRES(mu);
  std::size_t release_cached(Lock& lk) REQUIRES(mu);
  void garbage_collect(Lock& lk) REQUIRES(mu);
  // release_idle's one pass over the free sets (no fence waits); bytes released.
  std::size_t release_idle_now(Lock& lk, std::size_t want) REQUIRES(mu);

  // ---- expandable growth (pool_miss.cpp; the rules are ExpandableRanges') ----
  // Map pages so that a free block usable by the request's stream of >= rounded bytes exists;
  // *out = it. Returns ok, out_of_memory (upstream or limit), error, or sets *out = nullptr with
  // ok when the range has no room (the caller then falls back to a classic segment).
  // Before mapping beyond the high-water mark of reserved bytes it first makes room
  // (make_room(pages), when `may_wait` it may wait) and recycles whole free pages elsewhere;
  // *out may then be a free block that became usable (no pages mapped).
  UpstreamStatus grow_expandable(Lock& lk, Request& req, Block** out, bool may_wait) REQUIRES(mu);
  bool plan_growth(Lock& lk, Request& req, detail::Growth& growth, bool may_wait, Block** out) REQUIRES(mu);
  void take_pages(Request& req, detail::Growth& growth, std::size_t over, std::size_t avail) REQUIRES(mu);
  UpstreamStatus place_growth(Lock& lk, Request& req, detail::Growth& growth, Block** out) REQUIRES(mu);
  Block* map_piece(Lock& lk, Request& req, detail::Growth& growth, Block* u, std::size_t amount, bool back,
                   UpstreamStatus* failed) REQUIRES(mu);
  UpstreamStatus fill(Lock& lk, detail::Growth& growth, std::uintptr_t at, std::size_t amount) REQUIRES(mu);

  // ---- consistency and teardown (pool.cpp) ----
  std::string check() const REQUIRES(mu);
  void forget_all() REQUIRES(mu);
};

}  // namespace cudapool
