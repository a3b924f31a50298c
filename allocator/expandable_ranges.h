// Internal: expandable segments, the ranges' state and rules (expandable_ranges.cpp); the order
// of a growth (plan, make room, recycle, map) is the pool's (pool_miss.cpp, grow_expandable).
// One reserved range per pool kind, the high-water mark that growth is measured against, the
// ranges whose pages were aliased elsewhere and wait for their old mapping to go, and whether the
// upstream can alias at all. The rules:
//   plan:    where a request grows, the placement that needs the fewest new pages;
//   recycle: whole free units unmapped elsewhere (recycle_candidates, recycle_pages) and moved
//            into the growth; the bounce rule between the two ranges;
//   map:     units moved, aliased or mapped fresh into a hole (move_spare, alias_hot_units,
//            map_fresh), the hole split and the pages made a free block (split_hole, add_mapped);
//   alias:   draining ranges unaliased once their order completed (drop_aliases), then merged
//            back as holes (reclaim_drained);
//   release: whole free units unmapped (release_pages, release_page_range).
// The pool lock guards it, as everything else in the pool.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "allocator/block_store.h"
#include "allocator/blocks.h"
#include "allocator/events.h"
#include "allocator/limits.h"
#include "allocator/options.h"
#include "allocator/stats_ledger.h"
#include "allocator/upstream.h"

namespace cudapool::detail {

// Where a growth goes: the placement that needs the fewest new pages.
struct GrowPlan {
  Block* start = nullptr;      // forward: the first block of the run that grows (hole or free)
  Block* hole = nullptr;       // backward: the hole whose last pages join the free block after it
  std::size_t to_map = 0;      // bytes of new pages
  std::uintptr_t keep_lo = 0;  // [keep_lo, keep_hi): the blocks used and their neighbours,
  std::uintptr_t keep_hi = 0;  // which recycling must not touch
  explicit operator bool() const { return start != nullptr || hole != nullptr; }
};

// One growth in progress (pool_miss.cpp): its range, its plan and the units it may place.
struct Growth {
  Segment* seg = nullptr;
  int kind = 0;  // kind_index of the range
  StreamId stream = 0;
  GrowPlan plan;
  std::vector<Block*> cands, hot_cands;  // recycling candidates, cold and hot
  std::vector<Block*> own_cands;         // the stream's own free blocks, to alias (can_alias)
  std::vector<Unit> spare;               // recycled units, already unmapped in the pool's structures
  std::vector<HotUnit> hot_units;        // units of hot (then own) blocks to alias, still in place
  std::size_t placed = 0;                // bytes of the plan mapped or moved into place so far
  std::uint64_t alias_hot = 0;           // the newest order whose pages the last piece aliased
  bool alias_own = false;                // the last piece aliased units of the stream's own blocks
  // The order of the stream's own units: a fence on `stream` recorded before they are aliased
  // (0 = none picked). Their old mapping drains until it completed.
  std::uint64_t own_order = 0;
  std::size_t bounced = 0;  // mapped fresh past the cap by the bounce rule
};

class ExpandableRanges {
 public:
  ExpandableRanges(const PoolOptions& opt, Upstream& up, Limits& limits, BlockStore& store, StatsLedger& ledger,
                   EventLog& events)
      : opt_(opt), up_(up), limits_(limits), store_(store), ledger_(ledger), events_(events) {}
  ExpandableRanges(const ExpandableRanges&) = delete;
  ExpandableRanges& operator=(const ExpandableRanges&) = delete;

  // A range whose pages were aliased into a growth (Upstream::alias): a draining block, waiting
  // for the GPU-side wait that made its pages hot (Block::hot) to complete.
  struct Drain {
    Block* b;              // the draining block (never merged or split while it drains)
    bool dropped = false;  // its old mapping is gone (Upstream::unalias): it may become a hole
  };

