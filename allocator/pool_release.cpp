// Giving cached memory back to the upstream: every path that releases segments or unmaps
// pages. Only shared free blocks go back (their fences have passed), and never while a
// GPU-side wait that handed some of them out may still run (settle_ordered first).
//  * garbage_collect: on a miss, when reserved memory is above garbage_collection_threshold
//    of the limit (or of the device), the oldest cached blocks go back (PyTorch's age rule);
//  * release_oversize, release_cached: the out-of-memory path (pool_miss.cpp) before its retries;
//  * release_idle_now: idle cached memory, the longest-cached first; make_room(idle)
//    (pool_miss.cpp) runs it for DevicePool::release_idle and empty_cache (pool.cpp), waiting
//    for every fence when what has passed already is not enough.
#include <algorithm>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::now_ns;

std::size_t DevicePool::Impl::release_segments(Lock& lk, std::vector<Detached>& list) {
  std::size_t total = 0;
  for (const Detached& d : list) total += d.size;
  if (list.empty()) return 0;
  // Memory handed out under a GPU-side wait may belong to a block whose old work still runs;
  // the driver's unmap would pull the pages from under it. Rare: releases are the cold path.
  if (reuse.has_ordered()) reuse.settle_ordered();
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
    limits.hold(total);  // still "reserved" for the limit until the upstream has it back
    {
      detail::SpinUnlock unlocked(mu, lk);
      run();
    }
    limits.unhold(total);
  } else {
    run();
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    ledger.upstream_time(ns[i]);
    if (list[i].unmap) {
      ledger.device_unmap();
      events.emit(EventKind::segment_unmap, list[i].base, list[i].size, list[i].size, 0, ns[i]);
    } else {
      ledger.device_free();
      events.emit(EventKind::segment_free, list[i].base, list[i].size, list[i].size, 0, ns[i]);
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
  FreeSet& set = store.shared_set(/*small=*/false);
  const std::size_t key_size = std::max(rounded, opt.max_split_size);
  std::vector<Detached> out;
  for (auto it = set.lower_bound(detail::BySizeAddr::Key{key_size, 0}); it != set.end(); ++it) {
    if (!(*it)->is_split() && !(*it)->seg->expandable) {
      store.detach_segment(*it, out);
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
    for (Block* b : victims) store.detach_segment(b, out);
  }
  release_segments(lk, out);
  return true;
}

// Every free shared block that covers a whole segment goes back (both pool kinds), and every
// whole free page of an expandable range is unmapped.
std::size_t DevicePool::Impl::release_cached(Lock& lk) {
  std::vector<Block*> victims, paged;
  for (const bool small : {true, false})
    for (Block* b : store.shared_set(small)) {
      if (b->seg->expandable) {
        if (ranges.releasable_pages(b) != 0) paged.push_back(b);
      } else if (!b->is_split()) {
        victims.push_back(b);
      }
    }
  std::vector<Detached> out;
  out.reserve(victims.size() + paged.size());
  for (Block* b : victims) store.detach_segment(b, out);
  for (Block* b : paged) ranges.release_pages(b, out);
  return release_segments(lk, out);
}

std::size_t DevicePool::Impl::release_idle_now(Lock& lk, std::size_t want) {
  // Candidates: unsplit free segments, and free expandable blocks holding whole units; oldest
  // (longest since cached, in its pool kind's searches) first.
  std::vector<std::pair<std::uint64_t, Block*>> cands;
  for (int k = 0; k < 2; ++k)
    for (Block* b : store.shared_set(k == 0))
      if (b->seg->expandable ? ranges.releasable_pages(b) != 0 : !b->is_split())
        cands.emplace_back(store.searches(k) - b->gc_base, b);
  std::stable_sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Detached> out;
  std::size_t planned = 0;
  for (const auto& [age, b] : cands) {
    if (planned >= want) break;
    if (!b->seg->expandable) {
      planned += b->size;
      store.detach_segment(b, out);
      continue;
    }
    // Whole units from the block's first one, until the rest of `want` is covered.
    const auto [lo, hi] = ranges.unit_span(b->seg, b->ptr, b->ptr + b->size);
    std::uintptr_t end = lo;
    for (auto it = b->seg->units.lower_bound(lo);
         it != b->seg->units.end() && it->first < hi && planned + (end - lo) < want; ++it)
      end = it->first + it->second;
    planned += end - lo;
    ranges.release_page_range(b, lo, end, out);
  }
  return release_segments(lk, out);
}

// PyTorch's garbage_collect_cached_blocks with its age rule. Where PyTorch is inert because no
// memory fraction is set, the threshold applies to the device's total memory instead.
void DevicePool::Impl::garbage_collect(Lock& lk) {
  limits.ensure(up, opt);
  const std::size_t allowed = limits.gc_allowed();
  const double threshold = opt.garbage_collection_threshold * static_cast<double>(allowed);
  const auto reserved = static_cast<double>(ledger.reserved_bytes());
  if (reserved <= threshold) return;
  const double target = reserved - threshold;

  // Whole free segments, and free blocks of the expandable range that hold whole pages.
  std::vector<Block*> candidates;
  auto gain = [&](const Block* b) REQUIRES(mu) { return b->seg->expandable ? ranges.releasable_pages(b) : b->size; };
  for (Block* b : store.shared_set(/*small=*/false))
    if (b->seg->expandable ? ranges.releasable_pages(b) != 0 : !b->is_split()) candidates.push_back(b);
  if (candidates.empty()) return;
  const std::uint64_t now = store.searches(1);
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
        ranges.release_pages(candidates[i], out);
      else
        store.detach_segment(candidates[i], out);
    }
  }
  const std::size_t bytes = release_segments(lk, out);
  ledger.gc_pass(bytes);
  events.emit(EventKind::gc, 0, bytes, 0, 0);
}

}  // namespace cudapool
