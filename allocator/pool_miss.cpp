// The miss path of allocate(): no cached block fits. In order (docs/design.md):
//   1. make_room(reuse): memory that fences or other streams hold back becomes free, one step
//      at a time (reuse_step), with a search after each;
//   2. garbage collection (garbage_collection_threshold; pool_release.cpp);
//   3. grow: expandable ranges (recycling free pages, maybe making room past the high-water
//      mark: grow_expandable below, the rules in expandable_ranges.cpp); else / when full, a
//      new segment from the upstream (unless a limit says no: then no upstream call; limits.h);
//   4. on refusal, make_room(upstream) (upstream_step; the releases are in pool_release.cpp)
//      and grow again; then out_of_memory, with the cause of the refusal.
// Any upstream error other than out-of-memory is returned at once, with the upstream's code.
#include <algorithm>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;
using detail::now_ns;

DevicePool::Impl::Block* DevicePool::Impl::serve(Fit fit, std::size_t rounded, std::size_t size, StreamId stream) {
  Block* b = store.take(fit, rounded, size, stream);
  events.emit(EventKind::allocate, b->ptr, b->size, size, stream);
  return b;
}

namespace {
AllocResult allocated(const detail::Block* b) { return AllocResult{reinterpret_cast<void*>(b->ptr), AllocStatus::ok}; }
}  // namespace

AllocResult DevicePool::Impl::allocate_slow(Lock& lk, std::size_t size, std::size_t rounded, StreamId stream) {
  Request req{.size = size, .rounded = rounded, .small = is_small(rounded), .stream = stream};
  reuse.note_miss();
  // Memory that fences or other streams hold back, cheapest first: search again after each step
  // that freed blocks.
  while (make_room(lk, req, rounded, Room::reuse, true) != Made::nothing) {
    if (Fit fit = store.find_fit(rounded, stream)) {
      ledger.cache_hit();
      return allocated(serve(fit, rounded, size, stream));
    }
  }
  if (opt.garbage_collection_threshold > 0.0) garbage_collect(lk);
  ledger.cache_miss();
  // Grow; on refusal, make room with the upstream and grow again. Only the first growth may wait
  // for fences (the refusal steps wait for all of them).
  bool may_wait = true;
  for (Made made = Made::memory_released; made != Made::nothing;
       made = make_room(lk, req, rounded, Room::upstream, true)) {
    if (made == Made::blocks_freed) {
      if (Fit fit = store.find_fit(rounded, stream)) return allocated(serve(fit, rounded, size, stream));
      continue;
    }
    Block* fresh = nullptr;
    const UpstreamStatus us = grow(lk, req, may_wait, &fresh);
    may_wait = false;
    // The fresh block is taken directly, as PyTorch's alloc_block does: the oversize rules are
    // for reusing cached blocks (a 5 MiB request gets its 20 MiB segment even when
    // max_split_size is 20 MiB). We hold the lock again here, so nobody else has taken it.
    if (us == UpstreamStatus::ok) {
      FreeSet& set = store.set_of(fresh);
      return allocated(serve(Fit{&set, set.find(fresh)}, rounded, size, stream));
    }
    if (us == UpstreamStatus::error)
      return AllocResult{nullptr, AllocStatus::upstream_error, Refusal::none, us.error_code};
  }
  ledger.oom();
  events.emit(EventKind::allocate_failure, 0, size, size, stream);
  return AllocResult{nullptr, AllocStatus::out_of_memory, req.refusal, req.upstream_error, req.asked};
}

DevicePool::Impl::Made DevicePool::Impl::make_room(Lock& lk, Request& req, std::size_t bytes, Room kind,
                                                   bool may_wait) {
  switch (kind) {
    case Room::reuse: return reuse_step(req) ? Made::blocks_freed : Made::nothing;
    case Room::pages: return free_pages(req, bytes, may_wait) ? Made::blocks_freed : Made::nothing;
    case Room::upstream: return upstream_step(lk, req);
    case Room::idle:
      caches.flush_all();      // blocks parked in threads' caches count as idle too
      reuse.service_fences();  // fences that have passed, without waiting
      req.released = release_idle_now(lk, bytes);
      if (req.released < bytes && may_wait) {
        caches.flush_all();  // blocks parked in threads' caches are reclaimable too
        reuse.wait_all();
        req.released += release_idle_now(lk, bytes - req.released);
      }
      return req.released != 0 ? Made::memory_released : Made::nothing;
  }
  return Made::nothing;
}

