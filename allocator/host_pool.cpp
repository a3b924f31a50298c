#include "allocator/host_pool.h"

#include <algorithm>
#include <string>

#include "allocator/stats_ledger.h"

namespace cudapool {
namespace {

constexpr std::size_t kHostPage = 4 * KiB;
constexpr std::size_t kHostMaxRequest = 1024 * GiB;  // larger requests go to the driver as they are

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::size_t floor_pow2(std::size_t n) {
  std::size_t p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

void add(StatCounter& c, std::size_t n) { detail::add_stat(c, static_cast<std::int64_t>(n)); }
void sub(StatCounter& c, std::size_t n) { detail::add_stat(c, -static_cast<std::int64_t>(n)); }

}  // namespace

std::size_t host_class_size(std::size_t bytes, std::size_t threshold) noexcept {
  if (bytes == 0 || bytes > kHostMaxRequest) return 0;
  // Up to four pages, and above the rounding threshold: whole pages (the driver pins pages).
  if (bytes <= 4 * kHostPage || bytes > threshold) return round_up(bytes, kHostPage);
  // Four classes per power of two: [2^k, 2^(k+1)) in steps of 2^(k-2), at most 1.25x the request.
  return round_up(bytes, floor_pow2(bytes) / 4);
}

std::size_t host_max_block(std::size_t bytes, std::size_t threshold) noexcept {
  const std::size_t c = host_class_size(bytes, threshold);
  if (c == 0 || bytes > threshold) return c;
  return std::max(c, bytes + bytes / 4);
}

HostPool::HostPool(const HostPoolOptions& o, HostUpstream& upstream, FenceProvider& fences)
    : opt_(o), up_(upstream), fences_(fences) {}

HostPool::~HostPool() {
  for (auto& [base, seg] : segments_) delete seg;
  for (auto& [p, b] : live_) delete b;
  for (Block* b : free_) delete b;
}

bool HostPool::fences_done_locked(Block* b, Ask ask) {
  detail::FenceWaitCounts counts;
  const bool done = b->fences.done(fences_, ask, counts);
  stats_.fence_waits += counts.fence_waits;
  stats_.bound_waits += counts.bound_waits;
  return done;
}

HostPool::Block* HostPool::take_cached_locked(std::size_t bytes, unsigned flags, Owner owner, Ask ask,
                                              std::size_t* running) {
  const std::size_t size = host_class_size(bytes, opt_.max_round_threshold);
  const std::size_t hi = host_max_block(bytes, opt_.max_round_threshold);
  Segment probe_seg;
  probe_seg.owner = owner;
  probe_seg.flags = flags;
  Block probe;
  probe.seg = &probe_seg;
  probe.size = size;
  *running = 0;
  for (auto it = free_.lower_bound(&probe); it != free_.end(); ++it) {
    Block* b = *it;
    if (b->seg->owner != owner || b->seg->flags != flags) break;
    // Above the rounding threshold only exactly that size; otherwise any larger block, split.
    if (bytes > opt_.max_round_threshold && b->size > hi) break;
    if (!fences_done_locked(b, ask)) {
      ++*running;
      continue;
    }
    free_.erase(it);
    sub(stats_.cached_bytes, b->size);
    if (b->size > hi || b->size - size >= kHostPage) split_locked(b, size);
    return b;
  }
  return nullptr;
}

void HostPool::split_locked(Block* b, std::size_t size) {
  if (b->size <= size) return;
  auto* rest = new Block;
  rest->ptr = static_cast<char*>(b->ptr) + size;
  rest->size = b->size - size;
  rest->seg = b->seg;
  rest->prev = b;
  rest->next = b->next;
  if (b->next != nullptr) b->next->prev = rest;
  b->next = rest;
  b->size = size;
  rest->freed_at = b->freed_at;  // b's fences completed: the rest needs none
  add(stats_.cached_bytes, rest->size);
  free_.insert(rest);
}

void HostPool::insert_free_locked(Block* b) {
  // Merge with free neighbours of the segment: the merged block is reusable once every fence
  // of its parts completed.
  for (Block* n : {b->prev, b->next}) {
    if (n == nullptr || n->live) continue;
    free_.erase(n);
    sub(stats_.cached_bytes, n->size);
    if (n == b->prev) {
      b->ptr = n->ptr;
      b->prev = n->prev;
      if (n->prev != nullptr) n->prev->next = b;
    } else {
      b->next = n->next;
      if (n->next != nullptr) n->next->prev = b;
    }
    b->size += n->size;
    b->fences.absorb(n->fences);
    delete n;
  }
  add(stats_.cached_bytes, b->size);
  free_.insert(b);
}

HostPool::Segment* HostPool::new_segment_locked(std::size_t size, unsigned flags, Owner owner, bool reserve,
                                                int* error) {
  const std::int64_t t0 = detail::now_ns();
  const HostUpstreamResult got = up_.allocate(size, flags);
  stats_.upstream_ns += detail::now_ns() - t0;
  void* p = got.ptr;
  if (p == nullptr) {
    *error = got.error;
    return nullptr;
  }
  ++stats_.upstream_allocs;
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  if (auto old = segments_.find(base); old != segments_.end()) {
    // A gone context's segment at the same address (the driver reused it): its blocks are gone.
    drop_segment_locked(old->second);
  }
  auto* s = new Segment{base, size, flags, owner, reserve, false};
  segments_[base] = s;
  add(stats_.reserved_bytes, size);
  auto* b = new Block;
  b->ptr = p;
  b->size = size;
  b->seg = s;
  b->freed_at = ++clock_;
  add(stats_.cached_bytes, size);
  free_.insert(b);
  return s;
}

HostPool::Result HostPool::allocate(std::size_t bytes, unsigned flags, Owner owner) {
  const std::size_t size = host_class_size(bytes, opt_.max_round_threshold);
  if (size == 0) return {bytes == 0 ? AllocStatus::ok : AllocStatus::invalid_size, nullptr};
  std::lock_guard<std::mutex> lock(mu_);
  if (flags == 0 && opt_.reserve_segment != 0 && !reserve_tried_) {
    reserve_tried_ = true;  // one try: a reserve the driver refuses is not asked for again
    int ignored = 0;        // a refused reserve is no error of the request's
    new_segment_locked(opt_.reserve_segment, 0, owner, true, &ignored);
  }
  std::size_t running = 0;
  Block* b = take_cached_locked(bytes, flags, owner, Ask::plain, &running);
  // New pinned memory costs the driver milliseconds. Before that, fitting blocks whose fences
  // were not known complete are asked again at once (the shim's fences then sweep the streams
  // now, microseconds); if they still run and growing would break the held-memory bound, the
  // best-fitting one is waited for. That wait is never longer than the one the program's own
  // cudaFreeHost would have made: the fence was recorded at that free.
  if (b == nullptr && running != 0) b = take_cached_locked(bytes, flags, owner, Ask::urgent, &running);
  if (b == nullptr && running != 0 && over_bound_locked(bytes, size))
    b = take_cached_locked(bytes, flags, owner, Ask::wait, &running);
  stats_.fence_skips += static_cast<std::int64_t>(running);
  if (b != nullptr) {
    ++stats_.cache_hits;
  } else {
    ++stats_.cache_misses;
    trim_for_growth_locked(bytes, size);
    int error = 0;
    Segment* s = new_segment_locked(size, flags, owner, false, &error);
    // Out of memory: give back what is cached (fences completed), then everything cached.
    for (int round = 0; s == nullptr && round < 2; ++round) {
      if (release_cached_locked(round == 1) == 0 && round == 0) continue;
      s = new_segment_locked(size, flags, owner, false, &error);
    }
    if (s == nullptr) return {AllocStatus::out_of_memory, nullptr, error};
    b = take_cached_locked(bytes, flags, owner, Ask::plain, &running);
    if (b == nullptr) return {AllocStatus::out_of_memory, nullptr};  // not reached: the segment fits
  }
  b->live = true;
  b->requested = bytes;
  live_[b->ptr] = b;
  add(stats_.requested_bytes, bytes);
  add(stats_.allocated_bytes, b->size);
  add(stats_.blocks, 1);
  return {AllocStatus::ok, b->ptr};
}

FreeStatus HostPool::free(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    const auto q = reinterpret_cast<std::uintptr_t>(p);
    auto s = segments_.upper_bound(q);
    if (s == segments_.begin() || q >= std::prev(s)->first + std::prev(s)->second->size) return FreeStatus::not_owned;
    ++stats_.bad_frees;
    for (Block* f : free_)
      if (f->ptr == p) return FreeStatus::double_free;
    return FreeStatus::interior_pointer;
  }
  Block* b = it->second;
  live_.erase(it);
  b->live = false;
  sub(stats_.requested_bytes, b->requested);
  sub(stats_.allocated_bytes, b->size);
  sub(stats_.blocks, 1);
  b->requested = 0;
  if (b->seg->orphan) {
    // Its context is gone (forget_owner), and the memory with it: nothing to keep.
    Segment* s = b->seg;
    if (b->prev != nullptr) b->prev->next = b->next;
    if (b->next != nullptr) b->next->prev = b->prev;
    const bool last = b->prev == nullptr && b->next == nullptr;
    delete b;
    if (last) {
      up_.forget(reinterpret_cast<void*>(s->base), s->size);
      delete s;
    }
    return FreeStatus::ok;
  }
  // The program's cudaFreeHost would wait for the device: the block waits for a fence instead.
  b->fences.add(fences_.record_device());
  b->freed_at = ++clock_;
  insert_free_locked(b);
  trim_to_cap_locked();
  return FreeStatus::ok;
}

void HostPool::release_segment_locked(Segment* s) {
  auto it = segments_.find(s->base);
  Block* b = nullptr;
  for (Block* f : free_)
    if (f->seg == s) b = f;
  free_.erase(b);
  b->fences.release(fences_);
  sub(stats_.cached_bytes, b->size);
  delete b;
  const std::int64_t t0 = detail::now_ns();
  up_.release(reinterpret_cast<void*>(s->base), s->size, s->flags, s->owner);
  stats_.upstream_ns += detail::now_ns() - t0;
  ++stats_.upstream_frees;
  sub(stats_.reserved_bytes, s->size);
  segments_.erase(it);
  delete s;
}

// Wholly free segments (not the reserve), longest-cached first.
std::size_t HostPool::release_cached_locked(bool wait) {
  std::vector<Block*> whole;
  for (Block* b : free_)
    if (b->prev == nullptr && b->next == nullptr && !b->seg->reserve) whole.push_back(b);
  std::sort(whole.begin(), whole.end(), [](const Block* a, const Block* b) { return a->freed_at < b->freed_at; });
  std::size_t n = 0;
  for (Block* b : whole) {
    if (!fences_done_locked(b, Ask::plain)) {
      if (!wait) continue;
      detail::FenceWaitCounts counts;
      b->fences.wait_all(fences_, counts);
      stats_.fence_waits += counts.fence_waits;
    }
    n += b->seg->size;
    release_segment_locked(b->seg);
  }
  return n;
}

void HostPool::trim_to_cap_locked() {
  if (static_cast<std::size_t>(stats_.cached_bytes.current) <= opt_.max_cached) return;
  // The longest-cached whole segments go first. The driver's own free waits for the device, so
  // a segment whose fence still runs may go back too.
  std::vector<Block*> whole;
  for (Block* b : free_)
    if (b->prev == nullptr && b->next == nullptr && !b->seg->reserve) whole.push_back(b);
  std::sort(whole.begin(), whole.end(), [](const Block* a, const Block* b) { return a->freed_at < b->freed_at; });
  for (Block* b : whole) {
    if (static_cast<std::size_t>(stats_.cached_bytes.current) <= opt_.max_cached) break;
    release_segment_locked(b->seg);
  }
}

bool HostPool::over_bound_locked(std::size_t bytes, std::size_t size) const {
  const auto want = static_cast<double>(static_cast<std::size_t>(stats_.requested_bytes.current) + bytes);
  return static_cast<double>(static_cast<std::size_t>(stats_.reserved_bytes.current) + size) > kHeldRatio * want;
}

void HostPool::trim_for_growth_locked(std::size_t bytes, std::size_t size) {
  // The held-memory bound: new memory is mapped only while everything held stays within
  // kHeldRatio of the live requests (this one included); beyond it, whole free segments whose
  // fences completed go back first, longest-cached first (asked urgently: new memory is about to
  // be pinned). Nothing waits here (allocate already waited for a fitting block if there was
  // one): what the GPU still uses stays.
  if (!over_bound_locked(bytes, size)) return;
  std::vector<Block*> whole;
  for (Block* b : free_)
    if (b->prev == nullptr && b->next == nullptr && !b->seg->reserve) whole.push_back(b);
  std::sort(whole.begin(), whole.end(), [](const Block* a, const Block* b) { return a->freed_at < b->freed_at; });
  for (Block* b : whole) {
    if (!over_bound_locked(bytes, size)) break;
    if (!fences_done_locked(b, Ask::urgent)) continue;
    ++stats_.bound_releases;
    release_segment_locked(b->seg);
  }
}

bool HostPool::owns(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  auto s = segments_.upper_bound(q);
  return s != segments_.begin() && q < std::prev(s)->first + std::prev(s)->second->size;
}

void HostPool::drop_segment_locked(Segment* s) {
  // Its free blocks go; live ones stay with the program until their free (then dropped).
  bool any_live = false;
  for (auto it = free_.begin(); it != free_.end();) {
    Block* b = *it;
    if (b->seg != s) {
      ++it;
      continue;
    }
    b->fences.release(fences_);
    sub(stats_.cached_bytes, b->size);
    if (b->prev != nullptr) b->prev->next = b->next;
    if (b->next != nullptr) b->next->prev = b->prev;
    it = free_.erase(it);
    delete b;
  }
  for (auto& [p, b] : live_) any_live = any_live || b->seg == s;
  sub(stats_.reserved_bytes, s->size);
  segments_.erase(s->base);
  if (any_live) {
    s->orphan = true;  // forgotten at its last block's free
  } else {
    up_.forget(reinterpret_cast<void*>(s->base), s->size);
    delete s;
  }
}

void HostPool::forget_owner(Owner owner) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Segment*> gone;
  for (auto& [base, s] : segments_)
    if (s->owner == owner) gone.push_back(s);
  for (Segment* s : gone) drop_segment_locked(s);
}

