// PyTorch's size rules (docs/design.md, "Size rules"): 512 B rounding,
// roundup_power2_divisions, small/large pool, and the segment size asked from the upstream.
#include <bit>

#include "allocator/pool.h"

namespace cudapool {

namespace {

// Which roundup_power2_divisions bucket a size falls in: bucket i covers [2^(20+i), 2^(21+i)),
// bucket 0 also everything smaller, the last one everything larger.
std::size_t division_bucket(std::size_t size) {
  const int log_size = static_cast<int>(std::bit_width(size)) - 1;
  const int start = 20;  // 1 MiB
  std::size_t index = log_size > start ? static_cast<std::size_t>(log_size - start) : 0;
  return index < kRoundupIntervals ? index : kRoundupIntervals - 1;
}

// The next of `divisions` equal steps between floor_pow2(size) and 2 * floor_pow2(size).
std::size_t next_division(std::size_t size, std::size_t divisions) {
  if (std::has_single_bit(size)) return size;
  const std::size_t floor = std::bit_floor(size);
  const std::size_t step = floor / std::bit_floor(divisions);
  if (step == 0) return floor << 1;
  const std::size_t down = size & ~(step - 1);
  return down == size ? size : down + step;
}

}  // namespace

std::size_t round_size(std::size_t size, const PoolOptions& options) {
  if (size > kMaxRequestSize) return 0;  // absurd: the caller reports invalid_size
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::size_t divisions = options.roundup_power2_divisions[division_bucket(size)];
  // PyTorch applies the divisions only above 512 B * divisions; below, plain 512 B rounding.
  if (divisions > 1 && size > kMinBlockSize * divisions) return next_division(size, divisions);
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::size_t segment_size_for(std::size_t rounded_size) {
  if (rounded_size <= kSmallSize) return kSmallBuffer;
  if (rounded_size < kMinLargeAlloc) return kLargeBuffer;
  return (rounded_size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

bool is_small(std::size_t rounded_size) { return rounded_size <= kSmallSize; }

}  // namespace cudapool
