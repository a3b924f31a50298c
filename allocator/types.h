// Basic vocabulary shared by the pool, the shim and the tools.
// No CUDA header here: streams and devices are opaque integers to the pool.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cudapool {

// A stream as the pool sees it: an opaque handle value. 0 is CUDA's legacy default stream;
// the shim maps per-thread default streams to their own distinct values.
using StreamId = std::uintptr_t;

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
inline constexpr std::size_t GiB = 1024 * MiB;

// PyTorch's size classes (docs/policy.md has the rules they come from).
inline constexpr std::size_t kMinBlockSize = 512;        // every request rounds to this
inline constexpr std::size_t kSmallSize = 1 * MiB;       // <= this: small pool
inline constexpr std::size_t kSmallBuffer = 2 * MiB;     // small-pool segment size
inline constexpr std::size_t kMinLargeAlloc = 10 * MiB;  // < this: 20 MiB segment
inline constexpr std::size_t kLargeBuffer = 20 * MiB;    // large-pool segment for < 10 MiB
inline constexpr std::size_t kRoundLarge = 2 * MiB;      // larger segments round to this
inline constexpr std::size_t kRoundupIntervals = 16;     // roundup_power2_divisions buckets

// Result of asking the pool for memory.
enum class AllocStatus : std::uint8_t {
  ok,
  out_of_memory,   // upstream refused (or a limit), after release-and-retry
  upstream_error,  // upstream failed for another reason; returned at once, no retry
  invalid_size,    // 0 bytes is not an error at the API (ptr = nullptr); absurd sizes are
};

// Why an allocation was refused (AllocResult::refusal).
enum class Refusal : std::uint8_t {
  none,
  device,  // the upstream (the device) is out of memory
  limit,   // the pool's own limit (per_process_memory_fraction, max_reserved), no upstream call made
  budget,  // a budget outside the device (the shim's group budget) refused the upstream call
};

// Result of giving memory back.
enum class FreeStatus : std::uint8_t {
  ok,
  not_owned,         // pointer is not inside any segment of this pool: caller passes it on
  double_free,       // pointer is the start of a block that is already free or pending
  interior_pointer,  // pointer lies inside a block of this pool but is not its start
};

const char* to_string(AllocStatus s) noexcept;
const char* to_string(FreeStatus s) noexcept;
const char* to_string(Refusal r) noexcept;

}  // namespace cudapool
