// The TOML file, layering, profile selection, CUDAPOOL_ON_ERROR and the environment.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "config/policy.h"
#include "sys/secure.h"
#include "tests/unit/bounded_child.h"
#include "tests/unit/config_test_util.h"

namespace cudapool {
namespace {

using testing::TempFile;

bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

Policy must_load(const PolicySources& s) {
  PolicyResult r = load_policy(s);
  EXPECT_TRUE(r.policy) << r.error;
  return r.policy.value_or(Policy{});
}

std::string must_not_load(const PolicySources& s) {
  PolicyResult r = load_policy(s);
  EXPECT_FALSE(r.policy);
  EXPECT_FALSE(r.error.empty());
  return r.error;
}

PolicySources file(const TempFile& f, std::string profile = {}, std::string cmd = {}) {
  PolicySources s;
  s.config_path = f.path();
  s.profile = std::move(profile);
  s.command_line = std::move(cmd);
  return s;
}

const char* kJobFile = R"(# shared by every job
[policy]
max_split_size_mb = 128
garbage_collection_threshold = 0.8
per_process_memory_fraction = 0.9

[log]
level = "info"
file = "/tmp/cudapool-%p.log"

[profiles.train]
match = ["*train.py*"]
expandable_segments = true
max_split_size_mb = 256

[profiles.eval]
match = "*eval.py*"
free_sync = "immediate"
roundup_power2_divisions = {256 = 1, 512 = 2, ">" = 4}
)";

TEST(PolicyFile, PolicyAndLogTablesWithOrigins) {
  TempFile f(kJobFile);
  Policy p = must_load(file(f));
  EXPECT_EQ(p.pool.max_split_size, 128 * MiB);
  EXPECT_EQ(p.pool.garbage_collection_threshold, 0.8);
  EXPECT_EQ(p.log_level, "info");
  EXPECT_EQ(p.log_file, "/tmp/cudapool-%p.log");
  EXPECT_TRUE(p.pool.expandable_segments);  // no profile matched: the default
  EXPECT_EQ(p.origin.at("max_split_size_mb"), "file " + f.path() + ":3");
  EXPECT_EQ(p.origin.at("log_level"), "file " + f.path() + ":8");
  EXPECT_EQ(p.origin.at("expandable_segments"), "default");
  EXPECT_TRUE(p.warnings.empty());
}

TEST(PolicyFile, LayeringDefaultsFileProfileEnv) {
  TempFile f(kJobFile);
  PolicySources s = file(f, "", "python train.py --epochs 3");
  s.conf = "max_split_size_mb:512,log_level:debug";
  Policy p = must_load(s);
  EXPECT_EQ(p.pool.max_split_size, 512 * MiB);  // env over profile over file
  EXPECT_EQ(p.origin.at("max_split_size_mb"), "CUDAPOOL_CONF col 1");
  EXPECT_TRUE(p.pool.expandable_segments);  // profile
  EXPECT_EQ(p.origin.at("expandable_segments"), "profile train (" + f.path() + ":13)");
  EXPECT_EQ(p.pool.garbage_collection_threshold, 0.8);  // file
  EXPECT_EQ(p.origin.at("garbage_collection_threshold"), "file " + f.path() + ":4");
  EXPECT_EQ(p.log_level, "debug");                     // env over [log]
  EXPECT_EQ(p.pool.max_non_split_rounding, 20 * MiB);  // default
  EXPECT_EQ(p.origin.at("max_non_split_rounding_mb"), "default");

  // Without the env string the profile's value shows through.
  s.conf.clear();
  EXPECT_EQ(must_load(s).pool.max_split_size, 256 * MiB);
}

TEST(PolicyFile, ProfileByNameAndByMatch) {
  TempFile f(kJobFile);
  Policy eval = must_load(file(f, "", "/usr/bin/python3 eval.py"));
  EXPECT_EQ(eval.pool.free_sync, FreeSync::immediate);
  const std::array<std::uint32_t, 16> want{1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 4, 4, 4, 4, 4};
  EXPECT_EQ(eval.pool.roundup_power2_divisions, want);
  // An explicit choice wins over match.
  Policy train = must_load(file(f, "train", "/usr/bin/python3 eval.py"));
  EXPECT_TRUE(train.pool.expandable_segments);
  EXPECT_EQ(train.pool.free_sync, FreeSync::gpu_wait);
  // Nothing matches: the file's [policy] alone.
  Policy none = must_load(file(f, "", "./a.out"));
  EXPECT_EQ(none.pool.max_split_size, 128 * MiB);
  EXPECT_EQ(none.pool.free_sync, FreeSync::gpu_wait);
}

TEST(PolicyFile, TwoMatchingProfilesNameBoth) {
  TempFile f(kJobFile);
  std::string e = must_not_load(file(f, "", "python train.py --then eval.py"));
  EXPECT_TRUE(has(e, "'eval'")) << e;
  EXPECT_TRUE(has(e, "'train'")) << e;
  EXPECT_TRUE(has(e, "CUDAPOOL_PROFILE=NAME")) << e;
  // Choosing one resolves it.
  EXPECT_TRUE(must_load(file(f, "eval", "python train.py --then eval.py")).pool.free_sync == FreeSync::immediate);
}

TEST(PolicyFile, UnknownProfile) {
  TempFile f(kJobFile);
  std::string e = must_not_load(file(f, "trian"));
  EXPECT_TRUE(has(e, "profile 'trian' (CUDAPOOL_PROFILE) is not in " + f.path())) << e;
  EXPECT_TRUE(has(e, "eval, train")) << e;
  TempFile bare("[policy]\nmax_split_size_mb = 64\n");
  e = must_not_load(file(bare, "train"));
  EXPECT_TRUE(has(e, "no [profiles.NAME] tables")) << e;
}

TEST(PolicyFile, ProfileWithoutFile) {
  PolicySources s;
  s.profile = "train";
  std::string e = must_not_load(s);
  EXPECT_TRUE(has(e, "CUDAPOOL_PROFILE=train")) << e;
  EXPECT_TRUE(has(e, "CUDAPOOL_CONFIG")) << e;
}

TEST(PolicyFile, MissingFileAndDirectory) {
  PolicySources s;
  s.config_path = "/nonexistent/cudapool/policy.toml";
  std::string e = must_not_load(s);
  EXPECT_TRUE(has(e, "CUDAPOOL_CONFIG=/nonexistent/cudapool/policy.toml")) << e;
  EXPECT_TRUE(has(e, "no such file")) << e;
  s.config_path = "/tmp";
  e = must_not_load(s);
  EXPECT_TRUE(has(e, "is a directory")) << e;
}

TEST(PolicyFile, OutputFileThatIsASymbolicLinkIsRefused) {
  TempFile target("kept\n");
  const std::string link = target.path() + ".link";
  ASSERT_EQ(::symlink(target.path().c_str(), link.c_str()), 0);
  const std::string e = check_output_file(link, "stats_file", "CUDAPOOL_CONF");
  ::unlink(link.c_str());
  EXPECT_TRUE(has(e, "stats_file '" + link + "'")) << e;
  EXPECT_TRUE(has(e, "refusing to write through a symbolic link")) << e;
  EXPECT_EQ(check_output_file(target.path(), "stats_file", "CUDAPOOL_CONF"), "");
}

// A FIFO at CUDAPOOL_CONFIG would block open(2) until someone writes to it: it is refused at once.
TEST(PolicyFile, FifoIsRefusedWithoutBlocking) {
  TempFile f("");
  const std::string fifo = f.path() + ".fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const testing::BoundedRun r = testing::run_bounded([&] {
    PolicySources s;
    s.config_path = fifo;
    PolicyResult p = load_policy(s);
    return p.policy ? std::string("loaded") : p.error;
  });
  ::unlink(fifo.c_str());
  ASSERT_TRUE(r.finished) << r.describe();
  EXPECT_EQ(r.answer, "CUDAPOOL_CONFIG=" + fifo + ": not a regular file (a FIFO): give the path of a regular file");
}

