// A caching pool of page-locked (pinned) host memory: what cudaHostAlloc / cudaMallocHost hand
// out and cudaFreeHost takes back, kept and reused instead of pinned and unpinned on every call
// (each costs the driver milliseconds, and a free waits for the whole device).
//
// Plain C++ like the device pool: memory comes from a HostUpstream, the safety of reuse from a
// FenceProvider whose device fences cover every context that could still read or write a freed
// block (cudaFreeHost waits for the device; a cached free records a fence instead, and the block
// is handed out again only once that fence has completed).
//
// Waste is bounded by size classes: a request of s bytes is served with a block of its class,
// at most max(whole pages of s, s + s/4), so a live block holds at most 1.25x its request above
// 16 KiB (smaller requests take whole 4 KiB pages, as the driver pins them). A new segment is
// exactly one class; a free block larger than the class is split (best fit), and free neighbours
// merge, so memory cached in one size serves another. Cached bytes count against max_cached,
// beyond which the longest-cached whole segments go back to the upstream. docs/design.md,
// "Pinned host memory", has the rules and why.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "allocator/fence.h"
#include "allocator/host_options.h"
#include "allocator/options.h"
#include "allocator/reuse.h"
#include "allocator/stats.h"
#include "allocator/types.h"

namespace cudapool {

// What HostUpstream::allocate answers: the memory, or why it cannot be had. `error`: the
// upstream's own code for the refusal (nonzero; the shim's: a CUresult), handed to the caller
// through HostPool::Result::upstream_error.
struct HostUpstreamResult {
  void* ptr = nullptr;
  int error = 0;
};

// Page-locked memory from the driver. `flags`: the cuMemHostAlloc flags of the request.
// allocate() runs on the requesting thread, in the context the memory will belong to;
// release() names that context (`owner`, HostPool::Owner), which it may have to make current.
class HostUpstream {
 public:
  virtual ~HostUpstream() = default;
  // ptr nullptr when the memory cannot be had, with the upstream's reason in `error`.
  virtual HostUpstreamResult allocate(std::size_t bytes, unsigned flags) = 0;
  virtual void release(void* p, std::size_t bytes, unsigned flags, std::uintptr_t owner) = 0;
  // The owner context is gone and took the memory's pinning along: undo what is the upstream's
  // own (memory it mapped itself), without the driver. Called once no block of it is live.
  virtual void forget(void* /*p*/, std::size_t /*bytes*/) {}
};

struct HostStats {
  StatCounter requested_bytes;       // what the program asked for, of its live blocks
  StatCounter allocated_bytes;       // the live blocks' sizes
  StatCounter reserved_bytes;        // all memory held: live, cached, and the reserve's uncarved rest
  StatCounter cached_bytes;          // free blocks kept for reuse
  StatCounter blocks;                // live blocks
  std::int64_t cache_hits = 0;       // allocations served by a cached block
  std::int64_t cache_misses = 0;     // allocations that needed new memory
  std::int64_t fence_skips = 0;      // cached blocks passed over because their fence was running
  std::int64_t upstream_allocs = 0;  // upstream allocations (the reserve counts once)
  std::int64_t upstream_frees = 0;   // upstream releases (cap, empty_cache)
  std::int64_t upstream_ns = 0;      // time spent in them
  std::int64_t fence_waits = 0;      // host waits on a fence (held bound, out of memory, empty_cache)
  std::int64_t bound_waits = 0;      // allocations that waited for a cached block instead of growing
  std::int64_t bad_frees = 0;        // frees of a pointer inside the pool that is not a live block
  std::int64_t bound_releases = 0;   // segments given back to keep held memory within the bound
};

// Memory held (live, cached, reserve) stays within this many times the live requests when new
// memory is needed: a request that would take it past this waits for a fitting cached block the
// GPU is still using instead, and else whole cached segments the GPU is done with go back first
// (HostPool::allocate, trim_for_growth_locked). It is exceeded only by what the GPU still uses
// that fits no request, and by live blocks' class rounding.
inline constexpr double kHeldRatio = 1.25;

// The size a request of `bytes` is served with (see the top of this file). `threshold`:
// HostPoolOptions::max_round_threshold.
std::size_t host_class_size(std::size_t bytes, std::size_t threshold) noexcept;
// The largest block a request of `bytes` may take (its class, or up to 1.25x above 16 KiB).
std::size_t host_max_block(std::size_t bytes, std::size_t threshold) noexcept;

class HostPool {
 public:
  using Owner = std::uintptr_t;  // the context the memory belongs to (opaque)

