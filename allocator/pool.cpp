// The pool's front: every DevicePool call, each handed to the concept that holds its rule
// (pool_impl.h lists them). The hot path first: allocate() when a thread's cache or a cached
// block fits, free() / free_on_stream() of a live block: one short-critical-section lock
// (spin_lock.h), one hash lookup, a couple of O(log n) set operations on small sets, no malloc;
// with a thread cache hit, no pool lock at all. Misses are pool_miss.cpp's, giving memory back
// pool_release.cpp's.
#include <algorithm>
#include <sstream>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::ThreadBlockCache;

DevicePool::Impl::Impl(int dev, const PoolOptions& options, Upstream& upstream, FenceProvider& fence_provider,
                       EventSink* event_sink)
    : device(dev), opt(options), up(upstream), fences(fence_provider), events{dev, event_sink} {}

DevicePool::Impl::~Impl() {
  caches.detach_all();  // threads' caches forget this pool (their blocks go back with the segments)
  // Outstanding fences are handed back; every segment goes back to the upstream, live or not.
  reuse.release_all();
  ranges.unalias_remaining();
  for (auto& [base, seg] : store.segments()) {
    if (seg->expandable)
      ranges.destroy(seg);
    else
      up.release(reinterpret_cast<void*>(base), seg->size);
  }
}

DevicePool::DevicePool(int device, const PoolOptions& options, Upstream& upstream, FenceProvider& fences,
                       EventSink* sink)
    : impl_(std::make_unique<Impl>(device, options, upstream, fences, sink)) {}

DevicePool::~DevicePool() = default;

// After a locked allocation: lend the block through this thread's cache when its free could be
// stream-local; then the free and the next allocation of the same size on the same stream skip
// the pool lock.
inline void DevicePool::Impl::lend(ThreadBlockCache* cache, Block* b, std::size_t rounded) {
  if ((opt.free_sync != FreeSync::device || (cache != nullptr && cache->async_seen())) && caches.may_cache(b)) {
    if (cache == nullptr) cache = caches.create();
    detail::SpinGuard g(cache->mu);
    if (cache->wants_checkout())
      caches.checkout(*cache, b, rounded);
    else if (cache->has_free())
      caches.flush(*cache);  // the cache does not hit: its parked blocks are better off in the pool
  }
}

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
    if (cache->has_fenced() && detail::service_cache(*cache, pool.fences)) {
      if (std::uintptr_t p = cache->take(rounded, size, stream, no_evict, &slot_busy))
        return {reinterpret_cast<void*>(p), AllocStatus::ok};
    }
  }
  Impl::Lock lk(pool.mu);
  if (cache != nullptr && (slot_busy || cache->dirty())) {
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
  pool.store.unretire(stream);  // a retired handle in use again: a new stream (reuse.h, rule 6)
  if (pool.has_fence_work()) pool.reuse.service_fences();
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
    b = pool.store.find_live(reinterpret_cast<std::uintptr_t>(r.ptr));
  }
  pool.lend(cache, b, rounded);
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
    if (detail::cache_free_fenced(*cache, p, pool.fences)) return FreeStatus::ok;
  }
  Impl::Lock lk(pool.mu);
  if (cache != nullptr) pool.caches.merge_own();
  Impl::Block* b = pool.take_live(p);
  if (b == nullptr) return pool.store.diagnose_bad_free(p);
  pool.store.unallocate(b);
  pool.events.emit(EventKind::free, b->ptr, b->size, b->requested, b->owner);
  pool.reuse.free(b);  // local to its stream, or pending behind a device fence (reuse.h)
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
  Impl::Block* b = pool.take_live(p);
  if (b == nullptr) return pool.store.diagnose_bad_free(p);
  pool.store.unallocate(b);
  pool.events.emit(EventKind::free, b->ptr, b->size, b->requested, stream, 0, true);
  pool.store.unretire(stream);  // a retired handle in use again: a new stream (reuse.h, rule 6)
  pool.reuse.free_local(b, stream);
  if (!pool.caches.multi_threaded()) pool.caches.note_thread();
  if (pool.caches.on()) {
    // This thread frees on streams: later allocations may be lent through its cache.
    if (cache == nullptr) cache = pool.caches.create();
    Impl::Guard g(cache->mu);
    cache->note_async();
  }
  return FreeStatus::ok;
}

std::optional<AddressInfo> DevicePool::address_info(const void* ptr) const {
  Impl& pool = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Impl::Guard lock(pool.mu);
  if (pool.store.segment_containing(p) == nullptr) return std::nullopt;
  if (!pool.caches.empty() && pool.store.find_live(p) == nullptr)
    pool.caches.reclaim_lent(p);  // lent via a thread cache
  return pool.store.address_info(p);
}

bool DevicePool::owns(const void* ptr) const {
  Impl::Guard lock(impl_->mu);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Impl::Segment* seg = impl_->store.segment_containing(p);
  return seg != nullptr && (!seg->expandable || detail::block_at(seg, p)->mapped());
}

// Every view below first flushes the threads' caches (thread_caches.cpp): what it shows is then
// exact, and cached blocks count as free.
std::size_t DevicePool::cached_bytes() const {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  return impl_->ledger.reserved_bytes() - impl_->ledger.allocated_bytes();
}

