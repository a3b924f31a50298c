// describe(), to_conf_string() round trips, the docs' key table, and path patterns.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "config/keys.h"
#include "config/path_pattern.h"
#include "config/policy.h"
#include "config/roundup.h"
#include "tests/unit/config_test_util.h"

namespace cudapool {
namespace {

bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

Policy round_trip(const Policy& p) {
  const std::string s = to_conf_string(p);
  PolicyResult r = parse_conf(s, Policy{});
  EXPECT_TRUE(r.policy) << s << "\n" << r.error;
  return r.policy.value_or(Policy{});
}

TEST(ToConfString, DefaultsAreEmpty) { EXPECT_EQ(to_conf_string(Policy{}), ""); }

TEST(ToConfString, EveryKeyRoundTrips) {
  Policy p;
  p.pool.max_split_size = 300 * MiB;
  p.pool.max_non_split_rounding = 64 * MiB;
  p.pool.roundup_power2_divisions = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 4, 4, 4, 4, 4};
  p.pool.garbage_collection_threshold = 0.1 + 0.2;  // not a short decimal: must still read back exactly
  p.pool.expandable_segments = true;
  p.pool.release_lock_on_cudamalloc = true;
  p.pool.per_process_memory_fraction = 0.95;
  p.pool.max_reserved = 8 * GiB;
  p.pool.free_sync = FreeSync::device;
  p.backend = Backend::passthrough;
  p.log_level = "trace";
  p.log_file = "/tmp/log, with \"quotes\" and \\ and spaces-%p.log";
  p.trace_file = "/tmp/a:b=c.csv";
  p.stats_file = "[weird";
  const std::string s = to_conf_string(p);
  EXPECT_TRUE(has(s, "roundup_power2_divisions:[256:1,512:2,>:4]")) << s;
  EXPECT_TRUE(has(s, "max_split_size_mb:300")) << s;
  EXPECT_TRUE(has(s, "free_sync:device")) << s;
  testing::expect_same_policy(round_trip(p), p);
  p.pool.free_sync = FreeSync::immediate;
  testing::expect_same_policy(round_trip(p), p);
}

TEST(ToConfString, ParsedStringsRoundTrip) {
  for (const char* conf : {"max_split_size_mb=32", "roundup_power2_divisions:[1:2,64:4]",
                           "roundup_power2_divisions:[>:8]", "roundup_power2_divisions:[2:4,4:0,>:2]",
                           "roundup_power2_divisions:16", "max_split_size_mb:18446744073709551615",
                           "max_reserved_mb:1,per_process_memory_fraction:1", "log_file:\"\""}) {
    Policy p = testing::must_parse(conf);
    testing::expect_same_policy(round_trip(p), p);
  }
}

// Every bucket pattern built from a few values must survive format -> parse.
TEST(Roundup, FormatParsesBackForRandomBuckets) {
  std::mt19937 rng(12345);
  const std::uint32_t values[] = {0, 1, 2, 4, 8, 1u << 31};
  for (int n = 0; n < 20000; ++n) {
    config::RoundupBuckets b{};
    const int runs = 1 + static_cast<int>(rng() % 5);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = values[rng() % static_cast<unsigned>(runs + 1) % 6];
    config::RoundupBuckets back{};
    const std::string text = config::format_roundup(b);
    ASSERT_EQ(config::parse_roundup(text, back), "") << text;
    ASSERT_EQ(back, b) << text;
  }
}

TEST(Describe, EveryKeyWithValueAndOrigin) {
  PolicySources s;
  s.conf = "max_split_size_mb:64,log_file:/tmp/x.log";
  PolicyResult r = load_policy(s);
  ASSERT_TRUE(r.policy) << r.error;
  const std::string d = describe(*r.policy);
  std::istringstream in(d);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  int keys = 1;  // on_error
  for (const config::KeySpec& k : config::keys()) {
    if (k.format == nullptr) continue;
    ++keys;
    EXPECT_TRUE(has(d, std::string(k.name) + " ")) << k.name << "\n" << d;
  }
  EXPECT_EQ(lines, keys) << d;
  EXPECT_TRUE(has(d, "max_split_size_mb            = 64   (CUDAPOOL_CONF col 1)")) << d;
  EXPECT_TRUE(has(d, "log_file                     = /tmp/x.log   (CUDAPOOL_CONF col 22)")) << d;
  EXPECT_TRUE(has(d, "expandable_segments          = True   (default)")) << d;
  EXPECT_TRUE(has(d, "trace_file                   = \"\"   (default)")) << d;
  EXPECT_TRUE(has(d, "on_error                     = stop   (default)")) << d;
}

// docs/policy.md carries the table key_table_markdown() makes from the key table; if this fails,
// paste the printed table between the markers.
TEST(Docs, KeyTableMatchesTheCode) {
  std::ifstream in("docs/policy.md");
  ASSERT_TRUE(in) << "run from the repository root";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::string table = config::key_table_markdown();
  const std::string begin = "<!-- keys:begin -->\n", end = "<!-- keys:end -->";
  const auto b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), table) << "expected:\n" << table;
  for (const config::KeySpec& k : config::keys()) EXPECT_TRUE(has(table, "`" + std::string(k.name) + "`"));
}

TEST(PathPattern, Expands) {
  EXPECT_EQ(expand_path_pattern("/tmp/cp-%p.log", 42, "node7"), "/tmp/cp-42.log");
  EXPECT_EQ(expand_path_pattern("/tmp/%h/%p-%%-%x-%", 7, "h"), "/tmp/h/7-%-%x-%");
  EXPECT_EQ(expand_path_pattern("plain", 1, "h"), "plain");
  EXPECT_EQ(expand_path_pattern("%p").find('%'), std::string::npos);
}

}  // namespace
}  // namespace cudapool