  HostPool(const HostPoolOptions& o, HostUpstream& upstream, FenceProvider& fences);
  ~HostPool();  // gives nothing back: memory goes with the process or its contexts
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  struct Result {
    AllocStatus status = AllocStatus::ok;
    void* ptr = nullptr;
    int upstream_error = 0;  // out_of_memory: the last upstream refusal's code (0: none was made)
  };
  // A block of at least `bytes` with `flags`, belonging to `owner`: a cached block of the same
  // owner and flags whose free fence has completed and whose size is within the request's bound,
  // else new memory (the reserve first, for flags 0). On upstream out-of-memory, cached blocks
  // whose fences completed go back and the allocation is tried again, then the same after
  // waiting for every fence.
  Result allocate(std::size_t bytes, unsigned flags, Owner owner);
  // cudaFreeHost meaning: the block is reusable once a device fence recorded now has completed.
  // not_owned: not pool memory (the caller passes it on); double_free / interior_pointer:
  // inside pool memory but not a live block's start (nothing changes).
  FreeStatus free(void* p);
  bool owns(const void* p) const;
  // The context `owner` is gone, and its memory with it: forget its blocks without calling the
  // upstream (a live one's later free is accepted and forgets it).
  void forget_owner(Owner owner);
  // Waits for every fence of cached blocks and gives every cached block back (the reserve
  // stays). Returns the bytes given back.
  std::size_t empty_cache();

  HostStats stats() const;
  const HostPoolOptions& options() const noexcept { return opt_; }
  // Every invariant of the bookkeeping (tests): "" or what is wrong.
  std::string check_consistency() const;

 private:
  struct Segment;
  struct Block {
    void* ptr = nullptr;
    std::size_t size = 0;
    std::size_t requested = 0;  // live: the request it serves
    Segment* seg = nullptr;
    Block* prev = nullptr;  // address neighbours in the segment
    Block* next = nullptr;
    bool live = false;
    std::uint64_t freed_at = 0;  // free: when (a counter), for the longest-cached order
    detail::FenceList fences;    // free: reusable once all of these completed (reuse.h, rule 8)
  };
  struct Segment {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    unsigned flags = 0;
    Owner owner = 0;
    bool reserve = false;
    bool orphan = false;  // its context is gone (forget_owner): live blocks are dropped at their free
  };
  struct FreeOrder {
    bool operator()(const Block* a, const Block* b) const {
      return std::tie(a->seg->owner, a->seg->flags, a->size, a->ptr) <
             std::tie(b->seg->owner, b->seg->flags, b->size, b->ptr);
    }
  };

  // How a cached block whose fences were not yet seen complete is asked: plain, urgent (memory
  // is wanted), or wait (the held-memory bound forbids new memory).
  using Ask = detail::Ask;
  bool fences_done_locked(Block* b, Ask ask);
  // The best-fitting cached block for the request whose fences are done (Ask::wait: the first
  // fitting one whose fences can be waited for, after waiting), split to the request's class;
  // nullptr when none.
  // `*running`: fitting blocks passed over because their fences still ran.
  Block* take_cached_locked(std::size_t bytes, unsigned flags, Owner owner, Ask ask, std::size_t* running);
  // New memory of `size` for a request of `bytes` would hold more than kHeldRatio of live requests.
  bool over_bound_locked(std::size_t bytes, std::size_t size) const;
  // nullptr when the upstream refuses, with its code in `*error`.
  Segment* new_segment_locked(std::size_t size, unsigned flags, Owner owner, bool reserve, int* error);
  void split_locked(Block* b, std::size_t size);  // b keeps `size`; the rest becomes a free block
  void insert_free_locked(Block* b);              // merges with free neighbours
  void release_segment_locked(Segment* s);        // a wholly free segment back to the upstream
  std::size_t release_cached_locked(bool wait);
  void trim_for_growth_locked(std::size_t bytes, std::size_t size);
  void trim_to_cap_locked();
  void drop_segment_locked(Segment* s);  // forget it without the upstream (its context is gone)

  const HostPoolOptions opt_;
  HostUpstream& up_;
  FenceProvider& fences_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block*> live_;       // live blocks by start
  std::set<Block*, FreeOrder> free_;             // free blocks (owner, flags, size, address)
  std::map<std::uintptr_t, Segment*> segments_;  // by base
  std::uint64_t clock_ = 0;                      // counts frees
  bool reserve_tried_ = false;
  HostStats stats_;
};

}  // namespace cudapool
