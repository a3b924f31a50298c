#include <cstdio>
#include <unordered_map>
#include <utility>

#include "tools/json_text.h"
#include "tools/render.h"

namespace cudapool::tools {

namespace {

// Microseconds (the trace-event format's unit) from the first row.
double us_since(std::int64_t t, std::int64_t start) { return static_cast<double>(t - start) / 1000.0; }

// The memory counters. Perfetto copes with large files, but a million counter events help
// nobody: keep each bucket's extremes of at most 200 000 points (every point when there are fewer).
void add_counters(const TraceReport& r, const std::string& pid, std::string* o) {
  char buf[160];
  for (const auto& p : downsample(r.timeline, 200000)) {
    std::snprintf(buf, sizeof buf, ",\n{\"name\":\"memory\",\"ph\":\"C\",\"pid\":%s,\"tid\":0,\"ts\":%.3f,\"args\":{",
                  pid.c_str(), static_cast<double>(p.t_ns) / 1000.0);
    *o += buf;
    *o += "\"allocated\":" + std::to_string(p.allocated) + ",\"reserved\":" + std::to_string(p.reserved) + "}}";
  }
}

// The pool's moments (OOMs, refusals, gc, empty_cache) as instant events.
void add_instants(const std::vector<TraceRow>& rows, int device, const std::string& pid, std::int64_t start,
                  std::string* o) {
  char buf[160];
  for (const auto& row : rows) {
    if (row.device != device) continue;
    const char* name = row.action == TraceAction::oom                ? "oom"
                       : row.action == TraceAction::allocate_failure ? "allocate failure"
                       : row.action == TraceAction::gc               ? "gc"
                       : row.action == TraceAction::empty_cache      ? "empty_cache"
                                                                     : nullptr;
    if (!name) continue;
    std::snprintf(buf, sizeof buf, ",\n{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%s,\"tid\":0,\"ts\":%.3f,",
                  name, pid.c_str(), us_since(row.time_ns, start));
    *o += buf;
    *o += "\"args\":{\"bytes\":" + std::to_string(row.size) + "}}";
  }
}

// The start of an allocation slice's event, phase 'b' (begin) or 'e' (end), up to its time.
void add_slice_head(char phase, std::size_t bytes, std::uint64_t id, std::int64_t t, const std::string& pid,
                    std::int64_t start, std::string* o) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                ",\n{\"name\":\"%zu "
                "B\",\"cat\":\"allocation\",\"ph\":\"%c\",\"id\":%llu,\"pid\":%s,\"tid\":0,\"ts\":%.3f",
                bytes, phase, static_cast<unsigned long long>(id), pid.c_str(), us_since(t, start));
  *o += buf;
}

void add_slice_begin(const TraceRow& row, std::uint64_t id, const std::string& pid, std::int64_t start,
                     std::string* o) {
  add_slice_head('b', row.requested, id, row.time_ns, pid, start, o);
  char buf[160];
  std::snprintf(buf, sizeof buf,
                ",\"args\":{\"address\":\"0x%llx\",\"size\":%zu,\"requested\":%zu,\"stream\":\"0x%llx\"}}",
                static_cast<unsigned long long>(row.ptr), row.size, row.requested,
                static_cast<unsigned long long>(row.stream));
  *o += buf;
}

void add_slice_end(std::uint64_t id, std::size_t bytes, std::int64_t t, const std::string& pid, std::int64_t start,
                   std::string* o) {
  add_slice_head('e', bytes, id, t, pid, start, o);
  *o += "}";
}

// One slice per allocation, from its allocate row to its free row (or the trace's end), as
// async events: overlapping allocations get lanes of their own. Capped like the counters.
void add_allocation_slices(const std::vector<TraceRow>& rows, int device, const std::string& pid, std::int64_t start,
                           std::string* o) {
  constexpr std::size_t kMaxSlices = 200000;
  std::unordered_map<std::uintptr_t, std::pair<std::uint64_t, std::size_t>> open;  // ptr -> (id, requested)
  std::uint64_t next_id = 1;
  std::size_t slices = 0;
  std::int64_t last = start;
  for (const auto& row : rows) {
    if (row.device != device) continue;
    last = row.time_ns;
    if (row.action == TraceAction::allocate && slices < kMaxSlices) {
      const std::uint64_t id = next_id++;
      ++slices;
      open[row.ptr] = {id, row.requested};
      add_slice_begin(row, id, pid, start, o);
    } else if (row.action == TraceAction::free) {
      auto it = open.find(row.ptr);
      if (it == open.end()) continue;
      add_slice_end(it->second.first, it->second.second, row.time_ns, pid, start, o);
      open.erase(it);
    }
  }
  for (const auto& [ptr, v] : open) add_slice_end(v.first, v.second, last, pid, start, o);  // still live at the end
}

}  // namespace

std::string render_perfetto(const TraceReport& r, const std::vector<TraceRow>& rows) {
  // One process per device; counters on it become Perfetto counter tracks. Timestamps are
  // microseconds (the trace-event format's unit) from the first row.
  std::string pid = std::to_string(r.device);
  std::string o = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  o += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid +
       ",\"tid\":0,\"args\":{\"name\":" + json_string("cudapool device " + pid) + "}}";
  add_counters(r, pid, &o);
  std::int64_t start = -1;
  for (const auto& row : rows)
    if (row.device == r.device) {
      start = row.time_ns;
      break;
    }
  add_instants(rows, r.device, pid, start, &o);
  add_allocation_slices(rows, r.device, pid, start, &o);
  o += "\n]}\n";
  return o;
}

}  // namespace cudapool::tools
