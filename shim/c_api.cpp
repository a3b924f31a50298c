// The cudapool_* C functions (shim/cudapool.h).
#include "shim/cudapool.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "allocator/pool.h"
#include "config/policy.h"
#include "shim/export.h"
#include "shim/parking/parking.h"
#include "shim/runtime.h"
#include "telemetry/json.h"
#include "telemetry/logging.h"
#include "telemetry/summary.h"

using namespace cudapool;
using namespace cudapool::shim;

namespace {

void append_snapshot(std::string& out, const Snapshot& snap, bool& first_segment) {
  for (const SegmentInfo& s : snap.segments) {
    out += first_segment ? "\n" : ",\n";
    first_segment = false;
    fmt::format_to(std::back_inserter(out),
                   "  {{\"device\": {}, \"address\": {}, \"total_size\": {}, \"allocated_size\": {}, "
                   "\"active_size\": {}, \"requested_size\": {}, \"stream\": {}, \"segment_type\": \"{}\", "
                   "\"is_expandable\": {}, \"blocks\": [",
                   s.device, s.address, s.total_size, s.allocated_size, s.active_size, s.requested_size, s.stream,
                   s.is_small ? "small" : "large", s.is_expandable ? "true" : "false");
    bool first_block = true;
    for (const BlockInfo& b : s.blocks) {
      fmt::format_to(std::back_inserter(out),
                     "{}{{\"address\": {}, \"size\": {}, \"requested_size\": {}, \"state\": \"{}\"}}",
                     first_block ? "" : ", ", b.address, b.size, b.requested_size, to_string(b.state));
      first_block = false;
    }
    out += "]}";
  }
}

// The policy as PyTorch's snapshot names it (allocator_settings): the settings it shares with
// PyTorch's allocator, and the whole policy as the string that sets it.
void append_allocator_settings(std::string& out, const Policy& policy) {
  const PoolOptions& o = policy.pool;
  out += ", \"allocator_settings\": {\"PYTORCH_CUDA_ALLOC_CONF\": ";
  json::append_string(&out, to_conf_string(policy));
  fmt::format_to(std::back_inserter(out), ", \"max_split_size\": {}, \"garbage_collection_threshold\": ",
                 o.max_split_size == kNoLimit ? -1 : static_cast<long long>(o.max_split_size));
  json::append_double(&out, o.garbage_collection_threshold);
  fmt::format_to(std::back_inserter(out),
                 ", \"expandable_segments\": {}, \"release_lock_on_cudamalloc\": {}, \"roundup_power2_divisions\": [",
                 o.expandable_segments ? "true" : "false", o.release_lock_on_cudamalloc ? "true" : "false");
  for (std::size_t i = 0; i < o.roundup_power2_divisions.size(); ++i)
    fmt::format_to(std::back_inserter(out), "{}{}", i ? ", " : "", o.roundup_power2_divisions[i]);
  out += "]}";
}

// Copies `text` into buf (NUL-terminated, cut to size - 1; nothing when buf is NULL or size 0);
// returns its full length, so a caller can size a second try.
size_t copy_out(const std::string& text, char* buf, size_t size) {
  if (buf != nullptr && size > 0) {
    const size_t n = text.size() < size - 1 ? text.size() : size - 1;
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

}  // namespace

CUDAPOOL_EXPORT int cudapool_api_version(void) { return CUDAPOOL_API_VERSION; }

CUDAPOOL_EXPORT int cudapool_active(void) {
  Runtime* rt = Runtime::peek();
  return rt != nullptr && rt->native() ? 1 : 0;
}

CUDAPOOL_EXPORT int cudapool_get_stats(int device, struct cudapool_stats* out) {
  Runtime* rt = Runtime::peek();
  if (rt == nullptr || out == nullptr) return -1;
  cudapool_stats acc{};
  acc.device = device;
  bool any = false;
  rt->for_each_pool([&](ContextPool& cp) {
    if (cp.device != device) return;
    any = true;
    const Stats s = cp.pool.stats();
    acc.allocated_bytes += s.allocated_bytes[kAll].current;
    acc.allocated_bytes_peak += s.allocated_bytes[kAll].peak;
    acc.reserved_bytes += s.reserved_bytes[kAll].current;
    acc.reserved_bytes_peak += s.reserved_bytes[kAll].peak;
    acc.allocations += s.allocation[kAll].current;
    acc.segments += s.segment[kAll].current;
    acc.cache_hits += s.cache_hits;
    acc.cache_misses += s.cache_misses;
    acc.pending_bytes += s.pending_bytes;
    acc.num_device_alloc += s.num_device_alloc;
    acc.num_device_free += s.num_device_free;
    acc.num_ooms += s.num_ooms;
    acc.bad_frees += s.bad_frees;
  });
  if (!any) return -1;
  *out = acc;
  return 0;
}

CUDAPOOL_EXPORT size_t cudapool_memory_stats_json(int device, char* buf, size_t size) {
  std::string out = "{";
  if (Runtime* rt = Runtime::peek()) {
    // Sum the device's pools name by name: peaks of several contexts add up as the summary does.
    std::vector<std::pair<std::string, std::int64_t>> sum;
    rt->for_each_pool([&](ContextPool& cp) {
      if (cp.device != device) return;
      auto flat = flatten_stats(cp.pool.stats());
      if (sum.empty())
        sum = std::move(flat);
      else
        for (std::size_t i = 0; i < sum.size() && i < flat.size(); ++i) sum[i].second += flat[i].second;
    });
    bool first = true;
    for (const auto& [name, value] : sum) {
      fmt::format_to(std::back_inserter(out), "{}\"{}\": {}", first ? "" : ", ", name, value);
      first = false;
    }
    if (!first) {  // parking, process-wide (every device parks and restores together)
      const park::Counters c = park::counters();
      fmt::format_to(std::back_inserter(out),
                     ", \"parks\": {}, \"unparks\": {}, \"park_bytes_out\": {}, \"park_bytes_in\": {}, "
                     "\"park_ns\": {}, \"unpark_ns\": {}, \"parked_bytes\": {}",
                     c.parks, c.unparks, c.bytes_out, c.bytes_in, c.park_ns, c.unpark_ns, park::parked_bytes());
    }
  }
  out += "}";
  return copy_out(out, buf, size);
}

CUDAPOOL_EXPORT int64_t cudapool_passthrough_count(const char* kind) {
  if (kind == nullptr) return -1;
  Runtime* rt = Runtime::peek();
  for (int k = 0; k < static_cast<int>(PassKind::count_); ++k) {
    if (std::strcmp(kind, to_string(static_cast<PassKind>(k))) == 0) {
      return rt != nullptr ? rt->passes(static_cast<PassKind>(k)) : 0;
    }
  }
  return -1;
}

CUDAPOOL_EXPORT size_t cudapool_snapshot_json(char* buf, size_t size) {
  std::string out = "{\"segments\": [";
  bool first = true;
  Runtime* rt = Runtime::peek();
  if (rt != nullptr) {
    rt->for_each_pool([&](ContextPool& cp) { append_snapshot(out, cp.pool.snapshot(), first); });
  }
  out += first ? "]" : "\n]";
  if (rt != nullptr) append_allocator_settings(out, rt->policy());
  out += "}";
  return copy_out(out, buf, size);
}

CUDAPOOL_EXPORT size_t cudapool_empty_cache(void) {
  Runtime* rt = Runtime::peek();
  if (rt == nullptr || Runtime::exiting()) return 0;
  size_t freed = 0;
  rt->for_each_pool([&](ContextPool& cp) { freed += cp.pool.empty_cache(); });
  return freed;
}

CUDAPOOL_EXPORT void cudapool_set_clock_for_testing(int64_t (*clock)(void)) { set_pool_clock_for_testing(clock); }

namespace {
thread_local std::string tl_park_why;

}  // namespace

CUDAPOOL_EXPORT int cudapool_park(int discard) {
  tl_park_why.clear();
  if (Runtime::peek() == nullptr || Runtime::exiting()) {
    tl_park_why = "CUDA has not been used through the pool in this process";
    return -1;
  }
  return park::park(discard != 0 ? park::Mode::discard : park::Mode::copy, "cudapool_park", &tl_park_why) ? 0 : -1;
}

CUDAPOOL_EXPORT int cudapool_unpark(void) {
  tl_park_why.clear();
  return park::unpark(&tl_park_why) ? 0 : -1;
}

CUDAPOOL_EXPORT int cudapool_parked(size_t* parked_bytes) {
  const bool p = park::parked();
  if (parked_bytes != nullptr) *parked_bytes = p ? static_cast<size_t>(park::parked_bytes()) : 0;
  return p ? 1 : 0;
}

CUDAPOOL_EXPORT size_t cudapool_park_why(char* buf, size_t size) { return copy_out(tl_park_why, buf, size); }

CUDAPOOL_EXPORT int cudapool_set_log_level(const char* level) {
  if (level == nullptr) return -1;
  return set_log_level(level) ? 0 : -1;
}

CUDAPOOL_EXPORT int cudapool_reset_peak_stats(int device) {
  Runtime* rt = Runtime::peek();
  if (rt == nullptr) return -1;
  bool any = false;
  rt->for_each_pool([&](ContextPool& cp) {
    if (cp.device != device) return;
    cp.pool.reset_peak_stats();
    any = true;
  });
  return any ? 0 : -1;
}

CUDAPOOL_EXPORT int cudapool_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  Runtime* rt = Runtime::peek();
  if (rt == nullptr || free_bytes == nullptr || total_bytes == nullptr || Runtime::exiting()) return -1;
  size_t f = 0, t = 0, cached = 0, reserved = 0;
  bool any = false;
  rt->for_each_pool([&](ContextPool& cp) {
    if (cp.device != device) return;
    if (!any) cp.upstream.mem_info(&f, &t);  // the driver's figures for the device
    any = true;
    cached += cp.pool.cached_bytes();
    reserved += static_cast<size_t>(cp.pool.stats().reserved_bytes[kAll].current) + cp.pool.external_bytes();
  });
  if (!any) return -1;
  // As cuMemGetInfo under the shim: the pool's cache is free memory, a cap is the total.
  f += cached;
  const PoolOptions& po = rt->policy().pool;
  size_t cap = po.max_reserved;
  if (po.per_process_memory_fraction > 0.0)
    cap = std::min(cap, static_cast<size_t>(po.per_process_memory_fraction * static_cast<double>(t)));
  if (cap < t) {
    t = cap;
    const size_t room = cap > reserved ? cap - reserved : 0;
    f = std::min(f, room + cached);
  }
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}