std::size_t HostPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  return release_cached_locked(true);
}

HostStats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string HostPool::check_consistency() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t live = 0, requested = 0, cached = 0, held = 0;
  for (const auto& [p, b] : live_) {
    if (!b->live || b->ptr != p) return "a live block is filed wrongly";
    live += b->size, requested += b->requested;
    if (b->size < b->requested || b->size > host_max_block(b->requested, opt_.max_round_threshold))
      return "a live block does not fit its request";
  }
  for (const Block* b : free_) {
    if (b->live) return "a live block is in the free set";
    if (b->seg->orphan) return "a block of a gone context is cached";
    cached += b->size;
  }
  for (const auto& [base, s] : segments_) {
    held += s->size;
    // Its blocks tile it: walk from the block at its base.
    const Block* first = nullptr;
    if (auto it = live_.find(reinterpret_cast<void*>(base)); it != live_.end()) first = it->second;
    for (const Block* b : free_)
      if (b->ptr == reinterpret_cast<void*>(base)) first = b;
    if (first == nullptr || first->prev != nullptr) return "a segment does not start with a block";
    std::uintptr_t at = base;
    const Block* last_free = nullptr;
    for (const Block* b = first; b != nullptr; b = b->next) {
      if (reinterpret_cast<std::uintptr_t>(b->ptr) != at || b->seg != s) return "a segment's blocks do not tile it";
      if (!b->live && last_free != nullptr && last_free->next == b) return "two free neighbours were not merged";
      last_free = b->live ? nullptr : b;
      at += b->size;
    }
    if (at != base + s->size) return "a segment's blocks do not cover it";
  }
  if (static_cast<std::int64_t>(live) != stats_.allocated_bytes.current) return "allocated bytes miscounted";
  if (static_cast<std::int64_t>(requested) != stats_.requested_bytes.current) return "requested bytes miscounted";
  if (static_cast<std::int64_t>(cached) != stats_.cached_bytes.current) return "cached bytes miscounted";
  if (static_cast<std::int64_t>(held) != stats_.reserved_bytes.current) return "reserved bytes miscounted";
  if (static_cast<std::int64_t>(live_.size()) != stats_.blocks.current) return "live blocks miscounted";
  return {};
}

}  // namespace cudapool
