// Internal: the pool's memory map. A Segment is one upstream allocation (or one expandable
// range); its Blocks tile it in address order. Free blocks sit in free sets ordered by
// (size, address): one shared set per pool kind, one local set per pool kind per stream
// (StreamFree). These are plain data; the rules that move blocks between states are the block
// store's (block_store.h: take / insert_free) and reuse's (reuse.h: every freed block's state).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>

#include "allocator/fence.h"
#include "allocator/node_pool.h"
#include "allocator/types.h"

namespace cudapool::detail {

// unmapped: address space of an expandable segment with no pages behind it (in no set).
// draining: address space whose pages were aliased to another place (Upstream::alias) while old
//   work may still use them here; in no set, not reusable, unmapped once that work completed
//   (ExpandableRanges::draining).
// tcache: checked out to a thread cache (thread_cache.h): in no set, not in `live`.
enum class BState : std::uint8_t { allocated, pending, local, shared, retiring, unmapped, draining, tcache };

struct Segment;

struct Block {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // allocated/pending: what the caller asked for; else 0
  Segment* seg = nullptr;
  Block* prev = nullptr;  // address neighbours inside the segment
  Block* next = nullptr;
  Block* link = nullptr;      // next block of the same batch (pending / retiring)
  StreamId owner = 0;         // allocated/pending: allocation stream; local: the stream it is local to
  std::uint64_t epoch = 0;    // local: free stamp; promoted by a stream fence recorded at >= epoch
  std::uint64_t gc_base = 0;  // pool searches counter when the block was last cached (GC age)
  // Free memory handed out under a GPU-side wait (Impl::order_device_batches) whose fence may
  // still run, or pages a stream's growth aliased from its own free blocks: the order's sequence
  // number (0 = none). While FenceBatches::order_done() is below it, old work may still touch the
  // block: it may be reused, but its pages may not be unmapped or moved.
  std::uint64_t hot = 0;
  BState state = BState::shared;
  bool is_split() const { return prev != nullptr || next != nullptr; }
  bool mapped() const { return state != BState::unmapped && state != BState::draining; }
};

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  Block* head = nullptr;
  StreamId stream = 0;  // stream of the allocation that created it (snapshot only)
  bool small = false;
  bool expandable = false;  // a reserved range grown by mapping pages (expandable_ranges.cpp)
  std::size_t mapped = 0;   // expandable: bytes with pages behind them
  std::size_t page = 0;     // expandable: the unit of mapping (Limits::page_bytes)
  // expandable: the physical allocations behind the mapped bytes, base -> size. Each is one
  // Upstream::map() (whole pages, up to PoolOptions::expandable_max_unit) and can only be
  // unmapped or moved whole: the driver cannot split a physical allocation. They tile every
  // mapped run exactly (check() verifies it).
  std::map<std::uintptr_t, std::size_t> units;
  bool holds(std::uintptr_t p) const { return p >= base && p - base < size; }
};

// A physical allocation taken out of a range for recycling (expandable_ranges.cpp).
struct Unit {
  std::uintptr_t base;
  std::size_t size;
  bool used = false;  // moved into the growth already
};

// A physical allocation chosen to be aliased into a growth: still mapped and still part of its
// block until the alias is made (expandable_ranges.cpp). Either a unit of a hot shared free block
// (Block::hot) or, `own`, of a free block local to the growth's own stream, whose old mapping
// drains on a fence recorded on that stream (Growth::own_order).
struct HotUnit {
  Segment* seg;
  std::uintptr_t base;
  std::size_t size;
  bool own = false;
  bool used = false;  // aliased, or given up
};

// b swallows its address neighbour n (b->prev or b->next, in no free set): b covers both, n
// leaves the segment's block list and goes back to the caller, which recycles it. The one
// splice of every merge: free blocks (BlockStore::insert_free) and holes of an expandable range
// (ExpandableRanges::merge_unmapped).
inline void absorb_neighbour(Block* b, Block* n) {
  if (n == b->prev) {
    b->ptr = n->ptr;
    b->prev = n->prev;
    if (n->prev != nullptr)
      n->prev->next = b;
    else
      b->seg->head = b;
  } else {
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
  }
  b->size += n->size;
}

// The block containing p (p must lie in seg): a walk, for the slow paths only.
inline Block* block_at(Segment* seg, std::uintptr_t p) {
  for (Block* b = seg->head; b != nullptr; b = b->next)
    if (p < b->ptr + b->size) return b;
  return nullptr;
}

struct BySizeAddr {
  using is_transparent = void;
  struct Key {
    std::size_t size;
    std::uintptr_t ptr;
  };
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }
  bool operator()(const Block* a, const Key& k) const { return a->size != k.size ? a->size < k.size : a->ptr < k.ptr; }
  bool operator()(const Key& k, const Block* b) const { return k.size != b->size ? k.size < b->size : k.ptr < b->ptr; }
};
using FreeSet = std::set<Block*, BySizeAddr, ArenaAllocator<Block*>>;

// Takes b out of `set` if it is there. One search: std::set::erase(key) looks for the range of
// equal keys (a second descent) although (size, address) is unique; merges and promotions erase
// on every free.
inline void erase_block(FreeSet& set, Block* b) {
  if (auto it = set.find(b); it != set.end()) set.erase(it);
}

// Index of a pool kind into the per-kind arrays: 0 small, 1 large.
inline int kind_index(bool small) { return small ? 0 : 1; }

struct StreamFree {
  StreamId id;
  FreeSet sets[2];
  FenceHandle promo_fence = 0;    // outstanding fence on this stream, 0 = none
  std::uint64_t promo_epoch = 0;  // local blocks with epoch <= this are covered by promo_fence
  std::uint64_t promo_miss = 0;   // Reuse's miss count when promo_fence was recorded
  StreamFree(StreamId s, NodeArena* arena)
      : id(s),
        sets{FreeSet(BySizeAddr{}, ArenaAllocator<Block*>(arena)),
             FreeSet(BySizeAddr{}, ArenaAllocator<Block*>(arena))} {}
  bool empty() const { return sets[0].empty() && sets[1].empty(); }
};

struct Fit {
  FreeSet* set = nullptr;
  FreeSet::iterator it{};
  explicit operator bool() const { return set != nullptr; }
};

// A segment taken out of the pool's structures, to be handed back to the upstream (possibly
// with the lock dropped).
struct Detached {
  std::uintptr_t base;
  std::size_t size;
  bool unmap = false;  // pages of an expandable segment (Upstream::unmap), else a whole segment
};

}  // namespace cudapool::detail
