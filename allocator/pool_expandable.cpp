// expandable_segments, the pool side: instead of one upstream allocation per segment, one
// reserved virtual range per pool kind (small/large), grown by mapping pages where a request
// needs them and shrunk by unmapping wholly free pages. Freed space anywhere in the range can
// serve any size later, which is what keeps reserved memory near the live footprint.
//
// Representation: the range is a Segment with `expandable` set whose blocks tile the whole
// reservation; blocks with no pages behind them are in state `unmapped` (in no free set, merged
// with unmapped neighbours). Mapped runs are page aligned at both ends. Stats follow PyTorch:
// reserved bytes are mapped bytes, and each maximal mapped run counts (and is snapshotted) as one
// segment. Pages are only unmapped from shared free blocks, i.e. after a fence covering every use.
//
// Physical units: each Upstream::map() is one physical allocation of whole pages (up to
// PoolOptions::expandable_max_unit), recorded in Segment::units. The driver charges per
// allocation, not per byte, so growth maps few large units; recycling and release take whole
// units only (a unit half in use stays mapped), which is what keeps the driver's rule that a
// mapping is unmapped whole.
//
// Aliasing: free pages that a GPU-side wait handed out (Block::hot) may still be touched by old
// work at their address, so they cannot be unmapped or moved until that wait completed. Growth
// that needs them elsewhere maps them a second time at the growth (Upstream::alias): new work,
// which the GPU-side wait already orders after the old, uses the new address; the old address
// becomes a draining block and loses its mapping when the wait completed (drop_aliases).
#include <algorithm>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;
using detail::now_ns;

namespace {
std::uintptr_t round_up(std::uintptr_t v, std::size_t g) { return (v + g - 1) / g * g; }
}  // namespace

// Segment count bookkeeping: `piece` is a block that just became mapped (sign +1) or is about to
// become unmapped (sign -1), not yet merged with its neighbours.
void DevicePool::Impl::count_runs_change(Block* piece, int sign) {
  int delta = 1;
  if (piece->prev != nullptr && piece->prev->mapped()) --delta;
  if (piece->next != nullptr && piece->next->mapped()) --delta;
  ledger.runs_changed(piece->seg->small, sign * delta);
}

void DevicePool::Impl::merge_unmapped(Block* b) {
  Block* n;
  while ((n = b->prev) != nullptr && n->state == BState::unmapped) {
    b->ptr = n->ptr;
    b->size += n->size;
    b->prev = n->prev;
    if (n->prev != nullptr)
      n->prev->next = b;
    else
      b->seg->head = b;
    store.block_pool.put(n);
  }
  while ((n = b->next) != nullptr && n->state == BState::unmapped) {
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    store.block_pool.put(n);
  }
}

// Every hole is a candidate in two ways: forward (the free block before it, usable by
// `stream`, plus as many of the hole's first pages as needed, and on through later holes and
// free blocks: the original rule) and backward (the hole's LAST pages joined to the usable free
// block after it). The candidate needing the fewest new bytes wins, the lowest address on a tie:
// a hole between two free blocks left by earlier frees or recycling costs a page or two where
// the first hole that fits may cost the whole request.
DevicePool::Impl::GrowPlan DevicePool::Impl::plan_expandable(Segment* seg, std::size_t rounded, StreamId stream) {
  const std::size_t g = seg->page;
  auto usable = [&](const Block* x) {
    return x->state == BState::shared || (x->state == BState::local && x->owner == stream);
  };
  // What the growth touches: from the block before `first` to the block after `last`.
  auto keep_around = [](GrowPlan& c, const Block* first, const Block* last) {
    c.keep_lo = first->prev != nullptr ? first->prev->ptr : first->ptr;
    const Block* end = last->next != nullptr ? last->next : last;
    c.keep_hi = end->ptr + end->size;
  };
  GrowPlan best;
  auto consider = [&](const GrowPlan& c) {
    if (!best || c.to_map < best.to_map) best = c;
  };
  for (Block* b = seg->head; b != nullptr && !(best && best.to_map == 0); b = b->next) {
    if (b->state != BState::unmapped) continue;
    // Forward: map the first pages of this hole (and of later ones) after a usable free block.
    Block* start = (b->prev != nullptr && usable(b->prev)) ? b->prev : b;
    std::size_t covered = 0, to_map = 0;
    Block* last = nullptr;
    for (Block* x = start; x != nullptr && covered < rounded && (x->state == BState::unmapped || usable(x));
         x = x->next) {
      const std::size_t take = x->state == BState::unmapped ? std::min(x->size, round_up(rounded - covered, g))
                                                            : x->size;
      if (x->state == BState::unmapped) to_map += take;
      covered += take;
      last = x;
    }
    if (covered >= rounded) {
      GrowPlan c;
      c.start = start;
      c.to_map = to_map;
      keep_around(c, start, last);
      consider(c);
    }
    // Backward: map the last pages of this hole before a usable free block.
    Block* n = b->next;
    if (n != nullptr && usable(n) && n->size < rounded) {
      const std::size_t amount = round_up(rounded - n->size, g);
      if (amount <= b->size) {
        GrowPlan c;
        c.hole = b;
        c.to_map = amount;
        keep_around(c, b, n);
        consider(c);
      }
    }
  }
  return best;
}