// The start check of trace_file and stats_file applies the writers' rules: a FIFO, a device or a
// file of another user (0666, in a sticky directory) is a policy error now, not a hang or a lost
// summary at exit.
TEST(PolicyFile, OutputFileThatIsAFifoOrAnotherUsersIsRefused) {
  TempFile f("");
  const std::string fifo = f.path() + ".fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string e = check_output_file(fifo, "trace_file", "CUDAPOOL_CONF col 1");
  ::unlink(fifo.c_str());
  EXPECT_EQ(e, "trace_file '" + fifo +
                   "' (CUDAPOOL_CONF col 1) is not a regular file (a FIFO): give the path of a regular file");
  e = check_output_file("/dev/null", "stats_file", "");
  EXPECT_TRUE(has(e, "stats_file '/dev/null' is not a regular file (a character device)")) << e;

  char dir[] = "/tmp/cudapool-sticky-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  ASSERT_EQ(::chmod(dir, 01777), 0);
  const std::string theirs = std::string(dir) + "/s.json";
  { std::ofstream(theirs) << "theirs\n"; }
  const bool given = ::chmod(theirs.c_str(), 0666) == 0 && ::chown(theirs.c_str(), 65534, 65534) == 0;
  if (given) {
    e = check_output_file(theirs, "stats_file", "CUDAPOOL_STATS");
    PolicySources s;
    s.stats_file = theirs;
    PolicyResult p = load_policy(s);
    EXPECT_FALSE(p.policy);
    EXPECT_EQ(p.error, e);
  }
  ::unlink(theirs.c_str());
  ::rmdir(dir);
  if (!given) GTEST_SKIP() << "cannot give a file to uid 65534 (needs root)";
  EXPECT_EQ(e, "stats_file '" + theirs + "' (CUDAPOOL_STATS) is owned by uid 65534, not by this process's user (uid " +
                   std::to_string(::geteuid()) + "): remove it or choose another path");
}

