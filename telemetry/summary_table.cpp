// The table logged at exit: one column per device, one row per figure users ask about first.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "telemetry/oom.h"
#include "telemetry/summary.h"

namespace cudapool {
namespace {

std::string pct(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %%", r * 100.0);
  return buf;
}

std::string ms(std::int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string bytes(std::int64_t v) { return format_size(v > 0 ? static_cast<std::uint64_t>(v) : 0); }

// "  label: name n, name n" for a map of counts; nothing when it is empty.
void count_line(std::string& out, const char* label, const std::map<std::string, std::int64_t>& counts) {
  if (counts.empty()) return;
  out += "  ";
  out += label;
  out += ':';
  const char* sep = " ";
  for (const auto& [name, count] : counts) {
    out += sep + name + " " + std::to_string(count);
    sep = ", ";
  }
  out += '\n';
}

// One row of the table: its label and a device's value.
struct Row {
  const char* label;
  std::string (*value)(const DeviceSummary&);
};
constexpr Row kRows[] = {
    {"allocated (current)", [](const DeviceSummary& d) { return bytes(d.stats.allocated_bytes[kAll].current); }},
    {"allocated (peak)", [](const DeviceSummary& d) { return bytes(d.stats.allocated_bytes[kAll].peak); }},
    {"reserved (current)", [](const DeviceSummary& d) { return bytes(d.stats.reserved_bytes[kAll].current); }},
    {"reserved (peak)", [](const DeviceSummary& d) { return bytes(d.stats.reserved_bytes[kAll].peak); }},
    {"allocations", [](const DeviceSummary& d) { return std::to_string(d.stats.allocation[kAll].allocated); }},
    {"cache hit rate", [](const DeviceSummary& d) { return pct(d.hit_rate()); }},
    {"upstream allocs / frees",
     [](const DeviceSummary& d) {
       return std::to_string(d.stats.num_device_alloc) + " / " + std::to_string(d.stats.num_device_free);
     }},
    {"upstream time", [](const DeviceSummary& d) { return ms(d.stats.upstream_ns); }},
    {"fence waits (host / GPU)",
     [](const DeviceSummary& d) {
       return std::to_string(d.stats.fence_waits) + " / " + std::to_string(d.stats.gpu_waits);
     }},
    {"alloc retries / OOMs",
     [](const DeviceSummary& d) {
       return std::to_string(d.stats.num_alloc_retries) + " / " + std::to_string(d.stats.num_ooms);
     }},
    {"GC passes (freed)",
     [](const DeviceSummary& d) {
       return std::to_string(d.stats.gc_passes) + " (" + bytes(d.stats.gc_freed_bytes) + ")";
     }},
    {"bad frees", [](const DeviceSummary& d) { return std::to_string(d.stats.bad_frees); }},
};

std::string pad_left(const std::string& t, std::size_t w) {
  return std::string(w > t.size() ? w - t.size() : 0, ' ') + t;
}
std::string pad_right(const std::string& t, std::size_t w) {
  return t + std::string(w > t.size() ? w - t.size() : 0, ' ');
}

// Every device's column of values, and each column's width (its heading's or its widest value's).
struct Columns {
  std::vector<std::vector<std::string>> cells;  // [device][row]
  std::vector<std::size_t> width;
};
Columns device_columns(const Summary& s) {
  Columns c;
  for (const DeviceSummary& d : s.devices) {
    std::vector<std::string> col;
    std::size_t w = ("GPU " + std::to_string(d.device)).size();
    for (const Row& r : kRows) {
      col.push_back(r.value(d));
      w = std::max(w, col.back().size());
    }
    c.cells.push_back(std::move(col));
    c.width.push_back(w);
  }
  return c;
}

// The heading line of GPUs, then one line per row.
void device_table(std::string& out, const Summary& s) {
  std::size_t label_w = 0;
  for (const Row& r : kRows) label_w = std::max(label_w, std::string(r.label).size());
  const Columns c = device_columns(s);
  out += "  " + pad_right("", label_w);
  for (std::size_t i = 0; i < s.devices.size(); ++i)
    out += "  " + pad_left("GPU " + std::to_string(s.devices[i].device), c.width[i]);
  out += "\n";
  for (std::size_t r = 0; r < std::size(kRows); ++r) {
    out += "  " + pad_right(kRows[r].label, label_w);
    for (std::size_t i = 0; i < s.devices.size(); ++i) out += "  " + pad_left(c.cells[i][r], c.width[i]);
    out += "\n";
  }
}

}  // namespace

std::string format_summary_table(const Summary& s) {
  char head[128];
  std::snprintf(head, sizeof head, "cudapool summary: pid %lld, %.3f s, backend %s\n", static_cast<long long>(s.pid),
                s.wall_time_s, s.backend.empty() ? "native" : s.backend.c_str());
  std::string out = head;
  if (s.devices.empty())
    out += "  (no device pool was used)\n";
  else
    device_table(out, s);
  count_line(out, "passed through", s.passthrough);
  count_line(out, "served at cudart's entry points", s.runtime_api);
  return out;
}

}  // namespace cudapool
