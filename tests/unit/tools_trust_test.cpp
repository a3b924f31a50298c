// A trace is untrusted input: the policy its policy row records may name files (stats_file,
// trace_file, log_file), a signal, a group. replay, tune and report run on such a trace write no
// file they were not told to write, and tune's recommendation carries none of those keys.
#include <gtest/gtest.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "tools/commands.h"
#include "tools/snapshot.h"
#include "tools_util.h"

namespace cudapool::tools {
namespace {

namespace fs = std::filesystem;
using testing::TraceBuilder;

class ToolsTrust : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/cudapool-trust-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    // The tools take $CUDAPOOL_CONF over the trace's policy; these tests are about the trace's.
    if (const char* c = std::getenv("CUDAPOOL_CONF")) saved_conf_ = c;
    ::unsetenv("CUDAPOOL_CONF");
    write_crafted_trace();
  }
  void TearDown() override {
    if (saved_conf_) ::setenv("CUDAPOOL_CONF", saved_conf_->c_str(), 1);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // The files the crafted policy row names: none may exist after any command.
  std::vector<fs::path> named_files() const { return {dir_ / "stats.json", dir_ / "trace.csv", dir_ / "log.txt"}; }
  std::string crafted_policy() const {
    return "max_split_size_mb:64,stats_file:" + (dir_ / "stats.json").string() +
           ",trace_file:" + (dir_ / "trace.csv").string() + ",log_file:" + (dir_ / "log.txt").string() +
           ",log_level:debug,dump_signal:SIGUSR1,group:trusted,group_budget_mb:1024,publish_stats:False";
  }
  void write_crafted_trace() {
    TraceBuilder b;
    b.device(16 * GiB).segment(0x1000000, 20 * MiB).alloc(0x1000000, 5 * MiB).alloc(0x1600000, 3 * MiB);
    b.free(0x1000000, 5 * MiB).alloc(0x1000000, 4 * MiB).free(0x1000000, 4 * MiB).free(0x1600000, 3 * MiB);
    TraceRow policy;
    policy.thread = 1;
    policy.time_ns = 1'000'000'000;
    policy.action = TraceAction::policy;
    policy.detail = TraceDetail::policy;
    std::string csv = b.csv();
    const std::size_t after_header = csv.find('\n') + 1;
    csv.insert(after_header, format_trace_row(policy, crafted_policy()) + "\n");
    trace_ = dir_ / "crafted.csv";
    std::ofstream(trace_) << csv;
  }

  // Runs `cudapool ARGS…` in-process; returns its exit status, stdout and stderr.
  struct Ran {
    int rc = -1;
    std::string out, err;
  };
  Ran cudapool(std::vector<std::string> args) {
    CLI::App app;
    app.require_subcommand(1);
    Ran r;
    int status = 0;
    add_replay_command(app, &status);
    add_tune_command(app, &status);
    add_report_command(app, &status);
    std::reverse(args.begin(), args.end());  // CLI11 takes the words last first
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    try {
      app.parse(args);
      r.rc = status;
    } catch (const CLI::ParseError& e) {
      r.rc = 1000 + e.get_exit_code();
    }
    r.out = ::testing::internal::GetCapturedStdout();
    r.err = ::testing::internal::GetCapturedStderr();
    return r;
  }

  void expect_no_named_file(const std::string& after) const {
    for (const fs::path& p : named_files()) EXPECT_FALSE(fs::exists(p)) << after << " created " << p;
  }

  fs::path dir_, trace_;
  std::optional<std::string> saved_conf_;
};

TEST_F(ToolsTrust, ReplayWritesNoFileTheTraceNames) {
  Ran r = cudapool({"replay", trace_.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  expect_no_named_file("replay");
  // The pool-shaping key of the row still applies; the others are named as ignored.
  EXPECT_NE(r.out.find("policy: max_split_size_mb:64 (from the trace's policy row)"), std::string::npos) << r.out;
  for (const char* key : {"stats_file", "trace_file", "log_file", "dump_signal", "group", "publish_stats"}) {
    EXPECT_EQ(r.out.find(key), std::string::npos) << key << " in:\n" << r.out;
    EXPECT_NE(r.err.find(key), std::string::npos) << key << " not named in:\n" << r.err;
  }
  EXPECT_NE(r.err.find("cudapool replay: trace policy: ignored "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a trace cannot choose files to write"), std::string::npos) << r.err;
}

TEST_F(ToolsTrust, ReplayStillWritesTheSummaryItIsToldTo) {
  const fs::path told = dir_ / "told.json";
  Ran r = cudapool({"replay", trace_.string(), "--stats", told.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(told));
  expect_no_named_file("replay --stats");
}

TEST_F(ToolsTrust, TuneRecommendsNoKeyWithSideEffects) {
  const fs::path json = dir_ / "tune.json";
  Ran r = cudapool({"tune", trace_.string(), "--budget", "4", "--json", json.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  expect_no_named_file("tune");
  const std::size_t rec = r.out.find("recommended: ");
  ASSERT_NE(rec, std::string::npos) << r.out;
  const std::string line = r.out.substr(rec, r.out.find('\n', rec) - rec);
  std::ifstream in(json);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(written.find("\"recommended\""), std::string::npos) << written;
  for (const char* key :
       {"stats_file", "trace_file", "log_file", "log_level", "dump_signal", "group", "publish_stats", dir_.c_str()}) {
    EXPECT_EQ(line.find(key), std::string::npos) << key << " in: " << line;
    EXPECT_EQ(written.find(key), std::string::npos) << key << " in:\n" << written;
  }
  EXPECT_NE(r.out.find("base policy: max_split_size_mb:64 (from the trace's policy row)"), std::string::npos) << r.out;
}

TEST_F(ToolsTrust, ReportWritesNoFileTheTraceNames) {
  const fs::path snapshot = dir_ / "snap.pickle";
  Ran r = cudapool({"report", trace_.string(), "--snapshot", snapshot.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(snapshot));
  expect_no_named_file("report");
  EXPECT_NE(r.err.find("cudapool report: trace policy: ignored "), std::string::npos) << r.err;
}

// A policy row that is not a valid policy is no policy at all: nothing of it is applied, and the
// replay runs under the defaults rather than stopping.
TEST_F(ToolsTrust, AnInvalidPolicyRowIsIgnoredWhole) {
  TraceBuilder b;
  b.alloc(0x1000000, 5 * MiB).free(0x1000000, 5 * MiB);
  TraceRow policy;
  policy.thread = 1;
  policy.action = TraceAction::policy;
  policy.detail = TraceDetail::policy;
  std::string csv = b.csv();
  csv.insert(csv.find('\n') + 1,
             format_trace_row(policy, "stats_file:" + (dir_ / "stats.json").string() + ",no_such_key:1") + "\n");
  const fs::path bad = dir_ / "invalid.csv";
  std::ofstream(bad) << csv;
  Ran r = cudapool({"replay", bad.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  expect_no_named_file("replay of an invalid policy row");
  EXPECT_NE(r.err.find("trace policy: ignored, it is not a valid policy"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("policy: the defaults"), std::string::npos) << r.out;
}

bool has_control(const std::string& s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n') || u == 0x7f) return true;
  }
  return false;
}

// Messages that quote a trace quote it escaped: an invalid policy row's parse error, and a
// malformed field's. No escape sequence of the trace reaches the terminal.
TEST_F(ToolsTrust, MessagesQuotingTheTracePrintItsControlCharactersEscaped) {
  TraceBuilder b;
  b.alloc(0x1000000, 5 * MiB).free(0x1000000, 5 * MiB);
  TraceRow policy;
  policy.thread = 1;
  policy.action = TraceAction::policy;
  policy.detail = TraceDetail::policy;
  std::string csv = b.csv();
  csv.insert(csv.find('\n') + 1,
             format_trace_row(policy, "max_split_size_mb:\x1b]0;owned\x07,no_such_key\x1b[2J:1") + "\n");
  const fs::path bad = dir_ / "escapes.csv";
  std::ofstream(bad) << csv;
  Ran r = cudapool({"replay", bad.string()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("trace policy: ignored, it is not a valid policy"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\\x1b"), std::string::npos) << r.err;
  EXPECT_FALSE(has_control(r.err)) << r.err;
  EXPECT_FALSE(has_control(r.out)) << r.out;

  // A malformed field: the reader's error quotes it.
  std::string broken = b.csv();
  const std::size_t row = broken.find('\n') + 1;
  broken.replace(row, broken.find(',', row) - row, "\x1b[2J\x1b]0;owned\x07");
  const fs::path malformed = dir_ / "malformed.csv";
  std::ofstream(malformed) << broken;
  Ran m = cudapool({"replay", malformed.string()});
  EXPECT_EQ(m.rc, kExitBadInput) << m.out << m.err;
  EXPECT_NE(m.err.find("'\\x1b[2J\\x1b]0;owned\\x07'"), std::string::npos) << m.err;
  EXPECT_FALSE(has_control(m.err)) << m.err;
}

// A device ordinal is an index the tools size things by (a snapshot holds one list per device up
// to it): the reader refuses one above kMaxTraceDevice, so a crafted 2^31 - 1 costs nothing; and
// the snapshot writer bounds a caller's number too.
TEST_F(ToolsTrust, AHugeDeviceOrdinalIsRefusedNotAllocatedFor) {
  for (int dev : {2147483647, kMaxTraceDevice + 1}) {
    TraceBuilder b;
    b.alloc(0x1000000, 5 * MiB, 0, dev).free(0x1000000, 5 * MiB, 0, dev);
    const fs::path huge = dir_ / "huge-device.csv";
    std::ofstream(huge) << b.csv();
    const fs::path snapshot = dir_ / "snap.pickle";
    Ran r = cudapool({"report", huge.string(), "--snapshot", snapshot.string()});
    EXPECT_EQ(r.rc, kExitBadInput) << r.out << r.err;
    EXPECT_NE(r.err.find("is not a device ordinal (0 to 1023)"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(snapshot));
  }
  TraceBuilder ok;
  ok.alloc(0x1000000, 5 * MiB, 0, kMaxTraceDevice).free(0x1000000, 5 * MiB, 0, kMaxTraceDevice);
  const fs::path last = dir_ / "last-device.csv";
  std::ofstream(last) << ok.csv();
  const fs::path snapshot = dir_ / "snap.pickle";
  Ran r = cudapool({"report", last.string(), "--snapshot", snapshot.string()});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(snapshot));
  // The writer itself: a device number out of range writes at most kMaxTraceDevice empty lists.
  const std::string pickle = snapshot_pickle(Snapshot{}, {}, 2147483647, 0, "", PoolOptions{}, nullptr);
  EXPECT_LT(pickle.size(), 64u * 1024u);
}

}  // namespace
}  // namespace cudapool::tools