Stats DevicePool::stats() const {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  return impl_->ledger.view();
}

void DevicePool::reset_peak_stats() {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  impl_->ledger.reset_peaks();
}

void DevicePool::reset_accumulated_stats() {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  impl_->ledger.reset_accumulated();
}

Snapshot DevicePool::snapshot() const {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  return impl_->store.snapshot(impl_->device);
}

const PoolOptions& DevicePool::options() const { return impl_->opt; }

int DevicePool::device() const { return impl_->device; }

void DevicePool::set_event_sink(EventSink* sink) {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();  // cached operations emit no events: none may continue under a new sink
  impl_->events.sink = sink;
}

// Forget every segment without calling the upstream or the fence provider: the context that
// owned them is gone, so both would only fail.
void DevicePool::Impl::forget_all() {
  store.forget_all();
  ranges.forget();
  reuse.forget_all();
  ledger.forget_all();
}

void DevicePool::retire_stream(StreamId stream) {
  Impl::Lock lk(impl_->mu);
  impl_->caches.flush_all();  // no cache may keep (or later cache) a block of the dying stream
  impl_->reuse.retire(stream);
}

void DevicePool::abandon() {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  impl_->forget_all();
}

std::string DevicePool::check_consistency() const {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  return impl_->check();
}

// Slow full walk; every structure must agree with every other one.
std::string DevicePool::Impl::check() const {
  detail::BlockStore::Tally tally(opt.max_split_size);
  if (std::string e = store.check(tally); !e.empty()) return e;
  auto listed = [&](const Block* b) REQUIRES(mu) { return ranges.drains(b); };
  if (!std::all_of(tally.draining.begin(), tally.draining.end(), listed))
    return "draining block missing from the draining list";
  if (reuse.pending_count() != tally.pending_blocks) return "pending blocks and the fence batches disagree";
  if (reuse.retiring_count() != tally.retiring_blocks) return "retiring blocks and the fence batches disagree";
  if (ranges.draining_count() != tally.draining.size()) return "draining list and draining blocks disagree";
  const Stats& st = ledger.view();
  if (tally.pending_bytes != st.pending_bytes) return "pending_bytes stat";
  const Stats& recount = tally.recount.view();
  std::ostringstream err;
  auto same = [&](const StatArray& a, const StatArray& b, const char* name) {
    for (std::size_t i = 0; i < kNumStatPools; ++i)
      if (a[i].current != b[i].current) {
        err << "stat " << name << "[" << i << "] is " << a[i].current << ", recount " << b[i].current;
        return false;
      }
    return true;
  };
  if (!same(st.allocation, recount.allocation, "allocation") || !same(st.segment, recount.segment, "segment") ||
      !same(st.active, recount.active, "active") ||
      !same(st.inactive_split, recount.inactive_split, "inactive_split") ||
      !same(st.allocated_bytes, recount.allocated_bytes, "allocated_bytes") ||
      !same(st.reserved_bytes, recount.reserved_bytes, "reserved_bytes") ||
      !same(st.active_bytes, recount.active_bytes, "active_bytes") ||
      !same(st.inactive_split_bytes, recount.inactive_split_bytes, "inactive_split_bytes") ||
      !same(st.requested_bytes, recount.requested_bytes, "requested_bytes"))
    return err.str();
  return "";
}

bool DevicePool::reserve_external(std::size_t bytes) {
  Impl& pool = *impl_;
  std::size_t excess = 0;
  {
    Impl::Guard lock(pool.mu);
    pool.limits.ensure(pool.up, pool.opt);
    if (pool.limits.limit() != kNoLimit && bytes > pool.limits.limit()) return false;  // larger than the limit itself
    excess = pool.limits.excess(pool.ledger.reserved_bytes(), bytes);
    if (excess == 0) {
      pool.limits.add_external(bytes);
      return true;
    }
  }
  // Room from the pool's own idle cache, as an allocation of the pool would make it.
  release_idle(excess);
  Impl::Guard lock(pool.mu);
  if (pool.limits.excess(pool.ledger.reserved_bytes(), bytes) != 0) return false;
  pool.limits.add_external(bytes);
  return true;
}

void DevicePool::unreserve_external(std::size_t bytes) {
  Impl::Guard lock(impl_->mu);
  impl_->limits.remove_external(bytes);
}

std::size_t DevicePool::external_bytes() const {
  Impl::Guard lock(impl_->mu);
  return impl_->limits.external();
}

std::size_t DevicePool::release_idle(std::size_t want) {
  Impl& pool = *impl_;
  if (want == 0) return 0;
  Impl::Lock lk(pool.mu);
  Impl::Request req;
  pool.make_room(lk, req, want, Impl::Room::idle, true);
  pool.events.emit(EventKind::empty_cache, 0, req.released, 0, 0);
  return req.released;
}

std::size_t DevicePool::empty_cache() {
  Impl& pool = *impl_;
  Impl::Lock lk(pool.mu);
  pool.caches.flush_all();  // blocks parked in threads' caches are reclaimable too
  pool.reuse.wait_all();
  const std::size_t bytes = pool.release_cached(lk);
  pool.ledger.empty_cache_call();
  pool.events.emit(EventKind::empty_cache, 0, bytes, 0, 0);
  return bytes;
}

}  // namespace cudapool
