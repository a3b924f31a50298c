// Internal: the row formatter shared by the trace writer (hot flush path) and format_trace_row.
// Writes into caller memory only, no allocation, so it is usable from the signal flush path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "telemetry/trace.h"

namespace cudapool::trace_detail {

// Longest row format_row can produce, newline included.
inline constexpr std::size_t kMaxRowChars = 256;

// Seconds east of UTC, used to print Time as local wall-clock time like spdlog (RMM) does.
// Computed once per writer so that formatting never calls localtime.
std::int64_t local_utc_offset_s();

// Formats `row` + '\n' at `out` (at least kMaxRowChars free). Returns the number of chars.
// A policy row's detail is left empty: the caller appends quote_csv(text) before the newline.
std::size_t format_row(const TraceRow& row, std::int64_t utc_offset_s, char* out) noexcept;

// `text` as one CSV field: in double quotes, quotes doubled, line breaks made spaces.
std::string quote_csv(const std::string& text);

}  // namespace cudapool::trace_detail
