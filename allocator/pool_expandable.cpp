// expandable_segments (issue 7, pool side): instead of one upstream allocation per segment, one
// reserved virtual range per pool kind (small/large), grown by mapping pages where a request
// needs them and shrunk by unmapping wholly free pages. Freed space anywhere in the range can
// serve any size later, which is what keeps reserved memory near the live footprint.
//
// Representation: the range is a Segment with `expandable` set whose blocks tile the whole
// reservation; blocks with no pages behind them are in state `unmapped` (in no free set, merged
// with unmapped neighbours). Mapped runs are page aligned at both ends. Stats follow PyTorch:
// reserved bytes are mapped bytes, and each maximal mapped run counts (and is snapshotted) as one
// segment. Pages are only unmapped from shared free blocks, i.e. after a fence covering every use.
#include <chrono>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;

namespace {
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
std::uintptr_t round_up(std::uintptr_t v, std::size_t g) { return (v + g - 1) / g * g; }
std::uintptr_t round_down(std::uintptr_t v, std::size_t g) { return v / g * g; }
}  // namespace

// Segment count bookkeeping: `piece` is a block that just became mapped (sign +1) or is about to
// become unmapped (sign -1), not yet merged with its neighbours.
void DevicePool::Impl::count_runs_change(Block* piece, int sign) {
  int delta = 1;
  if (piece->prev != nullptr && piece->prev->mapped()) --delta;
  if (piece->next != nullptr && piece->next->mapped()) --delta;
  detail::bump(st.segment, detail::stat_pool(piece->seg->small), sign * delta);
}

void DevicePool::Impl::merge_unmapped(Block* b) {
  Block* n;
  while ((n = b->prev) != nullptr && n->state == BState::unmapped) {
    b->ptr = n->ptr;
    b->size += n->size;
    b->prev = n->prev;
    if (n->prev != nullptr) n->prev->next = b; else b->seg->head = b;
    block_pool.put(n);
  }
  while ((n = b->next) != nullptr && n->state == BState::unmapped) {
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    block_pool.put(n);
  }
}

DevicePool::Impl::Block* DevicePool::Impl::find_expandable_start(Segment* seg, std::size_t rounded, StreamId stream) {
  auto usable = [&](const Block* x) {
    return x->state == BState::shared || (x->state == BState::local && x->owner == stream);
  };
  for (Block* b = seg->head; b != nullptr; b = b->next) {
    if (b->state != BState::unmapped) continue;
    // A free block right before the hole can be extended instead of starting a new run.
    Block* start = (b->prev != nullptr && usable(b->prev)) ? b->prev : b;
    std::size_t bytes = 0;
    for (Block* x = start; x != nullptr && bytes < rounded && (x->state == BState::unmapped || usable(x)); x = x->next)
      bytes += x->size;
    if (bytes >= rounded) return start;
  }
  return nullptr;
}

