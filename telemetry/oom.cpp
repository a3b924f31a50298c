// OOM diagnosis text. Shape follows PyTorch's message (sizes, capacity, free, reserved vs
// allocated, the fragmentation hint); the words are cudapool's.
#include "telemetry/oom.h"

#include <algorithm>
#include <cstdio>

namespace cudapool {

std::string format_size(std::uint64_t bytes) {
  char buf[64];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
    return buf;
  }
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

OomInfo make_oom_info(int device, std::size_t requested, std::size_t asked, Refusal refusal, const Stats& stats,
                      const PoolOptions& options, std::size_t driver_free, std::size_t driver_total,
                      std::size_t external) {
  OomInfo info;
  info.device = device;
  info.requested = requested;
  info.asked = asked;
  info.refusal = refusal;
  auto nonneg = [](std::int64_t v) { return v > 0 ? static_cast<std::size_t>(v) : 0; };
  info.reserved = nonneg(stats.reserved_bytes[kAll].current);
  info.allocated = nonneg(stats.allocated_bytes[kAll].current);
  info.pending = nonneg(stats.pending_bytes);
  info.driver_free = driver_free;
  info.driver_total = driver_total;
  info.limit = options.max_reserved;
  if (options.per_process_memory_fraction > 0.0 && driver_total > 0) {
    auto by_fraction = static_cast<std::size_t>(options.per_process_memory_fraction *
                                                static_cast<double>(driver_total));
    info.limit = std::min(info.limit, by_fraction);
  }
  info.external = external;
  info.expandable_segments = options.expandable_segments;
  return info;
}

namespace {

// " The group budget (64.00 MiB) refused this growth: …": who holds how much of the budget, how
// much of it is free, and what would make room (nothing but a larger budget when the request
// alone is more than it).
std::string group_refusal(const OomInfo& in) {
  if (in.group_budget == 0)
    return " The group budget refused this growth: the processes of the group hold the rest of it (`cudapool top` "
           "shows who).";
  std::string s = " The group budget (" + format_size(in.group_budget) + ") refused this growth: this process holds " +
                  format_size(in.group_own) + " of it";
  if (in.group_other_members > 0)
    s += ", the " + std::to_string(in.group_other_members) + " other member(s) " + format_size(in.group_others);
  else
    s += ", no other member holds any";
  if (in.group_exited_members > 0)
    s += ", " + std::to_string(in.group_exited_members) + " member(s) that exited still " +
         format_size(in.group_exited) + " (given back when the next member joins or is refused)";
  const std::size_t held = in.group_own + in.group_others + in.group_exited;
  s += "; " + format_size(held < in.group_budget ? in.group_budget - held : 0) + " of it is free.";
  if (in.requested > in.group_budget)
    s += " The request alone (" + format_size(in.requested) +
         ") is more than the whole budget: no release makes room for it; raise group_budget_mb (or "
         "group_budget_fraction), or allocate less at once.";
  else if (in.asked > in.group_budget)
    s += " The growth the pool asked for (" + format_size(in.asked) +
         ") is more than the whole budget; raise group_budget_mb (or group_budget_fraction).";
  else if (in.group_other_members == 0 && in.group_exited_members == 0)
    s += " This process alone holds it: raise group_budget_mb (or group_budget_fraction), or hold less at once.";
  else
    s += " `cudapool top` shows who holds what.";
  return s;
}

}  // namespace

std::string format_oom(const OomInfo& in) {
  std::string s = "CUDA out of memory. Tried to allocate " + format_size(in.requested);
  if (in.asked > 0 && in.asked != in.requested) s += " (the pool asked to grow by " + format_size(in.asked) + ")";
  s += ". GPU " + std::to_string(in.device);
  if (in.driver_total > 0) {
    s += " has a total capacity of " + format_size(in.driver_total) + " of which " + format_size(in.driver_free) +
         " is free";
    // Free on the device is not free under the budget: say which one refused.
    if (in.refusal == Refusal::budget) s += " on the device, but the group budget is what refused";
  } else {
    s += " reported no capacity";
  }
  const std::size_t unallocated = in.reserved > in.allocated ? in.reserved - in.allocated : 0;
  s += ". Of the memory cudapool reserved (" + format_size(in.reserved) + "), " + format_size(in.allocated) +
       " is allocated and " + format_size(unallocated) + " is reserved but unallocated";
  if (in.pending > 0) s += " (" + format_size(in.pending) + " of it freed, waiting for GPU work)";
  s += ".";
  if (in.external > 0)
    s += " The program mapped " + format_size(in.external) + " itself (cuMemCreate), counted against the limit.";
  if (in.refusal == Refusal::limit) {
    s += " The pool's limit is " + format_size(in.limit) + " and it refused this growth before the driver was asked.";
  } else if (in.limit != kNoLimit) {
    s += " The pool's limit is " + format_size(in.limit);
    s += in.refusal == Refusal::device ? "; the driver refused below it." : ".";
  }
  if (in.refusal == Refusal::budget) s += group_refusal(in);
  // Fragmentation hint: a lot is cached but nothing fits. 20 % of reserved and at least the
  // request itself, so a nearly empty cache does not trigger it.
  const bool fragmented = unallocated >= in.requested && unallocated * 5 >= in.reserved && unallocated > 0;
  if (fragmented && !in.expandable_segments) {
    s += " If reserved but unallocated memory is large try setting "
         "CUDAPOOL_CONF=expandable_segments:True to avoid fragmentation.";
  }
  return s;
}

}  // namespace cudapool
