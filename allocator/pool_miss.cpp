// The miss path of allocate(): no cached block fits. In order (docs/design.md):
//   1. promote other streams' local blocks whose stream fence has completed (with expandable
//      ranges, this stream's own too); search again;
//   2. FreeSync::gpu_wait: pending free()d memory that could serve the request becomes free at
//      once, with every stream made to wait on the GPU for its fences; FreeSync::device: the host
//      waits for those fences instead; search again; fenced frees that idle threads left in
//      their caches join the open batch (tc_collect_fenced); search again;
//   3. garbage collection (garbage_collection_threshold; pool_release.cpp);
//   4. expandable ranges: grow (recycling free pages, maybe waiting for a fence, past the
//      high-water mark: pool_expandable.cpp); else / when full, a new segment from the upstream
//      (unless a limit says no: then no upstream call; limits.h);
//   5. on refusal (the releases are in pool_release.cpp): release oversize blocks (max_split_size) and retry; then wait for every
//      fence, search the pool AGAIN (PyTorch skips this), release every
//      unsplit free segment and retry; then out_of_memory.
// Any upstream error other than out-of-memory is returned at once.
#include <algorithm>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;
using detail::now_ns;

DevicePool::Impl::Block* DevicePool::Impl::serve(Fit fit, std::size_t rounded, std::size_t size, StreamId stream) {
  Block* b = take(fit, rounded, size, stream);
  emit(EventKind::allocate, b->ptr, b->size, size, stream);
  return b;
}

AllocResult DevicePool::Impl::allocate_slow(Lock& lk, std::size_t size, std::size_t rounded, StreamId stream) {
  const bool small = is_small(rounded);
  auto ok = [](Block* b) { return AllocResult{reinterpret_cast<void*>(b->ptr), AllocStatus::ok}; };
  ++slow_calls;

  // A miss closes the open batch at once: its blocks may be what this request needs.
  if (service_miss()) {
    if (Fit fit = find_fit(rounded, stream)) {
      ledger.cache_hit();
      return ok(serve(fit, rounded, size, stream));
    }
  }
  // Expandable ranges: keep one fence on this stream in flight, so that its own local blocks
  // become shared (and their pages recyclable) soon after they were freed.
  if (limits.granularity() != 0 && promote_own(stream, 0, false)) {
    if (Fit fit = find_fit(rounded, stream)) {
      ledger.cache_hit();
      return ok(serve(fit, rounded, size, stream));
    }
  }
  if (try_promote_for(rounded, stream)) {
    if (Fit fit = find_fit(rounded, stream)) {
      ledger.cache_hit();
      return ok(serve(fit, rounded, size, stream));
    }
  }
  // A GPU-side wait costs driver calls on every stream; a page of growth within the slack is
  // cheaper, and gives the pending blocks time to complete on their own.
  if (opt.free_sync == FreeSync::gpu_wait && !growth_within_slack(rounded, small) &&
      order_device_batches(rounded, small, false)) {
    if (Fit fit = find_fit(rounded, stream)) {
      ledger.cache_hit();
      return ok(serve(fit, rounded, size, stream));
    }
  }
  if (opt.free_sync == FreeSync::device && wait_device_batches()) {
    if (Fit fit = find_fit(rounded, stream)) {
      ledger.cache_hit();
      return ok(serve(fit, rounded, size, stream));
    }
  }
  // Before anything costlier: fenced frees left in the caches of threads that stopped allocating
  // (only their owner closes those batches) join the open batch, which is then closed and asked.
  // Not earlier: taking other threads' cache locks on every miss slowed busy threads down.
  if (!tcaches.empty() && tc_collect_fenced() &&
      (service_miss() || (opt.free_sync == FreeSync::gpu_wait && !growth_within_slack(rounded, small) &&
                          order_device_batches(rounded, small, false)))) {
    if (Fit fit = find_fit(rounded, stream)) {
      ledger.cache_hit();
      return ok(serve(fit, rounded, size, stream));
    }
  }
  if (opt.garbage_collection_threshold > 0.0) garbage_collect(lk);

  ledger.cache_miss();
  const std::size_t seg_size = segment_size_for(rounded);
  Block* fresh = nullptr;
  // Expandable segments first (map pages into the range); a classic segment when off or full.
  // Only the first attempt may wait for fences before growing (the OOM path below waits for all).
  bool first = true;
  auto grow = [&]() REQUIRES(mu) {
    limits.ensure(up, opt);
    const bool may_wait = first;
    first = false;
    if (limits.granularity() != 0) {
      UpstreamStatus us = grow_expandable(lk, rounded, small, stream, &fresh, may_wait);
      if (us != UpstreamStatus::ok || fresh != nullptr) return us;
    }
    return new_segment(lk, seg_size, small, stream, &fresh);
  };
  UpstreamStatus us = grow();

  // The fresh segment's block is taken directly, as PyTorch's alloc_block does: the oversize
  // rules are for reusing cached blocks (a 5 MiB request gets its 20 MiB segment even when
  // max_split_size is 20 MiB). We hold the lock again here, so nobody else has taken it.
  auto finish = [&]() REQUIRES(mu) -> AllocResult {
    FreeSet& set = set_of(fresh);
    return ok(serve(Fit{&set, set.find(fresh)}, rounded, size, stream));
  };
  if (us == UpstreamStatus::ok) return finish();
  if (us == UpstreamStatus::error) return AllocResult{nullptr, AllocStatus::upstream_error};

  // Refused (out of memory or over a limit). Step 1: oversize blocks.
  if (release_oversize(lk, rounded)) {
    us = grow();
    if (us == UpstreamStatus::ok) return finish();
    if (us == UpstreamStatus::error) return AllocResult{nullptr, AllocStatus::upstream_error};
  }
  // Step 2: everything that waits on a fence becomes shared, then look again before releasing.
  wait_all();
  if (Fit fit = find_fit(rounded, stream)) return ok(serve(fit, rounded, size, stream));
  release_cached(lk);
  ledger.alloc_retry();
  us = grow();
  if (us == UpstreamStatus::ok) return finish();
  if (us == UpstreamStatus::error) return AllocResult{nullptr, AllocStatus::upstream_error};
  // Step 3: give up.
  ledger.oom();
  emit(EventKind::allocate_failure, 0, size, size, stream);
  return AllocResult{nullptr, AllocStatus::out_of_memory};
}

