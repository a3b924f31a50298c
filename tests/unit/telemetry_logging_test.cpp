// Logging setup: file name patterns, level names, run-time level changes, file output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ctime>

#include "telemetry/logging.h"
#include "telemetry_util.h"
#include "tests/unit/bounded_child.h"

namespace cudapool {
namespace {

// One meaning of every pattern, for every file the library and the tools name.
TEST(TelemetryLogging, PathPatternsPinned) {
  EXPECT_EQ(expand_path_pattern("/tmp/cp-%p-%t-%h-%%-%%p-%q-%", 42, "node7", 1700000000),
            "/tmp/cp-42-1700000000-node7-%-%p-%q-%");
  EXPECT_EQ(expand_path_pattern("%t%p", 7, "h", 0), "07");
  EXPECT_EQ(expand_path_pattern("plain", 1, "h", 2), "plain");
}

TEST(TelemetryLogging, PathPatterns) {
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(expand_path_pattern("/tmp/x-%p.log"), "/tmp/x-" + pid + ".log");
  EXPECT_EQ(expand_path_pattern("%%p"), "%p");
  EXPECT_EQ(expand_path_pattern("a%qb%"), "a%qb%");  // unknown patterns stay as written
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_EQ(expand_path_pattern("%h"), host);
  const long long before = std::time(nullptr);
  const long long t = std::stoll(expand_path_pattern("%t"));
  EXPECT_GE(t, before);
  EXPECT_LE(t, before + 5);
}

TEST(TelemetryLogging, LevelsAndFileOutput) {
  testing::TempPath path(".log");
  Policy p;
  p.log_file = path.str();
  p.log_level = "loud";
  EXPECT_NE(init_logging(p).find("unknown log level 'loud'"), std::string::npos);
  p.log_level = "warn";
  ASSERT_EQ(init_logging(p), "");
  EXPECT_EQ(log_level_name(), "warning");
  log().info("hidden {}", 1);
  log().warn("shown {}", 2);
  EXPECT_FALSE(set_log_level("chatty"));
  EXPECT_TRUE(set_log_level("debug"));
  EXPECT_EQ(log_level_name(), "debug");
  log().debug("shown {}", 3);
  log().trace("hidden {}", 4);
  flush_logs();
  auto lines = testing::read_lines(path.str());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("[warning] shown 2"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("[cudapool " + std::to_string(::getpid())), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("[debug] shown 3"), std::string::npos) << lines[1];

  // A new log file is the owner's only, and a program started by this one does not inherit it.
  EXPECT_EQ(testing::file_mode(path.str()) & 077, 0);
  EXPECT_EQ(testing::file_mode(path.str()) & 0600, 0600);
  EXPECT_EQ(testing::cloexec_of_open_file(path.str()), 1);

  p.log_file = "/dev/null/a.log";
  EXPECT_NE(init_logging(p).find("cannot open log file '/dev/null/a.log'"), std::string::npos);
  // Back to stderr so later tests do not write into a removed file.
  p.log_file.clear();
  EXPECT_EQ(init_logging(p), "");
}

TEST(TelemetryLogging, RefusesToWriteThroughASymbolicLink) {
  testing::Victim victim;
  testing::TempPath path(".log");
  ASSERT_EQ(::symlink(victim.str().c_str(), path.str().c_str()), 0);
  Policy p;
  p.log_level = "warn";
  p.log_file = path.str();
  const std::string err = init_logging(p);
  EXPECT_NE(err.find("cannot open log file '" + path.str() + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("refusing to write through a symbolic link"), std::string::npos) << err;
  log().warn("must not reach the link's target");
  flush_logs();
  EXPECT_TRUE(victim.untouched());
  p.log_file.clear();
  EXPECT_EQ(init_logging(p), "");
}

// A FIFO at log_file would block open(2) until someone reads it: refused at once, and the log
// stays where it was.
TEST(TelemetryLogging, RefusesAFifoWithoutBlocking) {
  testing::TempPath path(".log");
  ASSERT_EQ(::mkfifo(path.str().c_str(), 0600), 0);
  const testing::BoundedRun r = testing::run_bounded([&] {
    Policy p;
    p.log_file = path.str();
    return init_logging(p);
  });
  ASSERT_TRUE(r.finished) << r.describe();
  EXPECT_EQ(r.answer,
            "cannot open log file '" + path.str() + "': not a regular file (a FIFO): give the path of a regular file");
}

// Another user's file at log_file (mode 0666, in /tmp) gets no line of this process's log.
TEST(TelemetryLogging, NeverWritesAnotherUsersFile) {
  testing::ForeignFile theirs(".log");
  if (!theirs.given()) GTEST_SKIP() << "cannot give a file to uid 65534 (needs root)";
  Policy p;
  p.log_level = "warn";
  p.log_file = theirs.str();
  const std::string err = init_logging(p);
  EXPECT_NE(err.find("cannot open log file '" + theirs.str() + "': owned by uid 65534"), std::string::npos) << err;
  log().warn("must not reach another user's file");
  flush_logs();
  EXPECT_TRUE(theirs.untouched());
  p.log_file.clear();
  EXPECT_EQ(init_logging(p), "");
}

}  // namespace
}  // namespace cudapool
