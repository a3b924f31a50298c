// JSON summary: every stat survives the round trip, the derived figures are right, malformed
// files are refused with a reason, and the exit table shows the numbers.
#include <gtest/gtest.h>

#include <set>

#include "telemetry/json_reader.h"
#include "telemetry/summary_reader.h"
#include "telemetry_util.h"
#include "tests/unit/bounded_child.h"

namespace cudapool {
namespace {

// A Stats with every field set to a distinct value, so a swapped or dropped field shows.
Stats distinct_stats(std::int64_t seed) {
  Stats s;
  std::int64_t v = seed;
  for (auto& [name, value] : flatten_stats(s)) {
    EXPECT_TRUE(set_stat(&s, name, v)) << name;
    v += 7;
  }
  return s;
}

Summary sample() {
  Summary s;
  s.pid = 4242;
  s.command = "python3 train.py --lr \"0.1\"\tüñí";
  s.policy = "max_split_size_mb:64,expandable_segments:False";
  s.backend = "native";
  s.start_unix_ns = 1'700'000'000'000'000'123LL;
  s.wall_time_s = 12.5;
  s.exit_status = 0;
  DeviceSummary d0;
  d0.device = 0;
  d0.stats = distinct_stats(1);
  d0.stats.cache_hits = 90;
  d0.stats.cache_misses = 10;
  d0.stats.upstream_ns = 5'000'000;
  d0.driver_total_bytes = 150'000'000'000ULL;
  DeviceSummary d1;
  d1.device = 3;
  d1.stats = distinct_stats(1000);
  d1.stats.cache_hits = 10;
  d1.stats.cache_misses = 10;
  d1.stats.upstream_ns = 1;
  s.devices = {d0, d1};
  s.passthrough = {{"capture", 2}, {"foreign_pointer", 17}};
  s.pinned_host = {{"reserved_bytes.peak", 41943040}, {"cache_hits", 998}};
  s.runtime_api = {{"cudaMalloc", 51200}, {"cudaFree", 51199}};
  return s;
}

TEST(TelemetrySummary, FlatNamesArePyTorchsAndComplete) {
  Stats s;
  auto flat = flatten_stats(s);
  EXPECT_EQ(flat.size(), 9u * 3 * 4 + 2 * 4 + 20);
  std::set<std::string> names;
  for (auto& [n, v] : flat) names.insert(n);
  EXPECT_EQ(names.size(), flat.size());
  for (const char* n :
       {"allocated_bytes.all.peak", "reserved_bytes.large_pool.current", "inactive_split_bytes.small_pool.freed",
        "oversize_segments.peak", "num_alloc_retries", "num_ooms", "num_sync_all_streams", "max_split_size",
        "cache_hits", "upstream_ns", "gpu_waits", "bad_frees"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(set_stat(&s, "allocated_bytes.all.bogus", 1));
  EXPECT_FALSE(set_stat(&s, "allocated_bytes.medium_pool.peak", 1));
  EXPECT_FALSE(set_stat(&s, "nonsense", 1));
  EXPECT_TRUE(set_stat(&s, "reserved_bytes.small_pool.peak", 77));
  EXPECT_EQ(s.reserved_bytes[kSmallPool].peak, 77);
}

TEST(TelemetrySummary, JsonRoundTrip) {
  const Summary s = sample();
  const std::string text = to_json(s);
  Summary back;
  std::string err;
  ASSERT_TRUE(from_json(text, &back, &err)) << err << "\n" << text;
  EXPECT_EQ(back.pid, s.pid);
  EXPECT_EQ(back.command, s.command);
  EXPECT_EQ(back.policy, s.policy);
  EXPECT_EQ(back.backend, s.backend);
  EXPECT_EQ(back.start_unix_ns, s.start_unix_ns);
  EXPECT_DOUBLE_EQ(back.wall_time_s, s.wall_time_s);
  EXPECT_EQ(back.exit_status, 0);
  EXPECT_EQ(back.passthrough, s.passthrough);
  EXPECT_EQ(back.pinned_host, s.pinned_host);
  EXPECT_EQ(to_json(Summary{}).find("pinned_host"), std::string::npos);  // only when the pool served
  EXPECT_EQ(back.runtime_api, s.runtime_api);
  EXPECT_EQ(to_json(Summary{}).find("runtime_api"), std::string::npos);  // only when the shim answered one
  ASSERT_EQ(back.devices.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.devices[i].device, s.devices[i].device);
    EXPECT_EQ(back.devices[i].driver_total_bytes, s.devices[i].driver_total_bytes);
    EXPECT_EQ(flatten_stats(back.devices[i].stats), flatten_stats(s.devices[i].stats));
  }
  EXPECT_DOUBLE_EQ(back.hit_rate(), 100.0 / 120.0);
  EXPECT_DOUBLE_EQ(back.devices[0].hit_rate(), 0.9);
  EXPECT_EQ(back.upstream_ns(), 5'000'001);
  // The derived figures are in the file too, for readers that do not recompute.
  json::Value root;
  ASSERT_TRUE(json::parse(text, &root, &err)) << err;
  ASSERT_TRUE(root.find("hit_rate"));
  EXPECT_DOUBLE_EQ(root.find("hit_rate")->as_double(), 100.0 / 120.0);
  EXPECT_EQ(root.find("upstream_ns")->i, 5'000'001);
  EXPECT_EQ(to_json(back), text);  // stable: writing what was read gives the same bytes
}

TEST(TelemetrySummary, LargeCountersStayExact) {
  Summary s;
  DeviceSummary d;
  d.stats.allocated_bytes[kAll].allocated = (1LL << 62) + 1;  // not representable as a double
  s.devices.push_back(d);
  Summary back;
  std::string err;
  ASSERT_TRUE(from_json(to_json(s), &back, &err)) << err;
  EXPECT_EQ(back.devices[0].stats.allocated_bytes[kAll].allocated, (1LL << 62) + 1);
}

TEST(TelemetrySummary, RejectsMalformedJson) {
  const std::string good = to_json(sample());
  struct Case {
    std::string text;
    const char* expect;
  };
  const Case cases[] = {
      {"", "invalid JSON"},
      {good.substr(0, good.size() / 2), "invalid JSON"},
      {"[1,2]", "not a JSON object"},
      {"{\"format\":\"other\"}", "not a cudapool summary"},
      {"{\"format\":\"cudapool-summary\",\"version\":99}", "newer than this reader"},
      {"{\"format\":\"cudapool-summary\",\"version\":1,\"pid\":\"x\"}", "\"pid\" must be an integer"},
      {"{\"format\":\"cudapool-summary\",\"version\":1,\"devices\":[{\"stats\":{\"num_ooms\":1.5}}]}",
       "devices[0].stats.num_ooms must be an integer"},
      {"{\"format\":\"cudapool-summary\",\"version\":1,\"runtime_api\":[]}", "\"runtime_api\" must be an object"},
      {"{\"format\":\"cudapool-summary\",\"version\":1,\"runtime_api\":{\"cudaMalloc\":\"7\"}}",
       "runtime_api \"cudaMalloc\" must be an integer"},
      {"{\"format\":\"cudapool-summary\",\"version\":1} x", "unexpected text"},
      {"{\"format\":\"cudapool-summary\",\"version\":1,\"command\":\"\\uD800\"}", "surrogate"},
      {std::string(200, '[') + std::string(200, ']'), "nesting too deep"},
  };
  for (const Case& c : cases) {
    Summary out;
    std::string err;
    EXPECT_FALSE(from_json(c.text, &out, &err)) << c.text;
    EXPECT_NE(err.find(c.expect), std::string::npos) << "input " << c.text.substr(0, 80) << " error " << err;
  }
}

// A summary whose member names hold bytes that are not UTF-8 (a fuzzer's input, kept in
// tests/fuzz/corpus/telemetry_summary/regress_invalid_utf8_key): refused, saying why and where,
// rather than read with the bytes in the names. The writer never writes such a file: whatever
// bytes a name holds, it writes U+FFFD for each malformed part.
TEST(TelemetrySummary, RefusesMemberNamesThatAreNotUtf8) {
  const std::string text = "{\"format\":\"cudapool-summary\",\"version\":1,\"pid\":3,\"passthrough\":{\"" +
                           std::string(17, '\xff') +
                           "a\":1},\"devices\":[{\"d-vice\":0,\"s\xce"
                           "ats\":{\"n_ooms\":2,\"allocated_bytes.all^pdak\":5}}]}";
  Summary out;
  std::string err;
  EXPECT_FALSE(from_json(text, &out, &err));
  EXPECT_NE(err.find("invalid JSON"), std::string::npos) << err;
  EXPECT_NE(err.find("ill-formed UTF-8"), std::string::npos) << err;
  EXPECT_NE(err.find("at byte 65"), std::string::npos) << err;  // the first 0xff
  EXPECT_EQ(err.find('\xff'), std::string::npos) << "the bytes echoed";
}

TEST(TelemetrySummary, UnknownKeysAreIgnored) {
  Summary out;
  std::string err;
  ASSERT_TRUE(
      from_json("{\"format\":\"cudapool-summary\",\"version\":1,\"future\":{\"a\":[1,2,null]},"
                "\"devices\":[{\"device\":2,\"stats\":{\"num_ooms\":4,\"new_stat\":9}}]}",
                &out, &err))
      << err;
  ASSERT_EQ(out.devices.size(), 1u);
  EXPECT_EQ(out.devices[0].device, 2);
  EXPECT_EQ(out.devices[0].stats.num_ooms, 4);
}

TEST(TelemetrySummary, FileRoundTripAndPattern) {
  testing::TempPath base(".json");
  const std::string pattern = base.str() + ".%p";
  ASSERT_EQ(write_summary_file(pattern, sample()), "");
  const std::string real = base.str() + "." + std::to_string(::getpid());
  Summary back;
  std::string err;
  ASSERT_TRUE(read_summary_file(real, &back, &err)) << err;
  EXPECT_EQ(back.pid, 4242);
  std::remove(real.c_str());
  EXPECT_NE(write_summary_file("/dev/null/s.json", sample()), "");
  EXPECT_FALSE(read_summary_file("/dev/null/s.json", &back, &err));
}

TEST(TelemetrySummary, RefusesToWriteThroughASymbolicLink) {
  testing::Victim victim;
  testing::TempPath path(".json");
  ASSERT_EQ(::symlink(victim.str().c_str(), path.str().c_str()), 0);
  const std::string err = write_summary_file(path.str(), sample());
  EXPECT_NE(err.find("'" + path.str() + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("refusing to write through a symbolic link"), std::string::npos) << err;
  EXPECT_TRUE(victim.untouched());
  EXPECT_TRUE(testing::is_symlink(path.str()));  // the link is left as it was, not replaced
}

// What is at the summary's path is replaced only when it is this user's regular file: a FIFO
// stays a FIFO, another user's file (mode 0666, in /tmp) stays theirs.
TEST(TelemetrySummary, LeavesAFifoAndAnotherUsersFile) {
  testing::TempPath fifo(".json");
  ASSERT_EQ(::mkfifo(fifo.str().c_str(), 0600), 0);
  std::string err = write_summary_file(fifo.str(), sample());
  EXPECT_NE(err.find("'" + fifo.str() + "': not a regular file (a FIFO)"), std::string::npos) << err;
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.str().c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // Reading one as a summary would block until someone writes to it: refused at once.
  const testing::BoundedRun r = testing::run_bounded([&] {
    Summary back;
    std::string why;
    return read_summary_file(fifo.str(), &back, &why) ? std::string("read") : why;
  });
  ASSERT_TRUE(r.finished) << r.describe();
  EXPECT_NE(r.answer.find("not a regular file (a FIFO)"), std::string::npos) << r.answer;

  testing::ForeignFile theirs(".json");
  if (!theirs.given()) GTEST_SKIP() << "cannot give a file to uid 65534 (needs root)";
  err = write_summary_file(theirs.str(), sample());
  EXPECT_NE(err.find("'" + theirs.str() + "': owned by uid 65534"), std::string::npos) << err;
  EXPECT_TRUE(theirs.untouched());
}

TEST(TelemetrySummary, TemporaryFileNameIsNotPredictable) {
  // A link planted where a "<path>.tmp<pid>" temporary would be is never written through.
  testing::Victim victim;
  testing::TempPath path(".json");
  const std::string guessed = path.str() + ".tmp" + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.str().c_str(), guessed.c_str()), 0);
  EXPECT_EQ(write_summary_file(path.str(), sample()), "");
  EXPECT_TRUE(victim.untouched());
  EXPECT_TRUE(testing::is_symlink(guessed));
  std::remove(guessed.c_str());
  EXPECT_FALSE(testing::is_symlink(path.str()));
  Summary back;
  std::string err;
  ASSERT_TRUE(read_summary_file(path.str(), &back, &err)) << err;
  EXPECT_EQ(back.pid, 4242);
  EXPECT_EQ(testing::file_mode(path.str()), 0600);  // mkstemp's mode: the owner only
  // Nothing is left beside it: the temporary was renamed into place.
  const std::size_t slash = path.str().find_last_of('/');
  const std::string dir = path.str().substr(0, slash), name = path.str().substr(slash + 1);
  DIR* d = ::opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  int leftovers = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != name && n.find(name) != std::string::npos) ++leftovers;
  }
  ::closedir(d);
  EXPECT_EQ(leftovers, 0);
}

