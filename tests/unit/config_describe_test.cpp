// describe(), to_conf_string() round trips, the docs' key table, and path patterns.
#include <gtest/gtest.h>

#include <algorithm>
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
  p.pool.expandable_segments = false;
  p.pool.release_lock_on_cudamalloc = true;
  p.pool.per_process_memory_fraction = 0.95;
  p.pool.max_reserved = 8 * GiB;
  p.pool.free_sync = FreeSync::device;
  p.pool.expandable_wait = false;
  p.pool.expandable_large_page = 4 * MiB;
  p.pool.expandable_max_unit = 64 * MiB;
  p.pool.expandable_unit_share = 0;  // what setting expandable_unit_mb means: every unit that size
  p.pool.expandable_headroom = 0.25;
  p.expandable_peer_access = true;
  p.free_host_sync = true;
  p.backend = Backend::passthrough;
  p.log_level = "trace";
  p.log_file = "/tmp/log, with \"quotes\" and \\ and spaces-%p.log";
  p.trace_file = "/tmp/a:b=c.csv";
  p.trace_call_sites = true;
  p.stats_file = "[weird";
  p.warm_start = "/var/tmp/plan, with spaces.txt";
  p.dump_signal = 12;  // SIGUSR2
  p.group = "train-a";
  p.group_budget = 4 * GiB;
  p.group_budget_fraction = 0.5;
  p.group_release_wait_ms = 250;
  p.group_pool_only = true;
  p.group_outside = static_cast<std::int64_t>(600 * MiB);
  p.group_outside_growth = 64 * MiB;
  p.group_park = true;
  p.group_park_host = static_cast<std::int64_t>(2 * GiB);
  p.group_park_idle_ms = 0;
  p.group_park_wait_ms = 1;
  p.publish_stats = false;
  p.pinned.enabled = true;
  p.pinned.use_host_register = true;
  p.pinned.register_threads = 16;
  p.pinned.reserve_segment = 32 * MiB;
  p.pinned.max_round_threshold = 0;
  p.pinned.max_cached = 256 * MiB;
  // Every key is set away from its default, so each one has to survive the round trip (a key
  // added to the key table without a line above fails here).
  for (const config::KeySpec& k : config::keys()) {
    if (k.format != nullptr) {
      EXPECT_FALSE(k.is_default(p)) << k.name << " keeps its default in this test";
    }
  }
  const std::string s = to_conf_string(p);
  EXPECT_TRUE(has(s, "roundup_power2_divisions:[256:1,512:2,>:4]")) << s;
  EXPECT_TRUE(has(s, "max_split_size_mb:300")) << s;
  EXPECT_TRUE(has(s, "free_sync:device")) << s;
  testing::expect_same_policy(round_trip(p), p);
  p.pool.free_sync = FreeSync::immediate;
  testing::expect_same_policy(round_trip(p), p);
}

