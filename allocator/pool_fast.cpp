// The hot path: allocate() when a cached block fits, free()/free_on_stream() of a live block.
// One short-critical-section lock (spin_lock.h), one hash lookup, a couple of O(log n) set operations on small sets, no malloc.
// Everything else (misses, fences, OOM, GC, bad frees) lives in the other pool_*.cpp files.
#include <algorithm>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;
using detail::ThreadBlockCache;

DevicePool::Impl::Impl(int dev, const PoolOptions& options, Upstream& upstream, FenceProvider& fence_provider,
                       EventSink* event_sink)
    : device(dev), opt(options), up(upstream), fences(fence_provider), events{dev, event_sink} {}

DevicePool::DevicePool(int device, const PoolOptions& options, Upstream& upstream, FenceProvider& fences,
                       EventSink* sink)
    : impl_(std::make_unique<Impl>(device, options, upstream, fences, sink)) {}

DevicePool::~DevicePool() = default;

AllocResult DevicePool::allocate(std::size_t size, StreamId stream) {
  if (size == 0) return {};
  if (size > kMaxRequestSize) return {nullptr, AllocStatus::invalid_size};
  Impl& pool = *impl_;
  const std::size_t rounded = round_size(size, pool.opt);
  ThreadBlockCache* cache = detail::ThreadCaches::find(pool.uid);
  bool slot_busy = false;
  if (cache != nullptr) {
    Impl::Guard g(cache->mu);
    auto no_evict = [](std::uintptr_t) { return false; };
    if (std::uintptr_t p = cache->take(rounded, size, stream, no_evict, &slot_busy))
      return {reinterpret_cast<void*>(p), AllocStatus::ok};
    if ((cache->npend | cache->nclosed) != 0 && cache->service(pool.fences)) {
      if (std::uintptr_t p = cache->take(rounded, size, stream, no_evict, &slot_busy))
        return {reinterpret_cast<void*>(p), AllocStatus::ok};
    }
  }
  Impl::Lock lk(pool.mu);
  if (cache != nullptr && (slot_busy || cache->dirty.load(std::memory_order_relaxed))) {
    Impl::Guard g(cache->mu);
    pool.caches.merge(*cache);  // this thread's cached operations come first (program order)
    if (slot_busy) {            // a cached block fits but its lent slot is taken: make room now
      // Runs inside take(), which knows nothing of the pool lock: both locks are held here.
      auto evict = [&](std::uintptr_t near) NO_THREAD_SAFETY_ANALYSIS {
        pool.caches.return_lent(*cache, cache->lent_any(near));
        return true;
      };
      if (std::uintptr_t p = cache->take(rounded, size, stream, evict, &slot_busy)) {
        pool.caches.merge(*cache);
        return {reinterpret_cast<void*>(p), AllocStatus::ok};
      }
    }
  }
  if (!pool.caches.multi_threaded()) pool.caches.note_thread();
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
  if ((pool.opt.free_sync != FreeSync::device || (cache != nullptr && cache->async_seen)) && pool.caches.may_cache(b)) {
    if (cache == nullptr) cache = pool.caches.create();
    Impl::Guard g(cache->mu);
    if (cache->wants_checkout())
      pool.caches.checkout(*cache, b, rounded);
    else if (cache->nfree != 0)
      pool.caches.flush(*cache);  // the cache does not hit: its parked blocks are better off in the pool
  }
  return r;
}

FreeStatus DevicePool::free(void* ptr) {
  Impl& pool = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  ThreadBlockCache* cache = detail::ThreadCaches::find(pool.uid);
  if (cache != nullptr && pool.opt.free_sync == FreeSync::immediate) {
    Impl::Guard g(cache->mu);
    if (cache->put(p, 0, true)) return FreeStatus::ok;
  } else if (cache != nullptr && (pool.opt.free_sync == FreeSync::fenced || pool.opt.free_sync == FreeSync::gpu_wait)) {
    Impl::Guard g(cache->mu);
    if (cache->put_pending(p)) {
      if (cache->npend == 1)
        cache->pend_since = detail::Reclaim::clock_ns();  // the cache's batch opens: its window starts
      else if (cache->npend == ThreadBlockCache::kMaxPend)
        cache->service(pool.fences);  // full: recorded now unless the previous batch still waits
      return FreeStatus::ok;
    }
  }
  Impl::Lock lk(pool.mu);
  if (cache != nullptr) pool.caches.merge_own();
  Impl::Block* b = p != 0 ? pool.store.live.take(p) : nullptr;
  if (b == nullptr && p != 0 && !pool.caches.empty() && pool.caches.reclaim_lent(p)) b = pool.store.live.take(p);
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
  ThreadBlockCache* cache = detail::ThreadCaches::find(pool.uid);
  if (cache != nullptr) {
    Impl::Guard g(cache->mu);
    if (cache->put(p, stream, false)) return FreeStatus::ok;
  }
  Impl::Lock lk(pool.mu);
  if (cache != nullptr) pool.caches.merge_own();
  Impl::Block* b = p != 0 ? pool.store.live.take(p) : nullptr;
  if (b == nullptr && p != 0 && !pool.caches.empty() && pool.caches.reclaim_lent(p)) b = pool.store.live.take(p);
  if (b == nullptr) return pool.store.diagnose_bad_free(p);
  pool.store.unallocate(b);
  pool.events.emit(EventKind::free, b->ptr, b->size, b->requested, stream, 0, true);
  if (!pool.store.retired.empty()) pool.store.retired.erase(stream);
  pool.store.make_local(b, stream);
  if (!pool.caches.multi_threaded()) pool.caches.note_thread();
  if (pool.caches.on()) {
    // This thread frees on streams: later allocations may be lent through its cache.
    if (cache == nullptr) cache = pool.caches.create();
    Impl::Guard g(cache->mu);
    cache->async_seen = true;
  }
  return FreeStatus::ok;
}

}  // namespace cudapool
