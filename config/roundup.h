// roundup_power2_divisions: the scalar and the list form, both ways (text -> buckets -> text).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "allocator/types.h"

namespace cudapool::config {

using RoundupBuckets = std::array<std::uint32_t, kRoundupIntervals>;

// Largest division count accepted: the pool stores counts as uint32, and past this the steps are
// far below the 512 B granule anyway.
inline constexpr std::uint64_t kMaxRoundupDivisions = std::uint64_t{1} << 31;

// `text` is the value as written after `roundup_power2_divisions:`, whitespace already removed or
// not: "4", or "[256:1,512:2,>:4]" (`=` may stand for `:`). Empty return = ok, `out` replaced.
std::string parse_roundup(std::string_view text, RoundupBuckets& out);
// The shortest text parse_roundup reads back as `buckets`: a scalar when all are equal, else a list.
std::string format_roundup(const RoundupBuckets& buckets);

}  // namespace cudapool::config
