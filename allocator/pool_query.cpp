// Everything that is not allocation or freeing: queries, stats, snapshot, bad-free diagnosis,
// the consistency checker, abandon() and teardown.
#include <sstream>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;

DevicePool::Impl::~Impl() {
  caches.detach_all();  // threads' caches forget this pool (their blocks go back with the segments)
  // Outstanding fences are handed back; every segment goes back to the upstream, live or not.
  reclaim.batches.release_all(fences);
  for (const Drain& d : ranges.draining)
    if (!d.dropped) up.unalias(reinterpret_cast<void*>(d.b->ptr), d.b->size);
  for (auto& [base, seg] : store.segments) {
    if (seg->expandable)
      ranges.destroy(seg);
    else
      up.release(reinterpret_cast<void*>(base), seg->size);
  }
}

std::optional<AddressInfo> DevicePool::address_info(const void* ptr) const {
  Impl& pool = *impl_;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Impl::Guard lock(pool.mu);
  Impl::Segment* seg = pool.store.segment_containing(p);
  if (seg == nullptr) return std::nullopt;
  if (!pool.caches.empty() && pool.store.live.find(p) == nullptr)
    pool.caches.reclaim_lent(p);  // lent via a thread cache
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
  Impl::Segment* seg = impl_->store.segment_containing(p);
  return seg != nullptr && (!seg->expandable || detail::block_at(seg, p)->mapped());
}

// Every view below first flushes the threads' caches (pool_tcache.cpp): what it shows is then
// exact, and cached blocks count as free.
std::size_t DevicePool::cached_bytes() const {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  return impl_->ledger.reserved_bytes() - impl_->ledger.allocated_bytes();
}

Stats DevicePool::stats() const {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  return impl_->ledger.view();
}

void DevicePool::reset_peak_stats() {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  impl_->ledger.reset_peaks();
}

void DevicePool::reset_accumulated_stats() {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  impl_->ledger.reset_accumulated();
}

Snapshot DevicePool::snapshot() const {
  Impl& pool = *impl_;
  Impl::Guard lock(pool.mu);
  pool.caches.flush_all();
  Snapshot snap;
  snap.segments.reserve(pool.store.segments.size());
  for (auto& [base, seg] : pool.store.segments) {
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
  impl_->caches.flush_all();  // cached operations emit no events: none may continue under a new sink
  impl_->events.sink = sink;
}

// Forget every segment without calling the upstream or the fence provider: the context that
// owned them is gone, so both would only fail.
void DevicePool::Impl::forget_all() {
  store.forget_all();
  ranges.forget();
  reclaim.batches.forget_all();
  ledger.forget_all();
}

void DevicePool::retire_stream(StreamId stream) {
  Impl::Lock lk(impl_->mu);
  impl_->caches.flush_all();  // no cache may keep (or later cache) a block of the dying stream
  impl_->reclaim.retire(stream);
}

void DevicePool::abandon() {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  impl_->forget_all();
}

std::string DevicePool::check_consistency() const {
  Impl::Guard lock(impl_->mu);
  impl_->caches.flush_all();
  return impl_->check();
}

// Slow full walk; every structure must agree with every other one.
std::string DevicePool::Impl::check() const {
  detail::BlockStore::Tally tally(opt.max_split_size);
  if (std::string e = store.check(tally); !e.empty()) return e;
  auto listed = [&](const Block* b) REQUIRES(mu) {
    return std::any_of(ranges.draining.begin(), ranges.draining.end(), [&](const Drain& d) { return d.b == b; });
  };
  if (!std::all_of(tally.draining.begin(), tally.draining.end(), listed))
    return "draining block missing from the draining list";
  if (reclaim.batches.pending_count() != tally.pending_blocks) return "pending blocks and reclaim.batches disagree";
  if (reclaim.batches.retiring_count() != tally.retiring_blocks) return "retiring blocks and reclaim.batches disagree";
  if (ranges.draining.size() != tally.draining.size()) return "draining list and draining blocks disagree";
  const Stats& st = ledger.view();
  if (tally.pending_bytes != st.pending_bytes) return "pending_bytes stat";
  const Stats& recount = tally.recount.view();
  std::ostringstream err;
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
