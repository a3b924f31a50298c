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
// becomes a draining block and loses its mapping when the wait completed (drop_aliases). The
// same holds for the free pages of the growing stream's own blocks (stream-ordered frees): its new
// work is ordered after its old work by the stream itself, so they are aliased at once instead of
// the host waiting for the stream; the growth stays local to that stream, and the old address
// drains on a fence recorded on it (Growth::own_order).
#include <algorithm>
#include <bit>

#include "allocator/expandable_ranges.h"

namespace cudapool::detail {

namespace {
std::uintptr_t round_up(std::uintptr_t v, std::size_t g) { return (v + g - 1) / g * g; }

// Candidates (whole units' bytes, block) appended to `out` fewest bytes first, the lowest
// address on a tie: small free islands between live blocks are the least useful mapped memory;
// large free runs serve later large requests without any driver call.
void append_fewest_first(std::vector<std::pair<std::size_t, Block*>>& ranked, std::vector<Block*>& out) {
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second->ptr < b.second->ptr;
  });
  for (const auto& [r, b] : ranked) out.push_back(b);
}
}  // namespace

// Segment count bookkeeping: `piece` is a block that just became mapped (sign +1) or is about to
// become unmapped (sign -1), not yet merged with its neighbours.
void ExpandableRanges::count_runs_change(Block* piece, int sign) {
  int delta = 1;
  if (piece->prev != nullptr && piece->prev->mapped()) --delta;
  if (piece->next != nullptr && piece->next->mapped()) --delta;
  ledger_.runs_changed(piece->seg->small, sign * delta);
}

void ExpandableRanges::merge_unmapped(Block* b) {
  Block* n;
  while ((n = b->prev) != nullptr && n->state == BState::unmapped) {
    absorb_neighbour(b, n);
    store_.recycle_block(n);
  }
  while ((n = b->next) != nullptr && n->state == BState::unmapped) {
    absorb_neighbour(b, n);
    store_.recycle_block(n);
  }
}