std::size_t DevicePool::Impl::recycle_candidates(const Segment* seg, const GrowPlan& plan, std::vector<Block*>& out,
                                                 std::size_t* hot_bytes, std::size_t* own_bytes,
                                                 std::vector<Block*>* hot_out) const {
  std::size_t total = 0;
  *hot_bytes = 0;
  *own_bytes = 0;
  std::vector<std::pair<std::size_t, Block*>> ranked, hot_ranked;  // (releasable bytes, block): computed once
  for (int k = 0; k < 2; ++k) {
    // Pages move between the two ranges only when they have the same page size: a page is one
    // physical allocation upstream, which cannot be split, and merging small ones into a large
    // page would break the whole-page promise made at reserve().
    if (ranges.seg[k] == nullptr || ranges.seg[k]->page != seg->page) continue;
    const FreeSet& set = store.shared[k];
    // Blocks smaller than a page hold no whole page.
    for (auto it = set.lower_bound(detail::BySizeAddr::Key{ranges.seg[k]->page, 0}); it != set.end(); ++it) {
      Block* b = *it;
      if (!b->seg->expandable) continue;
      if (b->seg == seg && b->ptr < plan.keep_hi && b->ptr + b->size > plan.keep_lo) continue;
      const std::size_t r = releasable_pages(b);
      if (is_hot(b)) {  // old work may still use it: reusable in place, not movable (only aliased)
        *hot_bytes += r;
        if (hot_out != nullptr && r != 0) hot_ranked.emplace_back(r, b);
        continue;
      }
      if (r == 0) continue;
      ranked.emplace_back(r, b);
      total += r;
      if (b->seg == seg) *own_bytes += r;
    }
  }
  // Fewest whole units' bytes first: small free islands between live blocks are the least
  // useful mapped memory; large free runs serve later large requests without any driver call.
  auto fewest_first = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second->ptr < b.second->ptr;
  };
  std::sort(ranked.begin(), ranked.end(), fewest_first);
  for (const auto& [r, b] : ranked) out.push_back(b);
  if (hot_out != nullptr) {
    std::sort(hot_ranked.begin(), hot_ranked.end(), fewest_first);
    for (const auto& [r, b] : hot_ranked) hot_out->push_back(b);
  }
  return total;
}

void DevicePool::Impl::pick_hot_units(const std::vector<Block*>& cands, std::size_t want,
                                      std::vector<detail::HotUnit>& out) const {
  std::size_t got = 0;
  for (Block* b : cands) {
    const auto [lo, hi] = unit_span(b->seg, b->ptr, b->ptr + b->size);
    for (auto it = b->seg->units.lower_bound(lo); it != b->seg->units.end() && it->first < hi && got < want; ++it) {
      out.push_back(detail::HotUnit{b->seg, it->first, it->second});
      got += it->second;
    }
    if (got >= want) return;
  }
}

void DevicePool::Impl::drop_aliases() {
  for (Drain& d : ranges.draining) {
    if (d.dropped || d.b->hot > batches.order_done()) continue;
    const std::int64_t t0 = now_ns();
    up.unalias(reinterpret_cast<void*>(d.b->ptr), d.b->size);
    ledger.upstream_time(now_ns() - t0);
    ledger.device_unmap();
    d.dropped = true;
  }
}

