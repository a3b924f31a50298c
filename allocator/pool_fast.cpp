// The hot path: allocate() when a cached block fits, free()/free_on_stream() of a live block.
// One short-critical-section lock (spin_lock.h), one hash lookup, a couple of O(log n) set operations on small sets, no malloc.
// Everything else (misses, fences, OOM, GC, bad frees) lives in the other pool_*.cpp files.
#include <algorithm>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;

DevicePool::Impl::Impl(int dev, const PoolOptions& options, Upstream& upstream, FenceProvider& fence_provider,
                       EventSink* event_sink)
    : device(dev),
      opt(options),
      up(upstream),
      fences(fence_provider),
      sink(event_sink),
      shared{FreeSet(detail::BySizeAddr{}, detail::ArenaAllocator<Block*>(&arena)),
             FreeSet(detail::BySizeAddr{}, detail::ArenaAllocator<Block*>(&arena))} {}

DevicePool::DevicePool(int device, const PoolOptions& options, Upstream& upstream, FenceProvider& fences,
                       EventSink* sink)
    : impl_(std::make_unique<Impl>(device, options, upstream, fences, sink)) {}

DevicePool::~DevicePool() = default;

namespace {

using detail::TcEntry;
using detail::ThreadCache;

// A free cached entry is lent (+1): the pool's take() of it, or a lent entry is freed
// stream-locally (-1): the pool's unallocate() and make_local(), in the ledger's terms.
void count_lent(detail::StatsDelta& d, const TcEntry& e, int sign) {
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
void count_pend(detail::StatsDelta& d, const TcEntry& e) {
  d.block_unallocated(e.small, e.size);
  d.pending_added(e.size);
}

// A fenced entry's fence completed: inactive now (the rest of count_lent(-1)).
void count_fence_done(detail::StatsDelta& d, const TcEntry& e) {
  d.block_deactivated(e.small, e.size, e.requested);
  if (e.split) d.inactive_split_changed(e.small, e.size, +1);
  d.pending_removed(e.size);
}

// Under tc.mu: a free cached block for exactly (stream, rounded) becomes lent. 0 = none.
// `evict(ptr)` makes room in a full lent table; it can only when the pool lock is held.
// *slot_busy: an entry matched but the lent table was full (the locked path can evict).
template <class Evict>
std::uintptr_t tc_take(ThreadCache& tc, std::size_t rounded, std::size_t requested, StreamId stream, Evict evict,
                       bool* slot_busy) {
  for (int i = tc.nfree - 1; i >= 0; --i) {  // newest first: the warmest block
    if (tc.free_[i].rounded != rounded || (tc.free_[i].stream != stream && !tc.free_[i].any_stream)) continue;
    if (tc.nlent >= ThreadCache::kMaxLent && !evict(tc.free_[i].ptr)) {
      *slot_busy = true;
      return 0;
    }
    TcEntry e = tc.free_[i];
    tc.free_[i] = tc.free_[--tc.nfree];
    tc.free_bytes -= e.size;
    e.requested = requested;
    e.stream = stream;  // lent: the allocation stream
    e.any_stream = false;
    tc.lent_insert(e);
    count_lent(tc.delta, e, +1);
    tc.delta.cache_hit();
    tc.dirty.store(true, std::memory_order_relaxed);
    tc.credit = std::min(tc.credit + ThreadCache::kHitCredit, ThreadCache::kMaxCredit);
    return e.ptr;
  }
  return 0;
}

// Under tc.mu: the block lent at p becomes free in the cache, local to `stream` (or to its
// allocation stream when use_owner). False: not lent by this cache, or no room.
bool tc_put(ThreadCache& tc, std::uintptr_t p, StreamId stream, bool use_owner) {
  const int i = tc.lent_find(p);
  if (i < 0) return false;
  if (tc.nfree >= ThreadCache::kMaxFree || tc.free_bytes + tc.lent[i].size > ThreadCache::kMaxFreeBytes) return false;
  TcEntry e = tc.lent[i];
  tc.lent_erase(i);
  count_lent(tc.delta, e, -1);
  tc.dirty.store(true, std::memory_order_relaxed);
  if (!use_owner) e.stream = stream;
  e.requested = 0;
  tc.free_[tc.nfree++] = e;
  tc.free_bytes += e.size;
  return true;
}

// Under tc.mu: a fenced free(p) of the block lent at p joins the cache's open batch. False: not
// lent by this cache, or the open batch is full (its fence waits for the closed one's).
bool tc_put_pending(ThreadCache& tc, std::uintptr_t p) {
  if (tc.npend == ThreadCache::kMaxPend) return false;
  const int i = tc.lent_find(p);
  if (i < 0) return false;
  TcEntry e = tc.lent[i];
  tc.lent_erase(i);
  count_pend(tc.delta, e);
  tc.dirty.store(true, std::memory_order_relaxed);
  tc.pend[tc.npend++] = e;
  return true;
}

}  // namespace

// Under tc.mu only (fence calls need no pool lock: FenceProvider is thread-safe). The cache's
// fenced batches move on: the closed batch's fence is asked (at most once per kTcQueryGapNs, a
// query costs ~0.3 us on an H200) and once complete its blocks become free for any stream; the
// open batch is closed (its fence recorded) when the closed slot is empty and the batch is full
// or older than the pool's batch window. True if blocks became free.
bool DevicePool::Impl::tc_service(ThreadCache& tc) {
  bool freed = false;
  const std::int64_t now = clock_ns();
  if (tc.fence != 0 && now - tc.last_query >= kTcQueryGapNs &&
      tc.nfree + tc.nclosed <= ThreadCache::kMaxFree + ThreadCache::kMaxPend) {
    tc.last_query = now;
    if (fences.query(tc.fence)) {
      fences.release(tc.fence);
      tc.fence = 0;
      for (int i = 0; i < tc.nclosed; ++i) {
        TcEntry e = tc.closed[i];
        count_fence_done(tc.delta, e);
        e.any_stream = true;
        e.requested = 0;
        tc.free_[tc.nfree++] = e;
        tc.free_bytes += e.size;
      }
      freed = tc.nclosed > 0;
      tc.nclosed = 0;
      tc.dirty.store(true, std::memory_order_relaxed);
    }
  }
  if (tc.fence == 0 && tc.npend > 0 &&
      (tc.npend == ThreadCache::kMaxPend || now - tc.pend_since >= detail::FenceBatches::kBatchWindowNs)) {
    tc.fence = fences.record_device();
    tc.delta.fence_recorded();
    tc.dirty.store(true, std::memory_order_relaxed);
    for (int i = 0; i < tc.npend; ++i) tc.closed[i] = tc.pend[i];
    tc.nclosed = tc.npend;
    tc.npend = 0;
    tc.last_query = now - kTcQueryGapNs;  // the next miss may ask at once: an idle GPU is done already
    tc.closed_since = now;
  }
  return freed;
}

AllocResult DevicePool::allocate(std::size_t size, StreamId stream) {
  if (size == 0) return {};
  if (size > kMaxRequestSize) return {nullptr, AllocStatus::invalid_size};
  Impl& I = *impl_;
  const std::size_t rounded = round_size(size, I.opt);
  ThreadCache* tc = I.tc_find();
  bool slot_busy = false;
  if (tc != nullptr) {
    Impl::Guard g(tc->mu);
    auto no_evict = [](std::uintptr_t) { return false; };
    if (std::uintptr_t p = tc_take(*tc, rounded, size, stream, no_evict, &slot_busy))
      return {reinterpret_cast<void*>(p), AllocStatus::ok};
    if ((tc->npend | tc->nclosed) != 0 && I.tc_service(*tc)) {
      if (std::uintptr_t p = tc_take(*tc, rounded, size, stream, no_evict, &slot_busy))
        return {reinterpret_cast<void*>(p), AllocStatus::ok};
    }
  }
  Impl::Lock lk(I.mu);
  if (tc != nullptr && (slot_busy || tc->dirty.load(std::memory_order_relaxed))) {
    Impl::Guard g(tc->mu);
    I.tc_merge(*tc);  // this thread's cached operations come first (program order)
    if (slot_busy) {  // a cached block fits but its lent slot is taken: make room now
      // Runs inside tc_take, which knows nothing of the pool lock: both locks are held here.
      auto evict = [&](std::uintptr_t near) NO_THREAD_SAFETY_ANALYSIS {
        I.tc_return_lent(*tc, tc->lent_any(near));
        return true;
      };
      if (std::uintptr_t p = tc_take(*tc, rounded, size, stream, evict, &slot_busy)) {
        I.tc_merge(*tc);
        return {reinterpret_cast<void*>(p), AllocStatus::ok};
      }
    }
  }
  if (!I.multi_threaded) I.note_thread();
  if (!I.retired.empty()) I.retired.erase(stream);
  if (I.has_fence_work()) I.service_fences();
  Impl::Fit fit = I.find_fit(rounded, stream);
  AllocResult r;
  Impl::Block* b;
  if (fit) {
    b = I.take(fit, rounded, size, stream);
    I.ledger.cache_hit();
    I.emit(EventKind::allocate, b->ptr, b->size, size, stream);
    r = {reinterpret_cast<void*>(b->ptr), AllocStatus::ok};
  } else {
    r = I.allocate_slow(lk, size, rounded, stream);
    if (r.status != AllocStatus::ok) return r;
    b = I.live.find(reinterpret_cast<std::uintptr_t>(r.ptr));
  }
  // Lend it through this thread's cache when its free could be stream-local: then the free and
  // the next allocation of the same size on the same stream skip the pool lock.
  if ((I.opt.free_sync != FreeSync::device || (tc != nullptr && tc->async_seen)) && I.tc_may_cache(b)) {
    if (tc == nullptr) tc = I.tc_create();
    Impl::Guard g(tc->mu);
    if (tc->wants_checkout())
      I.tc_checkout(*tc, b, rounded);
    else if (tc->nfree != 0)
      I.tc_flush(*tc);  // the cache does not hit: its parked blocks are better off in the pool
  }
  return r;
}

FreeStatus DevicePool::free(void* ptr) {
  Impl& I = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  ThreadCache* tc = I.tc_find();
  if (tc != nullptr && I.opt.free_sync == FreeSync::immediate) {
    Impl::Guard g(tc->mu);
    if (tc_put(*tc, p, 0, true)) return FreeStatus::ok;
  } else if (tc != nullptr && (I.opt.free_sync == FreeSync::fenced || I.opt.free_sync == FreeSync::gpu_wait)) {
    Impl::Guard g(tc->mu);
    if (tc_put_pending(*tc, p)) {
      if (tc->npend == 1)
        tc->pend_since = Impl::clock_ns();  // the cache's batch opens: its window starts
      else if (tc->npend == ThreadCache::kMaxPend)
        I.tc_service(*tc);  // full: recorded now unless the previous batch still waits
      return FreeStatus::ok;
    }
  }
  Impl::Lock lk(I.mu);
  if (tc != nullptr) I.tc_merge_own();
  Impl::Block* b = p != 0 ? I.live.take(p) : nullptr;
  if (b == nullptr && p != 0 && !I.tcaches.empty() && I.tc_reclaim_lent(p)) b = I.live.take(p);
  if (b == nullptr) return I.diagnose_bad_free(p);
  I.unallocate(b);
  I.emit(EventKind::free, b->ptr, b->size, b->requested, b->owner);
  if (I.opt.free_sync == FreeSync::immediate && (I.retired.empty() || I.retired.count(b->owner) == 0)) {
    I.make_local(b, b->owner);
  } else {
    // cudaFree meaning: nobody may reuse it before a device fence recorded after this point.
    // The fence is recorded once for the whole batch, when its window closes (add_pending).
    b->state = BState::pending;
    I.add_pending(b);
  }
  return FreeStatus::ok;
}

FreeStatus DevicePool::free_on_stream(void* ptr, StreamId stream) {
  Impl& I = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  ThreadCache* tc = I.tc_find();
  if (tc != nullptr) {
    Impl::Guard g(tc->mu);
    if (tc_put(*tc, p, stream, false)) return FreeStatus::ok;
  }
  Impl::Lock lk(I.mu);
  if (tc != nullptr) I.tc_merge_own();
  Impl::Block* b = p != 0 ? I.live.take(p) : nullptr;
  if (b == nullptr && p != 0 && !I.tcaches.empty() && I.tc_reclaim_lent(p)) b = I.live.take(p);
  if (b == nullptr) return I.diagnose_bad_free(p);
  I.unallocate(b);
  I.emit(EventKind::free, b->ptr, b->size, b->requested, stream, 0, true);
  if (!I.retired.empty()) I.retired.erase(stream);
  I.make_local(b, stream);
  if (!I.multi_threaded) I.note_thread();
  if (I.caches_on()) {
    // This thread frees on streams: later allocations may be lent through its cache.
    if (tc == nullptr) tc = I.tc_create();
    Impl::Guard g(tc->mu);
    tc->async_seen = true;
  }
  return FreeStatus::ok;
}

}  // namespace cudapool
