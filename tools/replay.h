// Replaying a trace through the real DevicePool on a simulated device (tools/sim_device.h).
//
// A trace is first turned into a PreparedTrace: pointers become dense slot numbers, so a replay
// (tune runs dozens on one trace) does no hashing and no parsing, only pool calls.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "allocator/options.h"
#include "allocator/stats.h"
#include "telemetry/trace.h"

namespace cudapool::tools {

struct ReplayOp {
  enum Kind : std::uint8_t { allocate, free, failed_allocate, empty_cache };
  Kind kind;
  std::uint32_t slot;  // allocate/free: which allocation (dense, 0-based)
  std::size_t size;    // allocate: the caller's requested size
  std::uintptr_t stream;
  std::int64_t time_ns;
  TraceDetail detail = TraceDetail::none;  // free: the recorded call (free_sync / free_async / none)
  std::uint32_t site = 0;                  // allocate: TraceRow::site (PreparedTrace::sites)
};

// What the trace itself says, before any replay.
struct TraceFacts {
  std::size_t rows = 0;
  std::size_t allocations = 0, frees = 0, failed_allocations = 0;
  std::size_t unmatched_frees = 0;  // frees of pointers the trace never allocated (skipped)
  std::size_t streams = 0;
  int device = 0;                                     // the device replayed
  std::vector<int> other_devices;                     // rows of these devices are ignored
  bool rmm_only = false;                              // no pool rows (segment_*): a plain allocation log
  std::optional<std::size_t> device_memory;           // from the "device" row
  std::optional<std::size_t> recorded_peak_reserved;  // from segment rows, when present
  std::size_t recorded_peak_allocated = 0;            // sum of live (rounded) allocation sizes
  std::int64_t start_ns = 0, end_ns = 0;
  std::size_t largest_allocation = 0;
  // Frees by the call the program made (traces with the detail column), and those the trace does
  // not say (older traces, RMM logs).
  std::size_t sync_frees = 0, async_frees = 0, unknown_frees = 0;
  // Streams the program created, by kind ("stream" rows).
  std::size_t blocking_streams = 0, non_blocking_streams = 0;
  std::optional<std::string> recorded_policy;  // the trace's policy row (set by load_trace)
  std::size_t threads = 0;                     // distinct Thread values on the replayed device's rows
  bool upstream_durations = false;             // segment rows carry driver times: recorded on a real GPU
  bool expandable_rows = false;                // segment_map/segment_unmap rows: expandable segments
  bool classic_rows = false;                   // segment_alloc/segment_free rows: classic segments
  // From the device row's facts (set by load_trace): the recording driver's page size for
  // expandable segments, and the allocation units of the recording pool that differ from this
  // build's ("small_buffer 2097152 (here 4194304)"). Older traces have no facts.
  bool device_facts = false;
  std::optional<std::size_t> granularity;
  std::vector<std::string> unit_mismatches;
  bool policy_assumed = false;  // recorded_policy was inferred from the rows (no policy row)
};

struct PreparedTrace {
  std::vector<ReplayOp> ops;
  std::uint32_t slots = 0;
  TraceFacts facts;
  std::vector<std::string> sites;  // the trace's call sites (TraceMeta::sites; set by load_trace)
};

// Chooses the device (`device` < 0: the one with the most allocations) and builds the ops.
PreparedTrace prepare_trace(const std::vector<TraceRow>& rows, int device = -1);

// How a recorded free is replayed. `recorded` (the default) replays each free as the call the
// trace says the program made: cudaFree as DevicePool::free (so free_sync takes effect),
// cudaFreeAsync as free_on_stream on the recorded stream; a free whose kind the trace does not
// say (a trace written before the detail column, an RMM log) replays as free_on_stream, which is
// what an RMM log means. `async` and `sync` replay every free one way, whatever the trace says.
enum class FreeMode : std::uint8_t { recorded, async, sync };

// The page size assumed for expandable segments when the trace does not record one (what
// datacenter GPUs report; the generator's simulated device uses it too).
inline constexpr std::size_t kAssumedGranularity = std::size_t{2} << 20;

struct ReplayConfig {
  PoolOptions pool;
  std::optional<std::size_t> device_memory;  // default: the trace's, else kUnknownDeviceMemory
  std::optional<std::size_t> granularity;    // default: the trace's, else kAssumedGranularity
  std::int64_t fence_latency_ns = 0;
  FreeMode free_mode = FreeMode::recorded;
  bool collect_rows = false;  // keep the pool's own events as trace rows (for report)
  // After this op (0-based index into PreparedTrace::ops) the pool's segments and blocks are
  // copied into ReplayResult::snapshot, and collected rows stop there.
  std::optional<std::size_t> snapshot_after_op;
  // Find the op after which reserved was highest (then allocated): ReplayResult::peak_op.
  bool track_peak = false;
};

// The device size assumed when neither the trace nor the user gives one: large enough that no
// realistic trace runs out, so the replay measures the policy and not a guessed limit.
inline constexpr std::size_t kUnknownDeviceMemory = std::size_t{1} << 40;  // 1 TiB

struct ReplayResult {
  Stats stats;
  std::size_t device_memory = 0;
  std::size_t ops = 0;
  double seconds = 0;                        // replay only (no parsing)
  std::size_t failed_allocations = 0;        // the pool said out of memory / error in the replay
  std::size_t recorded_failures_served = 0;  // "allocate failure" rows the replay could serve
  std::size_t bad_frees = 0;                 // the pool refused a free (should be 0)
  std::uint64_t fences = 0, fence_waits = 0;
  std::uint64_t unit_ops = 0;  // expandable: physical allocations created, moved, released
  // "upstream calls" as tools/metrics.h defines it: segment allocate/release and expandable
  // map/unmap (a move counts as both).
  std::uint64_t upstream_calls = 0;
  std::uint64_t device_calls = 0;    // as the simulated device counted them (equal to the above)
  std::vector<TraceRow> rows;        // when collect_rows
  std::optional<Snapshot> snapshot;  // when snapshot_after_op
  // With the snapshot: the call site (ReplayOp::site) of each live block, by its address.
  std::unordered_map<std::uintptr_t, std::uint32_t> block_sites;
  std::size_t peak_op = 0;  // when track_peak
};

// The index of the last op at or before `ns_since_start` of trace time (0 when none is).
std::size_t op_at_time(const PreparedTrace& trace, std::int64_t ns_since_start);

ReplayResult replay_trace(const PreparedTrace& trace, const ReplayConfig& config);

}  // namespace cudapool::tools
