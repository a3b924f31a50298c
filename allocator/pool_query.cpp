// Everything that is not allocation or freeing: queries, stats, snapshot, bad-free diagnosis,
// the consistency checker, abandon() and teardown.
#include <sstream>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;

DevicePool::Impl::~Impl() {
  tc_detach_all();  // threads' caches forget this pool (their blocks go back with the segments)
  // Outstanding fences are handed back; every segment goes back to the upstream, live or not.
  batches.release_all(fences);
  for (const Drain& d : ranges.draining)
    if (!d.dropped) up.unalias(reinterpret_cast<void*>(d.b->ptr), d.b->size);
  for (auto& [base, seg] : segments) {
    if (seg->expandable)
      destroy_expandable(seg);
    else
      up.release(reinterpret_cast<void*>(base), seg->size);
  }
}

DevicePool::Impl::Segment* DevicePool::Impl::segment_containing(std::uintptr_t p) const {
  auto it = segments.upper_bound(p);
  if (it == segments.begin()) return nullptr;
  --it;
  Segment* seg = it->second;
  return p < seg->base + seg->size ? seg : nullptr;
}

// The pointer is not the start of a live block. Say why, touching nothing.
FreeStatus DevicePool::Impl::diagnose_bad_free(std::uintptr_t p) {
  Segment* seg = segment_containing(p);
  if (seg == nullptr) return FreeStatus::not_owned;
  if (seg->expandable && !detail::block_at(seg, p)->mapped()) return FreeStatus::not_owned;
  ledger.bad_free();
  for (Block* b = seg->head; b != nullptr; b = b->next)
    if (b->ptr == p) return FreeStatus::double_free;  // starts a block that is not allocated
  return FreeStatus::interior_pointer;
}

std::optional<AddressInfo> DevicePool::address_info(const void* ptr) const {
  Impl& pool = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Impl::Guard lock(pool.mu);
  Impl::Segment* seg = pool.segment_containing(p);
  if (seg == nullptr) return std::nullopt;
  if (!pool.tcaches.empty() && pool.live.find(p) == nullptr) pool.tc_reclaim_lent(p);  // lent via a thread cache
  for (Impl::Block* b = seg->head; b != nullptr; b = b->next) {
    if (p < b->ptr || p >= b->ptr + b->size) continue;
    if (b->state != BState::allocated) return std::nullopt;
    AddressInfo info;
    info.block_base = b->ptr;
    info.block_size = b->requested;
    info.segment_base = seg->base;
    info.segment_size = seg->size;
    info.whole_segment = !b->is_split();
    info.expandable = seg->expandable;
    if (seg->expandable) {
      // The "segment" of an expandable block is its mapped run; never whole (no legacy IPC).
      Impl::Block* first = b;
      while (first->prev != nullptr && first->prev->mapped()) first = first->prev;
      Impl::Block* last = b;
      while (last->next != nullptr && last->next->mapped()) last = last->next;
      info.segment_base = first->ptr;
      info.segment_size = last->ptr + last->size - first->ptr;
      info.whole_segment = false;
    }
    return info;
  }
  return std::nullopt;
}

bool DevicePool::owns(const void* ptr) const {
  Impl::Guard lock(impl_->mu);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Impl::Segment* seg = impl_->segment_containing(p);
  return seg != nullptr && (!seg->expandable || detail::block_at(seg, p)->mapped());
}

// Every view below first flushes the threads' caches (pool_tcache.cpp): what it shows is then
// exact, and cached blocks count as free.
std::size_t DevicePool::cached_bytes() const {
  Impl::Guard lock(impl_->mu);
  impl_->tc_flush_all();
  return impl_->ledger.reserved_bytes() - impl_->ledger.allocated_bytes();
}

Stats DevicePool::stats() const {
  Impl::Guard lock(impl_->mu);
  impl_->tc_flush_all();
  return impl_->ledger.view();
}

void DevicePool::reset_peak_stats() {
  Impl::Guard lock(impl_->mu);
  impl_->tc_flush_all();
  impl_->ledger.reset_peaks();
}

void DevicePool::reset_accumulated_stats() {
  Impl::Guard lock(impl_->mu);
  impl_->tc_flush_all();
  impl_->ledger.reset_accumulated();
}

