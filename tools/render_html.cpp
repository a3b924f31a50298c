#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tools/render.h"

#include "tools/metrics.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string fbytes(std::int64_t b) { return format_bytes(static_cast<double>(b)); }
std::string fbytes_u(std::size_t b) { return format_bytes(static_cast<double>(b)); }

// "N host waits on fences (T ms)"; the time only where the rows are the recording's.
std::string waits_text(std::size_t n, std::int64_t ns, bool timed) {
  char buf[96];
  if (timed)
    std::snprintf(buf, sizeof buf, "%zu host waits on fences (%.1f ms)", n, static_cast<double>(ns) * 1e-6);
  else
    std::snprintf(buf, sizeof buf, "%zu host waits on fences", n);
  return buf;
}

// A "nice" axis step near span/target: 1, 2 or 5 times a power of `base`-friendly ten.
double nice_step(double span, int target) {
  if (span <= 0) return 1;
  double raw = span / target;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

constexpr const char* kStyle = R"(
body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse} td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}
td:first-child,th:first-child{text-align:left}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
svg text{font:11px system-ui,sans-serif;fill:#444}
.note{color:#666}
)";

std::string timeline_svg(const TraceReport& r) {
  const double W = 1000, H = 320, L = 80, R = 20, T = 10, B = 40;
  auto pts = downsample(r.timeline, 2000);
  double tmax = std::max<double>(1.0, static_cast<double>(r.duration_ns));
  double ymax = std::max<double>(1.0, static_cast<double>(std::max(r.peak_reserved, r.peak_allocated)));
  auto X = [&](double t) { return L + (W - L - R) * t / tmax; };
  auto Y = [&](double v) { return T + (H - T - B) * (1.0 - v / ymax); };
  std::string s = "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" +
                  num(H) + "\" data-peak-allocated=\"" + std::to_string(r.peak_allocated) + "\" data-peak-reserved=\"" +
                  std::to_string(r.peak_reserved) + "\">\n";
  // Axes with a few labelled ticks.
  double unit = ymax >= 1024.0 * 1024 * 1024 ? 1024.0 * 1024 * 1024 : 1024.0 * 1024;
  const char* uname = unit > 1024.0 * 1024 ? "GiB" : "MiB";
  double ystep = nice_step(ymax / unit, 5) * unit;
  for (double v = 0; v <= ymax * 1.0001; v += ystep) {
    s += "<line x1=\"" + num(L) + "\" x2=\"" + num(W - R) + "\" y1=\"" + num(Y(v)) + "\" y2=\"" + num(Y(v)) +
         "\" stroke=\"#eee\"/>";
    char lab[48];
    std::snprintf(lab, sizeof lab, "%g %s", v / unit, uname);
    s += "<text x=\"" + num(L - 6) + "\" y=\"" + num(Y(v) + 4) + "\" text-anchor=\"end\">" + lab + "</text>\n";
  }
  double tstep = nice_step(tmax * 1e-9, 8) * 1e9;
  for (double t = 0; t <= tmax * 1.0001; t += tstep) {
    char lab[48];
    std::snprintf(lab, sizeof lab, "%g s", t * 1e-9);
    s += "<text x=\"" + num(X(t)) + "\" y=\"" + num(H - B + 16) + "\" text-anchor=\"middle\">" + lab + "</text>\n";
  }
  s += "<line x1=\"" + num(L) + "\" x2=\"" + num(L) + "\" y1=\"" + num(T) + "\" y2=\"" + num(H - B) +
       "\" stroke=\"#888\"/><line x1=\"" + num(L) + "\" x2=\"" + num(W - R) + "\" y1=\"" + num(H - B) + "\" y2=\"" +
       num(H - B) + "\" stroke=\"#888\"/>\n";
  // Step lines: memory stays at a level until the next event changes it.
  auto path = [&](bool reserved, const char* color, const char* cls) {
    std::string d;
    double prev_y = Y(0);
    d += "M" + num(X(0)) + "," + num(prev_y);
    for (const auto& p : pts) {
      double y = Y(static_cast<double>(reserved ? p.reserved : p.allocated));
      d += " L" + num(X(static_cast<double>(p.t_ns))) + "," + num(prev_y) + " L" + num(X(static_cast<double>(p.t_ns))) +
           "," + num(y);
      prev_y = y;
    }
    d += " L" + num(X(tmax)) + "," + num(prev_y);
    return "<path class=\"" + std::string(cls) + "\" d=\"" + d + "\" fill=\"none\" stroke=\"" + color +
           "\" stroke-width=\"1.5\"/>\n";
  };
  s += path(true, "#e08a1e", "reserved");
  s += path(false, "#2a6fdb", "allocated");
  s += "<text x=\"" + num(W / 2) + "\" y=\"" + num(H - 6) +
       "\" text-anchor=\"middle\">time since the first row</text>\n";
  s += "</svg>\n";
  return s;
}

std::string segments_svg(const TraceReport& r) {
  // One row per segment (address order), width proportional to size against the largest one,
  // blocks drawn inside: the holes between blocks are what fragmentation looks like.
  const auto& segs = r.segments_at_peak;
  const double W = 1000, L = 150, R = 10, row = 16, gap = 4;
  std::size_t shown = std::min<std::size_t>(segs.size(), 300);
  double H = 10 + static_cast<double>(shown) * (row + gap);
  std::size_t maxsize = 1;
  for (const auto& sg : segs) maxsize = std::max(maxsize, sg.size);
  std::string s = "<svg id=\"segments\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" +
                  num(H) + "\" data-segments=\"" + std::to_string(segs.size()) + "\">\n";
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& sg = segs[i];
    double y = 5 + static_cast<double>(i) * (row + gap);
    double w = (W - L - R) * static_cast<double>(sg.size) / static_cast<double>(maxsize);
    std::size_t used = 0;
    for (const auto& b : sg.blocks) used += b.size;
    char lab[96];
    std::snprintf(lab, sizeof lab, "%s%s %.0f%%", format_bytes(static_cast<double>(sg.size)).c_str(),
                  sg.expandable ? " exp" : "", 100.0 * static_cast<double>(used) / static_cast<double>(sg.size));
    s += "<text x=\"" + num(L - 6) + "\" y=\"" + num(y + row - 4) + "\" text-anchor=\"end\">" + lab + "</text>";
    s += "<rect class=\"segment\" x=\"" + num(L) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
         num(row) + "\" fill=\"#e6e6e6\" stroke=\"#999\" data-size=\"" + std::to_string(sg.size) + "\"/>";
    for (const auto& b : sg.blocks) {
      double bx = L + w * static_cast<double>(b.offset) / static_cast<double>(sg.size);
      double bw = std::max(0.5, w * static_cast<double>(b.size) / static_cast<double>(sg.size));
      s += "<rect class=\"block\" x=\"" + num(bx) + "\" y=\"" + num(y + 1) + "\" width=\"" + num(bw) + "\" height=\"" +
           num(row - 2) + "\" fill=\"#2a6fdb\" data-size=\"" + std::to_string(b.size) + "\"><title>" +
           format_bytes(static_cast<double>(b.requested)) + " requested</title></rect>";
    }
    s += "\n";
  }
  s += "</svg>\n";
  if (shown < segs.size())
    s += "<p class=\"note\">" + std::to_string(segs.size() - shown) + " more segments not drawn.</p>\n";
  return s;
}

