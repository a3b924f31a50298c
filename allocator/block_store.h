// Internal: the block store, i.e. the pool's memory map and the rules that move a block between
// its states. It owns the segments, their blocks, the free sets (one shared set per pool kind,
// one local set per pool kind per stream), the pointer map of allocated blocks, the retired
// streams and the counters that age and order free blocks. blocks.h has the data types.
//
//   find_fit / take:         best fit for a request, split by PyTorch's rules (the hot path);
//   insert_free:             a block is filed free in the state Reuse gave it (reuse.h), merged
//                            with free neighbours of its class;
//   add_segment / detach_segment: a segment enters or leaves the map.
//
// Every counter change goes through the pool's StatsLedger. The pool lock guards the store, as
// everything else in the pool (pool_impl.h); the store itself knows nothing of locks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "allocator/blocks.h"
#include "allocator/node_pool.h"
#include "allocator/options.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/stats_ledger.h"

namespace cudapool::detail {

class BlockStore {
 public:
  BlockStore(const PoolOptions& opt, StatsLedger& ledger)
      : shared_{FreeSet(BySizeAddr{}, ArenaAllocator<Block*>(&arena_)),
                FreeSet(BySizeAddr{}, ArenaAllocator<Block*>(&arena_))},
        max_split_size_(opt.max_split_size),
        max_non_split_rounding_(opt.max_non_split_rounding),
        ledger_(ledger) {}
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // ---- streams ----
  StreamFree* stream_find(StreamId s) {
    if (last_stream_free_ != nullptr && last_stream_ == s) return last_stream_free_;
    auto it = streams_.find(s);
    if (it == streams_.end()) return nullptr;
    last_stream_free_ = it->second.get();
    last_stream_ = s;
    return last_stream_free_;
  }
  StreamFree* stream_get(StreamId s) {
    if (StreamFree* stream_free = stream_find(s)) return stream_free;
    auto& slot = streams_[s];
    slot = std::make_unique<StreamFree>(s, &arena_);
    last_stream_free_ = slot.get();
    last_stream_ = s;
    return last_stream_free_;
  }
  // The stream's free sets, without touching the one-entry cache; null if it has none.
  StreamFree* stream_lookup(StreamId s) const {
    auto it = streams_.find(s);
    return it == streams_.end() ? nullptr : it->second.get();
  }
  // The stream's free sets leave the store (retire_stream: its blocks went into a batch).
  void erase_stream(StreamId s) {
    auto it = streams_.find(s);
    if (it == streams_.end()) return;
    if (last_stream_free_ == it->second.get()) last_stream_free_ = nullptr;
    streams_.erase(it);
  }
  // f(id, stream_free) for every stream with free sets, in the map's order.
  template <class F>
  void for_each_stream(F f) {
    for (auto& [sid, owned] : streams_) f(sid, owned.get());
  }
  // Retired streams (Reuse: rule 6): not seen since their retirement. A free() under
  // FreeSync::immediate of a block allocated there takes the device-fenced path instead (no
  // fence could ever be recorded on a dead stream). A later use of the same handle value means
  // CUDA reused it for a new stream: it leaves the set.
  bool is_retired(StreamId s) const { return !retired_.empty() && retired_.count(s) != 0; }
  void mark_retired(StreamId s) { retired_.insert(s); }
  void unretire(StreamId s) {
    if (!retired_.empty()) retired_.erase(s);
  }

  // ---- the free-stamp and search counters ----
  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t next_epoch() { return ++epoch_; }               // a stream-local free
  std::uint64_t searches(int k) const { return searches_[k]; }  // find_fit calls per pool kind (the GC age clock)

  // ---- storage ----
  FreeSet& shared_set(bool small) { return shared_[kind_index(small)]; }
  const FreeSet& shared_set(bool small) const { return shared_[kind_index(small)]; }
  Block* new_block() { return block_pool_.get(); }
  void recycle_block(Block* b) { block_pool_.put(b); }
  // The pointer map of allocated blocks.
  Block* find_live(std::uintptr_t p) const { return live_.find(p); }
  Block* take_live(std::uintptr_t p) { return live_.take(p); }
  void put_live(Block* b) { live_.insert(b->ptr, b); }
  const std::map<std::uintptr_t, Segment*>& segments() const { return segments_; }

