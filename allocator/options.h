// The pool's policy knobs. config/ parses CUDAPOOL_CONF / TOML into this; tests set it directly.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "allocator/types.h"

namespace cudapool {

// What cudaFree (a free without a stream) means for reuse.
enum class FreeSync : std::uint8_t {
  // Reusable after a device-wide fence recorded after the free completes; when memory whose fence
  // still runs is needed, it is reused at once and every stream is made to wait for that fence
  // on the GPU (FenceProvider::order_after) instead of the pool growing or the host waiting
  // (default).
  gpu_wait,
  fenced,     // reusable after the device-wide fence completes; until then the pool grows instead
  device,     // like fenced, but when pending memory is needed the host waits for the fence
  immediate,  // reusable at once on the block's allocation stream (PyTorch's own semantics)
};

inline constexpr std::size_t kNoLimit = std::numeric_limits<std::size_t>::max();

struct PoolOptions {
  // Blocks >= this are "oversize": never split, not handed to smaller requests. kNoLimit = off.
  std::size_t max_split_size = kNoLimit;
  // A request >= max_split_size takes an oversize block only if block < request + this.
  std::size_t max_non_split_rounding = 20 * MiB;
  // roundup_power2_divisions per bucket; bucket i covers [2^(20+i), 2^(21+i)) bytes, bucket 0 also
  // everything below 2 MiB, the last bucket everything above. 0 or 1 = plain 512 B rounding.
  std::array<std::uint32_t, kRoundupIntervals> roundup_power2_divisions{};
  // 0 = off; else in (0, 1): GC starts when reserved exceeds this fraction of the allowed memory.
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  // When true the pool lock is dropped while the upstream allocates / releases.
  bool release_lock_on_cudamalloc = false;
  // 0 = unset; else (0, 1]: reserved may not exceed this fraction of the device's total memory.
  double per_process_memory_fraction = 0.0;
  // Absolute cap on reserved bytes. kNoLimit = off.
  std::size_t max_reserved = kNoLimit;
  FreeSync free_sync = FreeSync::gpu_wait;
  // expandable_segments: before the mapped total would rise above its previous peak, and when
  // memory freed earlier still waits for a fence that would cover the growth, wait for the
  // oldest such fence instead of mapping new pages (docs/design.md, "Expandable segments").
  bool expandable_wait = true;
  // expandable_segments: growth that keeps the mapped total within the live peak (times
  // 1 + headroom) plus this many bytes asks no fence first: it recycles free
  // pages whose fences have passed and maps fresh ones for the rest, without a GPU-side or host
  // wait. Classic pools get the same room from their spare segments: blocks freed with cudaFree
  // get the time their fences need, instead of every stream being made to wait on the GPU each
  // time the last free page is used up. 0 = none.
  std::size_t expandable_slack = 16 * MiB;
  // expandable_segments: the large pool's range maps pages of this many bytes (rounded up to a
  // multiple of the driver's granularity; 0 = the granularity itself, the default). The small
  // pool always uses the granularity. CUDA's map and access calls cost about the same per
  // physical allocation whatever its size (H200: ~50 us for 2 MiB or 20 MiB), so 20 MiB pages,
  // PyTorch's choice for its large pool, make growth ~10x cheaper per byte; the price is coarser
  // recycling (a page goes back only when all of it is free): PyTorch's peak on the H200 rose
  // from 1.00x to 1.075x of no caching with 20 MiB pages (docs/benchmarks.md).
  std::size_t expandable_large_page = 0;
  // expandable_segments: growth maps fresh memory in physical allocations of up to this many
  // bytes (whole pages; 0 or anything below a page = one page each). The driver's map and access
  // calls cost per allocation (~40-50 us on the H200), so a 2 GiB growth in 2 MiB pages spends
  // ~50 ms in the driver and in 64 MiB units ~1.5 ms. A unit is recycled or given back only
  // when all of it is free, so larger units can hold free memory that smaller ones would return;
  // the page (the alignment and smallest unit) stays fine-grained, so the ends of a mapping
  // still cost at most a page (docs/design.md, "Physical units").
  std::size_t expandable_max_unit = 16 * MiB;
  // expandable_segments: units scale with the pool. Growth maps units of at most the pool's
  // reserved bytes / this (rounded down to a power of two, at least a page), so a small pool
  // keeps small units: a unit half in use holds its free half, and 16 MiB units held ResNet-50
  // inference 3 % over its no-caching floor where 4 MiB ones held it at 0.2 % (H200,
  // docs/benchmarks.md). A large pool reaches expandable_max_unit and maps as few units as
  // before. 0: every unit up to expandable_max_unit (expandable_unit_mb set explicitly).
  std::size_t expandable_unit_share = 64;
  // expandable_segments: growth maps fresh pages, without recycling or waiting, while the mapped
  // total stays within the peak of live (allocated) bytes times 1 + this; beyond that it recycles
  // as before. 0 (the default) keeps memory at the floor; a few percent trades that much memory
  // for fewer page moves and fence waits (replays in docs/benchmarks.md).
  double expandable_headroom = 0.0;
  // Per-thread caches (docs/design.md, "Thread caches") engage from the first thread. false (the
  // default): only once a second thread has used the pool, so a single-threaded replay keeps the
  // exact placement of the traced run. The shim sets it under FreeSync::immediate: a traced run
  // has an event sink, which turns caches off anyway, and an untraced single-threaded program
  // gains the cache's hit path.
  bool cache_from_first_thread = false;
};

}  // namespace cudapool