std::string sizes_svg(const TraceReport& r) {
  const double W = 1000, L = 110, R = 120, row = 16, gap = 4;
  double H = 10 + static_cast<double>(r.largest_sizes.size()) * (row + gap);
  std::size_t maxsize = 1;
  for (const auto& sc : r.largest_sizes) maxsize = std::max(maxsize, sc.size);
  std::string s = "<svg id=\"sizes\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
                  "\">\n";
  for (std::size_t i = 0; i < r.largest_sizes.size(); ++i) {
    const auto& sc = r.largest_sizes[i];
    double y = 5 + static_cast<double>(i) * (row + gap);
    double w = std::max(1.0, (W - L - R) * static_cast<double>(sc.size) / static_cast<double>(maxsize));
    s += "<text x=\"" + num(L - 6) + "\" y=\"" + num(y + row - 4) + "\" text-anchor=\"end\">" +
         format_bytes(static_cast<double>(sc.size)) + "</text>";
    s += "<rect class=\"size-bar\" x=\"" + num(L) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
         num(row) + "\" fill=\"#6b9e3a\" data-size=\"" + std::to_string(sc.size) + "\" data-count=\"" +
         std::to_string(sc.count) + "\"/>";
    s += "<text x=\"" + num(L + w + 6) + "\" y=\"" + num(y + row - 4) + "\">× " + std::to_string(sc.count) +
         "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

}  // namespace

std::string figures_note(const ReportContext& c) {
  if (c.replayed) return "figures replayed: " + c.source_note;
  return "figures recorded: as the program ran, from the trace's rows (`cudapool replay` and `cudapool tune` show "
         "what this version of the pool does with the same requests; their figures may differ)";
}

std::string render_html(const TraceReport& r, const ReportContext& c) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>cudapool report: " +
                  esc(c.title) + "</title>\n<style>" + kStyle + "</style></head><body>\n";
  h += "<h1>cudapool report: " + esc(c.title) + "</h1>\n";
  h += "<p class=\"note\">" + esc(figures_note(c)) + "</p>\n";
  const double frag = peak_fragmentation(r);
  const double unused = unused_at_snapshot(r);
  char fr[32], un[32];
  std::snprintf(fr, sizeof fr, "%.1f %%", frag * 100);
  std::snprintf(un, sizeof un, "%.1f %%", unused * 100);
  h += "<table id=\"summary\">\n";
  auto row = [&](const std::string& k, const std::string& v) {
    h += "<tr><td>" + esc(k) + "</td><td>" + esc(v) + "</td></tr>\n";
  };
  row("device", std::to_string(r.device));
  if (c.device_memory) row("device memory", format_bytes(static_cast<double>(c.device_memory)));
  row("duration", format_seconds(static_cast<double>(r.duration_ns) * 1e-9));
  row("allocations / frees", std::to_string(r.allocations) + " / " + std::to_string(r.frees));
  row("peak allocated", fbytes(r.peak_allocated));
  row("peak reserved", fbytes(r.peak_reserved));
  row("segments at the peak", std::to_string(r.segments_at_peak.size()));
  row("fragmentation", fr);
  row("unused at the peak", un);
  row("upstream calls (allocs or maps / frees or unmaps)", std::to_string(r.segment_allocs + r.segment_frees) + " (" +
                                                               std::to_string(r.segment_allocs) + " / " +
                                                               std::to_string(r.segment_frees) + ")");
  if (const PeakCause& pc = r.peak_cause; pc.found) {
    row("peak allocated first reached", format_seconds(static_cast<double>(pc.t_ns) * 1e-9) + ", by a " +
                                            fbytes_u(pc.size) + " allocation; " + std::to_string(pc.live) +
                                            " allocations live");
    row("segment allocs or maps / frees or unmaps after it",
        std::to_string(pc.later_segment_allocs) + " / " + std::to_string(pc.later_segment_frees));
  }
  if (r.fence_waits != 0) {
    row("host waits on fences (after the allocated peak)",
        waits_text(r.fence_waits, r.fence_wait_ns, c.upstream_times) + " (" +
            std::to_string(r.peak_cause.later_fence_waits) + ")");
  }
  row("OOMs / failed allocations", std::to_string(r.ooms) + " / " + std::to_string(r.failed_allocations));
  h += "</table>\n";
  h += "<h2>Allocated vs reserved over time</h2>\n<div class=\"legend\"><span style=\"background:#2a6fdb\"></span>"
       "allocated<span style=\"background:#e08a1e\"></span>reserved</div>\n";
  h += timeline_svg(r);
  h += "<h2>Segment map at the peak (" + format_seconds(static_cast<double>(r.snapshot_t_ns) * 1e-9) + ": " +
       fbytes(r.snapshot_allocated) + " allocated of " + fbytes(r.snapshot_reserved) + " reserved)</h2>\n";
  h += "<div class=\"legend\"><span style=\"background:#2a6fdb\"></span>live block<span style=\"background:#e6e6e6;"
       "border:1px solid #999\"></span>cached / free</div>\n";
  h += segments_svg(r);
  h += "<h2>Largest allocation sizes</h2>\n";
  h += sizes_svg(r);
  h += "</body></html>\n";
  return h;
}