  // ---- what other concepts ask ----
  bool has_draining() const { return !draining_.empty(); }
  std::size_t draining_count() const { return draining_.size(); }
  bool drains(const Block* b) const {
    return std::any_of(draining_.begin(), draining_.end(), [&](const Drain& d) { return d.b == b; });
  }
  bool can_alias() const { return alias_ok_; }
  // A growth of kind `kind` mapped `bytes` fresh by the bounce rule: the other range keeps the
  // pages it had lent as its own from now on.
  void keep_bounced(int kind, std::size_t bytes) { lent_[kind] -= bytes; }
  // Teardown: every draining range still aliased loses its old mapping.
  void unalias_remaining() {
    for (const Drain& d : draining_)
      if (!d.dropped) up_.unalias(reinterpret_cast<void*>(d.b->ptr), d.b->size);
  }

  void note_reserved() {
    if (ledger_.reserved_bytes() > hwm_) hwm_ = ledger_.reserved_bytes();
  }
  // `bytes` of pages moved from the range of kind `from` into the other one: first they repay
  // what the other range had lent, the rest is lent by `from`.
  void moved_across(int from, std::size_t bytes) {
    std::size_t& repaid = lent_[1 - from];
    const std::size_t r = bytes < repaid ? bytes : repaid;
    repaid -= r;
    lent_[from] += bytes - r;
  }
  // The context is gone: its ranges went with it (the high-water mark stays a fact of the past).
  void forget() {
    range_of_[0] = range_of_[1] = nullptr;
    draining_.clear();
    lent_[0] = lent_[1] = 0;
  }

  // ---- growth ----
  // The range of a pool kind, reserved on first use; null when the upstream will not reserve.
  Segment* range_for(bool small, StreamId stream);
  GrowPlan plan(Segment* range, std::size_t rounded, StreamId stream);
  // The mapped total growth may reach without making room (fence work, recycling).
  std::size_t growth_cap() const;
  // true: mapping what `rounded` needs stays within the slack above the live peak, where fresh
  // pages are cheaper than a GPU-side wait (PoolOptions::expandable_slack).
  bool growth_within_slack(std::size_t rounded, bool small) const;
  // The bytes past the growth cap that growth of `range` maps fresh instead of taking back pages
  // its range lent the other one (`lent`): at most `short_by`, the part of the excess over the
  // cap that its own free pages cannot cover.
  std::size_t bounce_allowance(const Segment* range, std::size_t short_by) const;
  // The largest physical allocation a growth of `amount` bytes may map in `range` (a multiple of
  // its page). PoolOptions::expandable_unit_share scales it with the pool's reserved bytes
  // after the growth, so a pool's first large allocation still maps few units.
  std::size_t max_unit(const Segment* range, std::size_t amount) const;

  // ---- recycling ----
  // Shared free blocks of the ranges with whole pages, outside `plan`'s keep range, fewest whole
  // pages first; returns their total releasable bytes. Hot blocks (hot above `order_done`) are
  // left out; *hot_bytes = what they would have added, and they go to `hot_out` (same order)
  // when it is given. *own_bytes = the part of the total that lies in `range` itself.
  std::size_t recycle_candidates(const Segment* range, const GrowPlan& plan, std::uint64_t order_done,
                                 std::vector<Block*>& out, std::size_t* hot_bytes, std::size_t* own_bytes,
                                 std::vector<Block*>* hot_out) const;
  // Free blocks local to `stream` in the ranges (same page size as `range`) with whole units,
  // outside `plan`'s keep range, fewest whole units' bytes first; returns those bytes. Its own
  // new work is ordered after its old work, so their pages can serve its growth at a second
  // address at once, while the old address drains on a fence recorded on the stream.
  std::size_t own_candidates(const Segment* range, const GrowPlan& plan, StreamId stream,
                             std::vector<Block*>& out) const;
  // Whole units of the blocks `cands` (hot shared or own local), in order, until they hold at
  // least `want` bytes more than `out` had; returns the bytes picked.
  std::size_t pick_hot_units(const std::vector<Block*>& cands, std::size_t want, std::vector<HotUnit>& out) const;
  // Unmap at least `want` bytes (whole units) from `cands` in order; returns the bytes. The
  // units are appended to `out`, to be moved into the growth.
  std::size_t recycle_pages(const std::vector<Block*>& cands, std::size_t want, std::vector<Unit>& out);

