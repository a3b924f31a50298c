// The pool side of the per-thread caches (thread_cache.h has the model, docs/design.md the why):
// registration, check-out, stat merging, flushing back into the pool, thread exit, teardown.
// Lock order everywhere: cache registry mutex -> pool mu -> a cache's mu. The owner's fast path
// (pool_fast.cpp) takes only its own cache's mu.
#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "allocator/pool_impl.h"

namespace cudapool {

using detail::BState;
using detail::TcEntry;
using detail::ThreadCache;

namespace {

// Serializes "a cache leaves its pool": thread exit vs. pool destruction. Leaked on purpose:
// threads may exit after static destructors ran.
std::mutex& registry_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

std::atomic<std::uint64_t> next_uid{1};

// This thread's caches, one per pool it used. At thread exit every cache still attached to a
// live pool is flushed into it, so blocks parked here are never lost.
struct ThreadCaches {
  std::vector<std::shared_ptr<ThreadCache>> list;
  ThreadCache* last = nullptr;  // one-entry cache: most threads use one pool

  ~ThreadCaches() {
    std::lock_guard<std::mutex> reg(registry_mutex());
    for (auto& tc : list)
      if (tc->pool.load(std::memory_order_acquire) != nullptr) tc->exit_flush(*tc);  // else its pool is gone
  }
};

thread_local ThreadCaches t_caches;

}  // namespace

std::uint64_t new_pool_uid() { return next_uid.fetch_add(1, std::memory_order_relaxed); }

ThreadCache* DevicePool::Impl::tc_find() const {
  ThreadCaches& tl = t_caches;
  if (tl.last != nullptr && tl.last->pool_uid == uid) return tl.last;
  for (auto& tc : tl.list) {
    if (tc->pool_uid == uid) {
      tl.last = tc.get();
      return tl.last;
    }
  }
  return nullptr;
}

ThreadCache* DevicePool::Impl::tc_create() {
  if (ThreadCache* tc = tc_find()) return tc;
  ThreadCaches& tl = t_caches;
  // Caches of destroyed pools are dead weight: drop them now.
  std::erase_if(tl.list, [](const std::shared_ptr<ThreadCache>& c) {
    return c->pool.load(std::memory_order_acquire) == nullptr;
  });
  auto tc = std::make_shared<ThreadCache>();
  tc->pool_uid = uid;
  tc->exit_flush = &Impl::tc_exit_flush;
  tc->pool.store(this, std::memory_order_release);
  tcaches.push_back(tc);
  tl.list.push_back(tc);
  tl.last = tc.get();
  return tl.last;
}

void DevicePool::Impl::tc_exit_flush(ThreadCache& tc) {
  auto* impl = static_cast<Impl*>(tc.pool.load(std::memory_order_acquire));
  Guard pool_lock(impl->mu);
  {
    Guard cache_lock(tc.mu);
    impl->tc_flush(tc);
  }
  auto& v = impl->tcaches;
  std::erase_if(v, [&](const std::shared_ptr<ThreadCache>& c) { return c.get() == &tc; });
  tc.pool.store(nullptr, std::memory_order_release);
}

void DevicePool::Impl::tc_checkout(ThreadCache& tc, Block* b, std::size_t rounded) {
  // A full table: one older block goes back to the pool (it stays allocated, uncached).
  if (tc.nlent >= ThreadCache::kMaxLent) tc_return_lent(tc, tc.lent_any(b->ptr));
  live.take(b->ptr);
  b->state = BState::tcache;
  TcEntry e;
  e.block = b;
  e.ptr = b->ptr;
  e.size = b->size;
  e.rounded = rounded;
  e.requested = b->requested;
  e.stream = b->owner;
  e.small = b->seg->small;
  e.split = b->is_split();
  tc.lent_insert(e);
}

void DevicePool::Impl::tc_unlend(const TcEntry& e) {
  Block* b = e.block;
  b->state = BState::allocated;
  b->owner = e.stream;
  b->requested = e.requested;
  live.insert(b->ptr, b);
}

void DevicePool::Impl::tc_return_lent(ThreadCache& tc, int i) {
  tc_unlend(tc.lent[i]);
  tc.lent_erase(i);
}

void DevicePool::Impl::tc_merge(ThreadCache& tc) {
  if (!tc.dirty.load(std::memory_order_relaxed)) return;
  ledger.merge(tc.delta);
  tc.dirty.store(false, std::memory_order_relaxed);
}

void DevicePool::Impl::tc_flush(ThreadCache& tc) {
  tc_merge(tc);
  // Every lent block back (no erase while walking: erasing shifts entries backwards).
  for (TcEntry& e : tc.lent) {
    if (e.ptr == 0) continue;
    tc_unlend(e);
    e = TcEntry{};
  }
  tc.nlent = 0;
  for (int i = 0; i < tc.nfree; ++i) {
    const TcEntry& e = tc.free_[i];
    Block* b = e.block;
    // Already counted inactive (and in inactive_split) by the merged deltas; insert_free
    // recounts the split after merging with neighbours.
    if (e.split) count_inactive_split(b, -1);
    b->requested = 0;
    if (e.any_stream) {  // its device fence completed
      insert_free(b, BState::shared, 0, shared[detail::kind_index(e.small)]);
      continue;
    }
    StreamFree* sf = stream_get(e.stream);
    b->epoch = ++epoch;  // freed "now" as far as promotion fences go: later is only safer
    insert_free(b, BState::local, e.stream, sf->sets[detail::kind_index(e.small)]);
  }
  tc.nfree = 0;
  tc.free_bytes = 0;
  tc_flush_fenced(tc);
}

// Fenced frees, open or closed: into the pool's open batch, whose fence is recorded later than
// the cache's own (later is only safer); the cache's fence is dropped. Already counted pending
// and unallocated by the deltas, which are merged first.
void DevicePool::Impl::tc_flush_fenced(ThreadCache& tc) {
  if ((tc.npend | tc.nclosed) == 0) return;
  tc_merge(tc);
  auto to_pool_batch = [&](const TcEntry& e) REQUIRES(mu) {
    Block* b = e.block;
    b->state = BState::pending;
    b->requested = e.requested;
    b->owner = e.stream;
    add_pending_counted(b);
  };
  for (int i = 0; i < tc.nclosed; ++i) to_pool_batch(tc.closed[i]);
  for (int i = 0; i < tc.npend; ++i) to_pool_batch(tc.pend[i]);
  tc.nclosed = tc.npend = 0;
  if (tc.fence != 0) {
    fences.release(tc.fence);
    tc.fence = 0;
  }
}

// Only stale batches: an active owner closes its open batch within the window and collects its
// closed one at its next miss, so taking those away would only send it back to the pool lock —
// and two busy threads that miss in turn would keep emptying each other's caches (seen as a
// bimodal 3-25 M pairs/s in BM_Pool_Contention_Fenced). A batch untouched for kTcStaleNs means
// an owner that stopped allocating.
bool DevicePool::Impl::tc_collect_fenced() {
  bool moved = false;
  std::int64_t now = 0;
  for (auto& tc : tcaches) {
    Guard g(tc->mu);
    if ((tc->npend | tc->nclosed) == 0) continue;
    if (now == 0) now = clock_ns();
    const bool open_stale = tc->npend == 0 || now - tc->pend_since >= kTcStaleNs;
    const bool closed_stale = tc->nclosed == 0 || now - tc->closed_since >= kTcStaleNs;
    if (!open_stale || !closed_stale) continue;
    tc_flush_fenced(*tc);
    moved = true;
  }
  return moved;
}

void DevicePool::Impl::tc_flush_all() {
  for (auto& tc : tcaches) {
    Guard g(tc->mu);
    tc_flush(*tc);
  }
}

void DevicePool::Impl::tc_merge_own() {
  ThreadCache* tc = tc_find();
  if (tc != nullptr && tc->dirty.load(std::memory_order_relaxed)) {
    Guard g(tc->mu);
    tc_merge(*tc);
  }
}

bool DevicePool::Impl::tc_reclaim_lent(std::uintptr_t p) {
  auto reclaim_from = [&](ThreadCache& tc) REQUIRES(mu) {
    Guard g(tc.mu);
    if (tc.nlent == 0) return false;
    const int home = ThreadCache::slot_of(p);
    for (int k = 0; k < ThreadCache::kLentSlots; ++k) {  // from p's home slot (p is usually a start)
      const int i = (home + k) % ThreadCache::kLentSlots;
      const TcEntry& e = tc.lent[i];
      if (e.ptr != 0 && p >= e.ptr && p < e.ptr + e.size) {
        tc_merge(tc);  // its deltas describe this block's history
        tc_return_lent(tc, i);
        return true;
      }
    }
    return false;
  };
  // Usually the freeing thread lent it itself (e.g. free() of a lent block in a fenced pool):
  // look there first; other threads' caches only for cross-thread frees.
  ThreadCache* own = tc_find();
  if (own != nullptr && reclaim_from(*own)) return true;
  for (auto& tc : tcaches)
    if (tc.get() != own && reclaim_from(*tc)) return true;
  return false;
}

void DevicePool::Impl::tc_detach_all() {
  std::lock_guard<std::mutex> reg(registry_mutex());
  Guard pool_lock(mu);
  for (auto& tc : tcaches) {
    Guard g(tc->mu);
    for (TcEntry& e : tc->lent) e = TcEntry{};
    if (tc->fence != 0) fences.release(tc->fence);
    tc->fence = 0;
    tc->nfree = tc->nlent = tc->npend = tc->nclosed = 0;
    tc->free_bytes = 0;
    tc->delta = detail::StatsDelta{};
    tc->dirty.store(false, std::memory_order_relaxed);
    tc->pool.store(nullptr, std::memory_order_release);
  }
  tcaches.clear();
}

}  // namespace cudapool