void DevicePool::Impl::reclaim_drained() {
  std::size_t keep = 0;
  for (const Drain& d : ranges.draining) {
    if (!d.dropped) {
      ranges.draining[keep++] = d;
      continue;
    }
    // Later entries are still draining while this one merges: merging never takes them.
    d.b->state = BState::unmapped;
    merge_unmapped(d.b);
  }
  ranges.draining.resize(keep);
}

std::size_t DevicePool::Impl::recycle_pages(const std::vector<Block*>& cands, std::size_t want,
                                            std::vector<detail::Unit>& out) {
  std::size_t done = 0;
  std::vector<Detached> scratch;  // release_page_range's page runs: the units in `out` say more
  // Releasing a candidate touches only it and its neighbours, never another candidate (two
  // shared free blocks are never neighbours: they would have merged).
  for (Block* b : cands) {
    if (done >= want) break;
    const Segment* seg = b->seg;
    const auto [ulo, uhi] = unit_span(seg, b->ptr, b->ptr + b->size);
    if (uhi <= ulo) continue;
    const std::size_t need = want - done;
    std::uintptr_t lo = ulo, hi = uhi;
    if (need < uhi - ulo) {
      // A partial release takes the units next to a hole, so the hole grows instead of a new
      // one opening (fewer mapped runs, larger holes to grow into later).
      const bool from_top = b->next == nullptr || b->next->state == BState::unmapped || b->prev == nullptr ||
                            b->prev->state != BState::unmapped;
      if (from_top) {
        lo = uhi;  // walk down through the units below uhi (they tile [ulo, uhi))
        auto it = seg->units.lower_bound(uhi);
        while (lo > ulo && uhi - lo < need) lo = (--it)->first;
      } else {
        auto it = seg->units.find(ulo);
        hi = ulo;
        while (hi < uhi && hi - ulo < need) {
          hi += it->second;
          ++it;
        }
      }
    }
    release_page_range(b, lo, hi, scratch, &out);
    done += hi - lo;
  }
  return done;
}

// The bounce rule. Pages move between the two ranges (same page size) so that the pool as a
// whole stays at its high-water mark; but when each kind's own peak comes at a different moment,
// over and over (a loop whose large buffers and small ones take turns), the same pages would move
// to and fro every time, each move a few driver calls (~70 us for a 2 MiB page on an H200).
// Growth that would take back pages its range lent maps that much fresh instead, so the mark
// rises by what the two kinds trade and the trading stops. A range maps fresh only for what its
// own free pages cannot cover, so the rule never holds more than the two kinds' own peaks
// together (what separate pools, PyTorch's, would hold); a hard limit still moves the pages.
std::size_t DevicePool::Impl::bounce_allowance(const Segment* seg, std::size_t short_by) const {
  const int k = detail::kind_index(seg->small);
  const Segment* other = ranges.seg[1 - k];
  if (other == nullptr || other->page != seg->page) return 0;
  return std::min({short_by, ranges.lent[k], other->mapped});
}

// Mapping is free below the high-water mark, and below the live peak plus the headroom (a bound
// that does not move with the pool's own mapping, so growth into it cannot ratchet).
std::size_t DevicePool::Impl::growth_cap() const {
  const auto live_peak = static_cast<double>(ledger.allocated_peak());
  return std::max(ranges.hwm, static_cast<std::size_t>(live_peak * (1.0 + opt.expandable_headroom)));
}

// Within the slack (PoolOptions::expandable_slack says why) growth past the cap still recycles
// free pages whose fences have passed, but asks no fence: no GPU-side wait, no host wait. The
// slack sits on the live peak, not on the high-water mark, so growth into it cannot ratchet.
bool DevicePool::Impl::growth_within_slack(std::size_t rounded, bool small) const {
  if (limits.granularity() == 0 || opt.expandable_slack == 0) return false;
  const std::size_t reserved = ledger.reserved_bytes();
  const std::size_t need = round_up(rounded, limits.page_bytes(small, opt));
  const auto live_peak = static_cast<double>(ledger.allocated_peak());
  const auto bound = static_cast<std::size_t>(live_peak * (1.0 + opt.expandable_headroom)) + opt.expandable_slack;
  return reserved + need <= bound && limits.admits(reserved, need);
}

