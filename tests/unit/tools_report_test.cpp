// report: the analysis of a hand-built trace, the HTML page's content and the Perfetto JSON.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "telemetry/json_reader.h"
#include "tools/analysis.h"
#include "tools/render.h"
#include "tools_util.h"

namespace cudapool::tools {
namespace {

using testing::TraceBuilder;

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// Two segments; the peak is after the second segment arrives with three live blocks.
TraceBuilder sample() {
  TraceBuilder b;
  b.device(GiB)
      .segment(0x100000, 20 * MiB)
      .alloc(0x100000, 5 * MiB)
      .alloc(0x100000 + 5 * MiB, 5 * MiB)
      .free(0x100000, 5 * MiB)
      .segment(0x4000000, 30 * MiB)
      .alloc(0x4000000, 30 * MiB)
      .alloc(0x100000 + 10 * MiB, 2 * MiB)
      .free(0x4000000, 30 * MiB)
      .segment_free(0x4000000, 30 * MiB);
  return b;
}

TEST(ToolsAnalysis, PeaksAndSegmentMap) {
  TraceReport r = analyze_rows(sample().rows(), 0);
  EXPECT_EQ(r.peak_reserved, static_cast<std::int64_t>(50 * MiB));
  EXPECT_EQ(r.peak_allocated, static_cast<std::int64_t>(37 * MiB));
  EXPECT_EQ(r.snapshot_allocated, static_cast<std::int64_t>(37 * MiB));  // fullest moment at peak reserved
  ASSERT_EQ(r.segments_at_peak.size(), 2u);
  EXPECT_EQ(r.segments_at_peak[0].size, 20 * MiB);
  ASSERT_EQ(r.segments_at_peak[0].blocks.size(), 2u);
  EXPECT_EQ(r.segments_at_peak[0].blocks[0].offset, 5 * MiB);
  EXPECT_EQ(r.segments_at_peak[0].blocks[1].offset, 10 * MiB);
  ASSERT_EQ(r.segments_at_peak[1].blocks.size(), 1u);
  EXPECT_EQ(r.segments_at_peak[1].blocks[0].size, 30 * MiB);
  ASSERT_GE(r.largest_sizes.size(), 3u);
  EXPECT_EQ(r.largest_sizes[0].size, 30 * MiB);
  EXPECT_EQ(r.largest_sizes[1].size, 5 * MiB);
  EXPECT_EQ(r.largest_sizes[1].count, 2u);
  EXPECT_EQ(r.segment_allocs, 2u);
  EXPECT_EQ(r.segment_frees, 1u);
}

// The allocation that first reaches the allocated peak, what is live then, and the segment calls
// after it (with the upstream's time where the rows carry it).
TEST(ToolsAnalysis, WhereThePeakIsSetAndTheChurnAfterIt) {
  TraceReport r = analyze_rows(sample().rows(), 0);
  const PeakCause& pc = r.peak_cause;
  ASSERT_TRUE(pc.found);
  EXPECT_EQ(pc.size, 2 * MiB);  // the 2 MiB allocation takes allocated to 37 MiB
  EXPECT_EQ(pc.t_ns, 7000);     // the eighth row; rows are 1 us apart
  EXPECT_EQ(pc.live, 3u);       // 5, 30 and 2 MiB
  ASSERT_EQ(pc.live_by_bytes.size(), 3u);
  EXPECT_EQ(pc.live_by_bytes[0].size, 30 * MiB);
  EXPECT_EQ(pc.live_by_bytes[1].size, 5 * MiB);
  EXPECT_EQ(pc.live_by_bytes[2].size, 2 * MiB);
  EXPECT_EQ(pc.later_segment_allocs, 0u);
  EXPECT_EQ(pc.later_segment_frees, 1u);  // the 30 MiB segment given back
  EXPECT_EQ(pc.later_upstream_ns, 0);     // no durations in these rows
  EXPECT_EQ(pc.later_ns, 2000);

  // The same peak reached again later does not move it; only segment time after it is summed.
  TraceBuilder b;
  b.device(GiB).segment(0x100000, 20 * MiB);
  std::vector<TraceRow> rows = b.alloc(0x100000, 4 * MiB)
                                   .alloc(0x100000 + 4 * MiB, 4 * MiB)
                                   .alloc(0x100000 + 8 * MiB, 4 * MiB)
                                   .free(0x100000 + 8 * MiB, 4 * MiB)
                                   .segment(0x4000000, 2 * MiB)
                                   .segment_free(0x4000000, 2 * MiB)
                                   .alloc(0x100000 + 8 * MiB, 4 * MiB)
                                   .add(TraceAction::fence_wait, 0, 0, 0)
                                   .rows();
  rows[1].duration_ns = 700'000;  // before the peak: not counted
  rows[6].duration_ns = 300'000;
  rows[7].duration_ns = 200'000;
  rows[9].duration_ns = 2'500'000;         // a host wait after the peak
  rows.insert(rows.begin() + 2, rows[9]);  // and one before it
  rows[2].time_ns = rows[1].time_ns + 500;
  rows[2].duration_ns = 1'000'000;
  TraceReport again = analyze_rows(rows, 0);
  EXPECT_EQ(again.peak_allocated, static_cast<std::int64_t>(12 * MiB));
  EXPECT_EQ(again.peak_cause.t_ns, 4000);  // the first time 12 MiB were live
  EXPECT_EQ(again.peak_cause.later_segment_allocs, 1u);
  EXPECT_EQ(again.peak_cause.later_segment_frees, 1u);
  EXPECT_EQ(again.peak_cause.later_upstream_ns, 500'000);
  EXPECT_EQ(again.fence_waits, 2u);
  EXPECT_EQ(again.fence_wait_ns, 3'500'000);
  EXPECT_EQ(again.peak_cause.later_fence_waits, 1u);
  EXPECT_EQ(again.peak_cause.later_fence_wait_ns, 2'500'000);
  ASSERT_EQ(again.peak_cause.live_by_bytes.size(), 1u);
  EXPECT_EQ(again.peak_cause.live_by_bytes[0].count, 3u);

  const std::string text = render_text_summary(again, ReportContext{});
  EXPECT_NE(text.find("peak allocated first reached at 4.0 us by a 4.00 MiB allocation"), std::string::npos) << text;
  EXPECT_NE(text.find("1 segment allocs or maps, 1 frees or unmaps, 0.5 ms in the upstream"), std::string::npos)
      << text;
  EXPECT_NE(text.find("GC passes; 2 host waits on fences (3.5 ms)\n"), std::string::npos) << text;
  EXPECT_NE(text.find(", 1 host waits on fences (2.5 ms)\n"), std::string::npos) << text;
  ReportContext replayed;
  replayed.upstream_times = false;  // a replay's rows: counts, no times
  const std::string untimed = render_text_summary(again, replayed);
  EXPECT_NE(untimed.find("GC passes; 2 host waits on fences\n"), std::string::npos) << untimed;
  EXPECT_EQ(untimed.find("in the upstream"), std::string::npos) << untimed;
  // Nothing allocated: no such line.
  TraceBuilder none;
  none.device(GiB).segment(0x100000, 2 * MiB);
  EXPECT_FALSE(analyze_rows(none.rows(), 0).peak_cause.found);
  EXPECT_EQ(render_text_summary(analyze_rows(none.rows(), 0), ReportContext{}).find("peak allocated first"),
            std::string::npos);
}

TEST(ToolsAnalysis, DownsampleKeepsThePeak) {
  std::vector<TimePoint> pts;
  for (int i = 0; i < 10000; ++i) pts.push_back({i, i == 4321 ? 999999 : i % 100, i == 7777 ? 888888 : 50});
  auto d = downsample(pts, 200);
  EXPECT_LE(d.size(), 202u);
  bool has_a = false, has_r = false;
  for (const auto& p : d) {
    has_a |= p.allocated == 999999;
    has_r |= p.reserved == 888888;
  }
  EXPECT_TRUE(has_a);
  EXPECT_TRUE(has_r);
  for (std::size_t i = 1; i < d.size(); ++i) EXPECT_LT(d[i - 1].t_ns, d[i].t_ns);
}

TEST(ToolsRender, HtmlIsSelfContainedAndShowsTheTrace) {
  TraceReport r = analyze_rows(sample().rows(), 0);
  ReportContext ctx;
  ctx.title = "sample <trace>";
  ctx.device_memory = GiB;
  std::string html = render_html(r, ctx);
  // Self-contained: no script, no external resource of any kind.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_FALSE(std::regex_search(html, std::regex(R"((src|href)\s*=)")));
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_NE(html.find("sample &lt;trace&gt;"), std::string::npos);  // escaped title
  // The three figures, with the exact numbers in data attributes.
  EXPECT_NE(html.find("<svg id=\"timeline\""), std::string::npos);
  EXPECT_NE(html.find("data-peak-reserved=\"" + std::to_string(50 * MiB) + "\""), std::string::npos);
  EXPECT_NE(html.find("<svg id=\"segments\""), std::string::npos);
  EXPECT_EQ(count(html, "class=\"segment\""), 2u);
  EXPECT_EQ(count(html, "class=\"block\""), 3u);
  EXPECT_EQ(count(html, "class=\"size-bar\""), r.largest_sizes.size());
  EXPECT_EQ(count(html, "<path class=\"allocated\""), 1u);
  EXPECT_EQ(count(html, "<path class=\"reserved\""), 1u);
  EXPECT_NE(html.find("50.00 MiB"), std::string::npos);  // peak reserved in the summary table
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
}

TEST(ToolsRender, PerfettoJsonHasCounterTracks) {
  TraceBuilder b = sample();
  b.add(TraceAction::oom, 0, 64 * MiB, 0);
  TraceReport r = analyze_rows(b.rows(), 0);
  std::string js = render_perfetto(r, b.rows());
  json::Value doc;
  std::string err;
  ASSERT_TRUE(json::parse(js, &doc, &err)) << err;
  const json::Value* events = doc.find("traceEvents");
  ASSERT_TRUE(events);
  std::size_t counters = 0, instants = 0;
  double last_ts = -1;
  for (const auto& e : events->items) {
    std::string ph = e.find("ph")->s;
    if (ph == "C") {
      ++counters;
      ASSERT_TRUE(e.find("args")->find("allocated"));
      ASSERT_TRUE(e.find("args")->find("reserved"));
      EXPECT_GE(e.find("ts")->as_double(), last_ts);
      last_ts = e.find("ts")->as_double();
    }
    if (ph == "i") {
      ++instants;
      EXPECT_EQ(e.find("name")->s, "oom");
    }
  }
  EXPECT_EQ(counters, r.timeline.size());
  EXPECT_EQ(instants, 1u);
}

// One slice per allocation: begins at its allocate row, ends at its free row, or at the last
// row when it is never freed (rows are 1 us apart; the trace starts at the device row).
TEST(ToolsRender, PerfettoJsonHasOneSlicePerAllocation) {
  TraceBuilder b = sample();
  TraceReport r = analyze_rows(b.rows(), 0);
  json::Value doc;
  std::string err;
  ASSERT_TRUE(json::parse(render_perfetto(r, b.rows()), &doc, &err)) << err;
  std::map<std::int64_t, double> begin, end;
  std::map<std::int64_t, std::int64_t> size;
  for (const auto& e : doc.find("traceEvents")->items) {
    const std::string ph = e.find("ph")->s;
    if (ph != "b" && ph != "e") continue;
    EXPECT_EQ(e.find("cat")->s, "allocation");
    const std::int64_t id = e.find("id")->i;
    if (ph == "b") {
      EXPECT_FALSE(begin.count(id)) << "two begins for one id";
      begin[id] = e.find("ts")->as_double();
      size[id] = e.find("args")->find("requested")->i;
    } else {
      end[id] = e.find("ts")->as_double();
    }
  }
  ASSERT_EQ(begin.size(), 4u);
  ASSERT_EQ(end.size(), 4u);
  const std::pair<double, double> want[] = {{2, 4}, {3, 9}, {6, 8}, {7, 9}};
  const std::int64_t sizes[] = {5 * MiB, 5 * MiB, 30 * MiB, 2 * MiB};
  int i = 0;
  for (const auto& [id, t] : begin) {
    EXPECT_DOUBLE_EQ(t, want[i].first) << id;
    EXPECT_DOUBLE_EQ(end[id], want[i].second) << id;
    EXPECT_EQ(size[id], sizes[i]) << id;
    ++i;
  }
}

}  // namespace
}  // namespace cudapool::tools
