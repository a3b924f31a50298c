// The tools read a trace whole (tools/trace_input.cpp): past its bounds (--max-rows, and the
// text and line bounds of telemetry/trace.h) the load stops with one line and exit 65, plain or
// gzip; a gzip trace's rest is decompressed only so far to look for damage.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/tools_util.h"
#include "tools/commands.h"
#include "tools/gzip_input.h"
#include "tools/trace_input.h"

namespace cudapool::tools {
namespace {

namespace fs = std::filesystem;

class TraceBoundsLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cudapool_bounds_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    testing::TraceBuilder b;
    for (std::uintptr_t i = 0; i < 50; ++i) b.alloc(0x10000 + i * 0x1000, 4096);
    csv_ = b.csv();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string plain(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    FILE* f = std::fopen(p.c_str(), "wb");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    return p;
  }
  // `parts` written one after another into one gzip member.
  std::string gzip(const std::string& name, const std::vector<std::pair<std::string, std::size_t>>& parts) {
    const std::string p = (dir_ / name).string();
    gzFile f = gzopen(p.c_str(), "wb1");
    for (const auto& [text, times] : parts)
      for (std::size_t i = 0; i < times; ++i) gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
    gzclose(f);
    return p;
  }
  struct Loaded {
    int rc;
    std::string err;
  };
  Loaded load(const std::string& path, std::uint64_t max_rows) {
    LoadedTrace t;
    ::testing::internal::CaptureStderr();
    const int rc = load_trace(path, -1, &t, "cudapool replay", max_rows);
    return {rc, ::testing::internal::GetCapturedStderr()};
  }

  fs::path dir_;
  std::string csv_;
};

TEST_F(TraceBoundsLoad, MoreRowsThanTheBoundIsOneLineAndExit65) {
  for (const std::string& path : {plain("t.csv", csv_), gzip("t.csv.gz", {{csv_, 1}})}) {
    Loaded l = load(path, 10);
    EXPECT_EQ(l.rc, kExitBadInput);
    EXPECT_EQ(l.err, "cudapool replay: " + path + ": more than 10 rows (the limit): pass --max-rows N to raise it\n");
    l = load(path, 50);
    EXPECT_EQ(l.rc, 0) << l.err;
  }
}

TEST_F(TraceBoundsLoad, AHugeGzipLineIsRefusedAsALine) {
  // One line of 64 MiB, inflated from a file of some 64 KiB: refused at its first 64 KiB, and the
  // rest not taken for damage.
  const std::string path = gzip("line.csv.gz",
                                {{std::string(trace_header()) + "\n1,", 1}, {std::string(1 << 20, '7'), 64}});
  const Loaded l = load(path, 0);
  EXPECT_EQ(l.rc, kExitBadInput);
  EXPECT_EQ(l.err, "cudapool replay: " + path + ":2: line longer than 65536 bytes (not a trace?)\n");
}

TEST(GzipDrain, StopsAtItsBound) {
  const std::string path = (fs::temp_directory_path() / ("cudapool_drain_" + std::to_string(::getpid()))).string();
  gzFile f = gzopen(path.c_str(), "wb1");
  const std::string block(1 << 20, 'x');
  for (int i = 0; i < 8; ++i) gzwrite(f, block.data(), static_cast<unsigned>(block.size()));
  gzclose(f);
  {
    GzipInput gz(path);
    ASSERT_TRUE(gz.opened());
    gz.drain(std::uint64_t{1} << 20);
    EXPECT_EQ(gz.stream().get(), 'x') << "drained past its bound";
    EXPECT_EQ(gz.error(), "");
    gz.drain(UINT64_MAX);
    EXPECT_EQ(gz.stream().get(), std::char_traits<char>::eof());
    EXPECT_EQ(gz.error(), "");
  }
  fs::remove(path);
}

}  // namespace
}  // namespace cudapool::tools