TEST(ToConfString, ParsedStringsRoundTrip) {
  for (const char* conf :
       {"max_split_size_mb=32", "roundup_power2_divisions:[1:2,64:4]", "roundup_power2_divisions:[>:8]",
        "roundup_power2_divisions:[2:4,4:0,>:2]", "roundup_power2_divisions:16",
        "max_split_size_mb:18446744073709551615", "max_reserved_mb:1,per_process_memory_fraction:1", "log_file:\"\""}) {
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
  std::size_t column = std::string::npos;  // where " = " is: the same on every line
  while (std::getline(in, line)) {
    ++lines;
    const std::size_t at = line.find(" = ");
    ASSERT_NE(at, std::string::npos) << line;
    if (column == std::string::npos) column = at;
    EXPECT_EQ(at, column) << "misaligned: " << line << "\n" << d;
  }
  int keys = 1;  // the CUDAPOOL_ON_ERROR line
  for (const config::KeySpec& k : config::keys()) {
    if (k.format == nullptr) continue;
    ++keys;
    EXPECT_TRUE(has(d, std::string(k.name) + " ")) << k.name << "\n" << d;
  }
  EXPECT_EQ(lines, keys) << d;
  auto pad = [&](const std::string& name) { return name + std::string(column - name.size(), ' '); };
  EXPECT_TRUE(has(d, pad("max_split_size_mb") + " = 64   (CUDAPOOL_CONF col 1)")) << d;
  EXPECT_TRUE(has(d, pad("log_file") + " = /tmp/x.log   (CUDAPOOL_CONF col 22)")) << d;
  EXPECT_TRUE(has(d, pad("expandable_segments") + " = True   (default)")) << d;
  EXPECT_TRUE(has(d, pad("trace_file") + " = \"\"   (default)")) << d;
  std::size_t longest = std::string("CUDAPOOL_ON_ERROR").size();
  for (const config::KeySpec& k : config::keys())
    if (k.format != nullptr) longest = std::max(longest, k.name.size());
  EXPECT_EQ(column, longest) << d;  // the longest name sets the column, one space before " = "
  // CUDAPOOL_ON_ERROR is a variable, not a key: named as the variable, said to be no key.
  EXPECT_FALSE(has(d, "on_error ")) << d;
  EXPECT_TRUE(has(d, pad("CUDAPOOL_ON_ERROR") + " = stop   (default; an environment variable, not a policy key")) << d;
}

std::string read_doc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// docs/policy.md and README.md carry the tables made from the key table, as `make docs` writes
// them (run it when this fails).
TEST(Docs, KeyTablesMatchTheCode) {
  const std::string full = config::key_table_markdown(), brief = config::key_table_markdown_brief();
  for (const auto& [path, table] :
       {std::pair<std::string, std::string>{"docs/policy.md", full}, {"README.md", brief}}) {
    const std::string doc = read_doc(path);
    ASSERT_FALSE(doc.empty()) << path << ": run from the repository root";
    const auto current = config::with_key_table(doc, table);
    ASSERT_TRUE(current.has_value()) << path << " lacks the <!-- keys:begin --> / <!-- keys:end --> lines";
    EXPECT_TRUE(*current == doc) << path << " is not current: run `make docs`; its table should be:\n" << table;
  }
  for (const config::KeySpec& k : config::keys()) {
    const std::string name = "`" + std::string(k.name) + "`";
    EXPECT_TRUE(has(full, name)) << name;
    // The short table leaves out only what sets nothing: ignored and refused keys, second spellings.
    EXPECT_EQ(has(brief, name), k.format != nullptr) << name;
  }
}

TEST(Docs, KeyTableSplicedBetweenTheMarkers) {
  const std::string doc = "intro\n<!-- keys:begin -->\nold\n<!-- keys:end -->\nafter\n";
  EXPECT_EQ(config::with_key_table(doc, "| new |\n"),
            "intro\n<!-- keys:begin -->\n| new |\n<!-- keys:end "
            "-->\nafter\n");
  EXPECT_FALSE(config::with_key_table("no markers", "x").has_value());
  EXPECT_FALSE(config::with_key_table("<!-- keys:end -->\n<!-- keys:begin -->\n", "x").has_value());
  EXPECT_FALSE(config::with_key_table(doc + doc, "x").has_value());
}

TEST(PathPattern, Expands) {
  EXPECT_EQ(expand_path_pattern("/tmp/cp-%p.log", 42, "node7", 1), "/tmp/cp-42.log");
  EXPECT_EQ(expand_path_pattern("/tmp/%h/%p-%%-%x-%", 7, "h", 1), "/tmp/h/7-%-%x-%");
  EXPECT_EQ(expand_path_pattern("plain", 1, "h", 1), "plain");
  EXPECT_EQ(expand_path_pattern("run-%t", 1, "h", 1700000000), "run-1700000000");
  EXPECT_EQ(expand_path_pattern("%p").find('%'), std::string::npos);
  EXPECT_EQ(expand_path_pattern("%t").find_first_not_of("0123456789"), std::string::npos);  // the same %t as the log's
}

// A forked child's summary path: its own file beside the parent's, unless the pattern already
// names one per process.
TEST(PathPattern, PerProcessPatternAddsThePidOnce) {
  EXPECT_EQ(per_process_pattern("/tmp/s.json"), "/tmp/s.%p.json");
  EXPECT_EQ(per_process_pattern("/tmp/run.d/s"), "/tmp/run.d/s.%p");
  EXPECT_EQ(per_process_pattern("s.tar.gz"), "s.tar.%p.gz");
  EXPECT_EQ(per_process_pattern("/tmp/.hidden"), "/tmp/.hidden.%p");
  EXPECT_EQ(per_process_pattern("/tmp/s-%p.json"), "/tmp/s-%p.json");
  EXPECT_EQ(per_process_pattern("/tmp/100%%p.json"), "/tmp/100%%p.%p.json");  // "%%p" is no pid
  EXPECT_EQ(per_process_pattern("/tmp/%h-%t.json"), "/tmp/%h-%t.%p.json");
  EXPECT_EQ(expand_path_pattern(per_process_pattern("/tmp/s.json"), 42, "h", 1), "/tmp/s.42.json");
}

}  // namespace
}  // namespace cudapool
