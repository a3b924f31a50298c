// Out-of-memory diagnosis text, shaped like PyTorch's "CUDA out of memory" message so that users
// (and their grep patterns) recognise it, plus what cudapool knows in addition (the growth the
// pool asked for, who refused it, pending bytes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "allocator/options.h"
#include "allocator/stats.h"
#include "allocator/types.h"

namespace cudapool {

// "512 bytes", "1.50 KiB", "20.00 MiB", "139.80 GiB": bytes below 1 KiB as an integer, else
// two decimals in the largest unit not exceeding the value (PyTorch's format_size).
std::string format_size(std::uint64_t bytes);

struct OomInfo {
  int device = 0;
  std::size_t requested = 0;    // what the program asked for
  std::size_t asked = 0;        // the growth the pool asked for (a segment, or pages; 0 = none)
  std::size_t reserved = 0;     // pool's reserved bytes
  std::size_t allocated = 0;    // pool's allocated bytes
  std::size_t pending = 0;      // freed, waiting for a fence
  std::size_t driver_free = 0;  // per cuMemGetInfo, the real one (not the shim's fixed-up one)
  std::size_t driver_total = 0;
  std::size_t limit = kNoLimit;     // the pool's effective cap on reserved bytes; kNoLimit = none
  Refusal refusal = Refusal::none;  // who said no: the driver, the pool's limit or the group budget
  std::size_t external = 0;         // memory the program mapped itself, counted against the limit
  bool expandable_segments = false;
  // Refusal::budget: the group's budget and who holds it at the refusal (group_budget 0 = not
  // known): this process, the other members, and members that exited but are still charged.
  std::size_t group_budget = 0;
  std::size_t group_own = 0, group_others = 0, group_exited = 0;
  int group_other_members = 0, group_exited_members = 0;
};

// Fills the pool-side fields from stats and options (reserved, allocated, pending, limit).
// limit = min(max_reserved, per_process_memory_fraction * driver_total) when set. `asked` and
// `refusal` are the pool's own account of the refused growth (AllocResult).
OomInfo make_oom_info(int device, std::size_t requested, std::size_t asked, Refusal refusal, const Stats& stats,
                      const PoolOptions& options, std::size_t driver_free, std::size_t driver_total,
                      std::size_t external = 0);

// The multi-sentence diagnosis (one line, no trailing newline). Always contains the requested
// size, the growth asked for, reserved, allocated, driver free/total, the limit when there is one
// and who refused;
// for a group budget's refusal, who holds the budget, or that the request alone is more than it;
// suggests expandable_segments:True when reserved-but-unallocated is large (≥ 20 % of reserved
// and ≥ the request) and expandable segments are off.
std::string format_oom(const OomInfo& info);

}  // namespace cudapool