namespace {

// Where allocated first peaked and what the upstream did from then to the end: two lines.
std::string peak_cause_text(const PeakCause& pc, const ReportContext& c) {
  std::string s;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "peak allocated first reached at %s by a %s allocation (%s requested, stream 0x%llx); live then: "
                "%zu allocations",
                format_seconds(static_cast<double>(pc.t_ns) * 1e-9).c_str(), fbytes_u(pc.size).c_str(),
                fbytes_u(pc.requested).c_str(), static_cast<unsigned long long>(pc.stream), pc.live);
  s += buf;
  for (std::size_t i = 0; i < pc.live_by_bytes.size(); ++i)
    s += (i == 0 ? ", the most bytes in " : ", ") + fbytes_u(pc.live_by_bytes[i].size) + " ×" +
         std::to_string(pc.live_by_bytes[i].count);
  s += "\n";
  std::snprintf(buf, sizeof buf, "from then to the end (%s): %zu segment allocs or maps, %zu frees or unmaps",
                format_seconds(static_cast<double>(pc.later_ns) * 1e-9).c_str(), pc.later_segment_allocs,
                pc.later_segment_frees);
  s += buf;
  if (c.upstream_times && pc.later_upstream_ns > 0) {
    std::snprintf(buf, sizeof buf, ", %.1f ms in the upstream (%.1f %% of that time)",
                  static_cast<double>(pc.later_upstream_ns) * 1e-6,
                  pc.later_ns > 0 ? 100.0 * static_cast<double>(pc.later_upstream_ns) / static_cast<double>(pc.later_ns)
                                  : 0.0);
    s += buf;
  }
  if (pc.later_fence_waits != 0) s += ", " + waits_text(pc.later_fence_waits, pc.later_fence_wait_ns, c.upstream_times);
  s += "\n";
  return s;
}

}  // namespace

