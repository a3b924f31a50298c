// The block store's slow parts: segments entering and leaving the map, address questions, the
// bad-free diagnosis, forgetting everything, and the consistency walk over every block.
#include "allocator/block_store.h"

#include <sstream>

namespace cudapool::detail {

namespace {
std::string failure(const char* what, const Block* b) {
  std::ostringstream err;
  err << what << " (block 0x" << std::hex << (b ? b->ptr : 0) << std::dec << " size " << (b ? b->size : 0) << ")";
  return err.str();
}
}  // namespace

Segment* BlockStore::add_segment(std::uintptr_t base, std::size_t size, bool small, StreamId stream) {
  Segment* seg = segment_pool_.get();
  seg->base = base;
  seg->size = size;
  seg->stream = stream;
  seg->small = small;
  Block* b = block_pool_.get();
  b->ptr = base;
  b->size = size;
  b->seg = seg;
  seg->head = b;
  segments_.emplace(base, seg);
  return seg;
}

void BlockStore::detach_segment(Block* b, std::vector<Detached>& out) {
  Segment* seg = b->seg;
  erase_block(shared_[kind_index(seg->small)], b);
  segments_.erase(seg->base);
  ledger_.segment_removed(seg->small, seg->size);
  out.push_back(Detached{seg->base, seg->size});
  block_pool_.put(b);
  segment_pool_.put(seg);
}

Segment* BlockStore::segment_containing(std::uintptr_t p) const {
  auto it = segments_.upper_bound(p);
  if (it == segments_.begin()) return nullptr;
  --it;
  Segment* seg = it->second;
  return p < seg->base + seg->size ? seg : nullptr;
}

FreeStatus BlockStore::diagnose_bad_free(std::uintptr_t p) {
  Segment* seg = segment_containing(p);
  if (seg == nullptr) return FreeStatus::not_owned;
  if (seg->expandable && !block_at(seg, p)->mapped()) return FreeStatus::not_owned;
  ledger_.bad_free();
  for (Block* b = seg->head; b != nullptr; b = b->next)
    if (b->ptr == p) return FreeStatus::double_free;  // starts a block that is not allocated
  return FreeStatus::interior_pointer;
}

std::optional<AddressInfo> BlockStore::address_info(std::uintptr_t p) const {
  const Segment* seg = segment_containing(p);
  const Block* b = seg != nullptr ? block_at(const_cast<Segment*>(seg), p) : nullptr;
  if (b == nullptr || b->state != BState::allocated) return std::nullopt;
  AddressInfo info;
  info.block_base = b->ptr;
  info.block_size = b->requested;
  info.segment_base = seg->base;
  info.segment_size = seg->size;
  info.whole_segment = !b->is_split();
  info.expandable = seg->expandable;
  if (seg->expandable) {
    // The "segment" of an expandable block is its mapped run; never whole (no legacy IPC).
    const Block* first = b;
    while (first->prev != nullptr && first->prev->mapped()) first = first->prev;
    const Block* last = b;
    while (last->next != nullptr && last->next->mapped()) last = last->next;
    info.segment_base = first->ptr;
    info.segment_size = last->ptr + last->size - first->ptr;
    info.whole_segment = false;
  }
  return info;
}

Snapshot BlockStore::snapshot(int device) const {
  Snapshot snap;
  snap.segments.reserve(segments_.size());
  for (auto& [base, seg] : segments_) {
    for (const Block* first = seg->head; first != nullptr;) {
      if (!first->mapped()) {
        first = first->next;
        continue;
      }
      SegmentInfo si;
      si.device = device;
      si.address = first->ptr;
      si.stream = seg->stream;
      si.is_small = seg->small;
      si.is_expandable = seg->expandable;
      const Block* b = first;
      for (; b != nullptr && b->mapped(); b = b->next) {
        si.total_size += b->size;
        BlockInfo bi;
        bi.address = b->ptr;
        bi.size = b->size;
        bi.requested_size = b->requested;
        bi.state = b->state == BState::allocated ? BlockState::active_allocated
                   : b->state == BState::pending ? BlockState::active_pending_free
                                                 : BlockState::inactive;
        if (b->state == BState::allocated) si.allocated_size += b->size;
        if (b->state == BState::allocated || b->state == BState::pending) {
          si.active_size += b->size;
          si.requested_size += b->requested;
        }
        si.blocks.push_back(bi);
      }
      snap.segments.push_back(std::move(si));
      first = b;
    }
  }
  return snap;
}

void BlockStore::forget_all() {
  for (auto& [base, seg] : segments_) {
    for (Block* b = seg->head; b != nullptr;) {
      Block* next = b->next;
      block_pool_.put(b);
      b = next;
    }
    segment_pool_.put(seg);
  }
  segments_.clear();
  live_.clear();
  for (FreeSet& s : shared_) s.clear();
  last_stream_free_ = nullptr;
  streams_.clear();
  retired_.clear();
}

std::string BlockStore::check(Tally& tally) const {
  for (auto& [base, seg] : segments_) {
    if (seg->base != base || seg->head == nullptr || seg->head->prev != nullptr)
      return failure("bad segment head", seg->head);
    if (std::string e = check_segment(seg, tally); !e.empty()) return e;
  }
  std::size_t in_sets = shared_[0].size() + shared_[1].size();
  for (auto& [id, stream_free] : streams_) in_sets += stream_free->sets[0].size() + stream_free->sets[1].size();
  if (in_sets != tally.free_blocks) return failure("free sets hold blocks that are not free", nullptr);
  if (live_.size() != static_cast<std::size_t>(tally.recount.view().allocation[kAll].current))
    return failure("pointer map size", nullptr);
  return "";
}

// The physical units of an expandable segment tile every mapped run, and nothing else.
std::string BlockStore::check_units(const Segment* seg) const {
  auto u = seg->units.begin();
  for (const Block* b = seg->head; b != nullptr;) {
    if (!b->mapped()) {
      b = b->next;
      continue;
    }
    const Block* first = b;
    std::uintptr_t end = b->ptr;
    for (; b != nullptr && b->mapped(); b = b->next) end = b->ptr + b->size;
    for (std::uintptr_t at = first->ptr; at < end; at += (u++)->second)
      if (u == seg->units.end() || u->first != at || u->second == 0 || u->second % seg->page != 0 ||
          u->second > end - at)
        return failure("physical units do not tile a mapped run", first);
  }
  if (u != seg->units.end()) return failure("physical unit outside the mapped runs", seg->head);
  return "";
}

std::string BlockStore::check_segment(const Segment* seg, Tally& tally) const {
  if (!seg->expandable) tally.recount.segment_added(seg->small, seg->size);
  if (seg->expandable)
    if (std::string e = check_units(seg); !e.empty()) return e;
  std::uintptr_t at = seg->base;
  std::size_t mapped = 0;
  for (const Block* b = seg->head; b != nullptr; b = b->next) {
    if (seg->expandable && b->mapped()) {
      mapped += b->size;
      tally.recount.pages_mapped(seg->small, b->size);
      if (b->prev == nullptr || !b->prev->mapped()) {  // a run starts: page aligned
        tally.recount.runs_changed(seg->small, 1);
        if ((b->ptr - seg->base) % seg->page != 0) return failure("mapped run not page aligned", b);
      }
      if ((b->next == nullptr || !b->next->mapped()) && (b->ptr + b->size - seg->base) % seg->page != 0)
        return failure("mapped run end not page aligned", b);
    }
    if (b->seg != seg) return failure("block points at the wrong segment", b);
    if (b->ptr != at || b->size == 0 || b->size % kMinBlockSize != 0)
      return failure("blocks do not tile the segment", b);
    if (b->next != nullptr && b->next->prev != b) return failure("broken neighbour links", b);
    at += b->size;
    if (std::string e = check_block(b, tally); !e.empty()) return e;
  }
  if (at != seg->base + seg->size) return failure("blocks do not cover the segment", seg->head);
  if (seg->expandable && mapped != seg->mapped) return failure("expandable mapped bytes", seg->head);
  return "";
}

std::string BlockStore::check_block(const Block* b, Tally& tally) const {
  const Segment* seg = b->seg;
  switch (b->state) {
    case BState::allocated:
      if (live_.find(b->ptr) != b) return failure("allocated block missing from the pointer map", b);
      tally.recount.block_allocated(seg->small, b->size, b->requested);
      return "";
    case BState::pending:  // allocated, then unallocated: still active
      tally.recount.block_allocated(seg->small, b->size, b->requested);
      tally.recount.block_unallocated(seg->small, b->size);
      ++tally.pending_blocks;
      tally.pending_bytes += static_cast<std::int64_t>(b->size);
      return "";
    case BState::tcache:  // check_consistency() flushed every thread cache first
      return failure("block still checked out to a thread cache", b);
    case BState::unmapped:
      if (!seg->expandable) return failure("unmapped block in a classic segment", b);
      if (b->next != nullptr && b->next->state == BState::unmapped) return failure("unmerged unmapped blocks", b);
      if (b->requested != 0) return failure("unmapped block keeps a requested size", b);
      return "";
    case BState::draining:
      if (!seg->expandable) return failure("draining block in a classic segment", b);
      if (b->requested != 0) return failure("draining block keeps a requested size", b);
      tally.draining.push_back(b);
      return "";
    case BState::local:
    case BState::shared:
    case BState::retiring: break;
  }
  if (b->requested != 0) return failure("free block keeps a requested size", b);
  if (b->state == BState::retiring) {
    ++tally.retiring_blocks;
  } else {
    const FreeSet* set = nullptr;
    if (b->state == BState::shared) {
      set = &shared_[kind_index(seg->small)];
    } else {
      auto it = streams_.find(b->owner);
      if (it == streams_.end()) return failure("local block of an unknown stream", b);
      set = &it->second->sets[kind_index(seg->small)];
    }
    if (set->find(const_cast<Block*>(b)) == set->end()) return failure("free block missing from its set", b);
    ++tally.free_blocks;
    if (b->next != nullptr && same_class(b, b->next)) return failure("unmerged free neighbours", b);
  }
  if (b->is_split()) tally.recount.inactive_split_changed(seg->small, b->size, +1);
  return "";
}

}  // namespace cudapool::detail