TEST(PolicyFile, UnreadableFile) {
  TempFile f("[policy]\n");
  ASSERT_EQ(::chmod(f.path().c_str(), 0), 0);
  PolicyResult r = load_policy(file(f));
  if (::geteuid() == 0) {
    // root reads it anyway; the file is then simply valid.
    EXPECT_TRUE(r.policy) << r.error;
  } else {
    ASSERT_FALSE(r.policy);
    EXPECT_TRUE(has(r.error, "permission denied")) << r.error;
  }
}

TEST(PolicyFile, SyntaxErrorHasLineAndColumn) {
  TempFile f("[policy]\nmax_split_size_mb = 128\nexpandable_segments = \n");
  std::string e = must_not_load(file(f));
  EXPECT_TRUE(has(e, f.path() + ":3:")) << e;
  EXPECT_TRUE(has(e, "TOML syntax error")) << e;
  TempFile g("[policy\n");
  EXPECT_TRUE(has(must_not_load(file(g)), g.path() + ":1:")) << must_not_load(file(g));
  // One line: toml++ quotes the line break it saw; the message writes it as \n.
  for (const TempFile* t : {&f, &g}) {
    e = must_not_load(file(*t));
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_EQ(e.find('\r'), std::string::npos) << e;
  }
  e = must_not_load(file(f));
  EXPECT_TRUE(has(e, "\\n")) << e;
}

// toml++ asserts on these headers; the loader turns that into an error instead of an abort.
TEST(PolicyFile, HeadersThatTripTomlPlusPlusChecksAreErrors) {
  for (const char* text : {"[[[policy]]]\n", "[=]\n", "[[ [x]]]\n", "[policy]\n[.x]\n"}) {
    TempFile f(text);
    std::string e = must_not_load(file(f));
    EXPECT_TRUE(has(e, f.path())) << e;
    EXPECT_TRUE(has(e, "TOML syntax error")) << e;
  }
}

// toml++ 3.3 hits __builtin_unreachable when it asks whether these characters are whitespace; the
// loader patches that check, so they give a syntax error where they do not belong and work in
// comments and strings.
TEST(PolicyFile, NonAsciiCharactersAreSafe) {
  for (const char* text :
       {"[policy\xc3\xa9]\n", "[polower\xef\xbb\xb7", "[policy]\nmax_split_size_mb = 64 \xc3\xa9\n"}) {
    TempFile f(text);
    std::string e = must_not_load(file(f));
    EXPECT_TRUE(has(e, "TOML syntax error")) << e;
  }
  TempFile ok("# caf\xc3\xa9 \xef\xbb\xb7\n[log]\nfile = \"/tmp/caf\xc3\xa9-\xef\xbb\xb7.log\"\n");
  EXPECT_EQ(must_load(file(ok)).log_file, "/tmp/caf\xc3\xa9-\xef\xbb\xb7.log");
}

