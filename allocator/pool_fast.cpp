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
             FreeSet(detail::BySizeAddr{}, detail::ArenaAllocator<Block*>(&arena))} {
  open = batch_pool.get();
  promo_list.reserve(16);
  st.max_split_size = opt.max_split_size == kNoLimit ? 0 : static_cast<std::int64_t>(opt.max_split_size);
}

DevicePool::DevicePool(int device, const PoolOptions& options, Upstream& upstream, FenceProvider& fences,
                       EventSink* sink)
    : impl_(std::make_unique<Impl>(device, options, upstream, fences, sink)) {}

DevicePool::~DevicePool() = default;

namespace {

using detail::TcEntry;
using detail::ThreadCache;

void count_lent(detail::TcDelta& d, const TcEntry& e, std::int64_t sign) {
  const StatPool p = detail::stat_pool(e.small);
  const auto sz = sign * static_cast<std::int64_t>(e.size);
  detail::bump(d.allocation, p, sign);
  detail::bump(d.allocated_bytes, p, sz);
  detail::bump(d.active, p, sign);
  detail::bump(d.active_bytes, p, sz);
  detail::bump(d.requested_bytes, p, sign * static_cast<std::int64_t>(e.requested));
  if (e.split) {
    detail::bump(d.inactive_split, p, -sign);
    detail::bump(d.inactive_split_bytes, p, -sz);
  }
}

// Under tc.mu: a free cached block for exactly (stream, rounded) becomes lent. 0 = none.
// `evict(slot)` makes room in the lent table; it can only when the pool lock is held.
// *slot_busy: an entry matched but its lent slot was taken (the locked path can evict).
template <class Evict>
std::uintptr_t tc_take(ThreadCache& tc, std::size_t rounded, std::size_t requested, StreamId stream, Evict evict,
                       bool* slot_busy) {
  for (int i = tc.nfree - 1; i >= 0; --i) {  // newest first: the warmest block
    if (tc.free_[i].rounded != rounded || tc.free_[i].stream != stream) continue;
    const int slot = ThreadCache::slot_of(tc.free_[i].ptr);
    if (tc.lent[slot].ptr != 0 && !evict(slot)) {
      *slot_busy = true;
      return 0;
    }
    TcEntry e = tc.free_[i];
    tc.free_[i] = tc.free_[--tc.nfree];
    tc.free_bytes -= e.size;
    e.requested = requested;
    tc.lent[slot] = e;
    ++tc.nlent;
    count_lent(tc.delta, e, +1);
    ++tc.delta.cache_hits;
    tc.dirty.store(true, std::memory_order_relaxed);
    tc.credit = std::min(tc.credit + ThreadCache::kHitCredit, ThreadCache::kMaxCredit);
    return e.ptr;
  }
  return 0;
}

// Under tc.mu: the block lent at p becomes free in the cache, local to `stream` (or to its
// allocation stream when use_owner). False: not lent by this cache, or no room.
bool tc_put(ThreadCache& tc, std::uintptr_t p, StreamId stream, bool use_owner) {
  TcEntry& slot = tc.lent[ThreadCache::slot_of(p)];
  if (slot.ptr != p || p == 0) return false;
  if (tc.nfree == ThreadCache::kMaxFree || tc.free_bytes + slot.size > ThreadCache::kMaxFreeBytes) return false;
  TcEntry e = slot;
  slot = TcEntry{};
  --tc.nlent;
  count_lent(tc.delta, e, -1);
  tc.dirty.store(true, std::memory_order_relaxed);
  if (!use_owner) e.stream = stream;
  e.requested = 0;
  tc.free_[tc.nfree++] = e;
  tc.free_bytes += e.size;
  return true;
}

}  // namespace

AllocResult DevicePool::allocate(std::size_t size, StreamId stream) {
  if (size == 0) return {};
  if (size > kMaxRequestSize) return {nullptr, AllocStatus::invalid_size};
  Impl& I = *impl_;
  const std::size_t rounded = round_size(size, I.opt);
  ThreadCache* tc = I.tc_find();
  bool slot_busy = false;
  if (tc != nullptr) {
    Impl::Guard g(tc->mu);
    if (std::uintptr_t p = tc_take(*tc, rounded, size, stream, [](int) { return false; }, &slot_busy))
      return {reinterpret_cast<void*>(p), AllocStatus::ok};
  }
  Impl::Lock lk(I.mu);
  if (tc != nullptr && (slot_busy || tc->dirty.load(std::memory_order_relaxed))) {
    Impl::Guard g(tc->mu);
    I.tc_merge(*tc);  // this thread's cached operations come first (program order)
    if (slot_busy) {  // a cached block fits but its lent slot is taken: make room now
      auto evict = [&](int slot) {
        I.tc_return_lent(*tc, slot);
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
    ++I.st.cache_hits;
    I.emit(EventKind::allocate, b->ptr, b->size, size, stream);
    r = {reinterpret_cast<void*>(b->ptr), AllocStatus::ok};
  } else {
    r = I.allocate_slow(lk, size, rounded, stream);
    if (r.status != AllocStatus::ok) return r;
    b = I.live.find(reinterpret_cast<std::uintptr_t>(r.ptr));
  }
  // Lend it through this thread's cache when its free could be stream-local: then the free and
  // the next allocation of the same size on the same stream skip the pool lock.
  if ((I.opt.free_sync == FreeSync::immediate || (tc != nullptr && tc->async_seen)) && I.tc_may_cache(b)) {
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
  I.emit(EventKind::free, b->ptr, b->size, b->requested, stream);
  if (!I.retired.empty()) I.retired.erase(stream);
  I.make_local(b, stream);
  if (!I.multi_threaded) I.note_thread();
  if (I.multi_threaded && I.sink == nullptr) {
    // This thread frees on streams: later allocations may be lent through its cache.
    if (tc == nullptr) tc = I.tc_create();
    Impl::Guard g(tc->mu);
    tc->async_seen = true;
  }
  return FreeStatus::ok;
}

}  // namespace cudapool
