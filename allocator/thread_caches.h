// Internal: the pool side of the per-thread block caches (thread_cache.h has one cache and its
// fast path, docs/design.md "Thread caches" the why): which threads' caches a pool has,
// registration, check-out, stat merging, flushing back into the pool, thread exit, teardown.
// A cache's own fast path (no pool lock) is its own (thread_cache.h: take / put, called by
// pool.cpp) and, for fenced frees, reuse's (reuse.cpp: cache_free_fenced / service_cache).
// Lock order everywhere: cache registry mutex -> pool lock -> a cache's mu. The pool lock guards
// this object, as everything else in the pool; each cache's own state its mu.
#pragma once
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "allocator/events.h"
#include "allocator/fence.h"
#include "allocator/options.h"
#include "allocator/reuse.h"
#include "allocator/spin_lock.h"
#include "allocator/stats_ledger.h"
#include "allocator/thread_cache.h"

namespace cudapool::detail {

std::uint64_t new_pool_uid();  // a key no other pool of the process has had

class ThreadCaches {
 public:
  ThreadCaches(std::uint64_t uid, SpinLock& pool_mu, const PoolOptions& opt, FenceProvider& fences, StatsLedger& ledger,
               Reuse& reuse, EventLog& events)
      : uid_(uid),
        pool_mu_(pool_mu),
        from_first_thread_(opt.cache_from_first_thread),
        max_split_size_(opt.max_split_size),
        fences_(fences),
        ledger_(ledger),
        reuse_(reuse),
        events_(events) {}
  ThreadCaches(const ThreadCaches&) = delete;
  ThreadCaches& operator=(const ThreadCaches&) = delete;

  static constexpr std::int64_t kStaleNs = 1'000'000;  // a cache's batch untouched this long: its owner is idle

  // This thread's cache for the pool with key `uid`, or null. No lock: a thread-local list.
  static ThreadBlockCache* find(std::uint64_t uid);

  // ---- under the pool lock ----
  bool empty() const { return list_.empty(); }
  // This thread's cache, created and registered on first use.
  ThreadBlockCache* create();
  // Caches engage only once a second thread has used the pool: a single-threaded program (and a
  // trace replay) keeps exactly the block placement it had without them.
  bool multi_threaded() const { return multi_threaded_; }
  void note_thread() {
    const std::thread::id me = std::this_thread::get_id();
    if (first_thread_ == std::thread::id{})
      first_thread_ = me;
    else if (me != first_thread_)
      multi_threaded_ = true;
  }
  bool on() const { return (multi_threaded_ || from_first_thread_) && events_.sink == nullptr; }
  bool may_cache(const Block* b) const {
    return on() && b->size <= ThreadBlockCache::kMaxBlock && b->size < max_split_size_;
  }
  // Hand an allocated block (just taken) to the cache as lent.
  void checkout(ThreadBlockCache& cache, Block* b, std::size_t rounded) REQUIRES(cache.mu);
  // A lent entry becomes an ordinary allocated block again.
  void return_lent(ThreadBlockCache& cache, int i) REQUIRES(cache.mu);
  void merge(ThreadBlockCache& cache) REQUIRES(cache.mu);         // apply the stat deltas
  void flush(ThreadBlockCache& cache) REQUIRES(cache.mu);         // merge, then return every block
  void flush_all();                                               // every thread's cache
  void flush_fenced(ThreadBlockCache& cache) REQUIRES(cache.mu);  // its fenced batches only
  // The fenced batches of caches whose owner has left them alone for kStaleNs go into the pool's
  // open batch (a miss: only their owner would close them otherwise). True if any moved.
  bool collect_fenced();
  void merge_own();  // this thread's cache's deltas (program order)
  // The lent block containing p (any address inside) in any cache becomes an ordinary allocated
  // block; true if found.
  bool reclaim_lent(std::uintptr_t p);
  // Pool teardown (the pool lock not held: taken here, after the registry mutex).
  void detach_all();

 private:
  static void exit_flush(ThreadBlockCache& cache);  // thread exit (registry mutex held)

  const std::uint64_t uid_;           // the pool's key in every thread's cache list (never reused)
  SpinLock& pool_mu_;                 // taken by thread exit and teardown only
  const bool from_first_thread_;      // PoolOptions::cache_from_first_thread
  const std::size_t max_split_size_;  // PoolOptions::max_split_size
  FenceProvider& fences_;
  StatsLedger& ledger_;
  Reuse& reuse_;  // every change of a cached block's state (reuse.h, rule 7)
  EventLog& events_;
  std::thread::id first_thread_{};
  bool multi_threaded_ = false;
  std::vector<std::shared_ptr<ThreadBlockCache>> list_;  // registered caches
};

}  // namespace cudapool::detail