  // ---- finding and taking (the hot path) ----
  bool fits_oversize_rules(std::size_t rounded, std::size_t block) const {
    const std::size_t m = max_split_size_;
    if (rounded < m && block >= m) return false;  // oversize blocks are not for small requests
    if (rounded >= m && block - rounded >= max_non_split_rounding_) return false;
    return true;
  }

  // Best fit for `rounded` on `stream`: the smaller of the stream's local candidate and the shared one.
  Fit find_fit(std::size_t rounded, StreamId stream) {
    const int k = kind_index(is_small(rounded));
    ++searches_[k];
    const BySizeAddr::Key key{rounded, 0};
    Fit best;
    FreeSet& shared_set = shared_[k];
    if (!shared_set.empty()) {
      auto it = shared_set.lower_bound(key);
      if (it != shared_set.end()) best = Fit{&shared_set, it};
    }
    if (StreamFree* stream_free = stream_find(stream)) {
      FreeSet& local_set = stream_free->sets[k];
      if (!local_set.empty()) {
        auto it = local_set.lower_bound(key);
        if (it != local_set.end() && (!best || BySizeAddr{}(*it, *best.it))) best = Fit{&local_set, it};
      }
    }
    if (best && !fits_oversize_rules(rounded, (*best.it)->size)) return Fit{};
    return best;
  }

  void count_inactive_split(Block* b, int sign) { ledger_.inactive_split_changed(b->seg->small, b->size, sign); }

  // Turn the free block at `fit` into an allocated block of `rounded` bytes for `stream`,
  // splitting off the rest when PyTorch's rules say so.
  Block* take(Fit fit, std::size_t rounded, std::size_t requested, StreamId stream) {
    Block* b = *fit.it;
    const bool small = b->seg->small;
    if (b->is_split()) count_inactive_split(b, -1);
    const std::size_t rest = b->size - rounded;
    // Small blocks and blocks of expandable segments split whenever a minimal block remains (as
    // PyTorch's allocator does under expandable_segments): an expandable segment's free tail
    // joins whatever frees next to it, so it is memory the pool can use again, not a fragment.
    // A large block of a classic segment keeps tails of up to 1 MiB and is not split at or past
    // max_split_size, so that such segments are not cut into pieces too small for large requests.
    const bool split = (small || b->seg->expandable) ? rest >= kMinBlockSize
                                                     : (rounded < max_split_size_ && rest > kSmallSize);
    if (split) {
      // The remainder keeps b's place in the same set: same class, larger address.
      Block* r = block_pool_.get();
      r->ptr = b->ptr + rounded;
      r->size = rest;
      r->seg = b->seg;
      r->prev = b;
      r->next = b->next;
      if (b->next != nullptr) b->next->prev = r;
      b->next = r;
      r->state = b->state;
      r->owner = b->owner;
      r->epoch = b->epoch;
      r->gc_base = b->gc_base;
      r->hot = b->hot;
      auto hint = fit.set->erase(fit.it);  // before b->size changes: the set is ordered by size
      b->size = rounded;
      fit.set->insert(hint, r);
      count_inactive_split(r, +1);
    } else {
      fit.set->erase(fit.it);
    }
    b->state = BState::allocated;
    b->owner = stream;
    b->requested = requested;
    ledger_.block_allocated(small, b->size, requested);
    live_.insert(b->ptr, b);
    return b;
  }

  // Allocated -> no longer allocated (still active until it becomes free).
  void unallocate(Block* b) { ledger_.block_unallocated(b->seg->small, b->size); }
  // Active (allocated or pending) -> inactive.
  void deactivate(Block* b) {
    ledger_.block_deactivated(b->seg->small, b->size, b->requested);
    b->requested = 0;
  }

