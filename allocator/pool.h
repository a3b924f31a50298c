// One caching pool for one device (one CUDA context). Thread-safe: one short-section lock on the
// hot path, and per-thread caches in front of it for stream-local reuse (docs/design.md).
//
// Contract (see docs/design.md for the why):
//  * allocate(size, stream): best fit among blocks usable by `stream`; else a new segment from
//    the upstream; on refusal, release cache and retry (PyTorch's order), then out_of_memory.
//  * free(p): cudaFree meaning. The block becomes reusable by any stream only after a device-wide
//    fence recorded after the free has completed (FreeSync::fenced/device); with
//    FreeSync::immediate it is reusable at once on its allocation stream.
//  * free_on_stream(p, s): cudaFreeAsync meaning. Reusable at once on `s`; by other streams
//    only after a fence on `s` recorded after the free has completed.
//  * Bad frees return a distinct status and leave the pool untouched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "allocator/events.h"
#include "allocator/fence.h"
#include "allocator/options.h"
#include "allocator/stats.h"
#include "allocator/types.h"
#include "allocator/upstream.h"

namespace cudapool {

struct AllocResult {
  void* ptr = nullptr;
  AllocStatus status = AllocStatus::ok;
  // out_of_memory: who said no. `budget` when a budget outside the device refused any upstream
  // call of this allocation (other processes sharing that budget may hold idle memory); else
  // what refused last.
  Refusal refusal = Refusal::none;
  // upstream_error (and out_of_memory from the upstream): the upstream's own error code (the
  // shim: the driver's CUresult), 0 when it has none.
  int upstream_error = 0;
  // out_of_memory: the bytes the last refused growth asked for (a segment, or pages to map into
  // an expandable range); 0 when the pool asked nobody (a size no segment can hold).
  std::size_t asked_bytes = 0;
};

// Where an address lies, for cuMemGetAddressRange / cuPointerGetAttribute / IPC answers.
struct AddressInfo {
  std::uintptr_t block_base = 0;  // the live block containing the address
  std::size_t block_size = 0;     // the size the caller asked for (not the rounded size)
  std::uintptr_t segment_base = 0;
  std::size_t segment_size = 0;
  bool whole_segment = false;  // the block is the only block of its segment (IPC-safe)
  bool expandable = false;
};

class DevicePool {
 public:
  DevicePool(int device, const PoolOptions& options, Upstream& upstream, FenceProvider& fences,
             EventSink* sink = nullptr);
  // Releases every segment still held back to the upstream. The shim never destroys its pools
  // (no CUDA at exit); tests and tools do.
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  AllocResult allocate(std::size_t size, StreamId stream);
  FreeStatus free(void* ptr);
  FreeStatus free_on_stream(void* ptr, StreamId stream);
  // Warm start: one growth of `bytes` for the small or the large pool, serving nothing: `bytes`
  // of pages mapped into that pool's expandable range (free memory next to them counts), or one
  // classic segment (segment_size_for(bytes); the small pool's are 2 MiB). The memory is free at
  // once, as a growth leaves it (fresh segments for any stream, pages for `stream` at once).
  // Nothing counts as an allocation, no cached memory is given back and no fence is waited for;
  // a refusal comes back as allocate's would (status, refusal, asked_bytes) but is not counted
  // as an out-of-memory. ptr: the free block the growth made or extended.
  AllocResult prefill(std::size_t bytes, bool small, StreamId stream);

  // The live block containing `ptr` (any address inside it), or nullopt if none.
  std::optional<AddressInfo> address_info(const void* ptr) const;
  // true if `ptr` lies in any segment of this pool.
  bool owns(const void* ptr) const;

  // Wait for pending fences, then release every segment with no live block. Returns bytes released.
  std::size_t empty_cache();
  // Give back at least `want` bytes of idle cached memory if the pool has them, and not much more:
  // whole free segments and whole free pages, the longest-cached first. Memory whose fence has
  // passed goes first; only when that is not enough does it wait for pending fences (as
  // empty_cache does) and go on. Never a live block. Returns bytes released (0 for want = 0).
  std::size_t release_idle(std::size_t want);
  // Device memory the program takes outside the pool (the shim: cuMemCreate by the program
  // itself) counts against the pool's limit. reserve_external: true if `bytes` more fit under the
  // limit, after giving back idle cached memory to make room if needed (as release_idle); false
  // leaves nothing counted. unreserve_external: those bytes were given back.
  bool reserve_external(std::size_t bytes);
  void unreserve_external(std::size_t bytes);
  // Bytes counted by reserve_external and not given back.
  std::size_t external_bytes() const;
  // A stream is about to be destroyed: blocks that only it could reuse become pending on a
  // fence recorded on it now (call before the real destroy).
  void retire_stream(StreamId stream);
  // The context is gone (reset/destroy): forget every segment without calling the upstream.
  void abandon();

  // Bytes reserved but not allocated (cached free + pending): counted as free by cuMemGetInfo.
  std::size_t cached_bytes() const;
  Stats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  Snapshot snapshot() const;
  const PoolOptions& options() const;
  int device() const;

  // Replace the event sink (nullptr = none). Not synchronized with concurrent allocations.
  void set_event_sink(EventSink* sink);

  // Walks every internal structure and returns "" if they agree with each other (free sets,
  // block states, neighbours, pointer map, stats), else the first disagreement. Slow; for tests
  // and debugging tools.
  std::string check_consistency() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Requests above this are refused with invalid_size before any rounding (no overflow possible).
inline constexpr std::size_t kMaxRequestSize = 1024 * GiB;

// Size rules, exposed for tests, tools and documentation.
// round_size returns 0 for a size above kMaxRequestSize.
std::size_t round_size(std::size_t size, const PoolOptions& options);
std::size_t segment_size_for(std::size_t rounded_size);
bool is_small(std::size_t rounded_size);

// The monotonic clock the pool's fence batch window reads (nanoseconds). Tests install a fake
// one, the replay tool the trace's time; nullptr restores the default, steady time read from the
// CPU's counter where that is cheaper (allocator/pool_clock.h). Process-wide; set it only while
// no pool is being used by another thread.
using PoolClockFn = std::int64_t (*)();
void set_pool_clock_for_testing(PoolClockFn clock);

}  // namespace cudapool