UpstreamStatus DevicePool::Impl::grow_expandable(Lock& lk, Request& req, Block** out, bool may_wait) {
  const std::size_t rounded = req.rounded;
  const bool small = req.small;
  const StreamId stream = req.stream;
  *out = nullptr;
  const int k = detail::kind_index(small);
  const std::size_t g = limits.page_bytes(small, opt);
  if (ranges.seg[k] == nullptr) {
    // About 9/8 of the device, like PyTorch: the mapped part can never fill the range, and one
    // range per pool kind keeps address space use bounded however many streams there are.
    const std::size_t total = limits.device_total();
    const std::size_t bytes = round_up(total + total / 8 + g, g);
    void* base = nullptr;
    UpstreamStatus us = up.reserve(bytes, g, &base);
    if (us != UpstreamStatus::ok) return UpstreamStatus::ok;  // no range: classic segments instead
    Segment* seg = store.add_segment(reinterpret_cast<std::uintptr_t>(base), bytes, small, stream);
    seg->expandable = true;
    seg->page = g;
    seg->head->state = BState::unmapped;
    ranges.seg[k] = seg;
    ranges.alias_ok = up.can_alias();
  }
  Segment* seg = ranges.seg[k];
  note_reserved();

  // Plan; if the plan would take the mapped total above its high-water mark (or the limit),
  // first make memory that fences hold back reusable (once), then recycle whole free pages.
  GrowPlan plan;
  std::vector<Block*> cands, hot_cands;
  std::vector<detail::Unit> spare;         // recycled units, already unmapped in the pool's structures
  std::vector<detail::HotUnit> hot_units;  // units of hot blocks to alias, still in place
  bool fences_tried = false;
  std::size_t bounced = 0;  // mapped fresh past the cap by the bounce rule
  for (;;) {
    if (!ranges.draining.empty()) reclaim_drained();  // before planning: it merges holes
    plan = plan_expandable(seg, rounded, stream);
    if (!plan) return UpstreamStatus::ok;  // range exhausted: classic segment instead
    const std::size_t reserved = ledger.reserved_bytes();
    const std::size_t cap = growth_cap();
    const std::size_t past_cap = reserved + plan.to_map > cap ? reserved + plan.to_map - cap : 0;
    const std::size_t excess = limits.excess(reserved, plan.to_map);
    bounced = 0;
    if (std::max(past_cap, excess) == 0) break;
    cands.clear();
    hot_cands.clear();
    if (batches.has_ordered()) poll_ordered();  // blocks whose GPU-side wait has passed may move again
    std::size_t hot = 0, own = 0;
    const std::size_t avail = recycle_candidates(seg, plan, cands, &hot, &own, ranges.alias_ok ? &hot_cands : nullptr);
    // What the own range's free pages cannot cover would come from the other range: pages it
    // lent are not taken back (the bounce rule); a hard limit (`excess`) still recycles them.
    bounced = past_cap > own ? bounce_allowance(seg, past_cap - own) : 0;
    const std::size_t over = std::max(past_cap - bounced, excess);
    bounced = std::max(past_cap, excess) - over;  // what the rule really spares (a hard limit comes first)
    if (over == 0) break;
    if (bounced != 0)  // own pages first, the other range's only for what is left
      std::stable_partition(cands.begin(), cands.end(), [seg](const Block* c) { return c->seg == seg; });
    if (avail < over && !fences_tried && !growth_within_slack(rounded, small)) {
      fences_tried = true;
      // Free pages that fences hold back (make_room); they change the free sets: search again,
      // then plan again.
      req.hot_bytes = hot;
      if (make_room(lk, req, over - avail, Room::pages, may_wait) != Made::nothing) {
        if (Fit fit = store.find_fit(rounded, stream)) {
          *out = *fit.it;
          return UpstreamStatus::ok;
        }
        continue;
      }
    }
    if (avail != 0) recycle_pages(cands, std::min(over, avail), spare);
    if (avail < over) pick_hot_units(hot_cands, over - avail, hot_units);
    break;
  }
  ranges.lent[k] -= bounced;  // the other range keeps those pages as its own from now on
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
  SpareGuard guard{this, lk, spare};

  // The limit, checked before any upstream call.
  const std::size_t to_map = plan.to_map;
  const std::size_t reserved = ledger.reserved_bytes();
  if (limits.refuses(reserved, to_map)) {
    emit(EventKind::oom, 0, to_map, to_map, stream);
    req.refused(Refusal::limit);
    return UpstreamStatus::out_of_memory;
  }

  StreamFree* stream_free = store.stream_get(stream);
  UpstreamStatus failed = UpstreamStatus::ok;
  const std::size_t unit_cap = max_unit(seg);
  std::size_t placed = 0;  // bytes of the plan mapped or moved into place so far
  // Map `amount` bytes at the front (or the back) of hole u; the pages become a free block local
  // to the requesting stream, merged with the usable free blocks around it. Fresh pages were never
  // used, so any class would be safe; local lets them swallow a free block shared or local to this
  // stream into one block the request can take.
  // Recycled units that fit are moved there first (Upstream::move: the same physical memory at a
  // new address; a contiguous run of them in one call), fresh units mapped for the rest; all or
  // nothing per piece.
  std::uint64_t alias_hot = 0;  // the newest order whose pages fill() aliased into the piece
  auto fill = [&](std::uintptr_t at, std::size_t amount) REQUIRES(mu) -> UpstreamStatus {
    std::size_t done = 0;
    alias_hot = 0;
    UpstreamStatus us = UpstreamStatus::ok;
    for (std::size_t i = 0; i < spare.size() && done < amount && us == UpstreamStatus::ok;) {
      if (spare[i].used || spare[i].size > amount - done) {
        ++i;
        continue;
      }
      const std::uintptr_t from = spare[i].base;
      std::size_t n = 0, j = i;
      for (; j < spare.size() && !spare[j].used && spare[j].base == from + n && n + spare[j].size <= amount - done; ++j)
        n += spare[j].size;
      const std::int64_t t0 = now_ns();
      us = up.move(reinterpret_cast<void*>(from), reinterpret_cast<void*>(at + done), n);
      ledger.device_map();
      ledger.device_unmap();
      emit(EventKind::segment_unmap, from, n, n, 0, now_ns() - t0);  // the source is gone either way
      for (std::size_t q = i; q < j; ++q) {
        spare[q].used = true;
        if (us != UpstreamStatus::ok) continue;
        seg->units.emplace(at + done + (spare[q].base - from), spare[q].size);
        if (!seg->holds(spare[q].base)) ranges.moved_across(1 - k, spare[q].size);  // from the other range
      }
      if (us == UpstreamStatus::ok) done += n;
      i = j;
    }
    // Then the pages of hot free blocks, aliased: a contiguous run of one block per call.
    std::vector<Detached> none;  // a draining range detaches nothing now
    for (std::size_t i = 0; i < hot_units.size() && done < amount && us == UpstreamStatus::ok;) {
      detail::HotUnit& h = hot_units[i];
      if (h.used || h.size > amount - done) {
        ++i;
        continue;
      }
      std::size_t n = 0, j = i;
      for (; j < hot_units.size() && !hot_units[j].used && hot_units[j].seg == h.seg &&
             hot_units[j].base == h.base + n && n + hot_units[j].size <= amount - done;
           ++j)
        n += hot_units[j].size;
      Block* src = detail::block_at(h.seg, h.base);
      const bool intact = src != nullptr && src->state == BState::shared && src->ptr + src->size >= h.base + n;
      const std::int64_t t0 = now_ns();
      const UpstreamStatus ua = intact
                                    ? up.alias(reinterpret_cast<void*>(h.base), reinterpret_cast<void*>(at + done), n)
                                    : UpstreamStatus::error;
      for (std::size_t q = i; q < j; ++q) hot_units[q].used = true;
      if (ua == UpstreamStatus::ok) {
        ledger.device_map();
        ledger.device_alias();
        Block* old = release_page_range(src, h.base, h.base + n, none, nullptr, /*drain=*/true);
        ranges.draining.push_back(Drain{old});
        alias_hot = std::max(alias_hot, old->hot);
        emit(EventKind::segment_unmap, h.base, n, n, 0, now_ns() - t0);  // gone from the pool's view
        for (std::size_t q = i; q < j; ++q)
          seg->units.emplace(at + done + (hot_units[q].base - h.base), hot_units[q].size);
        done += n;
      }  // else the pages stay where they are, and fresh ones are mapped for the rest
      i = j;
    }
    // Spare units larger than all the growth still to place can never be used: they go back
    // now, before fresh memory is mapped, so the mapped total never passes the mark on the way.
    std::vector<Detached> unusable;
    for (detail::Unit& u : spare)
      if (!u.used && u.size > plan.to_map - placed - done) {
        u.used = true;
        unusable.push_back(Detached{u.base, u.size, true});
      }
    release_segments(lk, unusable);
    while (us == UpstreamStatus::ok && done < amount) {
      const std::size_t n = std::min(amount - done, unit_cap);
      us = up.map(reinterpret_cast<void*>(at + done), n);
      ledger.device_map();
      if (us == UpstreamStatus::ok) {
        seg->units.emplace(at + done, n);
        done += n;
      }
    }
    if (us != UpstreamStatus::ok && done != 0) {
      // Fresh and recycled units only, but the rule stays simple: nothing goes back to the
      // upstream while a GPU-side wait may still run (the out-of-memory path: a wait is cheap).
      if (batches.has_ordered()) settle_ordered();
      up.unmap(reinterpret_cast<void*>(at), done);
      ledger.device_unmap();
      seg->units.erase(seg->units.lower_bound(at), seg->units.lower_bound(at + done));
    }
    if (us == UpstreamStatus::ok) placed += amount;
    return us;
  };
  auto map_piece = [&](Block* u, std::size_t amount, bool back) REQUIRES(mu) -> Block* {
    const std::uintptr_t at = back ? u->ptr + u->size - amount : u->ptr;
    const std::int64_t t0 = now_ns();
    UpstreamStatus us = fill(at, amount);
    const std::int64_t dt = now_ns() - t0;
    ledger.upstream_time(dt);
    if (us != UpstreamStatus::ok) {
      if (us == UpstreamStatus::out_of_memory) {
        emit(EventKind::oom, at, amount, amount, stream, dt);
        req.refused(us);
      }
      failed = us;
      return nullptr;  // pages mapped so far stay as free blocks: nothing is inconsistent
    }
    if (amount < u->size) {  // split the hole: the mapped piece and the unmapped rest
      Block* rest = store.block_pool.get();
      rest->seg = seg;
      rest->state = BState::unmapped;
      if (back) {  // rest = the front, before u
        rest->ptr = u->ptr;
        rest->size = u->size - amount;
        rest->prev = u->prev;
        rest->next = u;
        if (u->prev != nullptr)
          u->prev->next = rest;
        else
          seg->head = rest;
        u->prev = rest;
        u->ptr = at;
      } else {
        rest->ptr = u->ptr + amount;
        rest->size = u->size - amount;
        rest->prev = u;
        rest->next = u->next;
        if (u->next != nullptr) u->next->prev = rest;
        u->next = rest;
      }
      u->size = amount;
    }
    u->state = BState::local;  // mapped now; insert_free below gives it its real place
    count_runs_change(u, +1);
    seg->mapped += amount;
    ledger.pages_mapped(small, amount);
    note_reserved();
    emit(EventKind::segment_map, u->ptr, amount, amount, stream, dt);
    u->epoch = 0;
    // Aliased pages keep their order: until it completed, old work may use them at their old
    // address, so they must not be given back or moved (a further alias is fine).
    u->hot = std::max(u->hot, alias_hot);
    // Fresh (or recycled: cold) memory no stream has pending work on is shared at once, as a
    // classic segment is, so other streams split what this request leaves of it. Next to a free
    // block local to this stream it joins that block instead (local absorbs shared), so growth
    // beside it makes one run.
    auto own = [&](const Block* n) { return n != nullptr && n->state == BState::local && n->owner == stream; };
    if (own(u->prev) || own(u->next))
      store.insert_free(u, BState::local, stream, stream_free->sets[k]);
    else
      store.insert_free(u, BState::shared, 0, store.shared[k]);
    return u;
  };

  if (plan.hole != nullptr) {
    Block* cur = map_piece(plan.hole, plan.to_map, /*back=*/true);
    if (cur == nullptr) return failed;
    *out = cur;
    return UpstreamStatus::ok;
  }
  Block* cur = plan.start;  // the block that grows to cover the request
  while (cur->state == BState::unmapped || cur->size < rounded) {
    Block* u = cur->state == BState::unmapped ? cur : cur->next;                  // the next hole to fill
    if (u == nullptr || u->state != BState::unmapped) return UpstreamStatus::ok;  // cannot happen
    const std::size_t have = cur->state == BState::unmapped ? 0 : cur->size;
    cur = map_piece(u, std::min(u->size, round_up(rounded - have, g)), /*back=*/false);
    if (cur == nullptr) return failed;
  }
  *out = cur;
  return UpstreamStatus::ok;
}