DevicePool::Impl::Segment* DevicePool::Impl::add_segment(std::uintptr_t base, std::size_t size, bool small,
                                                         StreamId stream) {
  Segment* seg = segment_pool.get();
  seg->base = base;
  seg->size = size;
  seg->stream = stream;
  seg->small = small;
  Block* b = block_pool.get();
  b->ptr = base;
  b->size = size;
  b->seg = seg;
  seg->head = b;
  segments.emplace(base, seg);
  return seg;
}

UpstreamStatus DevicePool::Impl::new_segment(Lock& lk, std::size_t seg_size, bool small, StreamId stream, Block** out) {
  limits.ensure(up, opt);
  if (limits.refuses(ledger.reserved_bytes(), seg_size)) {
    // Over the cap: refuse without asking the upstream, like PyTorch's memory fraction.
    emit(EventKind::oom, 0, seg_size, seg_size, stream);
    return UpstreamStatus::out_of_memory;
  }
  void* base = nullptr;
  UpstreamStatus us;
  const std::int64_t t0 = now_ns();
  if (opt.release_lock_on_cudamalloc) {
    // The bytes stay counted against the limit while the lock is dropped, so two threads
    // cannot both squeeze under it.
    limits.hold(seg_size);
    {
      detail::SpinUnlock unlocked(mu, lk);
      us = up.allocate(seg_size, &base);
    }
    limits.unhold(seg_size);
  } else {
    us = up.allocate(seg_size, &base);
  }
  const std::int64_t dt = now_ns() - t0;
  ledger.upstream_time(dt);
  if (us != UpstreamStatus::ok) {
    if (us == UpstreamStatus::out_of_memory) emit(EventKind::oom, 0, seg_size, seg_size, stream, dt);
    return us;
  }
  Segment* seg = add_segment(reinterpret_cast<std::uintptr_t>(base), seg_size, small, stream);
  Block* b = seg->head;
  ledger.segment_added(small, seg_size);
  note_reserved();
  ledger.device_alloc();
  emit(EventKind::segment_alloc, seg->base, seg_size, seg_size, stream, dt);
  // Fresh memory has never been used by any stream: shared at once.
  insert_free(b, BState::shared, 0, shared[detail::kind_index(small)]);
  *out = b;
  return UpstreamStatus::ok;
}

}  // namespace cudapool