TEST(TelemetrySummary, TableShowsTheNumbers) {
  Summary s = sample();
  s.devices[0].stats.reserved_bytes[kAll].peak = 3 * static_cast<std::int64_t>(GiB) / 2;
  s.devices[0].stats.num_ooms = 5;
  const std::string t = format_summary_table(s);
  EXPECT_NE(t.find("pid 4242"), std::string::npos) << t;
  EXPECT_NE(t.find("GPU 0"), std::string::npos) << t;
  EXPECT_NE(t.find("GPU 3"), std::string::npos) << t;
  EXPECT_NE(t.find("1.50 GiB"), std::string::npos) << t;
  EXPECT_NE(t.find("90.00 %"), std::string::npos) << t;
  EXPECT_NE(t.find("50.00 %"), std::string::npos) << t;
  EXPECT_NE(t.find("5.000 ms"), std::string::npos) << t;
  EXPECT_NE(t.find("foreign_pointer 17"), std::string::npos) << t;
  EXPECT_NE(t.find("served at cudart's entry points: cudaFree 51199, cudaMalloc 51200"), std::string::npos) << t;
  EXPECT_NE(t.find("/ 5"), std::string::npos) << t;  // retries / OOMs
  Summary empty;
  EXPECT_NE(format_summary_table(empty).find("no device pool"), std::string::npos);
}

}  // namespace
}  // namespace cudapool
