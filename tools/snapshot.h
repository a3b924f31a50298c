// PyTorch's memory snapshot (the dict torch.cuda.memory._snapshot() returns, pickled as
// torch.cuda.memory._dump_snapshot writes it; torch.cuda._memory_viz and pytorch.org/memory_viz
// read it) from a replay of a trace through the pool: the segments and their blocks at one
// moment, as the pool placed them, and the events up to it as device_traces.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "allocator/stats.h"
#include "telemetry/trace.h"
#include "tools/replay.h"

namespace cudapool::tools {

// What a snapshot holds, in exact numbers (report prints them; tests compare them with the file).
struct SnapshotFigures {
  std::size_t op = 0;     // taken after this op of the replay
  std::int64_t t_ns = 0;  // its trace time, since the trace's start
  bool at_peak = false;   // the moment of peak reserved (no --at)
  std::size_t segments = 0;
  std::uint64_t reserved = 0;   // sum of total_size
  std::uint64_t allocated = 0;  // sum of allocated_size
  std::uint64_t requested = 0;  // sum of requested_size
  std::size_t blocks = 0, active_blocks = 0;
  std::size_t events = 0;              // device_traces entries
  std::size_t blocks_with_frames = 0;  // active blocks whose frames name their call site
};

// The pickle of `snapshot` with `rows` (the pool's events up to it) as device `device`'s trace.
// `conf` and `options` fill allocator_settings.
// With `sites` (the trace's call sites) the alloc entries of `rows` with a site, and the active
// blocks that `block_sites` maps to one, get frames naming it.
std::string snapshot_pickle(const Snapshot& snapshot, const std::vector<TraceRow>& rows, int device,
                            std::size_t device_memory, const std::string& conf, const PoolOptions& options,
                            SnapshotFigures* figures, const std::vector<std::string>* sites = nullptr,
                            const std::unordered_map<std::uintptr_t, std::uint32_t>* block_sites = nullptr);

// Replays `trace` under `config` up to the moment (the peak reserved, or `at_ns` of trace time
// since its start) and builds the pickle there. `conf` is the policy string config was made from.
std::string snapshot_from_replay(const PreparedTrace& trace, const ReplayConfig& config,
                                 std::optional<std::int64_t> at_ns, const std::string& conf, SnapshotFigures* figures);

}  // namespace cudapool::tools
