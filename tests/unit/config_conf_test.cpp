// The env grammar: every key, every bound, the seeds' spellings, and the error messages.
#include <gtest/gtest.h>

#include <algorithm>

#include "config/keys.h"
#include "config/policy.h"
#include "tests/unit/config_test_util.h"

namespace cudapool {
namespace {

using testing::must_fail;
using testing::must_parse;

bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// ---- the seeds ---------------------------------------------------------------------------------

TEST(ConfSeeds, EqualsSeparatorWorks) {
  Policy p = must_parse("max_split_size_mb=32");
  EXPECT_EQ(p.pool.max_split_size, 32 * MiB);
  EXPECT_EQ(p.origin.at("max_split_size_mb"), "CUDAPOOL_CONF col 1");
}

TEST(ConfSeeds, ReservePercentageFailsHelpfully) {
  std::string e = must_fail("reserve_percentage=0.1");
  EXPECT_TRUE(has(e, "unknown key 'reserve_percentage'")) << e;
  EXPECT_TRUE(has(e, "col 1")) << e;
  // Nothing is close, so the message lists what is valid.
  EXPECT_TRUE(has(e, "valid keys:")) << e;
  EXPECT_TRUE(has(e, "max_split_size_mb")) << e;
  EXPECT_TRUE(has(e, "garbage_collection_threshold")) << e;
  EXPECT_FALSE(has(e, "did you mean")) << e;
}

TEST(ConfSeeds, RoundupListBucketsWorkedOutByHand) {
  Policy p = must_parse("roundup_power2_divisions:[256:1,512:2,>:4]");
  // Bucket i holds sizes in [2^(20+i), 2^(21+i)): 256 MiB = 2^28 is bucket 8, 512 MiB bucket 9.
  // The first entry (256:1) also covers everything smaller: buckets 0..8 = 1. 512:2 sets bucket 9.
  // '>' covers every bucket after the last listed one: 10..15 = 4.
  const std::array<std::uint32_t, 16> want{1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 4, 4, 4, 4, 4};
  EXPECT_EQ(p.pool.roundup_power2_divisions, want);
}

// ---- PyTorch's own spellings ------------------------------------------------------------------

TEST(ConfGrammar, PyTorchStringMeansTheSame) {
  Policy p = must_parse(
      "backend:native,max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:4],"
      "garbage_collection_threshold:0.6,expandable_segments:True,release_lock_on_cudamalloc:False,"
      "max_non_split_rounding_mb:64,per_process_memory_fraction:0.5");
  EXPECT_EQ(p.backend, Backend::native);
  EXPECT_EQ(p.pool.max_split_size, 128 * MiB);
  EXPECT_EQ(p.pool.garbage_collection_threshold, 0.6);
  EXPECT_TRUE(p.pool.expandable_segments);
  EXPECT_FALSE(p.pool.release_lock_on_cudamalloc);
  EXPECT_EQ(p.pool.max_non_split_rounding, 64 * MiB);
  EXPECT_EQ(p.pool.per_process_memory_fraction, 0.5);
  EXPECT_TRUE(p.warnings.empty());
}

TEST(ConfGrammar, SpacesAnywhere) {
  Policy p = must_parse(
      "  max_split_size_mb : 64 ,\texpandable_segments = true , roundup_power2_divisions: [ 256 : 1 , > : 2 ] ");
  EXPECT_EQ(p.pool.max_split_size, 64 * MiB);
  EXPECT_TRUE(p.pool.expandable_segments);
  EXPECT_EQ(p.pool.roundup_power2_divisions[8], 1u);
  EXPECT_EQ(p.pool.roundup_power2_divisions[9], 2u);
  // Like PyTorch's lexer, spaces inside a word are dropped.
  EXPECT_EQ(must_parse("max_split _size_mb:1 28").pool.max_split_size, 128 * MiB);
}

TEST(ConfGrammar, EmptyItemsAndTrailingCommaAreSkipped) {
  testing::expect_same_policy(must_parse(""), Policy{});
  testing::expect_same_policy(must_parse(" , ,"), Policy{});
  EXPECT_EQ(must_parse("max_split_size_mb:40,").pool.max_split_size, 40 * MiB);
  EXPECT_EQ(must_parse(",,max_split_size_mb:40,,").pool.max_split_size, 40 * MiB);
}

TEST(ConfGrammar, LaterValueWinsAndOriginFollows) {
  Policy p = must_parse("max_split_size_mb:40,expandable_segments:True,max_split_size_mb:50");
  EXPECT_EQ(p.pool.max_split_size, 50 * MiB);
  EXPECT_EQ(p.origin.at("max_split_size_mb"), "CUDAPOOL_CONF col 47");
  EXPECT_EQ(p.origin.at("expandable_segments"), "CUDAPOOL_CONF col 22");
}

TEST(ConfGrammar, ParsesOverBaseAndNamesTheOrigin) {
  Policy base;
  base.pool.max_split_size = 99 * MiB;
  base.log_level = "debug";
  PolicyResult r = parse_conf("expandable_segments:True", base, "PYTORCH_CUDA_ALLOC_CONF");
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_EQ(r.policy->pool.max_split_size, 99 * MiB);
  EXPECT_EQ(r.policy->log_level, "debug");
  EXPECT_EQ(r.policy->origin.at("expandable_segments"), "PYTORCH_CUDA_ALLOC_CONF col 1");
  PolicyResult bad = parse_conf("x:1", base, "PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_TRUE(has(bad.error, "PYTORCH_CUDA_ALLOC_CONF col 1")) << bad.error;
}

// ---- errors of the grammar ---------------------------------------------------------------------

TEST(ConfErrors, UnknownKeyCloseToAValidOneSuggestsIt) {
  std::string e = must_fail("expandable_segments:True,max_split_size:64");
  EXPECT_TRUE(has(e, "col 26")) << e;
  EXPECT_TRUE(has(e, "unknown key 'max_split_size'")) << e;
  EXPECT_TRUE(has(e, "did you mean 'max_split_size_mb'?")) << e;
  EXPECT_TRUE(has(must_fail("garbage_colection_threshold:0.5"), "did you mean 'garbage_collection_threshold'?"));
  EXPECT_TRUE(has(must_fail("Expandable_Segments:True"), "did you mean 'expandable_segments'?"));
  EXPECT_TRUE(has(must_fail("expandable:True"), "did you mean 'expandable_segments'?"));
  EXPECT_TRUE(has(must_fail("free_synch:device"), "did you mean 'free_sync'?"));
}

TEST(ConfErrors, KeyWithoutValue) {
  std::string e = must_fail("expandable_segments");
  EXPECT_TRUE(has(e, "key 'expandable_segments' has no value")) << e;
  EXPECT_TRUE(has(e, "expandable_segments:VALUE")) << e;
  EXPECT_TRUE(has(e, "True or False")) << e;
  e = must_fail("max_split_size_mb:64,expandable_segments,free_sync:device");
  EXPECT_TRUE(has(e, "col 22")) << e;
}

TEST(ConfErrors, ValueWithoutKey) {
  std::string e = must_fail(":64");
  EXPECT_TRUE(has(e, "col 1")) << e;
  EXPECT_TRUE(has(e, "without a key")) << e;
}

TEST(ConfErrors, BadValueColumnKeyValueAndForm) {
  std::string e = must_fail("expandable_segments:True,max_split_size_mb:10");
  EXPECT_TRUE(has(e, "CUDAPOOL_CONF col 44:")) << e;
  EXPECT_TRUE(has(e, "bad value '10' for max_split_size_mb")) << e;
  EXPECT_TRUE(has(e, ">= 20")) << e;
  EXPECT_TRUE(has(e, "e.g. max_split_size_mb:128")) << e;
}

TEST(ConfErrors, UnclosedListAndQuote) {
  std::string e = must_fail("roundup_power2_divisions:[256:1,512:2");
  EXPECT_TRUE(has(e, "without a closing ']'")) << e;
  EXPECT_TRUE(has(e, "roundup_power2_divisions")) << e;
  EXPECT_TRUE(has(e, "col 26")) << e;
  e = must_fail("log_file:\"/tmp/a,b");
  EXPECT_TRUE(has(e, "unterminated quoted value of log_file")) << e;
}

TEST(ConfErrors, JunkAfterAListOrQuote) {
  std::string e = must_fail("roundup_power2_divisions:[256:1]x,max_split_size_mb:64");
  EXPECT_TRUE(has(e, "unexpected 'x'")) << e;
  EXPECT_TRUE(has(e, "col 33")) << e;
  EXPECT_TRUE(has(must_fail("log_file:\"a\" b"), "separate settings with ','"));
}

// ---- every key, every bound --------------------------------------------------------------------

TEST(ConfKeys, MaxSplitSizeBounds) {
  EXPECT_TRUE(has(must_fail("max_split_size_mb:19"), "below the minimum 20"));
  EXPECT_EQ(must_parse("max_split_size_mb:20").pool.max_split_size, 20 * MiB);
  EXPECT_TRUE(has(must_fail("max_split_size_mb:-1"), "not a whole number"));
  EXPECT_TRUE(has(must_fail("max_split_size_mb:1.5"), "not a whole number"));
  EXPECT_TRUE(has(must_fail("max_split_size_mb:64MB"), "not a whole number"));
  EXPECT_TRUE(has(must_fail("max_split_size_mb:"), "bad value '' for max_split_size_mb (empty)"));
  EXPECT_TRUE(has(must_fail("max_split_size_mb:99999999999999999999999"), "too large"));
  // Past what fits in bytes it clamps, as PyTorch does, and stays a limit.
  Policy p = must_parse("max_split_size_mb:18446744073709551615");
  EXPECT_EQ(p.pool.max_split_size, (kNoLimit / MiB) * MiB);
  EXPECT_NE(p.pool.max_split_size, kNoLimit);
}

TEST(ConfKeys, ExpandablePageBounds) {
  EXPECT_EQ(Policy{}.pool.expandable_large_page, 0u);
  EXPECT_EQ(must_parse("expandable_page_mb:20").pool.expandable_large_page, 20 * MiB);
  EXPECT_EQ(must_parse("expandable_page_mb:64").pool.expandable_large_page, 64 * MiB);
  EXPECT_EQ(must_parse("expandable_page_mb:1024").pool.expandable_large_page, 1024 * MiB);
  EXPECT_TRUE(has(must_fail("expandable_page_mb:1025"), "above the maximum 1024"));
  EXPECT_TRUE(has(must_fail("expandable_page_mb:2.5"), "not a whole number"));
  EXPECT_TRUE(has(to_conf_string(must_parse("expandable_page_mb:2")), "expandable_page_mb:2"));
  EXPECT_FALSE(has(to_conf_string(must_parse("expandable_page_mb:0")), "expandable_page_mb"));  // the default
}

TEST(ConfKeys, ExpandableUnitBounds) {
  EXPECT_EQ(Policy{}.pool.expandable_max_unit, 16 * MiB);
  // Unset, units scale with the pool; a value set holds for every unit.
  EXPECT_EQ(Policy{}.pool.expandable_unit_share, 64u);
  EXPECT_EQ(must_parse("expandable_unit_mb:16").pool.expandable_unit_share, 0u);
  EXPECT_TRUE(has(to_conf_string(must_parse("expandable_unit_mb:16")), "expandable_unit_mb:16"));
  EXPECT_EQ(must_parse("expandable_unit_mb:0").pool.expandable_max_unit, 0u);
  EXPECT_EQ(must_parse("expandable_unit_mb:64").pool.expandable_max_unit, 64 * MiB);
  EXPECT_EQ(must_parse("expandable_unit_mb:1024").pool.expandable_max_unit, 1024 * MiB);
  EXPECT_TRUE(has(must_fail("expandable_unit_mb:1025"), "above the maximum 1024"));
  EXPECT_TRUE(has(must_fail("expandable_unit_mb:-1"), "expandable_unit_mb"));
  EXPECT_TRUE(has(must_fail("expandable_unit_mb:big"), "expandable_unit_mb"));
  EXPECT_TRUE(has(to_conf_string(must_parse("expandable_unit_mb:0")), "expandable_unit_mb:0"));
  EXPECT_FALSE(has(to_conf_string(Policy{}), "expandable_unit_mb"));  // the default: units scale
}

TEST(ConfKeys, ExpandableHeadroomBounds) {
  EXPECT_EQ(Policy{}.pool.expandable_headroom, 0.0);
  EXPECT_EQ(must_parse("expandable_headroom:0.03").pool.expandable_headroom, 0.03);
  EXPECT_EQ(must_parse("expandable_headroom:0").pool.expandable_headroom, 0.0);
  EXPECT_TRUE(has(must_fail("expandable_headroom:1"), "not in [0, 1)"));
  EXPECT_TRUE(has(must_fail("expandable_headroom:-0.1"), "expandable_headroom"));
  EXPECT_TRUE(has(must_fail("expandable_headroom:lots"), "expandable_headroom"));
  EXPECT_TRUE(has(to_conf_string(must_parse("expandable_headroom:0.05")), "expandable_headroom:0.05"));
}

TEST(ConfKeys, MaxNonSplitRoundingBounds) {
  EXPECT_EQ(Policy{}.pool.max_non_split_rounding, 20 * MiB);
  EXPECT_TRUE(has(must_fail("max_non_split_rounding_mb:19"), "max_non_split_rounding_mb"));
  EXPECT_EQ(must_parse("max_non_split_rounding_mb:20").pool.max_non_split_rounding, 20 * MiB);
  EXPECT_EQ(must_parse("max_non_split_rounding_mb:512").pool.max_non_split_rounding, 512 * MiB);
  EXPECT_TRUE(has(must_fail("max_non_split_rounding_mb:x"), "not a whole number"));
}

TEST(ConfKeys, GarbageCollectionThresholdIsAnOpenInterval) {
  for (const char* bad : {"0", "1", "1.0", "-0.1", "1.5", "nan", "inf", "x", "0.5.5"}) {
    std::string e = must_fail(std::string("garbage_collection_threshold:") + bad);
    EXPECT_TRUE(has(e, "garbage_collection_threshold")) << e;
    EXPECT_TRUE(has(e, "strictly between 0 and 1")) << e;
  }
  EXPECT_EQ(must_parse("garbage_collection_threshold:0.8").pool.garbage_collection_threshold, 0.8);
  EXPECT_EQ(must_parse("garbage_collection_threshold:1e-3").pool.garbage_collection_threshold, 0.001);
  EXPECT_EQ(must_parse("garbage_collection_threshold:0.999999").pool.garbage_collection_threshold, 0.999999);
}

TEST(ConfKeys, PerProcessMemoryFractionIsClosed) {
  EXPECT_EQ(must_parse("per_process_memory_fraction:0").pool.per_process_memory_fraction, 0.0);
  EXPECT_EQ(must_parse("per_process_memory_fraction:1").pool.per_process_memory_fraction, 1.0);
  EXPECT_EQ(must_parse("per_process_memory_fraction:0.25").pool.per_process_memory_fraction, 0.25);
  for (const char* bad : {"1.01", "-0.5", "2", "half"}) {
    std::string e = must_fail(std::string("per_process_memory_fraction:") + bad);
    EXPECT_TRUE(has(e, "per_process_memory_fraction")) << e;
    EXPECT_TRUE(has(e, "[0, 1]")) << e;
  }
}

TEST(ConfKeys, RoundupScalar) {
  Policy p = must_parse("roundup_power2_divisions:4");
  for (std::uint32_t d : p.pool.roundup_power2_divisions) EXPECT_EQ(d, 4u);
  for (std::uint32_t d : must_parse("roundup_power2_divisions:0").pool.roundup_power2_divisions) EXPECT_EQ(d, 0u);
  EXPECT_EQ(must_parse("roundup_power2_divisions:2147483648").pool.roundup_power2_divisions[3], 2147483648u);
  for (const char* bad : {"3", "6", "4294967296", "-4", "four"}) {
    std::string e = must_fail(std::string("roundup_power2_divisions:") + bad);
    EXPECT_TRUE(has(e, "roundup_power2_divisions")) << e;
    EXPECT_TRUE(has(e, "power of two")) << e;
  }
}

TEST(ConfKeys, RoundupListForms) {
  using A = std::array<std::uint32_t, 16>;
  // Keys between listed ones stay off; the first entry fills below it.
  EXPECT_EQ(must_parse("roundup_power2_divisions:[1:2,64:4]").pool.roundup_power2_divisions,
            (A{2, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  // '>' alone starts after bucket 0 (PyTorch's last_index starts at 0).
  EXPECT_EQ(must_parse("roundup_power2_divisions:[>:8]").pool.roundup_power2_divisions,
            (A{0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}));
  // Boundaries past 32 GiB land in the last bucket; '=' may stand for ':'.
  EXPECT_EQ(must_parse("roundup_power2_divisions:[65536=2]").pool.roundup_power2_divisions,
            (A{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
  // 0 in a list switches a bucket off; an empty list switches all off; a trailing comma is fine.
  EXPECT_EQ(must_parse("roundup_power2_divisions:[2:4,4:0,>:2]").pool.roundup_power2_divisions,
            (A{4, 4, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(must_parse("roundup_power2_divisions:[]").pool.roundup_power2_divisions, A{});
  EXPECT_EQ(must_parse("roundup_power2_divisions:[256:1,]").pool.roundup_power2_divisions[8], 1u);
  // A list replaces an earlier value entirely.
  EXPECT_EQ(must_parse("roundup_power2_divisions:8,roundup_power2_divisions:[2:1]").pool.roundup_power2_divisions,
            (A{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  for (const char* bad : {"[100:2]", "[256:3]", "[0:2]", "[256]", "[256:1,,512:2]", "[x:1]", "[256:1", "[,256:1]"}) {
    std::string e = must_fail(std::string("roundup_power2_divisions:") + bad);
    EXPECT_TRUE(has(e, "roundup_power2_divisions")) << e;
  }
  EXPECT_TRUE(has(must_fail("roundup_power2_divisions:[100:2]"), "boundary '100' is not a power of two"));
  EXPECT_TRUE(has(must_fail("roundup_power2_divisions:[256:3]"), "divisions '3' is not a power of two"));
}

TEST(ConfKeys, Booleans) {
  for (const char* t : {"True", "true", "TRUE", "tRuE"}) {
    EXPECT_TRUE(must_parse(std::string("expandable_segments:") + t).pool.expandable_segments);
    EXPECT_TRUE(must_parse(std::string("release_lock_on_cudamalloc:") + t).pool.release_lock_on_cudamalloc);
  }
  Policy on;
  on.pool.expandable_segments = on.pool.release_lock_on_cudamalloc = true;
  EXPECT_FALSE(must_parse("expandable_segments:False", on).pool.expandable_segments);
  EXPECT_FALSE(must_parse("release_lock_on_cudamalloc:false", on).pool.release_lock_on_cudamalloc);
  for (const char* bad : {"yes", "1", "on", ""}) {
    std::string e = must_fail(std::string("expandable_segments:") + bad);
    EXPECT_TRUE(has(e, "expandable_segments")) << e;
    EXPECT_TRUE(has(e, "True or False")) << e;
  }
}

TEST(ConfKeys, HipSpellingOfReleaseLockIsAnAlias) {
  Policy p = must_parse("release_lock_on_hipmalloc:True");
  EXPECT_TRUE(p.pool.release_lock_on_cudamalloc);
  EXPECT_TRUE(p.warnings.empty());
  EXPECT_EQ(p.origin.at("release_lock_on_cudamalloc"), "CUDAPOOL_CONF col 1");
  EXPECT_EQ(to_conf_string(p), "release_lock_on_cudamalloc:True");
  EXPECT_TRUE(has(must_fail("release_lock_on_hipmalloc:1"), "release_lock_on_hipmalloc"));
}

TEST(ConfKeys, Backend) {
  EXPECT_EQ(must_parse("backend:passthrough").backend, Backend::passthrough);
  EXPECT_EQ(must_parse("backend:native").backend, Backend::native);
  Policy p = must_parse("backend:cudaMallocAsync");
  EXPECT_EQ(p.backend, Backend::native);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_TRUE(has(p.warnings[0], "cudaMallocAsync is ignored")) << p.warnings[0];
  {
    const Policy twice = must_parse("backend:cudaMallocAsync,backend:cudaMallocAsync");
    EXPECT_EQ(std::count_if(twice.warnings.begin(), twice.warnings.end(),
                            [](const std::string& w) { return has(w, "is ignored"); }),
              1);
  }
  std::string e = must_fail("backend:pool");
  EXPECT_TRUE(has(e, "bad value 'pool' for backend")) << e;
  EXPECT_TRUE(has(e, "native, passthrough")) << e;
}

TEST(ConfKeys, FreeSync) {
  EXPECT_EQ(Policy{}.pool.free_sync, FreeSync::gpu_wait);
  EXPECT_EQ(must_parse("free_sync:fenced").pool.free_sync, FreeSync::fenced);
  EXPECT_EQ(must_parse("free_sync:GPU_WAIT").pool.free_sync, FreeSync::gpu_wait);
  EXPECT_EQ(must_parse("free_sync:device").pool.free_sync, FreeSync::device);
  EXPECT_EQ(must_parse("free_sync:Immediate").pool.free_sync, FreeSync::immediate);
  EXPECT_EQ(must_parse("free_sync:immediate,free_sync:fenced").pool.free_sync, FreeSync::fenced);
  std::string e = must_fail("free_sync:lazy");
  EXPECT_TRUE(has(e, "free_sync")) << e;
  EXPECT_TRUE(has(e, "gpu_wait, fenced, device or immediate")) << e;
}

TEST(ConfKeys, DuplicateKeysWarnAndTheLaterWins) {
  const Policy p = must_parse("max_split_size_mb:64,roundup_power2_divisions:2,max_split_size_mb:128");
  EXPECT_EQ(p.pool.max_split_size, 128 * MiB);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_TRUE(has(p.warnings[0], "max_split_size_mb is set twice (col 1 and col 49)")) << p.warnings[0];
  // An alias is the same key.
  const Policy q = must_parse("release_lock_on_cudamalloc:True,release_lock_on_hipmalloc:False");
  EXPECT_FALSE(q.pool.release_lock_on_cudamalloc);
  ASSERT_EQ(q.warnings.size(), 1u);
  EXPECT_TRUE(has(q.warnings[0], "release_lock_on_cudamalloc is set twice")) << q.warnings[0];
  EXPECT_TRUE(must_parse("max_split_size_mb:64,roundup_power2_divisions:2").warnings.empty());
}

TEST(ConfKeys, FreeHostSync) {
  EXPECT_FALSE(Policy{}.free_host_sync);
  EXPECT_TRUE(must_parse("free_host_sync:True").free_host_sync);
  EXPECT_FALSE(must_parse("free_host_sync:true,free_host_sync:false").free_host_sync);
  std::string e = must_fail("free_host_sync:sometimes");
  EXPECT_TRUE(has(e, "free_host_sync")) << e;
}

TEST(ConfKeys, MaxReserved) {
  EXPECT_EQ(must_parse("max_reserved_mb:1024").pool.max_reserved, 1 * GiB);
  EXPECT_EQ(must_parse("max_reserved_mb:1").pool.max_reserved, 1 * MiB);
  Policy capped;
  capped.pool.max_reserved = 5 * MiB;
  EXPECT_EQ(must_parse("max_reserved_mb:0", capped).pool.max_reserved, kNoLimit);
  EXPECT_TRUE(has(must_fail("max_reserved_mb:-5"), "max_reserved_mb"));
  EXPECT_TRUE(has(must_fail("max_reserved_mb:2G"), "a whole number of MiB"));
}

TEST(ConfKeys, LogLevel) {
  for (const char* l : {"trace", "debug", "info", "warn", "error", "critical", "off"})
    EXPECT_EQ(must_parse(std::string("log_level:") + l).log_level, l);
  EXPECT_EQ(must_parse("log_level:WARNING").log_level, "warn");
  EXPECT_EQ(must_parse("log_level:err").log_level, "error");
  EXPECT_EQ(must_parse("log_level:Info").log_level, "info");
  std::string e = must_fail("log_level:verbose");
  EXPECT_TRUE(has(e, "log_level")) << e;
  EXPECT_TRUE(has(e, "trace, debug, info, warn")) << e;
}

TEST(ConfKeys, Paths) {
  Policy p = must_parse("log_file:/tmp/a:b-%p.log,trace_file=/tmp/t.csv,stats_file:\"/tmp/my stats, 1.json\"");
  EXPECT_EQ(p.log_file, "/tmp/a:b-%p.log");
  EXPECT_EQ(p.trace_file, "/tmp/t.csv");
  EXPECT_EQ(p.stats_file, "/tmp/my stats, 1.json");
  EXPECT_EQ(must_parse("trace_file:\"a\\\"b\\\\c\"").trace_file, "a\"b\\c");
  Policy set;
  set.log_file = "/x";
  EXPECT_EQ(must_parse("log_file:\"\"", set).log_file, "");
  std::string e = must_fail(std::string("stats_file:\"a\x01") + "b\"");
  EXPECT_TRUE(has(e, "stats_file")) << e;
  EXPECT_TRUE(has(e, "control character")) << e;
}

TEST(ConfKeys, PinnedKeysSetThePinnedPool) {
  Policy p = must_parse(
      "pinned_cache:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
      "pinned_reserve_segment_size_mb:64,pinned_max_round_threshold_mb:32,pinned_max_cached_size_mb:512");
  EXPECT_TRUE(p.warnings.empty());
  EXPECT_TRUE(p.pinned.enabled);
  EXPECT_TRUE(p.pinned.use_host_register);
  EXPECT_EQ(p.pinned.register_threads, 8);
  EXPECT_EQ(p.pinned.reserve_segment, 64 * MiB);
  EXPECT_EQ(p.pinned.max_round_threshold, 32 * MiB);
  EXPECT_EQ(p.pinned.max_cached, 512 * MiB);
  EXPECT_EQ(p.origin.count("pinned_max_cached_size_mb"), 1u);
  // Off and unlimited by default; the string round-trips.
  EXPECT_FALSE(Policy{}.pinned.enabled);
  EXPECT_EQ(Policy{}.pinned.max_cached, kNoLimit);
  testing::expect_same_policy(must_parse(to_conf_string(p)), p);
  EXPECT_EQ(must_parse("pinned_max_cached_size_mb:0").pinned.max_cached, 0u);
  // Checked the way PyTorch checks them.
  EXPECT_TRUE(has(must_fail("pinned_num_register_threads:3"), "power of two <= 128"));
  EXPECT_TRUE(has(must_fail("pinned_num_register_threads:256"), "power of two <= 128"));
  EXPECT_TRUE(has(must_fail("pinned_reserve_segment_size_mb:0"), "below the minimum 1"));
  EXPECT_TRUE(has(must_fail("pinned_cache:maybe"), "pinned_cache"));
}

TEST(ConfKeys, PyTorchKeysWithoutMeaningHereAreAcceptedWithOneWarning) {
  Policy p = must_parse(
      "pinned_use_background_threads:True,pinned_use_hip_host_register:True,"
      "pinned_use_background_threads:False");
  ASSERT_EQ(p.warnings.size(), 2u);  // one per key
  EXPECT_TRUE(has(p.warnings[0], "pinned_use_background_threads is ignored")) << p.warnings[0];
  EXPECT_TRUE(has(p.warnings[0], "returns at once")) << p.warnings[0];
  EXPECT_EQ(p.origin.count("pinned_use_background_threads"), 0u);
  testing::expect_same_policy(p, Policy{});
  EXPECT_TRUE(has(must_fail("pinned_use_background_threads:maybe"), "pinned_use_background_threads"));
  EXPECT_EQ(must_parse("graph_capture_record_stream_reuse:True").warnings.size(), 1u);
}

TEST(ConfKeys, LargeSegmentSizeIsRefusedNotIgnored) {
  std::string e = must_fail("large_segment_size_mb:64");
  EXPECT_TRUE(has(e, "large_segment_size_mb")) << e;
  EXPECT_TRUE(has(e, "does not implement")) << e;
  EXPECT_TRUE(has(e, "remove the key")) << e;
}

// Every key of the table has a test above that sets it; this catches a key added without one.
TEST(ConfKeys, EveryTableKeyParsesItsOwnExample) {
  for (const config::KeySpec& k : config::keys()) {
    if (k.name == "large_segment_size_mb") continue;
    PolicyResult r = parse_conf(std::string(k.name) + ":" + std::string(k.example), Policy{});
    EXPECT_TRUE(r.policy) << k.name << ": " << r.error;
    EXPECT_FALSE(k.allowed.empty()) << k.name;
    EXPECT_FALSE(k.help.empty()) << k.name;
  }
}

// ---- untrusted policies (a trace's policy row) ---------------------------------------------------

std::vector<std::string> dropped_keys(const UntrustedConf& u) {
  std::vector<std::string> keys;
  for (const auto& d : u.dropped) keys.push_back(d.key);
  return keys;
}

TEST(ConfUntrusted, KeepsOnlyPoolShapingKeysWhateverTheSpelling) {
  const UntrustedConf u = pool_shaping_conf(
      R"( stats_file = "/tmp/a, b.json" ,max_split_size_mb=128,trace_file:/tmp/t.csv,log_file:/tmp/l, )"
      R"(roundup_power2_divisions:[256:1,>:4],release_lock_on_hipmalloc:True,log_level:debug,)"
      R"(dump_signal:usr2,group:g,group_budget_mb:64,publish_stats:False)",
      "a trace");
  ASSERT_TRUE(u.error.empty()) << u.error;
  EXPECT_EQ(u.conf, "max_split_size_mb:128,roundup_power2_divisions:[256:1,>:4],release_lock_on_cudamalloc:True");
  EXPECT_EQ(dropped_keys(u), (std::vector<std::string>{"log_level", "log_file", "trace_file", "stats_file",
                                                       "dump_signal", "group", "group_budget_mb", "publish_stats"}));
  const std::string line = describe_dropped(u.dropped);
  EXPECT_TRUE(has(line, "log_file, trace_file, stats_file (a trace cannot choose files to write)")) << line;
  EXPECT_TRUE(has(line, "log_level, dump_signal, group, group_budget_mb, publish_stats (a trace cannot set")) << line;
}

TEST(ConfUntrusted, AnInvalidPolicyKeepsNothing) {
  const UntrustedConf u = pool_shaping_conf("stats_file:/tmp/s.json,no_such_key:1", "a trace");
  EXPECT_TRUE(has(u.error, "no_such_key")) << u.error;
  EXPECT_TRUE(u.conf.empty());
  EXPECT_TRUE(u.dropped.empty());
}

// Each key by its own example: a pool key passes unchanged, any other is dropped and named.
TEST(ConfUntrusted, EveryKeyByItsReach) {
  for (const config::KeySpec& k : config::keys()) {
    // A path or a name (a file, a group) is never the pool's alone.
    if (k.kind == config::ValueKind::text) {
      EXPECT_NE(k.reach, config::Reach::pool) << k.name;
    }
    if (k.format == nullptr) continue;
    const std::string text = std::string(k.name) + ":" + std::string(k.example);
    PolicyResult r = parse_conf(text, Policy{});
    ASSERT_TRUE(r.policy) << r.error;
    if (k.is_default(*r.policy)) continue;
    const UntrustedConf u = pool_shaping_conf(text, "a trace");
    ASSERT_TRUE(u.error.empty()) << u.error;
    if (k.reach == config::Reach::pool) {
      EXPECT_EQ(u.conf, to_conf_string(*r.policy)) << k.name;
      EXPECT_TRUE(u.dropped.empty()) << k.name;
    } else {
      EXPECT_EQ(u.conf, "") << k.name;
      EXPECT_EQ(dropped_keys(u), std::vector<std::string>{std::string(k.name)});
    }
  }
}

}  // namespace
}  // namespace cudapool
