// A trace read whole into memory is bounded (telemetry/trace.h, TraceLimits): in rows, in bytes of
// text and in the length of a line, each refused with a clear error as soon as it is passed, not
// after the whole input was read. The inputs here are generated without end, so a reader that
// does not stop at the bound never returns.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <istream>
#include <sstream>
#include <streambuf>
#include <string>
#include <vector>

#include "telemetry/trace.h"

namespace cudapool {
namespace {

// An endless input: `head` once, then `next(i)` for i = 0, 1, 2, … Counts the bytes it hands out.
class EndlessInput : public std::streambuf {
 public:
  template <typename F>
  EndlessInput(std::string head, F next) : chunk_(std::move(head)), next_(std::move(next)) {
    setg(chunk_.data(), chunk_.data(), chunk_.data() + chunk_.size());
    given_ = chunk_.size();
  }
  std::uint64_t given() const { return given_; }

 protected:
  int_type underflow() override {
    chunk_ = next_(n_++);
    given_ += chunk_.size();
    setg(chunk_.data(), chunk_.data(), chunk_.data() + chunk_.size());
    return traits_type::to_int_type(chunk_[0]);
  }

 private:
  std::string chunk_;
  std::function<std::string(std::uint64_t)> next_;
  std::uint64_t n_ = 0;
  std::uint64_t given_ = 0;
};

std::string header() { return std::string(trace_header()) + "\n"; }

std::string alloc_row(std::uint64_t i, const std::string& site = "") {
  TraceRow r;
  r.thread = 1;
  r.time_ns = static_cast<std::int64_t>(1'700'000'000'000'000'000 + i);
  r.action = TraceAction::allocate;
  r.ptr = 0x7f0000000000 + i * 512;
  r.size = 512;
  r.requested = 512;
  r.site = site.empty() ? 0 : 1;
  return format_trace_row(r, site) + "\n";
}

TEST(TraceBounds, EndlessValidRowsStopAtTheRowBound) {
  EndlessInput src(header(), [](std::uint64_t i) { return alloc_row(i); });
  std::istream in(&src);
  std::vector<TraceRow> rows;
  std::string err;
  TraceMeta meta;
  TraceLimits limits = TraceLimits::for_rows(1000);
  ASSERT_FALSE(read_trace_stream(in, "big.csv", &rows, &err, &meta, limits));
  EXPECT_EQ(err, "big.csv: more than 1000 rows (the limit)");
  EXPECT_TRUE(meta.over_limit);
  EXPECT_EQ(rows.size(), 1000u);
  EXPECT_LE(rows.capacity(), 1000u) << "memory at the bound is what its rows take, no doubling past it";
  EXPECT_LT(src.given(), std::uint64_t{4} << 20) << "read far past the bound";
}

TEST(TraceBounds, TheDefaultBoundHoldsEveryShippedTraceWithAWideMargin) {
  // The largest shipped trace (tests/traces/gpu_hf_gpt2.csv.gz) has 84,950 rows of at most 228
  // bytes: the defaults are 50 times that in rows and more than twice that in bytes a row.
  const TraceLimits d;
  EXPECT_GE(d.max_rows, 50u * 84'950u);
  EXPECT_EQ(d.max_bytes, d.max_rows * kTraceBytesPerRow);
  EXPECT_GE(kTraceBytesPerRow, 2u * 228u);
  EXPECT_EQ(TraceLimits::for_rows(0).max_rows, d.max_rows);
  EXPECT_EQ(TraceLimits::for_rows(7).max_bytes, 7 * kTraceBytesPerRow);
  EXPECT_EQ(TraceLimits::for_rows(UINT64_MAX).max_bytes, UINT64_MAX);  // saturates
}

TEST(TraceBounds, TextBoundStopsLongRows) {
  // Rows of ~1 KiB (a call site each) against a bound of 64 bytes a row.
  const std::string site(900, 's');
  EndlessInput src(header(), [&](std::uint64_t) { return alloc_row(0, site); });
  std::istream in(&src);
  std::vector<TraceRow> rows;
  std::string err;
  TraceMeta meta;
  TraceLimits limits;
  limits.max_rows = 1000;
  limits.max_bytes = 64 * 1000;
  ASSERT_FALSE(read_trace_stream(in, "wide.csv", &rows, &err, &meta, limits));
  EXPECT_EQ(err, "wide.csv: more than 64000 bytes of text (the limit)");
  EXPECT_TRUE(meta.over_limit);
  EXPECT_LT(rows.size(), 70u);
}

TEST(TraceBounds, AnEndlessLineIsRefusedAtTheLineBound) {
  EndlessInput src(header() + "1,", [](std::uint64_t) { return std::string(4096, '7'); });
  std::istream in(&src);
  std::vector<TraceRow> rows;
  std::string err;
  TraceMeta meta;
  ASSERT_FALSE(read_trace_stream(in, "line.csv", &rows, &err, &meta));
  EXPECT_EQ(err, "line.csv:2: line longer than 65536 bytes (not a trace?)");
  EXPECT_FALSE(meta.over_limit);  // malformed, not too large: --max-rows would not help
  EXPECT_LT(src.given(), std::uint64_t{2} << 20) << "read far past the line bound";
}

TEST(TraceBounds, ALineAtTheBoundIsReadAndOnePastItIsNot) {
  // A quoted call site fills an allocate row to exactly kMaxTraceLineBytes (newline excluded).
  const std::size_t base = alloc_row(0, "x").size() - 1;  // the row with a 1-byte site
  const std::string fits = alloc_row(0, std::string(kMaxTraceLineBytes - base + 1, 'x'));
  ASSERT_EQ(fits.size(), kMaxTraceLineBytes + 1);
  std::vector<TraceRow> rows;
  std::string err;
  std::istringstream ok(header() + fits);
  EXPECT_TRUE(read_trace_stream(ok, "t", &rows, &err)) << err;
  const std::string over = alloc_row(0, std::string(kMaxTraceLineBytes - base + 2, 'x'));
  std::istringstream bad(header() + over);
  rows.clear();
  EXPECT_FALSE(read_trace_stream(bad, "t", &rows, &err));
  EXPECT_EQ(err, "t:2: line longer than 65536 bytes (not a trace?)");
}

TEST(TraceBounds, CallSitesAreBoundedInBytes) {
  // Distinct call sites of 60,000 bytes each: held once each, but not past their bound.
  EndlessInput src(header(), [](std::uint64_t i) {
    std::string site = std::to_string(i) + ":";
    site.resize(60'000, 'f');
    return alloc_row(i, site);
  });
  std::istream in(&src);
  std::vector<TraceRow> rows;
  std::string err;
  TraceMeta meta;
  TraceLimits limits;
  limits.max_rows = 1'000'000;
  limits.max_bytes = UINT64_MAX;
  ASSERT_FALSE(read_trace_stream(in, "sites.csv", &rows, &err, &meta, limits));
  EXPECT_NE(err.find("is a call site past the 32 MiB the call sites of a trace may take"), std::string::npos) << err;
  EXPECT_EQ(rows.size(), kMaxTraceSiteBytes / 60'000);
}

}  // namespace
}  // namespace cudapool