TEST(PolicyFile, UnknownKeyHasFileLineAndSuggestion) {
  TempFile f("[policy]\nexpandable_segments = true\nmax_split_size = 64\n");
  std::string e = must_not_load(file(f));
  EXPECT_TRUE(has(e, f.path() + ":3: unknown key 'max_split_size' in [policy]")) << e;
  EXPECT_TRUE(has(e, "did you mean 'max_split_size_mb'?")) << e;
  TempFile g("[profiles.x]\nreserve_percentage = 0.1\n");
  e = must_not_load(file(g));
  EXPECT_TRUE(has(e, g.path() + ":2: unknown key 'reserve_percentage' in [profiles.x]")) << e;
  EXPECT_TRUE(has(e, "valid keys:")) << e;
  TempFile h("[log]\nlevels = \"info\"\n");
  e = must_not_load(file(h));
  EXPECT_TRUE(has(e, h.path() + ":2: unknown key 'levels' in [log]")) << e;
  EXPECT_TRUE(has(e, "level, file")) << e;
}

TEST(PolicyFile, BadValueUsesTomlSyntaxInTheExample) {
  TempFile f("[policy]\n\nmax_split_size_mb = 10\n");
  std::string e = must_not_load(file(f));
  EXPECT_TRUE(has(e, f.path() + ":3: bad value '10' for max_split_size_mb")) << e;
  EXPECT_TRUE(has(e, "e.g. max_split_size_mb = 128")) << e;
  TempFile g("[policy]\nfree_sync = \"sometimes\"\n");
  e = must_not_load(file(g));
  EXPECT_TRUE(has(e, "e.g. free_sync = \"fenced\"")) << e;
  TempFile h("[policy]\nexpandable_segments = [true]\n");
  e = must_not_load(file(h));
  EXPECT_TRUE(has(e, "bad value 'an array' for expandable_segments (wrong TOML type)")) << e;
  EXPECT_TRUE(has(e, "e.g. expandable_segments = false")) << e;
  TempFile i("[policy]\ngarbage_collection_threshold = 1.0\n");
  EXPECT_TRUE(has(must_not_load(file(i)), "strictly between 0 and 1"));
  TempFile j("[policy]\nmax_reserved_mb = -1\n");
  EXPECT_TRUE(has(must_not_load(file(j)), "bad value '-1' for max_reserved_mb"));
  // A number in quotes is a string in TOML: refused, with the number to write instead.
  TempFile k("[policy]\nmax_split_size_mb = \"128\"\n");
  e = must_not_load(file(k));
  EXPECT_TRUE(has(e, k.path() + ":2: bad value '\"128\"' for max_split_size_mb (a string; write the number without "
                                "quotes)"))
      << e;
  EXPECT_TRUE(has(e, "e.g. max_split_size_mb = 128")) << e;
  TempFile l("[policy]\ngarbage_collection_threshold = \"0.8\"\n");
  EXPECT_TRUE(has(must_not_load(file(l)), "(a string; write the number without quotes)"));
}

TEST(PolicyFile, TomlValueForms) {
  TempFile f(R"([policy]
expandable_segments = "True"
release_lock_on_cudamalloc = true
per_process_memory_fraction = 1
roundup_power2_divisions = "[256:1,512:2,>:4]"
stats_file = "/tmp/s p a c e, and comma.json"
[log]
trace_file = "/tmp/t-%p.csv"
)");
  Policy p = must_load(file(f));
  EXPECT_TRUE(p.pool.expandable_segments);
  EXPECT_TRUE(p.pool.release_lock_on_cudamalloc);
  EXPECT_EQ(p.pool.per_process_memory_fraction, 1.0);
  EXPECT_EQ(p.pool.roundup_power2_divisions[9], 2u);
  EXPECT_EQ(p.stats_file, "/tmp/s p a c e, and comma.json");
  EXPECT_EQ(p.trace_file, "/tmp/t-%p.csv");
  TempFile g("[policy]\nroundup_power2_divisions = 8\n");
  EXPECT_EQ(must_load(file(g)).pool.roundup_power2_divisions[15], 8u);
  TempFile h("[policy]\nroundup_power2_divisions = {1024 = 4, 256 = 2}\n");
  // Ordered by boundary, not by spelling: 256:2 first (buckets 0..8), then 1024:4 (bucket 10).
  const std::array<std::uint32_t, 16> want{2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 4, 0, 0, 0, 0, 0};
  EXPECT_EQ(must_load(file(h)).pool.roundup_power2_divisions, want);
  TempFile k("[policy]\nroundup_power2_divisions = {256 = \"x\"}\n");
  EXPECT_TRUE(has(must_not_load(file(k)), "divisions must be an integer"));
}

