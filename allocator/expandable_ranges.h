// Internal: the state of the expandable ranges; pool_expandable.cpp has the rules (placement,
// physical units, recycling, aliasing). One reserved range per pool kind, the high-water mark
// that growth is measured against, the ranges whose pages were aliased elsewhere and wait for
// their old mapping to go, and whether the upstream can alias at all. The pool lock guards it, as
// everything else in the pool.
#pragma once
#include <cstddef>
#include <vector>

#include "allocator/blocks.h"

namespace cudapool::detail {

struct ExpandableRanges {
  // A range whose pages were aliased into a growth (Upstream::alias): a draining block, waiting
  // for the GPU-side wait that made its pages hot (Block::hot) to complete.
  struct Drain {
    Block* b;              // the draining block (never merged or split while it drains)
    bool dropped = false;  // its old mapping is gone (Upstream::unalias): it may become a hole
  };

  Segment* seg[2] = {nullptr, nullptr};  // the range of each pool kind (kind_index), once reserved
  // The most bytes ever reserved (not reset by reset_peak_stats). Growth beyond it is what
  // recycling, aliasing and the waits avoid.
  std::size_t hwm = 0;
  std::vector<Drain> draining;
  bool alias_ok = false;  // the upstream can alias (asked when the first range is reserved)
  // Bytes of pages that the range of kind k gave to the other range's growth and the other has
  // not given back. Growth of kind k that would take them back maps fresh pages instead (the
  // bounce rule, pool_expandable.cpp), so the same pages do not move to and fro.
  std::size_t lent[2] = {0, 0};

  void note_reserved(std::size_t reserved) {
    if (reserved > hwm) hwm = reserved;
  }
  // `bytes` of pages moved from the range of kind `from` into the other one: first they repay
  // what the other range had lent, the rest is lent by `from`.
  void moved_across(int from, std::size_t bytes) {
    std::size_t& repaid = lent[1 - from];
    const std::size_t r = bytes < repaid ? bytes : repaid;
    repaid -= r;
    lent[from] += bytes - r;
  }
  // The context is gone: its ranges went with it (the high-water mark stays a fact of the past).
  void forget() {
    seg[0] = seg[1] = nullptr;
    draining.clear();
    lent[0] = lent[1] = 0;
  }
};

}  // namespace cudapool::detail
