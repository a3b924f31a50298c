// The hot path: allocate() when a cached block fits, free()/free_on_stream() of a live block.
// One short-critical-section lock (spin_lock.h), one hash lookup, a couple of O(log n) set operations on small sets, no malloc.
// Everything else (misses, fences, OOM, GC, bad frees) lives in the other pool_*.cpp files.
#include <algorithm>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;

DevicePool::Impl::Impl(int dev, const PoolOptions& options, Upstream& upstream, FenceProvider& fence_provider,
                       EventSink* event_sink)
    : device(dev), opt(options), up(upstream), fences(fence_provider), events{dev, event_sink} {}

DevicePool::DevicePool(int device, const PoolOptions& options, Upstream& upstream, FenceProvider& fences,
                       EventSink* sink)
    : impl_(std::make_unique<Impl>(device, options, upstream, fences, sink)) {}

DevicePool::~DevicePool() = default;

namespace {

using detail::CachedBlock;
using detail::ThreadBlockCache;

// A free cached entry is lent (+1): the pool's take() of it, or a lent entry is freed
// stream-locally (-1): the pool's unallocate() and make_local(), in the ledger's terms.
void count_lent(detail::StatsDelta& d, const CachedBlock& e, int sign) {
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
void count_pend(detail::StatsDelta& d, const CachedBlock& e) {
  d.block_unallocated(e.small, e.size);
  d.pending_added(e.size);
}

// A fenced entry's fence completed: inactive now (the rest of count_lent(-1)).
void count_fence_done(detail::StatsDelta& d, const CachedBlock& e) {
  d.block_deactivated(e.small, e.size, e.requested);
  if (e.split) d.inactive_split_changed(e.small, e.size, +1);
  d.pending_removed(e.size);
}

// Under cache.mu: a free cached block for exactly (stream, rounded) becomes lent. 0 = none.
// `evict(ptr)` makes room in a full lent table; it can only when the pool lock is held.
// *slot_busy: an entry matched but the lent table was full (the locked path can evict).
template <class Evict>
std::uintptr_t tc_take(ThreadBlockCache& cache, std::size_t rounded, std::size_t requested, StreamId stream,
                       Evict evict, bool* slot_busy) {
  for (int i = cache.nfree - 1; i >= 0; --i) {  // newest first: the warmest block
    if (cache.free_[i].rounded != rounded || (cache.free_[i].stream != stream && !cache.free_[i].any_stream)) continue;
    if (cache.nlent >= ThreadBlockCache::kMaxLent && !evict(cache.free_[i].ptr)) {
      *slot_busy = true;
      return 0;
    }
    CachedBlock e = cache.free_[i];
    cache.free_[i] = cache.free_[--cache.nfree];
    cache.free_bytes -= e.size;
    e.requested = requested;
    e.stream = stream;  // lent: the allocation stream
    e.any_stream = false;
    cache.lent_insert(e);
    count_lent(cache.delta, e, +1);
    cache.delta.cache_hit();
    cache.dirty.store(true, std::memory_order_relaxed);
    cache.credit = std::min(cache.credit + ThreadBlockCache::kHitCredit, ThreadBlockCache::kMaxCredit);
    return e.ptr;
  }
  return 0;
}

// Under cache.mu: the block lent at p becomes free in the cache, local to `stream` (or to its
// allocation stream when use_owner). False: not lent by this cache, or no room.
bool tc_put(ThreadBlockCache& cache, std::uintptr_t p, StreamId stream, bool use_owner) {
  const int i = cache.lent_find(p);
  if (i < 0) return false;
  if (cache.nfree >= ThreadBlockCache::kMaxFree ||
      cache.free_bytes + cache.lent[i].size > ThreadBlockCache::kMaxFreeBytes)
    return false;
  CachedBlock e = cache.lent[i];
  cache.lent_erase(i);
  count_lent(cache.delta, e, -1);
  cache.dirty.store(true, std::memory_order_relaxed);
  if (!use_owner) e.stream = stream;
  e.requested = 0;
  cache.free_[cache.nfree++] = e;
  cache.free_bytes += e.size;
  return true;
}

// Under cache.mu: a fenced free(p) of the block lent at p joins the cache's open batch. False: not
// lent by this cache, or the open batch is full (its fence waits for the closed one's).
bool tc_put_pending(ThreadBlockCache& cache, std::uintptr_t p) {
  if (cache.npend == ThreadBlockCache::kMaxPend) return false;
  const int i = cache.lent_find(p);
  if (i < 0) return false;
  CachedBlock e = cache.lent[i];
  cache.lent_erase(i);
  count_pend(cache.delta, e);
  cache.dirty.store(true, std::memory_order_relaxed);
  cache.pend[cache.npend++] = e;
  return true;
}

}  // namespace

// Under cache.mu only (fence calls need no pool lock: FenceProvider is thread-safe). The cache's
// fenced batches move on: the closed batch's fence is asked (at most once per kTcQueryGapNs, a
// query costs ~0.3 us on an H200) and once complete its blocks become free for any stream; the
// open batch is closed (its fence recorded) when the closed slot is empty and the batch is full
// or older than the pool's batch window. True if blocks became free.
bool DevicePool::Impl::tc_service(ThreadBlockCache& cache) {
  bool freed = false;
  const std::int64_t now = detail::Reclaim::clock_ns();
  if (cache.fence != 0 && now - cache.last_query >= kTcQueryGapNs &&
      cache.nfree + cache.nclosed <= ThreadBlockCache::kMaxFree + ThreadBlockCache::kMaxPend) {
    cache.last_query = now;
    if (fences.query(cache.fence)) {
      fences.release(cache.fence);
      cache.fence = 0;
      for (int i = 0; i < cache.nclosed; ++i) {
        CachedBlock e = cache.closed[i];
        count_fence_done(cache.delta, e);
        e.any_stream = true;
        e.requested = 0;
        cache.free_[cache.nfree++] = e;
        cache.free_bytes += e.size;
      }
      freed = cache.nclosed > 0;
      cache.nclosed = 0;
      cache.dirty.store(true, std::memory_order_relaxed);
    }
  }
  if (cache.fence == 0 && cache.npend > 0 &&
      (cache.npend == ThreadBlockCache::kMaxPend || now - cache.pend_since >= detail::FenceBatches::kBatchWindowNs)) {
    cache.fence = fences.record_device();
    cache.delta.fence_recorded();
    cache.dirty.store(true, std::memory_order_relaxed);
    for (int i = 0; i < cache.npend; ++i) cache.closed[i] = cache.pend[i];
    cache.nclosed = cache.npend;
    cache.npend = 0;
    cache.last_query = now - kTcQueryGapNs;  // the next miss may ask at once: an idle GPU is done already
    cache.closed_since = now;
  }
  return freed;
}

AllocResult DevicePool::allocate(std::size_t size, StreamId stream) {
  if (size == 0) return {};
  if (size > kMaxRequestSize) return {nullptr, AllocStatus::invalid_size};
  Impl& pool = *impl_;
  const std::size_t rounded = round_size(size, pool.opt);
  ThreadBlockCache* cache = pool.tc_find();
  bool slot_busy = false;
  if (cache != nullptr) {
    Impl::Guard g(cache->mu);
    auto no_evict = [](std::uintptr_t) { return false; };
    if (std::uintptr_t p = tc_take(*cache, rounded, size, stream, no_evict, &slot_busy))
      return {reinterpret_cast<void*>(p), AllocStatus::ok};
    if ((cache->npend | cache->nclosed) != 0 && pool.tc_service(*cache)) {
      if (std::uintptr_t p = tc_take(*cache, rounded, size, stream, no_evict, &slot_busy))
        return {reinterpret_cast<void*>(p), AllocStatus::ok};
    }
  }
  Impl::Lock lk(pool.mu);
  if (cache != nullptr && (slot_busy || cache->dirty.load(std::memory_order_relaxed))) {
    Impl::Guard g(cache->mu);
    pool.tc_merge(*cache);  // this thread's cached operations come first (program order)
    if (slot_busy) {        // a cached block fits but its lent slot is taken: make room now
      // Runs inside tc_take, which knows nothing of the pool lock: both locks are held here.
      auto evict = [&](std::uintptr_t near) NO_THREAD_SAFETY_ANALYSIS {
        pool.tc_return_lent(*cache, cache->lent_any(near));
        return true;
      };
      if (std::uintptr_t p = tc_take(*cache, rounded, size, stream, evict, &slot_busy)) {
        pool.tc_merge(*cache);
        return {reinterpret_cast<void*>(p), AllocStatus::ok};
      }
    }
  }
  if (!pool.multi_threaded) pool.note_thread();
  if (!pool.store.retired.empty()) pool.store.retired.erase(stream);
  if (pool.has_fence_work()) pool.reclaim.service_fences();
  Impl::Fit fit = pool.store.find_fit(rounded, stream);
  AllocResult r;
  Impl::Block* b;
  if (fit) {
    b = pool.store.take(fit, rounded, size, stream);
    pool.ledger.cache_hit();
    pool.events.emit(EventKind::allocate, b->ptr, b->size, size, stream);
    r = {reinterpret_cast<void*>(b->ptr), AllocStatus::ok};
  } else {
    r = pool.allocate_slow(lk, size, rounded, stream);
    if (r.status != AllocStatus::ok) return r;
    b = pool.store.live.find(reinterpret_cast<std::uintptr_t>(r.ptr));
  }
  // Lend it through this thread's cache when its free could be stream-local: then the free and
  // the next allocation of the same size on the same stream skip the pool lock.
  if ((pool.opt.free_sync != FreeSync::device || (cache != nullptr && cache->async_seen)) && pool.tc_may_cache(b)) {
    if (cache == nullptr) cache = pool.tc_create();
    Impl::Guard g(cache->mu);
    if (cache->wants_checkout())
      pool.tc_checkout(*cache, b, rounded);
    else if (cache->nfree != 0)
      pool.tc_flush(*cache);  // the cache does not hit: its parked blocks are better off in the pool
  }
  return r;
}

FreeStatus DevicePool::free(void* ptr) {
  Impl& pool = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  ThreadBlockCache* cache = pool.tc_find();
  if (cache != nullptr && pool.opt.free_sync == FreeSync::immediate) {
    Impl::Guard g(cache->mu);
    if (tc_put(*cache, p, 0, true)) return FreeStatus::ok;
  } else if (cache != nullptr && (pool.opt.free_sync == FreeSync::fenced || pool.opt.free_sync == FreeSync::gpu_wait)) {
    Impl::Guard g(cache->mu);
    if (tc_put_pending(*cache, p)) {
      if (cache->npend == 1)
        cache->pend_since = detail::Reclaim::clock_ns();  // the cache's batch opens: its window starts
      else if (cache->npend == ThreadBlockCache::kMaxPend)
        pool.tc_service(*cache);  // full: recorded now unless the previous batch still waits
      return FreeStatus::ok;
    }
  }
  Impl::Lock lk(pool.mu);
  if (cache != nullptr) pool.tc_merge_own();
  Impl::Block* b = p != 0 ? pool.store.live.take(p) : nullptr;
  if (b == nullptr && p != 0 && !pool.tcaches.empty() && pool.tc_reclaim_lent(p)) b = pool.store.live.take(p);
  if (b == nullptr) return pool.store.diagnose_bad_free(p);
  pool.store.unallocate(b);
  pool.events.emit(EventKind::free, b->ptr, b->size, b->requested, b->owner);
  if (pool.opt.free_sync == FreeSync::immediate &&
      (pool.store.retired.empty() || pool.store.retired.count(b->owner) == 0)) {
    pool.store.make_local(b, b->owner);
  } else {
    // cudaFree meaning: nobody may reuse it before a device fence recorded after this point.
    // The fence is recorded once for the whole batch, when its window closes (add_pending).
    b->state = BState::pending;
    pool.reclaim.add_pending(b);
  }
  return FreeStatus::ok;
}

FreeStatus DevicePool::free_on_stream(void* ptr, StreamId stream) {
  Impl& pool = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  ThreadBlockCache* cache = pool.tc_find();
  if (cache != nullptr) {
    Impl::Guard g(cache->mu);
    if (tc_put(*cache, p, stream, false)) return FreeStatus::ok;
  }
  Impl::Lock lk(pool.mu);
  if (cache != nullptr) pool.tc_merge_own();
  Impl::Block* b = p != 0 ? pool.store.live.take(p) : nullptr;
  if (b == nullptr && p != 0 && !pool.tcaches.empty() && pool.tc_reclaim_lent(p)) b = pool.store.live.take(p);
  if (b == nullptr) return pool.store.diagnose_bad_free(p);
  pool.store.unallocate(b);
  pool.events.emit(EventKind::free, b->ptr, b->size, b->requested, stream, 0, true);
  if (!pool.store.retired.empty()) pool.store.retired.erase(stream);
  pool.store.make_local(b, stream);
  if (!pool.multi_threaded) pool.note_thread();
  if (pool.caches_on()) {
    // This thread frees on streams: later allocations may be lent through its cache.
    if (cache == nullptr) cache = pool.tc_create();
    Impl::Guard g(cache->mu);
    cache->async_seen = true;
  }
  return FreeStatus::ok;
}

}  // namespace cudapool