TEST(PolicyFile, StructureErrors) {
  TempFile f("max_split_size_mb = 64\n");
  std::string e = must_not_load(file(f));
  EXPECT_TRUE(has(e, "outside any table; put it under [policy]")) << e;
  TempFile g("[polcy]\nmax_split_size_mb = 64\n");
  e = must_not_load(file(g));
  EXPECT_TRUE(has(e, "unknown table 'polcy'")) << e;
  TempFile h("policy = 3\n");
  EXPECT_TRUE(has(must_not_load(file(h)), "'policy' must be a table"));
  TempFile i("[profiles]\ntrain = 1\n");
  EXPECT_TRUE(has(must_not_load(file(i)), "profile 'train' must be a table"));
  TempFile j("[profiles.train]\nmatch = 5\n");
  EXPECT_TRUE(has(must_not_load(file(j)), "match must be a string or an array of strings"));
  TempFile k("[profiles.train]\nmatch = [\"a\", 5]\n");
  EXPECT_TRUE(has(must_not_load(file(k)), "match globs must be strings"));
}

TEST(PolicyFile, EveryProfileIsCheckedEvenWhenNotChosen) {
  TempFile f("[profiles.good]\nmax_split_size_mb = 64\n[profiles.bad]\nmax_split_size_mb = 5\n");
  std::string e = must_not_load(file(f, "good"));
  EXPECT_TRUE(has(e, f.path() + ":4: bad value '5' for max_split_size_mb")) << e;
}

TEST(PolicyFile, ProfileLogSubtable) {
  TempFile f("[profiles.dbg]\n[profiles.dbg.log]\nlevel = \"trace\"\n");
  Policy p = must_load(file(f, "dbg"));
  EXPECT_EQ(p.log_level, "trace");
  EXPECT_EQ(p.origin.at("log_level"), "profile dbg (" + f.path() + ":3)");
}

TEST(PolicyFile, EnvErrorAfterFileStillReported) {
  TempFile f(kJobFile);
  PolicySources s = file(f);
  s.conf = "max_split_size_mb:1";
  std::string e = must_not_load(s);
  EXPECT_TRUE(has(e, "CUDAPOOL_CONF col 19")) << e;
}

TEST(OnError, FromSourcesEvenWhenThePolicyIsInvalid) {
  PolicySources s;
  s.on_error = "passthrough";
  s.conf = "reserve_percentage:0.1";
  PolicyResult r = load_policy(s);
  EXPECT_FALSE(r.policy);
  EXPECT_EQ(r.on_error, OnError::passthrough);
  s.conf.clear();
  r = load_policy(s);
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_EQ(r.policy->on_error, OnError::passthrough);
  EXPECT_EQ(r.policy->origin.at("on_error"), "CUDAPOOL_ON_ERROR");
  s.on_error = "STOP";
  EXPECT_EQ(load_policy(s).policy->on_error, OnError::stop);
  s.on_error = "ignore";
  r = load_policy(s);
  EXPECT_FALSE(r.policy);
  EXPECT_EQ(r.on_error, OnError::stop);
  EXPECT_TRUE(has(r.error, "CUDAPOOL_ON_ERROR=ignore")) << r.error;
  EXPECT_TRUE(has(r.error, "passthrough")) << r.error;
  EXPECT_TRUE(has(r.error, "78")) << r.error;
}

TEST(Warnings, GarbageCollectionWithoutALimitIsNotInert) {
  // PyTorch ignores the threshold without a memory fraction; cudapool applies it
  // to the device's total memory instead, so there is nothing to warn about.
  PolicySources s;
  s.conf = "garbage_collection_threshold:0.7";
  Policy p = must_load(s);
  EXPECT_TRUE(p.warnings.empty()) << p.warnings[0];
  EXPECT_DOUBLE_EQ(p.pool.garbage_collection_threshold, 0.7);
}

TEST(Layering, TraceAndStatsShortcutsWinOverConf) {
  PolicySources s;
  s.conf = "trace_file:/tmp/from-conf.csv,stats_file:/tmp/from-conf.json";
  Policy p = must_load(s);
  EXPECT_EQ(p.trace_file, "/tmp/from-conf.csv");
  s.trace_file = "/tmp/t-%p.csv";
  s.stats_file = "/tmp/s.json";
  p = must_load(s);
  EXPECT_EQ(p.trace_file, "/tmp/t-%p.csv");
  EXPECT_EQ(p.stats_file, "/tmp/s.json");
  EXPECT_EQ(p.origin["trace_file"], "CUDAPOOL_TRACE");
  EXPECT_EQ(p.origin["stats_file"], "CUDAPOOL_STATS");
}