  // ---- becoming free ----
  static bool same_class(const Block* a, const Block* b) {
    return a->state == b->state && (a->state != BState::local || a->owner == b->owner);
  }
  // b (being inserted) may swallow free neighbour n: same class, or b is local and n shared
  // (making shared memory local is only more restrictive, so always safe; the reverse is not).
  static bool can_absorb(const Block* b, const Block* n) {
    return same_class(b, n) || (b->state == BState::local && n->state == BState::shared);
  }
  FreeSet& set_of(Block* n) {
    const int k = kind_index(n->seg->small);
    return n->state == BState::shared ? shared_[k] : stream_find(n->owner)->sets[k];
  }

  // Put an inactive block that is in no set and not counted in inactive_split into `set` as
  // `state`, merging with free neighbours of the same class first.
  void insert_free(Block* b, BState state, StreamId owner, FreeSet& set) {
    b->state = state;
    b->owner = owner;
    // Loops: a local block that swallows a shared neighbour may then touch a local one.
    const auto absorb = [&](Block* n) {
      erase_block(set_of(n), n);
      count_inactive_split(n, -1);
      absorb_neighbour(b, n);
      if (n->epoch > b->epoch) b->epoch = n->epoch;
      if (n->hot > b->hot) b->hot = n->hot;
      block_pool_.put(n);
    };
    Block* n;
    while ((n = b->prev) != nullptr && can_absorb(b, n)) absorb(n);
    while ((n = b->next) != nullptr && can_absorb(b, n)) absorb(n);
    if (b->is_split()) count_inactive_split(b, +1);
    b->gc_base = searches_[kind_index(b->seg->small)];
    set.insert(b);
  }
  // ---- segments (block_store.cpp) ----
  // A segment of [base, base + size) with one block spanning it (its head), entered in
  // `segments`; classic and expandable segments alike, the caller sets the rest.
  Segment* add_segment(std::uintptr_t base, std::size_t size, bool small, StreamId stream);
  // b: a free shared block covering its whole segment. Removes both from every structure.
  void detach_segment(Block* b, std::vector<Detached>& out);
  Segment* segment_containing(std::uintptr_t p) const;
  // The pointer is not the start of a live block: say why, touching nothing.
  FreeStatus diagnose_bad_free(std::uintptr_t p);
  // The live block containing p (p inside one of the segments), as DevicePool::address_info says.
  std::optional<AddressInfo> address_info(std::uintptr_t p) const;
  // Every segment, block by block (an expandable range: one entry per mapped run).
  Snapshot snapshot(int device) const;
  // Forget every segment and block (the context is gone).
  void forget_all();
  // What check() found that other structures must agree with.
  struct Tally {
    explicit Tally(std::size_t max_split_size) : recount(max_split_size) {}
    StatsLedger recount;  // the counters as the blocks' states say they should be
    std::int64_t pending_bytes = 0;
    std::size_t pending_blocks = 0, retiring_blocks = 0, free_blocks = 0;
    std::vector<const Block*> draining;
  };
  // "" if every block agrees with its segment, its set and the pointer map, else the first
  // disagreement. Slow; for check_consistency().
  std::string check(Tally& tally) const;

 private:
  std::string check_units(const Segment* seg) const;
  std::string check_segment(const Segment* seg, Tally& tally) const;
  std::string check_block(const Block* b, Tally& tally) const;

  // Storage first: the sets below allocate from the arena and must die before it.
  NodeArena arena_;
  ObjectPool<Block> block_pool_;
  ObjectPool<Segment> segment_pool_;
  PtrMap<Block*> live_;                          // allocated blocks by start address
  std::map<std::uintptr_t, Segment*> segments_;  // by base; slow paths and queries only
  FreeSet shared_[2];                            // by pool kind (kind_index)
  std::unordered_map<StreamId, std::unique_ptr<StreamFree>> streams_;
  std::unordered_set<StreamId> retired_;    // is_retired()
  std::uint64_t epoch_ = 0;                 // bumped by every stream-local free
  std::uint64_t searches_[2] = {0, 0};      // find_fit calls per pool kind
  StreamFree* last_stream_free_ = nullptr;  // one-entry cache in front of `streams_`
  StreamId last_stream_ = 0;
  const std::size_t max_split_size_;
  const std::size_t max_non_split_rounding_;
  StatsLedger& ledger_;
};

}  // namespace cudapool::detail