UpstreamStatus DevicePool::Impl::grow_expandable(std::size_t rounded, bool small, StreamId stream, Block** out) {
  *out = nullptr;
  const int k = detail::kind_index(small);
  const std::size_t g = granularity;
  if (xseg[k] == nullptr) {
    // About 9/8 of the device, like PyTorch: the mapped part can never fill the range, and one
    // range per pool kind keeps address space use bounded however many streams there are.
    const std::size_t bytes = round_up(device_total + device_total / 8 + g, g);
    void* base = nullptr;
    UpstreamStatus us = up.reserve(bytes, &base);
    if (us != UpstreamStatus::ok) return UpstreamStatus::ok;  // no range: classic segments instead
    Segment* seg = segment_pool.get();
    seg->base = reinterpret_cast<std::uintptr_t>(base);
    seg->size = bytes;
    seg->stream = stream;
    seg->small = small;
    seg->expandable = true;
    Block* b = block_pool.get();
    b->ptr = seg->base;
    b->size = bytes;
    b->seg = seg;
    b->state = BState::unmapped;
    seg->head = b;
    segments.emplace(seg->base, seg);
    xseg[k] = seg;
  }
  Segment* seg = xseg[k];
  Block* start = find_expandable_start(seg, rounded, stream);
  if (start == nullptr) return UpstreamStatus::ok;  // range exhausted: classic segment instead

  // How much must be mapped, to check the limit before any upstream call.
  std::size_t to_map = 0, covered = 0;
  for (Block* x = start; covered < rounded; x = x->next) {
    const std::size_t take = x->state == BState::unmapped ? std::min(x->size, round_up(rounded - covered, g)) : x->size;
    if (x->state == BState::unmapped) to_map += take;
    covered += take;
  }
  const auto reserved = static_cast<std::size_t>(st.reserved_bytes[kAll].current);
  if (limit != kNoLimit && (to_map > limit || reserved + inflight > limit - to_map)) {
    emit(EventKind::oom, 0, to_map, to_map, stream);
    return UpstreamStatus::out_of_memory;
  }

  StreamFree* sf = stream_get(stream);
  Block* cur = start;  // the block that grows to cover the request
  while (cur->state == BState::unmapped || cur->size < rounded) {
    Block* u = cur->state == BState::unmapped ? cur : cur->next;  // the next hole to fill
    if (u == nullptr || u->state != BState::unmapped) return UpstreamStatus::ok;  // cannot happen
    const std::size_t have = cur->state == BState::unmapped ? 0 : cur->size;
    const std::size_t amount = std::min(u->size, round_up(rounded - have, g));
    const std::int64_t t0 = now_ns();
    UpstreamStatus us = up.map(reinterpret_cast<void*>(u->ptr), amount);
    const std::int64_t dt = now_ns() - t0;
    st.upstream_ns += dt;
    if (us != UpstreamStatus::ok) {
      if (us == UpstreamStatus::out_of_memory) emit(EventKind::oom, u->ptr, amount, amount, stream, dt);
      return us;  // pages mapped so far stay as free blocks: nothing is inconsistent
    }
    if (amount < u->size) {  // split the hole: the mapped front, the unmapped rest
      Block* rest = block_pool.get();
      rest->ptr = u->ptr + amount;
      rest->size = u->size - amount;
      rest->seg = seg;
      rest->state = BState::unmapped;
      rest->prev = u;
      rest->next = u->next;
      if (u->next != nullptr) u->next->prev = rest;
      u->next = rest;
      u->size = amount;
    }
    u->state = BState::local;  // mapped now; insert_free below gives it its real place
    count_runs_change(u, +1);
    seg->mapped += amount;
    detail::bump(st.reserved_bytes, detail::stat_pool(small), static_cast<std::int64_t>(amount));
    emit(EventKind::segment_map, u->ptr, amount, amount, stream, dt);
    // Fresh pages are local to the requesting stream (never used, so any class would be safe;
    // local lets them swallow the free block the run started from, shared or local to this
    // stream, into one block the request can take).
    u->epoch = 0;
    insert_free(u, BState::local, stream, sf->sets[k]);
    cur = u;
  }
  *out = cur;
  return UpstreamStatus::ok;
}

// Bytes of whole pages inside a free block of an expandable segment.
std::size_t DevicePool::Impl::releasable_pages(const Block* b) const {
  if (!b->seg->expandable) return 0;
  const std::uintptr_t base = b->seg->base;
  const std::uintptr_t lo = base + round_up(b->ptr - base, granularity);
  const std::uintptr_t hi = base + round_down(b->ptr + b->size - base, granularity);
  return hi > lo ? hi - lo : 0;
}

// b: a shared free block of an expandable segment. Its whole pages become unmapped; the partial
// pages at either end stay mapped as (smaller) shared free blocks.
void DevicePool::Impl::release_pages(Block* b, std::vector<Detached>& out) {
  const std::size_t bytes = releasable_pages(b);
  if (bytes == 0) return;
  Segment* seg = b->seg;
  const int k = detail::kind_index(seg->small);
  const std::uintptr_t lo = seg->base + round_up(b->ptr - seg->base, granularity);
  const std::uintptr_t hi = lo + bytes;
  shared[k].erase(b);
  if (b->is_split()) count_inactive_split(b, -1);
  auto cut_after = [&](Block* x, std::uintptr_t at) {  // split x at address `at`, return the back
    Block* r = block_pool.get();
    r->ptr = at;
    r->size = x->ptr + x->size - at;
    r->seg = seg;
    r->state = x->state;
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
  mid->state = BState::unmapped;
  mid->requested = 0;
  count_runs_change(mid, -1);
  seg->mapped -= bytes;
  detail::bump(st.reserved_bytes, detail::stat_pool(seg->small), -static_cast<std::int64_t>(bytes));
  merge_unmapped(mid);
  if (head != nullptr) insert_free(head, BState::shared, 0, shared[k]);
  if (tail != nullptr) insert_free(tail, BState::shared, 0, shared[k]);
  out.push_back(Detached{lo, bytes, true});
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
  }
  up.unreserve(reinterpret_cast<void*>(seg->base), seg->size);
}

}  // namespace cudapool