std::string render_text_summary(const TraceReport& r, const ReportContext& c) {
  std::string s;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: device %d, %s, %zu allocations, %zu frees\n", c.title.c_str(), r.device,
                format_seconds(static_cast<double>(r.duration_ns) * 1e-9).c_str(), r.allocations, r.frees);
  s += buf;
  s += figures_note(c) + "\n";
  // fragmentation and upstream calls as every command defines them (tools/metrics.h).
  const double frag = peak_fragmentation(r);
  const double unused = unused_at_snapshot(r);
  std::snprintf(buf, sizeof buf,
                "peak allocated %s, peak reserved %s, fragmentation %.1f %%; at the peak %zu segments, "
                "%.1f %% of reserved unused at that moment\n",
                fbytes(r.peak_allocated).c_str(), fbytes(r.peak_reserved).c_str(), frag * 100,
                r.segments_at_peak.size(), unused * 100);
  s += buf;
  std::snprintf(buf, sizeof buf,
                "upstream calls %zu (%zu segment allocs or maps, %zu frees or unmaps); %zu OOMs, %zu failed "
                "allocations, %zu GC passes",
                r.segment_allocs + r.segment_frees, r.segment_allocs, r.segment_frees, r.ooms, r.failed_allocations,
                r.gc_passes);
  s += buf;
  if (r.fence_waits != 0) s += "; " + waits_text(r.fence_waits, r.fence_wait_ns, c.upstream_times);
  s += "\n";
  if (r.peak_cause.found) s += peak_cause_text(r.peak_cause, c);
  s += "largest sizes:";
  for (std::size_t i = 0; i < r.largest_sizes.size() && i < 5; ++i)
    s += " " + format_bytes(static_cast<double>(r.largest_sizes[i].size)) + " ×" +
         std::to_string(r.largest_sizes[i].count) +
         (i + 1 < std::min<std::size_t>(5, r.largest_sizes.size()) ? "," : "");
  s += "\n";
  return s;
}

}  // namespace cudapool::tools