// Room::reuse, in order: the open batch closed and the device fences asked; this stream's own
// local blocks (expandable ranges: keep one fence on it in flight, so they become shared and
// their pages recyclable soon after they were freed); other streams' local blocks; pending
// free()d memory under a GPU-side wait (gpu_wait; a page of growth within the slack is cheaper,
// and gives the pending blocks time to complete on their own) or a host wait (device); fenced
// frees that idle threads left in their caches (only their owner closes those batches; not
// earlier: taking other threads' cache locks on every miss slowed busy threads down).
bool DevicePool::Impl::reuse_step(Request& req) {
  const std::size_t rounded = req.rounded;
  auto order = [&]() REQUIRES(mu) {
    return opt.free_sync == FreeSync::gpu_wait && !ranges.growth_within_slack(rounded, req.small) &&
           reuse.order_device_batches(rounded, req.small, false);
  };
  for (;;) {
    switch (req.reuse_step++) {
      case 0:
        if (reuse.service_miss()) return true;
        break;
      case 1:
        if (limits.granularity() != 0 && reuse.promote_own(req.stream, 0, false)) return true;
        break;
      case 2:
        if (reuse.try_promote_for(rounded, req.stream)) return true;
        break;
      case 3:
        if (order()) return true;
        break;
      case 4:
        if (opt.free_sync == FreeSync::device && reuse.wait_device_batches()) return true;
        break;
      case 5:
        if (!caches.empty() && caches.collect_fenced() && (reuse.service_miss() || order())) return true;
        break;
      default: return false;
    }
  }
}

// Room::upstream, PyTorch's order: oversize cached blocks go back (max_split_size); then every
// fence is waited for and the pool searched AGAIN (PyTorch skips this); then every unsplit free
// segment and free page goes back.
DevicePool::Impl::Made DevicePool::Impl::upstream_step(Lock& lk, Request& req) {
  for (;;) {
    switch (req.upstream_step++) {
      case 0:
        if (release_oversize(lk, req.rounded)) return Made::memory_released;
        break;
      case 1:
        caches.flush_all();  // blocks parked in threads' caches are reclaimable too
        reuse.wait_all();
        return Made::blocks_freed;
      case 2:
        release_cached(lk);
        ledger.alloc_retry();
        return Made::memory_released;
      default: return Made::nothing;
    }
  }
}

// Room::pages, cheapest first: own-stream local blocks whose stream fence (recorded by an
// earlier miss) has passed, or will (a wait on an older fence); pending free()d pages reused at
// once with the GPU waiting (nothing moves, nothing blocks); the oldest device fence that frees
// enough; hot free pages (reused under a GPU-side wait: they cannot move until its fences
// complete, and past the high-water mark expandable_wait prefers waiting to mapping new memory,
// unless the upstream can alias them, which needs no wait); last, a fence on this stream
// recorded now (a stream synchronize). Where the upstream can alias, the stream's own fences
// are never waited for (its own free pages are aliased instead), and when hot pages and its own
// free pages (req.hot_bytes + req.own_bytes) cover the growth no step waits at all: plan_growth aliases them.
// True if free blocks changed.
bool DevicePool::Impl::free_pages(Request& req, std::size_t bytes, bool may_wait) {
  const bool wait = may_wait && opt.expandable_wait;
  const bool own_wait = wait && !ranges.can_alias();
  if (reuse.promote_own(req.stream, bytes, own_wait)) return true;
  if (opt.free_sync == FreeSync::gpu_wait && reuse.order_device_batches(bytes, req.small, true)) return true;
  if (!wait || (ranges.can_alias() && req.hot_bytes + req.own_bytes >= bytes)) return false;
  if (reuse.wait_device_batches_for(bytes)) return true;
  if (!ranges.can_alias() && req.hot_bytes >= bytes && req.hot_bytes != 0) {
    reuse.settle_ordered();
    return true;
  }
  return own_wait && reuse.sync_own(req.stream, bytes);
}