TEST(Environment, TraceAndStatsVariables) {
  ::setenv("CUDAPOOL_TRACE", "/tmp/env-trace.csv", 1);
  ::setenv("CUDAPOOL_STATS", "/tmp/env-stats.json", 1);
  PolicySources s = sources_from_environment();
  ::unsetenv("CUDAPOOL_TRACE");
  ::unsetenv("CUDAPOOL_STATS");
  EXPECT_EQ(s.trace_file, "/tmp/env-trace.csv");
  EXPECT_EQ(s.stats_file, "/tmp/env-stats.json");
}

TEST(Warnings, PassthroughMakesPoolKeysMoot) {
  PolicySources s;
  s.conf = "backend:passthrough,max_split_size_mb:64,log_level:info";
  Policy p = must_load(s);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_TRUE(has(p.warnings[0], "max_split_size_mb has no effect")) << p.warnings[0];
}

TEST(Warnings, ExpandableKeysNeedExpandableSegments) {
  PolicySources s;
  s.conf = "expandable_segments:False,expandable_unit_mb:64,expandable_headroom:0.03";
  Policy p = must_load(s);
  ASSERT_EQ(p.warnings.size(), 2u);
  EXPECT_TRUE(has(p.warnings[0] + p.warnings[1], "expandable_unit_mb has no effect without expandable_segments:True"));
  EXPECT_TRUE(has(p.warnings[0] + p.warnings[1], "expandable_headroom has no effect without expandable_segments:True"));
  s.conf = "expandable_segments:True,expandable_unit_mb:64";
  EXPECT_TRUE(must_load(s).warnings.empty());
  s.conf = "expandable_unit_mb:64";  // the default has them
  EXPECT_TRUE(must_load(s).warnings.empty());
}

TEST(Environment, SourcesAndLoad) {
  TempFile f(kJobFile);
  ::setenv("CUDAPOOL_CONF", "expandable_segments:True", 1);
  ::setenv("CUDAPOOL_CONFIG", f.path().c_str(), 1);
  ::setenv("CUDAPOOL_PROFILE", "eval", 1);
  ::setenv("CUDAPOOL_ON_ERROR", "passthrough", 1);
  PolicySources s = sources_from_environment();
  EXPECT_EQ(s.conf, "expandable_segments:True");
  EXPECT_EQ(s.config_path, f.path());
  EXPECT_EQ(s.profile, "eval");
  EXPECT_EQ(s.on_error, "passthrough");
  EXPECT_TRUE(has(s.command_line, "config_tests")) << s.command_line;  // this binary's argv[0]
  PolicyResult r = load_policy_from_environment();
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_TRUE(r.policy->pool.expandable_segments);
  EXPECT_EQ(r.policy->pool.free_sync, FreeSync::immediate);
  EXPECT_EQ(r.on_error, OnError::passthrough);
  for (const char* v : {"CUDAPOOL_CONF", "CUDAPOOL_CONFIG", "CUDAPOOL_PROFILE", "CUDAPOOL_ON_ERROR"}) ::unsetenv(v);
  r = load_policy_from_environment();
  ASSERT_TRUE(r.policy) << r.error;
  testing::expect_same_policy(*r.policy, Policy{});
}

TEST(SecureMode, Decision) {
  EXPECT_TRUE(secure_mode(1, nullptr));  // AT_SECURE: setuid, setgid, file capabilities
  EXPECT_TRUE(secure_mode(1, "0"));      // the variable cannot turn it off
  EXPECT_FALSE(secure_mode(0, nullptr));
  EXPECT_FALSE(secure_mode(0, ""));
  EXPECT_FALSE(secure_mode(0, "0"));
  EXPECT_TRUE(secure_mode(0, "1"));
  EXPECT_TRUE(secure_mode(0, "yes"));
}

