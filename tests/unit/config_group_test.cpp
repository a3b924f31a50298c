// The group keys: their forms and bounds, the check that a group has a budget (and a budget a
// group), TOML profiles setting them, and round trips through to_conf_string.
#include <gtest/gtest.h>

#include "config/keys.h"
#include "config/policy.h"
#include "tests/unit/config_test_util.h"

namespace cudapool {
namespace {

using testing::must_fail;
using testing::must_parse;
using testing::TempFile;

bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

PolicyResult load_conf(const std::string& conf) {
  PolicySources s;
  s.conf = conf;
  return load_policy(s);
}

TEST(GroupKeys, ParseAndRoundTrip) {
  Policy p = must_parse(
      "group:serve-1.a_b,group_budget_mb:4096,group_budget_fraction:0.5,group_release_wait_ms:250,"
      "publish_stats:False");
  EXPECT_EQ(p.group, "serve-1.a_b");
  EXPECT_EQ(p.group_budget, 4096 * MiB);
  EXPECT_EQ(p.group_budget_fraction, 0.5);
  EXPECT_EQ(p.group_release_wait_ms, 250);
  EXPECT_FALSE(p.publish_stats);
  testing::expect_same_policy(must_parse(to_conf_string(p)), p);
  EXPECT_TRUE(has(describe(p), "group                          = serve-1.a_b")) << describe(p);
  EXPECT_TRUE(has(describe(p), "group_budget_mb                = 4096")) << describe(p);
}

// What the budget counts: the whole footprint by default (outside memory measured), the pools
// only with group_budget_counts:pool, or a fixed charge per process.
TEST(GroupKeys, BudgetCountsAndOutsideCharge) {
  Policy d = must_parse("group:s,group_budget_mb:100");
  EXPECT_FALSE(d.group_pool_only);
  EXPECT_EQ(d.group_outside, -1);
  Policy p = must_parse("group:s,group_budget_mb:100,group_budget_counts:pool,group_outside_mb:600");
  EXPECT_TRUE(p.group_pool_only);
  EXPECT_EQ(p.group_outside, static_cast<std::int64_t>(600 * MiB));
  testing::expect_same_policy(must_parse(to_conf_string(p)), p);
  EXPECT_EQ(must_parse("group:s,group_budget_mb:100,group_outside_mb:auto").group_outside, -1);
  EXPECT_TRUE(has(must_fail("group_budget_counts:all"), "not footprint or pool"));
  EXPECT_TRUE(has(must_fail("group_outside_mb:lots"), "(or auto)"));
  PolicyResult r = load_conf("group_budget_counts:pool");
  ASSERT_TRUE(r.policy) << r.error;
  ASSERT_EQ(r.policy->warnings.size(), 1u);
  EXPECT_TRUE(has(r.policy->warnings[0], "group_budget_counts has no effect without group"));
}

TEST(GroupKeys, BadValuesSayWhatIsAllowed) {
  std::string e = must_fail("group:a/b");
  EXPECT_TRUE(has(e, "bad value 'a/b' for group")) << e;
  EXPECT_TRUE(has(e, "letters, digits")) << e;
  EXPECT_TRUE(has(must_fail("group:" + std::string(49, 'x')), "longer than 48"));
  EXPECT_TRUE(has(must_fail("group:.."), "not a name"));
  EXPECT_TRUE(has(must_fail("group_budget_fraction:1.5"), "outside [0, 1]"));
  EXPECT_TRUE(has(must_fail("group_budget_mb:-1"), "group_budget_mb"));
  EXPECT_TRUE(has(must_fail("group_release_wait_ms:20000"), "above the maximum 10000"));
}

TEST(GroupKeys, GroupNeedsABudgetAndABudgetAGroup) {
  PolicyResult r = load_conf("group:serve");
  ASSERT_FALSE(r.policy);
  EXPECT_TRUE(has(r.error, "group:serve (CUDAPOOL_CONF col 1) has no budget")) << r.error;
  EXPECT_TRUE(has(r.error, "group_budget_mb:N")) << r.error;
  r = load_conf("group_budget_fraction:0.4");
  ASSERT_FALSE(r.policy);
  EXPECT_TRUE(has(r.error, "group_budget_fraction (CUDAPOOL_CONF col 1) is set but group is not")) << r.error;
  r = load_conf("group:serve,group_budget_fraction:0.4");
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_TRUE(r.policy->warnings.empty());
  r = load_conf("group_release_wait_ms:50");
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_TRUE(has(r.policy->warnings.empty() ? "" : r.policy->warnings[0], "has no effect without group"));
}

// Parking: off by default with its figures' defaults, every key read back the way it was
// written, bad values refused with what is allowed, and the figures without parking (or parking
// without a group) warned about.
TEST(GroupKeys, ParkingKeys) {
  Policy d = must_parse("group:s,group_budget_mb:100");
  EXPECT_FALSE(d.group_park);
  EXPECT_EQ(d.group_park_host, -1);
  EXPECT_EQ(d.group_park_idle_ms, 2000);
  EXPECT_EQ(d.group_park_wait_ms, 30000);
  // describe() pads the names to one column: "group_park   ...   = off".
  auto described = [](const Policy& policy, const std::string& key, const std::string& value) {
    const std::string text = describe(policy);
    const std::size_t at = text.find("\n" + key + " ");
    return at != std::string::npos && text.substr(text.find(" = ", at), 3 + value.size() + 1) == " = " + value + " ";
  };
  EXPECT_TRUE(described(d, "group_park", "off")) << describe(d);
  EXPECT_TRUE(described(d, "group_park_host_mb", "auto")) << describe(d);
  EXPECT_TRUE(described(d, "group_park_idle_ms", "2000")) << describe(d);
  Policy p = must_parse(
      "group:s,group_budget_mb:100,group_park:ON,group_park_host_mb:2048,group_park_idle_ms:0,"
      "group_park_wait_ms:60000");
  EXPECT_TRUE(p.group_park);
  EXPECT_EQ(p.group_park_host, static_cast<std::int64_t>(2048 * MiB));
  EXPECT_EQ(p.group_park_idle_ms, 0);
  EXPECT_EQ(p.group_park_wait_ms, 60000);
  testing::expect_same_policy(must_parse(to_conf_string(p)), p);
  EXPECT_TRUE(has(to_conf_string(p), "group_park:on")) << to_conf_string(p);
  EXPECT_TRUE(must_parse("group:s,group_budget_mb:100,group_park:true").group_park);
  EXPECT_FALSE(must_parse("group:s,group_budget_mb:100,group_park:on,group_park:off").group_park);
  EXPECT_EQ(must_parse("group:s,group_budget_mb:100,group_park_host_mb:AUTO").group_park_host, -1);

  std::string e = must_fail("group_park:maybe");
  EXPECT_TRUE(has(e, "bad value 'maybe' for group_park (not on or off); allowed: on or off")) << e;
  e = must_fail("group_park_host_mb:0");
  EXPECT_TRUE(has(e, "use group_park:off to turn parking off")) << e;
  EXPECT_TRUE(has(must_fail("group_park_host_mb:lots"), "(or auto)"));
  EXPECT_TRUE(has(must_fail("group_park_idle_ms:-5"), "group_park_idle_ms"));
  EXPECT_TRUE(has(must_fail("group_park_idle_ms:86400001"), "above the maximum 86400000"));
  EXPECT_TRUE(has(must_fail("group_park_wait_ms:600001"), "above the maximum 600000"));
  e = must_fail("group_park_wait_ms:0");
  EXPECT_TRUE(has(e, "use group_park:off instead")) << e;

  // A TOML profile sets them with TOML's own types.
  TempFile f(R"([profiles.serve]
group = "serving"
group_budget_mb = 4096
group_park = "on"
group_park_idle_ms = 500
group_park_host_mb = "auto"
)");
  PolicySources s;
  s.config_path = f.path();
  s.profile = "serve";
  PolicyResult r = load_policy(s);
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_TRUE(r.policy->group_park);
  EXPECT_EQ(r.policy->group_park_idle_ms, 500);
  EXPECT_TRUE(r.policy->warnings.empty()) << r.policy->warnings[0];

  r = load_conf("group_park:on");
  ASSERT_TRUE(r.policy) << r.error;
  ASSERT_EQ(r.policy->warnings.size(), 1u);
  EXPECT_TRUE(has(r.policy->warnings[0], "group_park has no effect without group"));
  r = load_conf("group:s,group_budget_mb:100,group_park_idle_ms:10");
  ASSERT_TRUE(r.policy) << r.error;
  ASSERT_EQ(r.policy->warnings.size(), 1u);
  EXPECT_TRUE(has(r.policy->warnings[0], "group_park_idle_ms has no effect without group_park:on"));
  r = load_conf("group:s,group_budget_mb:100,group_park:on,expandable_segments:False");
  ASSERT_TRUE(r.policy) << r.error;
  ASSERT_EQ(r.policy->warnings.size(), 1u);
  EXPECT_TRUE(has(r.policy->warnings[0], "this process is never parked")) << r.policy->warnings[0];
}

TEST(GroupKeys, ProfilesSetThem) {
  TempFile f(R"([policy]
max_split_size_mb = 128

[profiles.serve]
group = "serving"
group_budget_mb = 40960
group_release_wait_ms = 250
publish_stats = false
)");
  PolicySources s;
  s.config_path = f.path();
  s.profile = "serve";
  PolicyResult r = load_policy(s);
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_EQ(r.policy->group, "serving");
  EXPECT_EQ(r.policy->group_budget, 40960 * MiB);
  EXPECT_EQ(r.policy->group_release_wait_ms, 250);
  EXPECT_FALSE(r.policy->publish_stats);
  EXPECT_EQ(r.policy->origin.at("group"), "profile serve (" + f.path() + ":5)");
  // The profile's group without its budget is refused like the env string's.
  TempFile g("[profiles.serve]\ngroup = \"serving\"\n");
  s.config_path = g.path();
  r = load_policy(s);
  ASSERT_FALSE(r.policy);
  EXPECT_TRUE(has(r.error, "has no budget")) << r.error;
}

}  // namespace
}  // namespace cudapool