UpstreamStatus DevicePool::Impl::grow(Lock& lk, Request& req, bool may_wait, Block** out) {
  limits.ensure(up, opt);
  if (limits.granularity() != 0) {
    // Expandable segments first (map pages into the range); a classic segment when full.
    const UpstreamStatus us = grow_expandable(lk, req, out, may_wait);
    if (us != UpstreamStatus::ok || *out != nullptr) return us;
  }
  // A small-pool segment is 2 MiB whatever a prefill asked for (allocations ask for at most 1 MiB).
  return new_segment(lk, req, segment_size_for(req.small ? std::min(req.rounded, kSmallSize) : req.rounded), out);
}

AllocResult DevicePool::prefill(std::size_t bytes, bool small, StreamId stream) {
  if (bytes == 0 || bytes > kMaxRequestSize) return {nullptr, AllocStatus::invalid_size};
  Impl& pool = *impl_;
  Impl::Lock lk(pool.mu);
  const std::size_t rounded = (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
  Impl::Request req{.size = bytes, .rounded = rounded, .small = small, .stream = stream, .prefill = true};
  Impl::Block* fresh = nullptr;
  const UpstreamStatus us = pool.grow(lk, req, /*may_wait=*/false, &fresh);
  if (us == UpstreamStatus::ok && fresh != nullptr) return {reinterpret_cast<void*>(fresh->ptr), AllocStatus::ok};
  if (us == UpstreamStatus::error) return {nullptr, AllocStatus::upstream_error, Refusal::none, us.error_code};
  return {nullptr, AllocStatus::out_of_memory, req.refusal, req.upstream_error, req.asked};
}

UpstreamStatus DevicePool::Impl::new_segment(Lock& lk, Request& req, std::size_t seg_size, Block** out) {
  const bool small = req.small;
  const StreamId stream = req.stream;
  limits.ensure(up, opt);
  if (limits.refuses(ledger.reserved_bytes(), seg_size)) {
    // Over the cap: refuse without asking the upstream, like PyTorch's memory fraction.
    events.emit(EventKind::oom, 0, seg_size, seg_size, stream);
    req.refused(Refusal::limit, seg_size);
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
    if (us == UpstreamStatus::out_of_memory) {
      events.emit(EventKind::oom, 0, seg_size, seg_size, stream, dt);
      req.refused(us, seg_size);
    }
    return us;
  }
  Segment* seg = store.add_segment(reinterpret_cast<std::uintptr_t>(base), seg_size, small, stream);
  Block* b = seg->head;
  ledger.segment_added(small, seg_size);
  ranges.note_reserved();
  ledger.device_alloc();
  events.emit(EventKind::segment_alloc, seg->base, seg_size, seg_size, stream, dt);
  // Fresh memory has never been used by any stream: shared at once.
  reuse.fresh_shared(b);
  *out = b;
  return UpstreamStatus::ok;
}

// ---- expandable growth: the order of the steps; expandable_ranges.cpp has the rules ----

UpstreamStatus DevicePool::Impl::grow_expandable(Lock& lk, Request& req, Block** out, bool may_wait) {
  *out = nullptr;
  Segment* range = ranges.range_for(req.small, req.stream);
  if (range == nullptr) return UpstreamStatus::ok;  // no range: classic segments instead
  ranges.note_reserved();
  detail::Growth growth;
  growth.seg = range;
  growth.kind = detail::kind_index(req.small);
  growth.stream = req.stream;
  if (!plan_growth(lk, req, growth, may_wait, out)) return UpstreamStatus::ok;  // *out, or range exhausted
  ranges.keep_bounced(growth.kind, growth.bounced);
  // Units recycled and not moved into the growth (a failure, more than needed, or too large
  // for what is left of a hole) are unmapped when this function returns, whatever the path.
  struct SpareGuard {
    Impl* impl;
    Lock& lk;
    std::vector<detail::Unit>& spare;
    ~SpareGuard() {
      std::vector<Detached> rest;
      for (const detail::Unit& u : spare) {
        if (u.used) continue;
        if (!rest.empty() && rest.back().base + rest.back().size == u.base)
          rest.back().size += u.size;  // one unmap call per contiguous run
        else
          rest.push_back(Detached{u.base, u.size, true});
      }
      impl->release_segments(lk, rest);
    }
  };
  SpareGuard guard{this, lk, growth.spare};
  // The limit, checked before any upstream call.
  const std::size_t to_map = growth.plan.to_map;
  if (limits.refuses(ledger.reserved_bytes(), to_map)) {
    events.emit(EventKind::oom, 0, to_map, to_map, req.stream);
    req.refused(Refusal::limit, to_map);
    return UpstreamStatus::out_of_memory;
  }
  return place_growth(lk, req, growth, out);
}

// Plan; if the plan would take the mapped total above its high-water mark (or the limit), first
// make room (once: memory that fences hold back), then recycle whole free pages. False: no plan
// (the range is exhausted) or *out = a free block that became usable.
bool DevicePool::Impl::plan_growth(Lock& lk, Request& req, detail::Growth& growth, bool may_wait, Block** out) {
  Segment* range = growth.seg;
  bool room_tried = false;
  for (;;) {
    if (ranges.has_draining()) ranges.reclaim_drained();  // before planning: it merges holes
    growth.plan = ranges.plan(range, req.rounded, req.stream);
    if (!growth.plan) return false;  // range exhausted: classic segment instead
    // A warm start reserves what the recorded run held: nothing of it is taken back from the
    // other range's fresh pages (the limit is still checked before any upstream call).
    if (req.prefill) return true;
    const std::size_t reserved = ledger.reserved_bytes();
    const std::size_t to_map = growth.plan.to_map;
    const std::size_t cap = ranges.growth_cap();
    const std::size_t past_cap = reserved + to_map > cap ? reserved + to_map - cap : 0;
    const std::size_t excess = limits.excess(reserved, to_map);
    growth.bounced = 0;
    if (std::max(past_cap, excess) == 0) return true;
    growth.cands.clear();
    growth.hot_cands.clear();
    growth.own_cands.clear();
    if (reuse.has_ordered()) reuse.poll_ordered();  // blocks whose GPU-side wait has passed may move again
    std::size_t hot = 0, own = 0;
    const std::size_t avail = ranges.recycle_candidates(range, growth.plan, reuse.order_done(), growth.cands, &hot,
                                                        &own, ranges.can_alias() ? &growth.hot_cands : nullptr);
    const std::size_t own_local = ranges.can_alias()
                                      ? ranges.own_candidates(range, growth.plan, req.stream, growth.own_cands)
                                      : 0;
    // What the own range's free pages cannot cover would come from the other range: pages it
    // lent are not taken back (the bounce rule); a hard limit (`excess`) still recycles them.
    const std::size_t bounce = past_cap > own ? ranges.bounce_allowance(range, past_cap - own) : 0;
    const std::size_t over = std::max(past_cap - bounce, excess);
    growth.bounced = std::max(past_cap, excess) - over;  // what the rule really spares (a hard limit comes first)
    if (over == 0) return true;
    if (growth.bounced != 0)  // own pages first, the other range's only for what is left
      std::stable_partition(growth.cands.begin(), growth.cands.end(),
                            [range](const Block* c) { return c->seg == range; });
    if (avail < over && !room_tried && !ranges.growth_within_slack(req.rounded, req.small)) {
      room_tried = true;
      // Free pages that fences hold back (make_room); they change the free sets: search again,
      // then plan again.
      req.hot_bytes = hot;
      req.own_bytes = own_local;
      if (make_room(lk, req, over - avail, Room::pages, may_wait) != Made::nothing) {
        if (Fit fit = store.find_fit(req.rounded, req.stream)) {
          *out = *fit.it;
          return false;
        }
        continue;
      }
    }
    take_pages(req, growth, over, avail);
    return true;
  }
}

// The growth maps `over` bytes less: `avail` of them recycled from cold free pages, the rest
// picked from hot pages and then from the stream's own free pages, to be aliased.
void DevicePool::Impl::take_pages(Request& req, detail::Growth& growth, std::size_t over, std::size_t avail) {
  if (avail != 0) ranges.recycle_pages(growth.cands, std::min(over, avail), growth.spare);
  if (avail >= over) return;
  const std::size_t got = ranges.pick_hot_units(growth.hot_cands, over - avail, growth.hot_units);
  // The stream's own pages after the hot ones: they need a fence of their own.
  const std::size_t first_own = growth.hot_units.size();
  if (got < over - avail) ranges.pick_hot_units(growth.own_cands, over - avail - got, growth.hot_units);
  if (growth.hot_units.size() > first_own) growth.own_order = reuse.order_stream(req.stream);
}

// Map the plan: the back of its hole, or hole after hole from its start until the block that
// grows covers the request.
UpstreamStatus DevicePool::Impl::place_growth(Lock& lk, Request& req, detail::Growth& growth, Block** out) {
  store.stream_get(req.stream);  // the pieces may become local to it
  UpstreamStatus failed = UpstreamStatus::ok;
  if (growth.plan.hole != nullptr) {
    Block* cur = map_piece(lk, req, growth, growth.plan.hole, growth.plan.to_map, /*back=*/true, &failed);
    if (cur == nullptr) return failed;
    *out = cur;
    return UpstreamStatus::ok;
  }
  const std::size_t page = growth.seg->page;
  Block* cur = growth.plan.start;  // the block that grows to cover the request
  while (cur->state == BState::unmapped || cur->size < req.rounded) {
    Block* u = cur->state == BState::unmapped ? cur : cur->next;                  // the next hole to fill
    if (u == nullptr || u->state != BState::unmapped) return UpstreamStatus::ok;  // cannot happen
    const std::size_t have = cur->state == BState::unmapped ? 0 : cur->size;
    const std::size_t want = (req.rounded - have + page - 1) / page * page;
    cur = map_piece(lk, req, growth, u, std::min(u->size, want), /*back=*/false, &failed);
    if (cur == nullptr) return failed;
  }
  *out = cur;
  return UpstreamStatus::ok;
}

// Map `amount` bytes at the front (or the back) of hole u; the pages become a free block
// (ExpandableRanges::add_mapped). Null on failure (*failed says why): the pages mapped so far
// stay as free blocks, nothing is inconsistent.
DevicePool::Impl::Block* DevicePool::Impl::map_piece(Lock& lk, Request& req, detail::Growth& growth, Block* u,
                                                     std::size_t amount, bool back, UpstreamStatus* failed) {
  const std::uintptr_t at = back ? u->ptr + u->size - amount : u->ptr;
  const std::int64_t t0 = now_ns();
  const UpstreamStatus us = fill(lk, growth, at, amount);
  const std::int64_t dt = now_ns() - t0;
  ledger.upstream_time(dt);
  if (us != UpstreamStatus::ok) {
    if (us == UpstreamStatus::out_of_memory) {
      events.emit(EventKind::oom, at, amount, amount, req.stream, dt);
      req.refused(us, growth.plan.to_map);
    }
    *failed = us;
    return nullptr;
  }
  ranges.split_hole(u, amount, back);
  return ranges.add_mapped(u, amount, req.stream, growth.alias_hot, growth.alias_own, dt);
}

// The pages of [at, at + amount): recycled units moved there first, then hot units aliased,
// fresh units mapped for the rest; all or nothing.
UpstreamStatus DevicePool::Impl::fill(Lock& lk, detail::Growth& growth, std::uintptr_t at, std::size_t amount) {
  std::size_t done = 0;
  growth.alias_hot = 0;
  growth.alias_own = false;
  UpstreamStatus us = ranges.move_spare(growth, at, amount, &done);
  if (us == UpstreamStatus::ok) us = ranges.alias_hot_units(growth, at, amount, &done);
  const std::size_t left = growth.plan.to_map - growth.placed - done;
  // Fresh memory follows for this piece: the pieces after it can take only what they need.
  const std::size_t later = done < amount ? growth.plan.to_map - growth.placed - amount : SIZE_MAX;
  std::vector<Detached> unusable = ranges.take_unusable(growth, left, later);
  release_segments(lk, unusable);
  if (us == UpstreamStatus::ok) us = ranges.map_fresh(growth, at, amount, &done);
  if (us != UpstreamStatus::ok && done != 0) {
    // Fresh and recycled units only, but the rule stays simple: nothing goes back to the
    // upstream while a GPU-side wait may still run (the out-of-memory path: a wait is cheap).
    if (reuse.has_ordered()) reuse.settle_ordered();
    ranges.unmap_placed(growth.seg, at, done);
  }
  if (us == UpstreamStatus::ok) growth.placed += amount;
  return us;
}

}  // namespace cudapool