std::pair<std::uintptr_t, std::uintptr_t> DevicePool::Impl::unit_span(const Segment* seg, std::uintptr_t lo,
                                                                      std::uintptr_t hi) const {
  auto it = seg->units.lower_bound(lo);
  if (it == seg->units.end()) return {lo, lo};
  const std::uintptr_t first = it->first;
  std::uintptr_t end = first;
  // Units tile a mapped run, so they follow one another without gaps.
  for (; it != seg->units.end() && it->first == end && it->first + it->second <= hi; ++it) end += it->second;
  return {first, end};
}

// Bytes of whole units inside a free block of an expandable segment.
std::size_t DevicePool::Impl::releasable_pages(const Block* b) const {
  if (!b->seg->expandable) return 0;
  const auto [lo, hi] = unit_span(b->seg, b->ptr, b->ptr + b->size);
  return hi - lo;
}

// b: a shared free block of an expandable segment. Its whole units become unmapped; the parts
// of units at either end stay mapped as (smaller) shared free blocks.
void DevicePool::Impl::release_pages(Block* b, std::vector<Detached>& out) {
  const auto [lo, hi] = unit_span(b->seg, b->ptr, b->ptr + b->size);
  if (hi > lo) release_page_range(b, lo, hi, out);
}

DevicePool::Impl::Block* DevicePool::Impl::release_page_range(Block* b, std::uintptr_t lo, std::uintptr_t hi,
                                                              std::vector<Detached>& out,
                                                              std::vector<detail::Unit>* units_out, bool drain) {
  if (hi <= lo) return nullptr;
  const std::size_t bytes = hi - lo;
  Segment* seg = b->seg;
  const int k = detail::kind_index(seg->small);
  store.shared[k].erase(b);
  if (b->is_split()) store.count_inactive_split(b, -1);
  auto cut_after = [&](Block* x, std::uintptr_t at) REQUIRES(mu) {  // split x at address `at`, return the back
    Block* r = store.block_pool.get();
    r->ptr = at;
    r->size = x->ptr + x->size - at;
    r->seg = seg;
    r->state = x->state;
    r->hot = x->hot;  // both halves of a hot block stay hot
    r->prev = x;
    r->next = x->next;
    if (x->next != nullptr) x->next->prev = r;
    x->next = r;
    x->size = at - x->ptr;
    return r;
  };
  Block* head = nullptr;
  Block* mid = b;
  if (b->ptr < lo) {
    head = b;
    mid = cut_after(b, lo);
  }
  Block* tail = (mid->ptr + mid->size > hi) ? cut_after(mid, hi) : nullptr;
  for (auto it = seg->units.lower_bound(lo); it != seg->units.end() && it->first < hi;) {
    if (units_out != nullptr) units_out->push_back(detail::Unit{it->first, it->second});
    it = seg->units.erase(it);
  }
  count_runs_change(mid, -1);
  mid->state = drain ? BState::draining : BState::unmapped;
  mid->requested = 0;
  seg->mapped -= bytes;
  ledger.pages_unmapped(seg->small, bytes);
  if (!drain) merge_unmapped(mid);
  if (head != nullptr) store.insert_free(head, BState::shared, 0, store.shared[k]);
  if (tail != nullptr) store.insert_free(tail, BState::shared, 0, store.shared[k]);
  if (!drain) out.push_back(Detached{lo, bytes, true});
  return mid;
}

// Teardown: every mapped run is unmapped, then the reservation is returned.
void DevicePool::Impl::destroy_expandable(Segment* seg) {
  Block* b = seg->head;
  while (b != nullptr) {
    if (!b->mapped()) {
      b = b->next;
      continue;
    }
    const std::uintptr_t start = b->ptr;
    std::uintptr_t end = start;
    while (b != nullptr && b->mapped()) {
      end = b->ptr + b->size;
      b = b->next;
    }
    up.unmap(reinterpret_cast<void*>(start), end - start);
    ledger.device_unmap();
  }
  seg->units.clear();
  up.unreserve(reinterpret_cast<void*>(seg->base), seg->size);
}

}  // namespace cudapool
