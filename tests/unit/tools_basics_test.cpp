// Sizes, tables, comparison statistics and the ab JSON.
#include <gtest/gtest.h>

#include "telemetry/json_reader.h"
#include "tools/compare.h"
#include "tools/units.h"

namespace cudapool::tools {
namespace {

TEST(ToolsUnits, ParseSize) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("80GiB"), 80ull << 30);
  EXPECT_EQ(parse_size("80G"), 80ull << 30);
  EXPECT_EQ(parse_size("512 MiB"), 512ull << 20);
  EXPECT_EQ(parse_size("1.5k"), 1536u);
  EXPECT_EQ(parse_size("2t"), 2ull << 40);
  EXPECT_FALSE(parse_size(""));
  EXPECT_FALSE(parse_size("GiB"));
  EXPECT_FALSE(parse_size("12 parsecs"));
  EXPECT_FALSE(parse_size("-3G"));
  EXPECT_FALSE(parse_size("1G extra"));
}

// Byte totals over an untrusted trace saturate: two segments of 2^63 - 1 bytes do not overflow.
TEST(ToolsUnits, ByteTotalsSaturate) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(add_bytes(5, 7), 12);
  EXPECT_EQ(sub_bytes(5, 7), -2);
  EXPECT_EQ(add_bytes(add_bytes(0, static_cast<std::size_t>(kMax)), static_cast<std::size_t>(kMax)), kMax);
  EXPECT_EQ(add_bytes(0, SIZE_MAX), kMax);
  EXPECT_EQ(add_bytes(-10, SIZE_MAX), kMax - 10);
  EXPECT_EQ(sub_bytes(sub_bytes(0, SIZE_MAX), SIZE_MAX), kMin);
}

TEST(ToolsUnits, FormatBytesLikePyTorch) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(20.0 * 1024 * 1024), "20.00 MiB");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
}

TEST(ToolsTable, AlignsAndRendersMarkdown) {
  Table t;
  t.header = {"metric", "A"};
  t.add({"peak", "1.00 GiB"});
  t.add({"x", "–"});  // a multi-byte dash counts as one column
  std::string text = t.to_text();
  EXPECT_NE(text.find("metric         A\n"), std::string::npos) << text;
  EXPECT_NE(text.find("peak    1.00 GiB\n"), std::string::npos) << text;
  EXPECT_NE(text.find("x              –\n"), std::string::npos) << text;
  EXPECT_EQ(t.to_markdown(), "| metric | A |\n| :--- | ---: |\n| peak | 1.00 GiB |\n| x | – |\n");
}

Metrics one(double wall, double reserved) {
  Metrics m;
  m.values.assign(metric_defs().size(), std::nullopt);
  m.values[0] = wall;
  m.values[1] = reserved;
  return m;
}

TEST(ToolsCompare, MedianMinMax) {
  std::vector<Metrics> runs{one(3, 10), one(1, 30), one(2, 20)};
  Spread s = spread(runs, 0);
  ASSERT_TRUE(s.any);
  EXPECT_EQ(s.median, 2);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 3);
  runs.push_back(one(10, 40));  // even count: mean of the middle two
  EXPECT_EQ(spread(runs, 0).median, 2.5);
  EXPECT_FALSE(spread(runs, 4).any);  // nobody measured upstream calls
}

TEST(ToolsCompare, Ratios) {
  Spread a{true, 2, 2, 2}, b{true, 1, 1, 1}, zero{true, 0, 0, 0}, none;
  EXPECT_EQ(ratio_text(a, b), "0.50×");
  EXPECT_EQ(ratio_text(zero, zero), "1.00×");
  EXPECT_EQ(ratio_text(zero, b), "—");
  EXPECT_EQ(ratio_text(none, b), "—");
}

TEST(ToolsCompare, AbTableAndJson) {
  std::vector<VariantRuns> v{{"A", "", {one(2, 100), one(4, 100)}, 0}, {"B", "max_split_size_mb:64", {one(1, 50)}, 1}};
  Table t = ab_table(v, 0, 1);
  ASSERT_EQ(t.header.size(), 6u);
  EXPECT_EQ(t.header.back(), "B/A");
  ASSERT_EQ(t.rows.size(), 3u);  // wall time, peak reserved, runs
  EXPECT_EQ(t.rows[0][0], "wall time");
  EXPECT_EQ(t.rows[0][5], "0.33×");  // 1 / 3
  EXPECT_EQ(t.rows[1][5], "0.50×");
  EXPECT_EQ(t.rows[2][3], "1 / 1");  // B: one ok, one failed

  std::string js = ab_json({"./app", "--x"}, v, 0, 1);
  json::Value doc;
  std::string err;
  ASSERT_TRUE(json::parse(js, &doc, &err)) << err << "\n" << js;
  const json::Value* ratios = doc.find("ratios");
  ASSERT_TRUE(ratios);
  ASSERT_TRUE(ratios->find("peak_reserved_bytes"));
  EXPECT_DOUBLE_EQ(ratios->find("peak_reserved_bytes")->as_double(), 0.5);
  EXPECT_EQ(ratios->find("ooms")->type, json::Value::Type::null);
  const json::Value* variants = doc.find("variants");
  ASSERT_TRUE(variants && variants->items.size() == 2);
  EXPECT_EQ(variants->items[1].find("failed")->i, 1);
  EXPECT_DOUBLE_EQ(variants->items[0].find("metrics")->find("wall_time_s")->find("median")->as_double(), 3.0);
}

TEST(ToolsMetrics, FromStats) {
  Stats s;
  s.reserved_bytes[kAll].peak = 100;
  s.allocated_bytes[kAll].peak = 75;
  s.cache_hits = 3;
  s.cache_misses = 1;
  s.num_device_alloc = 4;
  s.num_device_free = 2;
  Metrics m = metrics_from_stats(s, 1.5);
  EXPECT_EQ(*m.values[0], 1.5);
  EXPECT_DOUBLE_EQ(*m.values[3], 0.25);  // fragmentation
  EXPECT_EQ(*m.values[4], 6);            // upstream calls
  EXPECT_DOUBLE_EQ(*m.values[6], 0.75);  // hit rate
  EXPECT_FALSE(metrics_from_stats(s, std::nullopt).values[0]);
  EXPECT_FALSE(metrics_from_stats(Stats{}, 1.0).values[6]);  // no lookups: no hit rate
}

}  // namespace
}  // namespace cudapool::tools
