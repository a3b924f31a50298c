// The pool side of the per-thread caches (thread_caches.h): registration, check-out, stat
// merging, flushing back into the pool, thread exit, teardown. Lock order everywhere: cache
// registry mutex -> pool lock -> a cache's mu. The owner's fast path (ThreadBlockCache::take /
// put, called by pool.cpp; reuse.cpp, cache_free_fenced / service_cache) takes only its own
// cache's mu. What a cached block's state becomes when it goes back is Reuse's (reuse.cpp).
#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "allocator/thread_caches.h"

namespace cudapool::detail {

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
struct ThisThreadCaches {
  std::vector<std::shared_ptr<ThreadBlockCache>> list;
  ThreadBlockCache* last = nullptr;  // one-entry cache: most threads use one pool

  ~ThisThreadCaches() {
    std::lock_guard<std::mutex> reg(registry_mutex());
    for (auto& cache : list)
      if (cache->pool() != nullptr) cache->exit_flush();  // else its pool is gone
  }
};

thread_local ThisThreadCaches t_caches;

}  // namespace

std::uint64_t new_pool_uid() { return next_uid.fetch_add(1, std::memory_order_relaxed); }

ThreadBlockCache* ThreadCaches::find(std::uint64_t uid) {
  ThisThreadCaches& tl = t_caches;
  if (tl.last != nullptr && tl.last->pool_uid() == uid) return tl.last;
  for (auto& cache : tl.list) {
    if (cache->pool_uid() == uid) {
      tl.last = cache.get();
      return tl.last;
    }
  }
  return nullptr;
}

ThreadBlockCache* ThreadCaches::create() {
  if (ThreadBlockCache* cache = find(uid_)) return cache;
  ThisThreadCaches& tl = t_caches;
  // Caches of destroyed pools are dead weight: drop them now.
  std::erase_if(tl.list, [](const std::shared_ptr<ThreadBlockCache>& c) { return c->pool() == nullptr; });
  auto cache = std::make_shared<ThreadBlockCache>();
  cache->attach(this, uid_, &ThreadCaches::exit_flush);
  list_.push_back(cache);
  tl.list.push_back(cache);
  tl.last = cache.get();
  return tl.last;
}

void ThreadCaches::exit_flush(ThreadBlockCache& cache) {
  auto* caches = static_cast<ThreadCaches*>(cache.pool());
  SpinGuard pool_lock(caches->pool_mu_);
  {
    SpinGuard cache_lock(cache.mu);
    caches->flush(cache);
  }
  auto& v = caches->list_;
  std::erase_if(v, [&](const std::shared_ptr<ThreadBlockCache>& c) { return c.get() == &cache; });
  cache.detach();
}

void ThreadCaches::checkout(ThreadBlockCache& cache, Block* b, std::size_t rounded) {
  // A full table: one older block goes back to the pool (it stays allocated, uncached).
  if (cache.lent_count() >= ThreadBlockCache::kMaxLent) return_lent(cache, cache.lent_any(b->ptr));
  reuse_.lend_to_cache(b);
  CachedBlock e;
  e.block = b;
  e.ptr = b->ptr;
  e.size = b->size;
  e.rounded = rounded;
  e.requested = b->requested;
  e.stream = b->owner;
  e.small = b->seg->small;
  e.split = b->is_split();
  cache.lent_insert(e);
}

void ThreadCaches::return_lent(ThreadBlockCache& cache, int i) {
  reuse_.unlend(cache.lent_at(i));
  cache.lent_erase(i);
}

void ThreadCaches::merge(ThreadBlockCache& cache) { cache.merge_into(ledger_); }

void ThreadCaches::flush(ThreadBlockCache& cache) {
  merge(cache);
  cache.drain_lent([&](const CachedBlock& e) { reuse_.unlend(e); });  // every lent block back
  cache.drain_free([&](const CachedBlock& e) { reuse_.return_cached_free(e); });
  flush_fenced(cache);
}

// Fenced frees, open or closed: into the pool's open batch (Reuse::return_cached_fenced); the
// cache's fence is dropped. Already counted pending and unallocated by the deltas, which are
// merged first.
void ThreadCaches::flush_fenced(ThreadBlockCache& cache) {
  if (!cache.has_fenced()) return;
  merge(cache);
  cache.drain_fenced(fences_, [&](const CachedBlock& e) { reuse_.return_cached_fenced(e); });
}

// Only stale batches: an active owner closes its open batch within the window and collects its
// closed one at its next miss, so taking those away would only send it back to the pool lock —
// and two busy threads that miss in turn would keep emptying each other's caches (seen as a
// bimodal 3-25 M pairs/s in BM_Pool_Contention_Fenced). A batch untouched for kStaleNs means
// an owner that stopped allocating.
bool ThreadCaches::collect_fenced() {
  bool moved = false;
  std::int64_t now = 0;
  for (auto& cache : list_) {
    SpinGuard g(cache->mu);
    if (!cache->has_fenced()) continue;
    if (now == 0) now = Reuse::clock_ns();
    if (!cache->fenced_stale(now, kStaleNs)) continue;
    flush_fenced(*cache);
    moved = true;
  }
  return moved;
}

void ThreadCaches::flush_all() {
  for (auto& cache : list_) {
    SpinGuard g(cache->mu);
    flush(*cache);
  }
}

void ThreadCaches::merge_own() {
  ThreadBlockCache* cache = find(uid_);
  if (cache != nullptr && cache->dirty()) {
    SpinGuard g(cache->mu);
    merge(*cache);
  }
}

bool ThreadCaches::reclaim_lent(std::uintptr_t p) {
  auto reclaim_from = [&](ThreadBlockCache& cache) {
    SpinGuard g(cache.mu);
    if (cache.lent_count() == 0) return false;
    const int i = cache.lent_containing(p);
    if (i < 0) return false;
    merge(cache);  // its deltas describe this block's history
    return_lent(cache, i);
    return true;
  };
  // Usually the freeing thread lent it itself (e.g. free() of a lent block in a fenced pool):
  // look there first; other threads' caches only for cross-thread frees.
  ThreadBlockCache* own = find(uid_);
  if (own != nullptr && reclaim_from(*own)) return true;
  for (auto& cache : list_)
    if (cache.get() != own && reclaim_from(*cache)) return true;
  return false;
}

void ThreadCaches::detach_all() {
  std::lock_guard<std::mutex> reg(registry_mutex());
  SpinGuard pool_lock(pool_mu_);
  for (auto& cache : list_) {
    SpinGuard g(cache->mu);
    cache->forget(fences_);
    cache->detach();
  }
  list_.clear();
}

}  // namespace cudapool::detail
