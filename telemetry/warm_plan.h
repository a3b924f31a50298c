// A warm-start plan: the segments each device's pool held when its reserved memory peaked in a
// recorded run, so that a later run of the same program can preallocate them when its pool
// starts (policy key warm_start; shim/warm_start/warm_start.cpp) and its first step does not grow the pool.
//
// Two sources: a plan file written by `cudapool plan` (replays the trace on the pool core and
// also records how each segment was split at the peak), or a trace itself (trace_file), read
// here from its recorded segment rows. Both are files from outside the process: every count and
// size is bounded, and the first malformed line stops the read with "line N: what is wrong".
//
// The plan file is text, one record per line ('#' starts a comment line; blank lines pass):
//   cudapool-warm-start-plan 1                         (the first line, exactly)
//   source train.csv                                   (optional: what it was made from)
//   device 0 peak_reserved 46137344                    (optional, once per device)
//   segment 0 large classic 20971520 split 10485760,10485760
//   segment 0 small expandable 4194304
// `segment DEVICE small|large classic|expandable BYTES [split B1,B2,...]`: one segment (classic)
// or one run of mapped pages (expandable) of the pool kind; `split`: its blocks at the peak in
// address order, summing to BYTES. docs/trace-format.md, "Warm-start plans", has the rules.
#pragma once
#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

namespace cudapool {

struct WarmSegment {
  int device = 0;
  bool small = false;       // the small pool's (blocks of at most 1 MiB)
  bool expandable = false;  // a run of mapped pages of an expandable range, else a classic segment
  std::size_t bytes = 0;
  std::vector<std::size_t> split;  // the blocks at the peak, in address order; empty = not known
};

struct WarmDevice {
  int device = 0;
  std::size_t peak_reserved = 0;  // as recorded (0 = not said)
};

struct WarmPlan {
  std::string source;  // what the plan was made from (text for people)
  std::vector<WarmDevice> devices;
  std::vector<WarmSegment> segments;
  // Bytes of `device`'s segments of one pool kind, and of both.
  std::size_t bytes(int device, bool small) const;
  std::size_t bytes(int device) const;
};

// Bounds on what a plan may hold (a larger or crafted file is refused, naming the line).
inline constexpr std::string_view kWarmPlanMagic = "cudapool-warm-start-plan 1";
inline constexpr std::size_t kMaxWarmPlanFile = std::size_t{64} << 20;     // bytes of a plan file
inline constexpr std::size_t kMaxWarmPlanLine = 64 * 1024;                 // characters of one line
inline constexpr std::size_t kMaxWarmSegments = 100000;                    // segment lines, all devices
inline constexpr std::size_t kMaxWarmSplit = 4096;                         // blocks of one segment
inline constexpr std::size_t kMaxWarmSegmentBytes = std::size_t{1} << 40;  // 1 TiB, the largest request
inline constexpr std::size_t kMaxWarmDeviceBytes = std::size_t{64} << 40;  // 64 TiB per device
inline constexpr std::size_t kWarmUnit = 512;                              // sizes are multiples of this
// A trace read for a warm start: rows and live segments at most (a plan made by `cudapool plan`
// is the small form of a long trace).
inline constexpr std::uint64_t kMaxWarmTraceRows = std::uint64_t{1} << 27;
inline constexpr std::size_t kMaxWarmTraceLive = kMaxWarmSegments;
// The largest trace load_warm_plan reads (the shim reads it at a pool's first allocation, where a
// long parse would stall the program): about a million rows, a second or two.
inline constexpr std::size_t kMaxWarmTraceFile = std::size_t{64} << 20;

// Parses a plan file's text. false with *error = "line N: what is wrong" on the first problem.
bool parse_warm_plan(std::string_view text, WarmPlan* plan, std::string* error);
// The plan as a file (parse_warm_plan reads it back to the same plan).
std::string format_warm_plan(const WarmPlan& plan);
// From a trace's recorded segment rows (segment_alloc/segment_free for classic segments,
// segment_map/segment_unmap for expandable pages): for each device, the segments it held at the
// first row where its reserved bytes were highest. A mapped run counts for the pool kind of the
// allocation it was mapped for (the next allocate row of that device; large when none follows).
// `in` is read twice (the peak first, then the segments held there), so it must be seekable.
// false with *error = "line N: what is wrong" on a malformed trace or one past the bounds.
bool warm_plan_from_trace(std::istream& in, WarmPlan* plan, std::string* error);
// Reads `path` (a regular file; a plan when its first line is kWarmPlanMagic, else a trace).
// false with *error = "PATH:N: what is wrong" or "PATH: why it cannot be read".
bool load_warm_plan(const std::string& path, WarmPlan* plan, std::string* error);

}  // namespace cudapool