Snapshot DevicePool::snapshot() const {
  Impl& pool = *impl_;
  Impl::Guard lock(pool.mu);
  pool.tc_flush_all();
  Snapshot snap;
  snap.segments.reserve(pool.segments.size());
  for (auto& [base, seg] : pool.segments) {
    // A classic segment is one entry; an expandable range one entry per mapped run.
    for (Impl::Block* first = seg->head; first != nullptr;) {
      if (!first->mapped()) {
        first = first->next;
        continue;
      }
      SegmentInfo si;
      si.device = pool.device;
      si.address = first->ptr;
      si.stream = seg->stream;
      si.is_small = seg->small;
      si.is_expandable = seg->expandable;
      Impl::Block* b = first;
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

const PoolOptions& DevicePool::options() const { return impl_->opt; }
int DevicePool::device() const { return impl_->device; }
void DevicePool::set_event_sink(EventSink* sink) {
  Impl::Guard lock(impl_->mu);
  impl_->tc_flush_all();  // cached operations emit no events: none may continue under a new sink
  impl_->sink = sink;
}

// Forget every segment without calling the upstream or the fence provider: the context that
// owned them is gone, so both would only fail.
void DevicePool::Impl::forget_all() {
  for (auto& [base, seg] : segments) {
    for (Block* b = seg->head; b != nullptr;) {
      Block* next = b->next;
      block_pool.put(b);
      b = next;
    }
    segment_pool.put(seg);
  }
  segments.clear();
  ranges.forget();
  live.clear();
  for (FreeSet& s : shared) s.clear();
  last_stream_free = nullptr;
  streams.clear();
  retired.clear();
  batches.forget_all();
  ledger.forget_all();
}

void DevicePool::abandon() {
  Impl::Guard lock(impl_->mu);
  impl_->tc_flush_all();
  impl_->forget_all();
}

std::string DevicePool::check_consistency() const {
  Impl::Guard lock(impl_->mu);
  impl_->tc_flush_all();
  return impl_->check();
}

// Slow full walk; every structure must agree with every other one.
std::string DevicePool::Impl::check() const {
  std::ostringstream err;
  auto fail = [&](const char* what, const Block* b) {
    err << what << " (block 0x" << std::hex << (b ? b->ptr : 0) << std::dec << " size " << (b ? b->size : 0) << ")";
    return err.str();
  };
  // The counters as the blocks' states say they should be, counted by the ledger's own rules.
  detail::StatsLedger recount_ledger(opt.max_split_size);
  std::size_t free_blocks = 0, pending_blocks = 0, retiring_blocks = 0, draining_blocks = 0;
  std::int64_t pending_bytes = 0;
  for (auto& [base, seg] : segments) {
    if (seg->base != base || seg->head == nullptr || seg->head->prev != nullptr)
      return fail("bad segment head", seg->head);
    if (!seg->expandable) recount_ledger.segment_added(seg->small, seg->size);
    if (seg->expandable) {  // the physical units tile every mapped run, and nothing else
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
            return fail("physical units do not tile a mapped run", first);
      }
      if (u != seg->units.end()) return fail("physical unit outside the mapped runs", seg->head);
    }
    std::uintptr_t at = base;
    std::size_t mapped = 0;
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      if (seg->expandable && b->mapped()) {
        mapped += b->size;
        recount_ledger.pages_mapped(seg->small, b->size);
        if (b->prev == nullptr || !b->prev->mapped()) {  // a run starts: page aligned
          recount_ledger.runs_changed(seg->small, 1);
          if ((b->ptr - base) % seg->page != 0) return fail("mapped run not page aligned", b);
        }
        if ((b->next == nullptr || !b->next->mapped()) && (b->ptr + b->size - base) % seg->page != 0)
          return fail("mapped run end not page aligned", b);
      }
      if (b->seg != seg) return fail("block points at the wrong segment", b);
      if (b->ptr != at || b->size == 0 || b->size % kMinBlockSize != 0)
        return fail("blocks do not tile the segment", b);
      if (b->next != nullptr && b->next->prev != b) return fail("broken neighbour links", b);
      at += b->size;
      const auto sz = static_cast<std::int64_t>(b->size);
      switch (b->state) {
        case BState::allocated:
          if (live.find(b->ptr) != b) return fail("allocated block missing from the pointer map", b);
          recount_ledger.block_allocated(seg->small, b->size, b->requested);
          break;
        case BState::pending:  // allocated, then unallocated: still active
          recount_ledger.block_allocated(seg->small, b->size, b->requested);
          recount_ledger.block_unallocated(seg->small, b->size);
          ++pending_blocks;
          pending_bytes += sz;
          break;
        case BState::tcache:  // check_consistency() flushed every thread cache first
          return fail("block still checked out to a thread cache", b);
        case BState::unmapped:
          if (!seg->expandable) return fail("unmapped block in a classic segment", b);
          if (b->next != nullptr && b->next->state == BState::unmapped) return fail("unmerged unmapped blocks", b);
          if (b->requested != 0) return fail("unmapped block keeps a requested size", b);
          break;
        case BState::draining:
          if (!seg->expandable) return fail("draining block in a classic segment", b);
          if (b->requested != 0) return fail("draining block keeps a requested size", b);
          if (std::none_of(ranges.draining.begin(), ranges.draining.end(), [&](const Drain& d) { return d.b == b; }))
            return fail("draining block missing from the draining list", b);
          ++draining_blocks;
          break;
        case BState::local:
        case BState::shared:
        case BState::retiring: {
          if (b->requested != 0) return fail("free block keeps a requested size", b);
          if (b->state == BState::retiring) {
            ++retiring_blocks;
          } else {
            const FreeSet* set = nullptr;
            if (b->state == BState::shared) {
              set = &shared[detail::kind_index(seg->small)];
            } else {
              auto it = streams.find(b->owner);
              if (it == streams.end()) return fail("local block of an unknown stream", b);
              set = &it->second->sets[detail::kind_index(seg->small)];
            }
            if (set->find(const_cast<Block*>(b)) == set->end()) return fail("free block missing from its set", b);
            ++free_blocks;
            if (b->next != nullptr && same_class(b, b->next)) return fail("unmerged free neighbours", b);
          }
          if (b->is_split()) recount_ledger.inactive_split_changed(seg->small, b->size, +1);
          break;
        }
      }
    }
    if (at != base + seg->size) return fail("blocks do not cover the segment", seg->head);
    if (seg->expandable && mapped != seg->mapped) return fail("expandable mapped bytes", seg->head);
  }
  const Stats& recount = recount_ledger.view();
  const Stats& st = ledger.view();
  std::size_t in_sets = shared[0].size() + shared[1].size();
  for (auto& [sid, stream_free] : streams) in_sets += stream_free->sets[0].size() + stream_free->sets[1].size();
  if (in_sets != free_blocks) return fail("free sets hold blocks that are not free", nullptr);
  if (live.size() != static_cast<std::size_t>(recount.allocation[kAll].current))
    return fail("pointer map size", nullptr);
  const std::size_t batched = batches.pending_count();
  const std::size_t retire_batched = batches.retiring_count();
  if (batched != pending_blocks) return fail("pending blocks and batches disagree", nullptr);
  if (retire_batched != retiring_blocks) return fail("retiring blocks and batches disagree", nullptr);
  if (ranges.draining.size() != draining_blocks) return fail("draining list and draining blocks disagree", nullptr);
  if (pending_bytes != st.pending_bytes) return fail("pending_bytes stat", nullptr);
  auto same = [&](const StatArray& a, const StatArray& b, const char* name) {
    for (std::size_t i = 0; i < kNumStatPools; ++i)
      if (a[i].current != b[i].current) {
        err << "stat " << name << "[" << i << "] is " << a[i].current << ", recount " << b[i].current;
        return false;
      }
    return true;
  };
  if (!same(st.allocation, recount.allocation, "allocation") || !same(st.segment, recount.segment, "segment") ||
      !same(st.active, recount.active, "active") ||
      !same(st.inactive_split, recount.inactive_split, "inactive_split") ||
      !same(st.allocated_bytes, recount.allocated_bytes, "allocated_bytes") ||
      !same(st.reserved_bytes, recount.reserved_bytes, "reserved_bytes") ||
      !same(st.active_bytes, recount.active_bytes, "active_bytes") ||
      !same(st.inactive_split_bytes, recount.inactive_split_bytes, "inactive_split_bytes") ||
      !same(st.requested_bytes, recount.requested_bytes, "requested_bytes"))
    return err.str();
  return "";
}

}  // namespace cudapool
