// The hot path: allocate() when a cached block fits, free()/free_on_stream() of a live block.
// One short-critical-section lock (spin_lock.h), one hash lookup, a couple of O(log n) set operations on small sets, no malloc.
// Everything else (misses, fences, OOM, GC, bad frees) lives in the other pool_*.cpp files.
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

AllocResult DevicePool::allocate(std::size_t size, StreamId stream) {
  if (size == 0) return {};
  if (size > kMaxRequestSize) return {nullptr, AllocStatus::invalid_size};
  Impl& I = *impl_;
  const std::size_t rounded = round_size(size, I.opt);
  Impl::Lock lk(I.mu);
  if (!I.retired.empty()) I.retired.erase(stream);
  if (I.has_fence_work()) I.service_fences();
  Impl::Fit fit = I.find_fit(rounded, stream);
  if (!fit) return I.allocate_slow(lk, size, rounded, stream);
  Impl::Block* b = I.take(fit, rounded, size, stream);
  ++I.st.cache_hits;
  I.emit(EventKind::allocate, b->ptr, b->size, size, stream);
  return {reinterpret_cast<void*>(b->ptr), AllocStatus::ok};
}

FreeStatus DevicePool::free(void* ptr) {
  Impl& I = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Impl::Lock lk(I.mu);
  Impl::Block* b = p != 0 ? I.live.take(p) : nullptr;
  if (b == nullptr) return I.diagnose_bad_free(p);
  I.unallocate(b);
  I.emit(EventKind::free, b->ptr, b->size, b->requested, b->owner);
  if (I.opt.free_sync == FreeSync::immediate && (I.retired.empty() || I.retired.count(b->owner) == 0)) {
    I.make_local(b, b->owner);
  } else {
    // cudaFree meaning: nobody may reuse it before a device fence recorded after this point.
    // The fence is recorded once for the whole batch, by the next allocate().
    b->state = BState::pending;
    I.open->push(b);
    I.st.pending_bytes += static_cast<std::int64_t>(b->size);
  }
  return FreeStatus::ok;
}

FreeStatus DevicePool::free_on_stream(void* ptr, StreamId stream) {
  Impl& I = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Impl::Lock lk(I.mu);
  Impl::Block* b = p != 0 ? I.live.take(p) : nullptr;
  if (b == nullptr) return I.diagnose_bad_free(p);
  I.unallocate(b);
  I.emit(EventKind::free, b->ptr, b->size, b->requested, stream);
  if (!I.retired.empty()) I.retired.erase(stream);
  I.make_local(b, stream);
  return FreeStatus::ok;
}

}  // namespace cudapool