// The real mechanism: a copy of this test binary, setuid to another user, starts with AT_SECURE
// set by the kernel and reports secure mode (its environment also asks for none). Needs root to
// make the copy setuid, and a file system that honours setuid; skipped otherwise.
TEST(SecureMode, SetuidProgramIsSecure) {
  if (const char* child = std::getenv("CUDAPOOL_TEST_REPORT_SECURE"); child != nullptr) {
    std::printf("secure_process=%d\n", secure_process() ? 1 : 0);
    return;
  }
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a setuid copy";
  char dir[] = "/tmp/cudapool-setuid-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  ASSERT_EQ(::chmod(dir, 0755), 0);
  const std::string copy = std::string(dir) + "/config_tests";
  ASSERT_EQ(std::system(("cp /proc/" + std::to_string(::getpid()) + "/exe " + copy).c_str()), 0);
  ASSERT_EQ(::chown(copy.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chmod(copy.c_str(), 04755), 0);
  auto report = [&](const char* secure_var) {
    std::string cmd = "env CUDAPOOL_TEST_REPORT_SECURE=1 ";
    cmd += secure_var;
    cmd += " " + copy + " --gtest_filter=SecureMode.SetuidProgramIsSecure 2>&1";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[512];
      std::size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  };
  const std::string out = report("CUDAPOOL_SECURE=0");
  std::system(("rm -rf " + std::string(dir)).c_str());
  if (has(out, "secure_process=0")) GTEST_SKIP() << "setuid is not honoured here (nosuid mount?): " << out;
  // A sanitizer runtime may refuse to start a setuid program at all.
  if (!has(out, "secure_process=")) GTEST_SKIP() << "the setuid copy did not run: " << out;
  EXPECT_TRUE(has(out, "secure_process=1")) << out;
}

// In secure mode nothing of the environment is read, not even the file CUDAPOOL_CONFIG names
// (whose lines a parse error would quote): the defaults, with nothing that writes a file.
TEST(SecureMode, ReadsNoVariableAndNoFile) {
  TempFile secret("[policy]\nsecret-line-7f3a = ]\n");  // not a valid policy file
  ::setenv("CUDAPOOL_SECURE", "1", 1);
  ::setenv("CUDAPOOL_CONF", "stats_file:/tmp/secure-stats.json,max_split_size_mb:64", 1);
  ::setenv("CUDAPOOL_CONFIG", secret.path().c_str(), 1);
  ::setenv("CUDAPOOL_TRACE", "/tmp/secure-trace.csv", 1);
  ::setenv("CUDAPOOL_ON_ERROR", "passthrough", 1);
  PolicySources s = sources_from_environment();
  PolicyResult r = load_policy_from_environment();
  for (const char* v : {"CUDAPOOL_SECURE", "CUDAPOOL_CONF", "CUDAPOOL_CONFIG", "CUDAPOOL_TRACE", "CUDAPOOL_ON_ERROR"})
    ::unsetenv(v);
  EXPECT_TRUE(s.secure);
  EXPECT_EQ(s.conf, "");
  EXPECT_EQ(s.config_path, "");
  EXPECT_EQ(s.trace_file, "");
  EXPECT_EQ(s.on_error, "");
  const std::vector<std::string> names{"CUDAPOOL_CONF", "CUDAPOOL_CONFIG", "CUDAPOOL_ON_ERROR", "CUDAPOOL_TRACE"};
  for (const std::string& n : names) EXPECT_NE(std::find(s.ignored.begin(), s.ignored.end(), n), s.ignored.end()) << n;
  ASSERT_TRUE(r.policy) << r.error;
  EXPECT_TRUE(r.secure);
  EXPECT_EQ(r.on_error, OnError::stop);
  Policy expected;
  expected.publish_stats = false;
  testing::expect_same_policy(*r.policy, expected);
  EXPECT_EQ(r.policy->origin["publish_stats"], "secure mode");
  const std::string m = secure_mode_message(r.ignored);
  EXPECT_TRUE(has(m, "no file is written")) << m;
  EXPECT_TRUE(has(m, "CUDAPOOL_CONFIG")) << m;
  EXPECT_FALSE(has(m, "secret-line")) << m;
  EXPECT_FALSE(has(m, "/tmp/secure-stats.json")) << m;  // names, never values
  // Without it, the same environment is read (and the broken file is an error naming its line).
  ::setenv("CUDAPOOL_CONFIG", secret.path().c_str(), 1);
  PolicyResult plain = load_policy_from_environment();
  ::unsetenv("CUDAPOOL_CONFIG");
  EXPECT_FALSE(plain.secure);
  EXPECT_FALSE(plain.policy.has_value());
}

}  // namespace
}  // namespace cudapool