// Every hole is a candidate in two ways: forward (the free block before it, usable by
// `stream`, plus as many of the hole's first pages as needed, and on through later holes and
// free blocks: the original rule) and backward (the hole's LAST pages joined to the usable free
// block after it). The candidate needing the fewest new bytes wins, the lowest address on a tie:
// a hole between two free blocks left by earlier frees or recycling costs a page or two where
// the first hole that fits may cost the whole request.
GrowPlan ExpandableRanges::plan(Segment* seg, std::size_t rounded, StreamId stream) {
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

std::size_t ExpandableRanges::recycle_candidates(const Segment* seg, const GrowPlan& plan, std::uint64_t order_done,
                                                 std::vector<Block*>& out, std::size_t* hot_bytes,
                                                 std::size_t* own_bytes, std::vector<Block*>* hot_out) const {
  std::size_t total = 0;
  *hot_bytes = 0;
  *own_bytes = 0;
  std::vector<std::pair<std::size_t, Block*>> ranked, hot_ranked;  // (releasable bytes, block): computed once
  for (int k = 0; k < 2; ++k) {
    // Pages move between the two ranges only when they have the same page size: a page is one
    // physical allocation upstream, which cannot be split, and merging small ones into a large
    // page would break the whole-page promise made at reserve().
    if (range_of_[k] == nullptr || range_of_[k]->page != seg->page) continue;
    const FreeSet& set = store_.shared_set(k == 0);
    // Blocks smaller than a page hold no whole page.
    for (auto it = set.lower_bound(BySizeAddr::Key{range_of_[k]->page, 0}); it != set.end(); ++it) {
      Block* b = *it;
      if (!b->seg->expandable) continue;
      if (b->seg == seg && b->ptr < plan.keep_hi && b->ptr + b->size > plan.keep_lo) continue;
      const std::size_t r = releasable_pages(b);
      if (b->hot > order_done) {  // old work may still use it: reusable in place, not movable (only aliased)
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
  append_fewest_first(ranked, out);
  if (hot_out != nullptr) append_fewest_first(hot_ranked, *hot_out);
  return total;
}

std::size_t ExpandableRanges::own_candidates(const Segment* seg, const GrowPlan& plan, StreamId stream,
                                             std::vector<Block*>& out) const {
  const StreamFree* stream_free = store_.stream_find(stream);
  if (stream_free == nullptr || stream_free->empty()) return 0;
  std::vector<std::pair<std::size_t, Block*>> ranked;
  std::size_t total = 0;
  for (int k = 0; k < 2; ++k) {
    if (range_of_[k] == nullptr || range_of_[k]->page != seg->page) continue;  // as recycle_candidates
    const FreeSet& set = stream_free->sets[k];
    for (auto it = set.lower_bound(BySizeAddr::Key{range_of_[k]->page, 0}); it != set.end(); ++it) {
      Block* b = *it;
      if (!b->seg->expandable) continue;
      if (b->seg == seg && b->ptr < plan.keep_hi && b->ptr + b->size > plan.keep_lo) continue;
      const std::size_t r = releasable_pages(b);
      if (r == 0) continue;
      ranked.emplace_back(r, b);
      total += r;
    }
  }
  append_fewest_first(ranked, out);
  return total;
}

std::size_t ExpandableRanges::pick_hot_units(const std::vector<Block*>& cands, std::size_t want,
                                             std::vector<HotUnit>& out) const {
  std::size_t got = 0;
  for (Block* b : cands) {
    if (got >= want) break;
    const auto [lo, hi] = unit_span(b->seg, b->ptr, b->ptr + b->size);
    const bool own = b->state == BState::local;
    for (auto it = b->seg->units.lower_bound(lo); it != b->seg->units.end() && it->first < hi && got < want; ++it) {
      out.push_back(HotUnit{b->seg, it->first, it->second, own});
      got += it->second;
    }
  }
  return got;
}

void ExpandableRanges::drop_aliases(std::uint64_t order_done) {
  for (Drain& d : draining_) {
    if (d.dropped || d.b->hot > order_done) continue;
    const std::int64_t t0 = now_ns();
    up_.unalias(reinterpret_cast<void*>(d.b->ptr), d.b->size);
    ledger_.upstream_time(now_ns() - t0);
    ledger_.device_unmap();
    d.dropped = true;
  }
}

void ExpandableRanges::reclaim_drained() {
  std::size_t keep = 0;
  for (const Drain& d : draining_) {
    if (!d.dropped) {
      draining_[keep++] = d;
      continue;
    }
    // Later entries are still draining while this one merges: merging never takes them.
    d.b->state = BState::unmapped;
    merge_unmapped(d.b);
  }
  draining_.resize(keep);
}

std::size_t ExpandableRanges::recycle_pages(const std::vector<Block*>& cands, std::size_t want,
                                            std::vector<Unit>& out) {
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
std::size_t ExpandableRanges::bounce_allowance(const Segment* seg, std::size_t short_by) const {
  const int k = kind_index(seg->small);
  const Segment* other = range_of_[1 - k];
  if (other == nullptr || other->page != seg->page) return 0;
  return std::min({short_by, lent_[k], other->mapped});
}

// Mapping is free below the high-water mark, and below the live peak plus the headroom (a bound
// that does not move with the pool's own mapping, so growth into it cannot ratchet).
std::size_t ExpandableRanges::growth_cap() const {
  const auto live_peak = static_cast<double>(ledger_.allocated_peak());
  return std::max(hwm_, static_cast<std::size_t>(live_peak * (1.0 + opt_.expandable_headroom)));
}

// Within the slack (PoolOptions::expandable_slack says why) growth past the cap still recycles
// free pages whose fences have passed, but asks no fence: no GPU-side wait, no host wait. The
// slack sits on the live peak, not on the high-water mark, so growth into it cannot ratchet.
bool ExpandableRanges::growth_within_slack(std::size_t rounded, bool small) const {
  if (limits_.granularity() == 0 || opt_.expandable_slack == 0) return false;
  const std::size_t reserved = ledger_.reserved_bytes();
  const std::size_t need = round_up(rounded, limits_.page_bytes(small, opt_));
  const auto live_peak = static_cast<double>(ledger_.allocated_peak());
  const auto bound = static_cast<std::size_t>(live_peak * (1.0 + opt_.expandable_headroom)) + opt_.expandable_slack;
  return reserved + need <= bound && limits_.admits(reserved, need);
}

std::pair<std::uintptr_t, std::uintptr_t> ExpandableRanges::unit_span(const Segment* seg, std::uintptr_t lo,
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
std::size_t ExpandableRanges::releasable_pages(const Block* b) const {
  if (!b->seg->expandable) return 0;
  const auto [lo, hi] = unit_span(b->seg, b->ptr, b->ptr + b->size);
  return hi - lo;
}

// b: a shared free block of an expandable segment. Its whole units become unmapped; the parts
// of units at either end stay mapped as (smaller) shared free blocks.
void ExpandableRanges::release_pages(Block* b, std::vector<Detached>& out) {
  const auto [lo, hi] = unit_span(b->seg, b->ptr, b->ptr + b->size);
  if (hi > lo) release_page_range(b, lo, hi, out);
}

Block* ExpandableRanges::release_page_range(Block* b, std::uintptr_t lo, std::uintptr_t hi, std::vector<Detached>& out,
                                            std::vector<Unit>* units_out, bool drain) {
  if (hi <= lo) return nullptr;
  const std::size_t bytes = hi - lo;
  Segment* seg = b->seg;
  const BState state = b->state;  // shared, or (drain) local to `owner`
  const StreamId owner = state == BState::local ? b->owner : 0;
  FreeSet& set = store_.set_of(b);
  erase_block(set, b);
  if (b->is_split()) store_.count_inactive_split(b, -1);
  auto cut_after = [&](Block* x, std::uintptr_t at) {  // split x at address `at`, return the back
    Block* r = store_.new_block();
    r->ptr = at;
    r->size = x->ptr + x->size - at;
    r->seg = seg;
    r->state = x->state;
    r->hot = x->hot;      // both halves of a hot block stay hot
    r->epoch = x->epoch;  // and of a local one wait for the same stream fence
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
    if (units_out != nullptr) units_out->push_back(Unit{it->first, it->second});
    it = seg->units.erase(it);
  }
  count_runs_change(mid, -1);
  mid->state = drain ? BState::draining : BState::unmapped;
  mid->requested = 0;
  seg->mapped -= bytes;
  ledger_.pages_unmapped(seg->small, bytes);
  if (!drain) merge_unmapped(mid);
  if (head != nullptr) store_.insert_free(head, state, owner, set);
  if (tail != nullptr) store_.insert_free(tail, state, owner, set);
  if (!drain) out.push_back(Detached{lo, bytes, true});
  return mid;
}

// Teardown: every mapped run is unmapped, then the reservation is returned.
void ExpandableRanges::destroy(Segment* seg) {
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
    up_.unmap(reinterpret_cast<void*>(start), end - start);
    ledger_.device_unmap();
  }
  seg->units.clear();
  up_.unreserve(reinterpret_cast<void*>(seg->base), seg->size);
}

}  // namespace cudapool::detail

namespace cudapool::detail {

Segment* ExpandableRanges::range_for(bool small, StreamId stream) {
  const int k = kind_index(small);
  if (range_of_[k] != nullptr) return range_of_[k];
  // About 9/8 of the device, like PyTorch: the mapped part can never fill the range, and one
  // range per pool kind keeps address space use bounded however many streams there are.
  const std::size_t g = limits_.page_bytes(small, opt_);
  const std::size_t total = limits_.device_total();
  const std::size_t bytes = round_up(total + total / 8 + g, g);
  void* base = nullptr;
  if (up_.reserve(bytes, g, &base) != UpstreamStatus::ok) return nullptr;  // classic segments instead
  Segment* range = store_.add_segment(reinterpret_cast<std::uintptr_t>(base), bytes, small, stream);
  range->expandable = true;
  range->page = g;
  range->head->state = BState::unmapped;
  range_of_[k] = range;
  alias_ok_ = up_.can_alias();
  return range;
}

// Upstream::move: the same physical memory at a new address, a contiguous run of spare units
// in one call. The source is gone either way.
UpstreamStatus ExpandableRanges::move_spare(Growth& growth, std::uintptr_t at, std::size_t amount, std::size_t* done) {
  std::vector<Unit>& spare = growth.spare;
  UpstreamStatus us = UpstreamStatus::ok;
  for (std::size_t i = 0; i < spare.size() && *done < amount && us == UpstreamStatus::ok;) {
    if (spare[i].used || spare[i].size > amount - *done) {
      ++i;
      continue;
    }
    const std::uintptr_t from = spare[i].base;
    std::size_t n = 0, j = i;
    for (; j < spare.size() && !spare[j].used && spare[j].base == from + n && n + spare[j].size <= amount - *done; ++j)
      n += spare[j].size;
    const std::int64_t t0 = now_ns();
    us = up_.move(reinterpret_cast<void*>(from), reinterpret_cast<void*>(at + *done), n);
    ledger_.device_map();
    ledger_.device_unmap();
    events_.emit(EventKind::segment_unmap, from, n, n, 0, now_ns() - t0);  // the source is gone either way
    for (std::size_t q = i; q < j; ++q) {
      spare[q].used = true;
      if (us != UpstreamStatus::ok) continue;
      growth.seg->units.emplace(at + *done + (spare[q].base - from), spare[q].size);
      if (!growth.seg->holds(spare[q].base)) moved_across(1 - growth.kind, spare[q].size);  // from the other range
    }
    if (us == UpstreamStatus::ok) *done += n;
    i = j;
  }
  return us;
}

// The pages of hot free blocks, aliased (Upstream::alias): a contiguous run of one block per
// call. A failed alias leaves the pages where they are; fresh ones are mapped for the rest.
UpstreamStatus ExpandableRanges::alias_hot_units(Growth& growth, std::uintptr_t at, std::size_t amount,
                                                 std::size_t* done) {
  std::vector<HotUnit>& hot_units = growth.hot_units;
  std::vector<Detached> none;  // a draining range detaches nothing now
  for (std::size_t i = 0; i < hot_units.size() && *done < amount;) {
    HotUnit& h = hot_units[i];
    if (h.used || h.size > amount - *done) {
      ++i;
      continue;
    }
    std::size_t n = 0, j = i;
    for (; j < hot_units.size() && !hot_units[j].used && hot_units[j].seg == h.seg && hot_units[j].own == h.own &&
           hot_units[j].base == h.base + n && n + hot_units[j].size <= amount - *done;
         ++j)
      n += hot_units[j].size;
    Block* src = block_at(h.seg, h.base);
    // Still the free block it was when picked: shared, or (own) local to the growing stream.
    const bool in_state = src != nullptr && (h.own ? src->state == BState::local && src->owner == growth.stream
                                                   : src->state == BState::shared);
    const bool intact = in_state && src->ptr + src->size >= h.base + n;
    const std::int64_t t0 = now_ns();
    const UpstreamStatus ua = intact
                                  ? up_.alias(reinterpret_cast<void*>(h.base), reinterpret_cast<void*>(at + *done), n)
                                  : UpstreamStatus::error;
    for (std::size_t q = i; q < j; ++q) hot_units[q].used = true;
    if (ua == UpstreamStatus::ok) {
      ledger_.device_map();
      ledger_.device_alias();
      Block* old = release_page_range(src, h.base, h.base + n, none, nullptr, /*drain=*/true);
      draining_.push_back(Drain{old});
      if (h.own) {
        old->hot = std::max(old->hot, growth.own_order);  // drains once the stream's fence completed
        growth.alias_own = true;
      }
      growth.alias_hot = std::max(growth.alias_hot, old->hot);
      events_.emit(EventKind::segment_unmap, h.base, n, n, 0, now_ns() - t0);  // gone from the pool's view
      for (std::size_t q = i; q < j; ++q)
        growth.seg->units.emplace(at + *done + (hot_units[q].base - h.base), hot_units[q].size);
      *done += n;
    }
    i = j;
  }
  return UpstreamStatus::ok;
}

std::vector<Detached> ExpandableRanges::take_unusable(Growth& growth, std::size_t left, std::size_t later) {
  std::vector<Detached> unusable;
  std::size_t kept = 0;
  for (Unit& u : growth.spare) {
    if (u.used) continue;
    if (u.size > left) {
      u.used = true;
      unusable.push_back(Detached{u.base, u.size, true});
    } else {
      kept += u.size;
    }
  }
  while (kept > later) {
    Unit* smallest = nullptr;
    for (Unit& u : growth.spare)
      if (!u.used && (smallest == nullptr || u.size < smallest->size)) smallest = &u;
    smallest->used = true;
    unusable.push_back(Detached{smallest->base, smallest->size, true});
    kept -= smallest->size;
  }
  return unusable;
}

std::size_t ExpandableRanges::max_unit(const Segment* range, std::size_t amount) const {
  std::size_t want = opt_.expandable_max_unit;
  if (opt_.expandable_unit_share != 0) {
    const std::size_t after = ledger_.reserved_bytes() + amount;
    want = std::min(want, std::bit_floor(std::max<std::size_t>(after / opt_.expandable_unit_share, 1)));
  }
  return want <= range->page ? range->page : want / range->page * range->page;
}

UpstreamStatus ExpandableRanges::map_fresh(Growth& growth, std::uintptr_t at, std::size_t amount, std::size_t* done) {
  const std::size_t unit_cap = max_unit(growth.seg, amount);
  UpstreamStatus us = UpstreamStatus::ok;
  while (us == UpstreamStatus::ok && *done < amount) {
    const std::size_t n = std::min(amount - *done, unit_cap);
    us = up_.map(reinterpret_cast<void*>(at + *done), n);
    ledger_.device_map();
    if (us == UpstreamStatus::ok) {
      growth.seg->units.emplace(at + *done, n);
      *done += n;
    }
  }
  return us;
}

void ExpandableRanges::unmap_placed(Segment* range, std::uintptr_t at, std::size_t done) {
  up_.unmap(reinterpret_cast<void*>(at), done);
  ledger_.device_unmap();
  range->units.erase(range->units.lower_bound(at), range->units.lower_bound(at + done));
}

void ExpandableRanges::split_hole(Block* u, std::size_t amount, bool back) {
  if (amount >= u->size) return;
  Block* rest = store_.new_block();
  rest->seg = u->seg;
  rest->state = BState::unmapped;
  rest->size = u->size - amount;
  if (back) {  // rest = the front, before u
    rest->ptr = u->ptr;
    rest->prev = u->prev;
    rest->next = u;
    if (u->prev != nullptr)
      u->prev->next = rest;
    else
      u->seg->head = rest;
    u->prev = rest;
    u->ptr += rest->size;
  } else {
    rest->ptr = u->ptr + amount;
    rest->prev = u;
    rest->next = u->next;
    if (u->next != nullptr) u->next->prev = rest;
    u->next = rest;
  }
  u->size = amount;
}

Block* ExpandableRanges::add_mapped(Block* u, std::size_t amount, StreamId stream, std::uint64_t alias_hot,
                                    bool alias_own, std::int64_t ns) {
  Segment* range = u->seg;
  u->state = BState::local;  // mapped now; insert_free below gives it its real place
  count_runs_change(u, +1);
  range->mapped += amount;
  ledger_.pages_mapped(range->small, amount);
  note_reserved();
  events_.emit(EventKind::segment_map, u->ptr, amount, amount, stream, ns);
  u->epoch = 0;
  // Aliased pages keep their order: until it completed, old work may use them at their old
  // address, so they must not be given back or moved (a further alias is fine).
  u->hot = std::max(u->hot, alias_hot);
  // Fresh (or recycled: cold) memory no stream has pending work on is shared at once, as a
  // classic segment is, so other streams split what this request leaves of it. Next to a free
  // block local to this stream it joins that block instead (local absorbs shared), so growth
  // beside it makes one run.
  // Pages aliased from the stream's own free blocks stay its own until a fence on it recorded
  // after now completed: stamped as a free of now, which only such a fence covers.
  auto own = [&](const Block* n) { return n != nullptr && n->state == BState::local && n->owner == stream; };
  const int k = kind_index(range->small);
  if (alias_own) u->epoch = store_.epoch();
  if (alias_own || own(u->prev) || own(u->next))
    store_.insert_free(u, BState::local, stream, store_.stream_get(stream)->sets[k]);
  else
    store_.insert_free(u, BState::shared, 0, store_.shared_set(range->small));
  return u;
}

}  // namespace cudapool::detail
