// The slow path of allocate(): no cached block fits. In order (docs/design.md):
//   1. promote other streams' local blocks whose stream fence has completed (with expandable
//      ranges, this stream's own too); search again;
//   2. FreeSync::gpu_wait: pending free()d memory that could serve the request becomes free at
//      once, with every stream made to wait on the GPU for its fences; FreeSync::device: the host
//      waits for those fences instead; search again; fenced frees that idle threads left in
//      their caches join the open batch (tc_collect_fenced); search again;
//   3. garbage collection (garbage_collection_threshold);
//   4. expandable ranges: grow (recycling free pages, maybe waiting for a fence, past the
//      high-water mark: pool_expandable.cpp); else / when full, a new segment from the upstream
//      (unless a limit says no: then no upstream call);
//   5. on refusal: release oversize blocks (max_split_size) and retry; then wait for every
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
  if (granularity != 0 && promote_own(stream, 0, false)) {
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
  auto grow = [&]() {
    ensure_limits();
    const bool may_wait = first;
    first = false;
    if (granularity != 0) {
      UpstreamStatus us = grow_expandable(lk, rounded, small, stream, &fresh, may_wait);
      if (us != UpstreamStatus::ok || fresh != nullptr) return us;
    }
    return new_segment(lk, seg_size, small, stream, &fresh);
  };
  UpstreamStatus us = grow();

  // The fresh segment's block is taken directly, as PyTorch's alloc_block does: the oversize
  // rules are for reusing cached blocks (a 5 MiB request gets its 20 MiB segment even when
  // max_split_size is 20 MiB). We hold the lock again here, so nobody else has taken it.
  auto finish = [&]() -> AllocResult {
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

void DevicePool::Impl::ensure_limits() {
  if (limits_ready) return;
  const bool need_total = opt.per_process_memory_fraction > 0.0 || opt.garbage_collection_threshold > 0.0 ||
                          opt.expandable_segments;
  if (opt.expandable_segments) granularity = up.granularity();  // 0: the upstream cannot
  if (need_total) {
    std::size_t free_bytes = 0;
    up.mem_info(&free_bytes, &device_total);
  }
  limit = opt.max_reserved;
  if (opt.per_process_memory_fraction > 0.0) {
    const auto by_fraction = static_cast<std::size_t>(opt.per_process_memory_fraction * static_cast<double>(device_total));
    limit = std::min(limit, by_fraction);
  }
  limits_ready = true;
}

UpstreamStatus DevicePool::Impl::new_segment(Lock& lk, std::size_t seg_size, bool small, StreamId stream, Block** out) {
  ensure_limits();
  const std::size_t reserved = ledger.reserved_bytes();
  if (limit != kNoLimit && (seg_size > limit || reserved + inflight > limit - seg_size)) {
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
    inflight += seg_size;
    lk.unlock();
    us = up.allocate(seg_size, &base);
    lk.lock();
    inflight -= seg_size;
  } else {
    us = up.allocate(seg_size, &base);
  }
  const std::int64_t dt = now_ns() - t0;
  ledger.upstream_time(dt);
  if (us != UpstreamStatus::ok) {
    if (us == UpstreamStatus::out_of_memory) emit(EventKind::oom, 0, seg_size, seg_size, stream, dt);
    return us;
  }
  Segment* seg = segment_pool.get();
  seg->base = reinterpret_cast<std::uintptr_t>(base);
  seg->size = seg_size;
  seg->stream = stream;
  seg->small = small;
  Block* b = block_pool.get();
  b->ptr = seg->base;
  b->size = seg_size;
  b->seg = seg;
  seg->head = b;
  segments.emplace(seg->base, seg);
  ledger.segment_added(small, seg_size);
  note_reserved();
  ledger.device_alloc();
  emit(EventKind::segment_alloc, seg->base, seg_size, seg_size, stream, dt);
  // Fresh memory has never been used by any stream: shared at once.
  insert_free(b, BState::shared, 0, shared[detail::kind_index(small)]);
  *out = b;
  return UpstreamStatus::ok;
}

// b: a free shared block covering its whole segment. Removes both from every structure.
void DevicePool::Impl::detach_segment(Block* b, std::vector<Detached>& out) {
  Segment* seg = b->seg;
  shared[detail::kind_index(seg->small)].erase(b);
  segments.erase(seg->base);
  ledger.segment_removed(seg->small, seg->size);
  out.push_back(Detached{seg->base, seg->size});
  block_pool.put(b);
  segment_pool.put(seg);
}

std::size_t DevicePool::Impl::release_segments(Lock& lk, std::vector<Detached>& list) {
  std::size_t total = 0;
  for (const Detached& d : list) total += d.size;
  if (list.empty()) return 0;
  // Memory handed out under a GPU-side wait may belong to a block whose old work still runs;
  // the driver's unmap would pull the pages from under it. Rare: releases are the cold path.
  if (!ordered.empty()) settle_ordered();
  std::vector<std::int64_t> ns(list.size());
  bool unmaps = false;
  for (const Detached& d : list) unmaps |= d.unmap;
  auto run = [&] {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::int64_t t0 = now_ns();
      if (list[i].unmap)
        up.unmap(reinterpret_cast<void*>(list[i].base), list[i].size);
      else
        up.release(reinterpret_cast<void*>(list[i].base), list[i].size);
      ns[i] = now_ns() - t0;
    }
  };
  // Unmapped pages are already marked unmapped in the range: another thread could map them
  // again before our unmap ran, so page releases keep the lock.
  if (opt.release_lock_on_cudamalloc && !unmaps) {
    inflight += total;  // still "reserved" for the limit until the upstream has it back
    lk.unlock();
    run();
    lk.lock();
    inflight -= total;
  } else {
    run();
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    ledger.upstream_time(ns[i]);
    if (list[i].unmap) {
      ledger.device_unmap();
      emit(EventKind::segment_unmap, list[i].base, list[i].size, list[i].size, 0, ns[i]);
    } else {
      ledger.device_free();
      emit(EventKind::segment_free, list[i].base, list[i].size, list[i].size, 0, ns[i]);
    }
  }
  list.clear();
  return total;
}

// PyTorch's release_available_cached_blocks: with max_split_size set, free the smallest cached
// oversize block >= max(request, M); if there is none, free oversize blocks from the largest
// down until the request's size is covered. Only shared (fence-safe) whole-segment blocks.
bool DevicePool::Impl::release_oversize(Lock& lk, std::size_t rounded) {
  if (opt.max_split_size == kNoLimit) return false;
  FreeSet& set = shared[1];
  const std::size_t key_size = std::max(rounded, opt.max_split_size);
  std::vector<Detached> out;
  for (auto it = set.lower_bound(detail::BySizeAddr::Key{key_size, 0}); it != set.end(); ++it) {
    if (!(*it)->is_split() && !(*it)->seg->expandable) {
      detach_segment(*it, out);
      break;
    }
  }
  if (out.empty()) {
    std::vector<Block*> victims;
    std::size_t total = 0;
    for (auto it = set.rbegin(); it != set.rend() && total < key_size && (*it)->size >= opt.max_split_size; ++it) {
      if ((*it)->is_split() || (*it)->seg->expandable) continue;
      victims.push_back(*it);
      total += (*it)->size;
    }
    if (total < key_size) return false;  // PyTorch frees nothing then either
    for (Block* b : victims) detach_segment(b, out);
  }
  release_segments(lk, out);
  return true;
}

// Every free shared block that covers a whole segment goes back (both pool kinds), and every
// whole free page of an expandable range is unmapped.
std::size_t DevicePool::Impl::release_cached(Lock& lk) {
  std::vector<Block*> victims, paged;
  for (FreeSet& set : shared)
    for (Block* b : set) {
      if (b->seg->expandable) {
        if (releasable_pages(b) != 0) paged.push_back(b);
      } else if (!b->is_split()) {
        victims.push_back(b);
      }
    }
  std::vector<Detached> out;
  out.reserve(victims.size() + paged.size());
  for (Block* b : victims) detach_segment(b, out);
  for (Block* b : paged) release_pages(b, out);
  return release_segments(lk, out);
}

// PyTorch's garbage_collect_cached_blocks with its age rule. Where PyTorch is inert because no
// memory fraction is set, the threshold applies to the device's total memory instead.
std::size_t DevicePool::release_idle(std::size_t want) {
  Impl& I = *impl_;
  if (want == 0) return 0;
  Impl::Lock lk(I.mu);
  I.tc_flush_all();     // blocks parked in threads' caches count as idle too
  I.service_fences();   // fences that have passed, without waiting
  std::size_t got = I.release_idle_now(lk, want);
  if (got < want) {
    I.wait_all();
    got += I.release_idle_now(lk, want - got);
  }
  I.emit(EventKind::empty_cache, 0, got, 0, 0);
  return got;
}

std::size_t DevicePool::Impl::release_idle_now(Lock& lk, std::size_t want) {
  // Candidates: unsplit free segments, and free expandable blocks holding whole units; oldest
  // (longest since cached, in its pool kind's searches) first.
  std::vector<std::pair<std::uint64_t, Block*>> cands;
  for (int k = 0; k < 2; ++k)
    for (Block* b : shared[k])
      if (b->seg->expandable ? releasable_pages(b) != 0 : !b->is_split())
        cands.emplace_back(searches[k] - b->gc_base, b);
  std::stable_sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Detached> out;
  std::size_t planned = 0;
  for (const auto& [age, b] : cands) {
    if (planned >= want) break;
    if (!b->seg->expandable) {
      planned += b->size;
      detach_segment(b, out);
      continue;
    }
    // Whole units from the block's first one, until the rest of `want` is covered.
    const auto [lo, hi] = unit_span(b->seg, b->ptr, b->ptr + b->size);
    std::uintptr_t end = lo;
    for (auto it = b->seg->units.lower_bound(lo);
         it != b->seg->units.end() && it->first < hi && planned + (end - lo) < want; ++it)
      end = it->first + it->second;
    planned += end - lo;
    release_page_range(b, lo, end, out);
  }
  return release_segments(lk, out);
}

void DevicePool::Impl::garbage_collect(Lock& lk) {
  ensure_limits();
  const std::size_t allowed = limit != kNoLimit ? limit : device_total;
  const double threshold = opt.garbage_collection_threshold * static_cast<double>(allowed);
  const auto reserved = static_cast<double>(ledger.reserved_bytes());
  if (reserved <= threshold) return;
  const double target = reserved - threshold;

  // Whole free segments, and free blocks of the expandable range that hold whole pages.
  std::vector<Block*> candidates;
  auto gain = [&](const Block* b) { return b->seg->expandable ? releasable_pages(b) : b->size; };
  for (Block* b : shared[1])
    if (b->seg->expandable ? releasable_pages(b) != 0 : !b->is_split()) candidates.push_back(b);
  if (candidates.empty()) return;
  const std::uint64_t now = searches[1];
  double total_age = 0;
  for (Block* b : candidates) total_age += static_cast<double>(now - b->gc_base);
  std::size_t count = candidates.size();
  std::vector<bool> gone(candidates.size(), false);
  std::vector<Detached> out;
  double reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && count > 0) {
    const double avg_age = total_age / static_cast<double>(count);
    freed = false;
    // Free every block at least as old as the average, even past the target, so GC does not
    // run again on the very next miss (PyTorch's reasoning).
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (gone[i]) continue;
      const auto age = static_cast<double>(now - candidates[i]->gc_base);
      if (age < avg_age) continue;
      gone[i] = true;
      freed = true;
      reclaimed += static_cast<double>(gain(candidates[i]));
      total_age -= age;
      --count;
      if (candidates[i]->seg->expandable)
        release_pages(candidates[i], out);
      else
        detach_segment(candidates[i], out);
    }
  }
  const std::size_t bytes = release_segments(lk, out);
  ledger.gc_pass(bytes);
  emit(EventKind::gc, 0, bytes, 0, 0);
}

}  // namespace cudapool