  // ---- mapping a piece of the growth at [at, at + amount) of growth.seg ----
  // Recycled units that fit are moved there first (a contiguous run of them in one call), then
  // hot and own units aliased; *done counts the bytes placed. Errors stop the piece.
  UpstreamStatus move_spare(Growth& growth, std::uintptr_t at, std::size_t amount, std::size_t* done);
  UpstreamStatus alias_hot_units(Growth& growth, std::uintptr_t at, std::size_t amount, std::size_t* done);
  // Spare units larger than all the growth still to place (`left`) can never be used: they go
  // back now (the list to unmap), so the mapped total never passes the mark on the way. When the
  // current piece maps fresh memory next, the pieces after it need only `later` bytes: spares
  // beyond that would go back after the fresh map anyway, so the smallest go back now, until
  // what is left of them fits `later` (SIZE_MAX: the piece maps nothing fresh).
  std::vector<Detached> take_unusable(Growth& growth, std::size_t left, std::size_t later);
  UpstreamStatus map_fresh(Growth& growth, std::uintptr_t at, std::size_t amount, std::size_t* done);
  // A failed piece: the `done` bytes placed at `at` are unmapped (the caller settled the orders).
  void unmap_placed(Segment* range, std::uintptr_t at, std::size_t done);
  // The hole u keeps `amount` bytes at its front (or back) as the mapped piece; the rest stays a hole.
  void split_hole(Block* u, std::size_t amount, bool back);
  // The mapped piece u becomes a free block (local to `stream` next to its free blocks or when
  // `alias_own`: it holds pages the stream's old work may still use; else shared), counted,
  // traced (`ns`: the upstream's time).
  Block* add_mapped(Block* u, std::size_t amount, StreamId stream, std::uint64_t alias_hot, bool alias_own,
                    std::int64_t ns);

  // ---- aliased pages (docs/design.md, "Moving pages still in use") ----
  // Unalias every draining range whose order completed (order number <= order_done). Touches no
  // block structure, so it may run anywhere.
  void drop_aliases(std::uint64_t order_done);
  // Dropped draining blocks become unmapped holes, merged with their neighbours: only where no
  // caller holds a pointer to an unmapped block (the start of growth, fence service).
  void reclaim_drained();

  // ---- giving pages back ----
  // The whole units inside [lo, hi) of a mapped run: [first unit's base, last unit's end), or an
  // empty span (first == second) when no unit fits.
  std::pair<std::uintptr_t, std::uintptr_t> unit_span(const Segment* range, std::uintptr_t lo, std::uintptr_t hi) const;
  std::size_t releasable_pages(const Block* b) const;  // bytes of whole units inside free block b
  void release_pages(Block* b, std::vector<Detached>& out);
  // Unmap the whole units [lo, hi) of free block b (lo, hi unit boundaries inside b; b shared,
  // or local when `drain`; what is left of b on either side keeps its state); the units taken out
  // are appended to `units_out` when given, in address order. With `drain` the pages were aliased
  // elsewhere: the range becomes a draining block (nothing is appended to `out`: its old mapping
  // goes later, through drop_aliases). Returns the block of [lo, hi).
  Block* release_page_range(Block* b, std::uintptr_t lo, std::uintptr_t hi, std::vector<Detached>& out,
                            std::vector<Unit>* units_out = nullptr, bool drain = false);
  void destroy(Segment* range);  // teardown: every mapped run unmapped, the reservation returned

 private:
  void merge_unmapped(Block* b);
  void count_runs_change(Block* piece, int sign);

  Segment* range_of_[2] = {nullptr, nullptr};  // the range of each pool kind (kind_index), once reserved
  // The most bytes ever reserved (not reset by reset_peak_stats). Growth beyond it is what
  // recycling, aliasing and the waits avoid.
  std::size_t hwm_ = 0;
  std::vector<Drain> draining_;
  bool alias_ok_ = false;  // the upstream can alias (asked when the first range is reserved)
  // Bytes of pages that the range of kind k gave to the other range's growth and the other has
  // not given back. Growth of kind k that would take them back maps fresh pages instead (the
  // bounce rule, expandable_ranges.cpp), so the same pages do not move to and fro.
  std::size_t lent_[2] = {0, 0};

  const PoolOptions& opt_;
  Upstream& up_;
  Limits& limits_;
  BlockStore& store_;
  StatsLedger& ledger_;
  EventLog& events_;
};

}  // namespace cudapool::detail
