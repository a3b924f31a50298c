// The trace of a real DevicePool (fake upstream and fences from tests/support): a scripted
// sequence gives exactly the rows PyTorch's rules predict, the rows agree with the pool's own
// stats, and the JSON summary built from those stats reads back equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "allocator/pool.h"
#include "telemetry/summary_reader.h"
#include "telemetry/trace.h"
#include "telemetry_util.h"
#include "tests/support/fake_fence.h"
#include "tests/support/fake_upstream.h"

namespace cudapool {
namespace {

// The columns a scripted sequence determines (not thread/time/duration).
using Key = std::tuple<TraceAction, std::uintptr_t, std::size_t, std::size_t, std::uintptr_t, int>;

Key key_of(const TraceRow& r, bool with_requested_and_stream) {
  return {
      r.action, r.ptr, r.size, with_requested_and_stream ? r.requested : 0, with_requested_and_stream ? r.stream : 0,
      r.device};
}

bool is_segment_row(TraceAction a) {
  return a == TraceAction::segment_alloc || a == TraceAction::segment_free || a == TraceAction::empty_cache ||
         a == TraceAction::oom;
}

TEST(TelemetryPoolTrace, ScriptedSequenceGivesExactRows) {
  constexpr int kDevice = 2;
  constexpr StreamId kSide = 0x10;
  testing::FakeUpstream upstream(64 * MiB);
  testing::FakeFence fences(/*auto_complete=*/true);
  testing::TempPath path;
  std::string err;
  auto writer = TraceWriter::open(path.str(), &err);
  ASSERT_TRUE(writer) << err;

  PoolOptions opt;
  opt.free_sync = FreeSync::immediate;  // reuse at once on the same stream: a deterministic hit
  Stats stats;
  {
    DevicePool pool(kDevice, opt, upstream, fences, writer.get());
    AllocResult a = pool.allocate(1000, 0);  // small: 2 MiB segment, 1024 B block
    ASSERT_EQ(a.status, AllocStatus::ok);
    AllocResult b = pool.allocate(3 * MiB, kSide);  // large < 10 MiB: 20 MiB segment
    ASSERT_EQ(b.status, AllocStatus::ok);
    ASSERT_EQ(pool.free(a.ptr), FreeStatus::ok);
    AllocResult c = pool.allocate(1000, 0);  // cache hit: same block
    ASSERT_EQ(c.status, AllocStatus::ok);
    EXPECT_EQ(c.ptr, a.ptr);
    ASSERT_EQ(pool.free_on_stream(b.ptr, kSide), FreeStatus::ok);
    ASSERT_EQ(pool.free(c.ptr), FreeStatus::ok);
    EXPECT_EQ(pool.empty_cache(), 22 * MiB);
    AllocResult d = pool.allocate(100 * MiB, 0);  // more than the 64 MiB device
    EXPECT_EQ(d.status, AllocStatus::out_of_memory);
    stats = pool.stats();
  }
  writer->flush();

  std::vector<TraceRow> rows;
  ASSERT_TRUE(read_trace_file(path.str(), &rows, &err)) << err;
  // empty_cache waits for the streams' promotion fences: one fence_wait row per wait, as many as
  // the pool counted. They are checked here and left out of the row-by-row comparison below.
  const auto waits = std::count_if(rows.begin(), rows.end(),
                                   [](const TraceRow& r) { return r.action == TraceAction::fence_wait; });
  EXPECT_GE(waits, 1);
  EXPECT_EQ(waits, stats.fence_waits);
  std::erase_if(rows, [](const TraceRow& r) { return r.action == TraceAction::fence_wait; });
  ASSERT_GE(rows.size(), 12u) << testing::read_file(path.str());

  const auto pa = reinterpret_cast<std::uintptr_t>(rows[0].ptr);  // segments' bases, as traced
  const auto pb = reinterpret_cast<std::uintptr_t>(rows[2].ptr);
  // Block rows: exactly these, in this order.
  const std::vector<Key> expect_head = {
      {TraceAction::segment_alloc, pa, 2 * MiB, 0, 0, kDevice},
      {TraceAction::allocate, pa, 1024, 1000, 0, kDevice},
      {TraceAction::segment_alloc, pb, 20 * MiB, 0, 0, kDevice},
      {TraceAction::allocate, pb, 3 * MiB, 3 * MiB, kSide, kDevice},
      {TraceAction::free, pa, 1024, 1000, 0, kDevice},
      {TraceAction::allocate, pa, 1024, 1000, 0, kDevice},
      {TraceAction::free, pb, 3 * MiB, 3 * MiB, kSide, kDevice},
      {TraceAction::free, pa, 1024, 1000, 0, kDevice},
  };
  for (std::size_t i = 0; i < expect_head.size(); ++i) {
    EXPECT_EQ(key_of(rows[i], !is_segment_row(rows[i].action)), expect_head[i]) << "row " << i + 2;
  }
  // empty_cache: both segments released (in either order) and one empty_cache row of 22 MiB.
  std::vector<Key> got_release, expect_release = {
                                    {TraceAction::segment_free, pa, 2 * MiB, 0, 0, kDevice},
                                    {TraceAction::segment_free, pb, 20 * MiB, 0, 0, kDevice},
                                    {TraceAction::empty_cache, 0, 22 * MiB, 0, 0, kDevice},
                                };
  for (std::size_t i = 8; i < 11; ++i) {
    Key k = key_of(rows[i], false);
    std::get<1>(k) = rows[i].action == TraceAction::empty_cache ? 0 : std::get<1>(k);
    got_release.push_back(k);
  }
  std::sort(got_release.begin(), got_release.end());
  std::sort(expect_release.begin(), expect_release.end());
  EXPECT_EQ(got_release, expect_release);
  // OOM: one or more refusals of the 100 MiB segment (one per retry), then the failure.
  std::size_t i = 11;
  std::size_t ooms = 0;
  for (; i + 1 < rows.size() && rows[i].action == TraceAction::oom; ++i, ++ooms) {
    EXPECT_EQ(rows[i].size, 100 * MiB);
    EXPECT_EQ(rows[i].device, kDevice);
  }
  EXPECT_GE(ooms, 1u);
  ASSERT_EQ(i + 1, rows.size()) << "unexpected rows after the OOM";
  EXPECT_EQ(rows[i].action, TraceAction::allocate_failure);
  EXPECT_EQ(rows[i].size, 100 * MiB);

  // The trace and the pool's counters tell the same story.
  auto count = [&](TraceAction a) {
    return static_cast<std::int64_t>(
        std::count_if(rows.begin(), rows.end(), [a](const TraceRow& r) { return r.action == a; }));
  };
  EXPECT_EQ(count(TraceAction::allocate), stats.allocation[kAll].allocated);
  EXPECT_EQ(count(TraceAction::free), stats.allocation[kAll].freed);
  EXPECT_EQ(count(TraceAction::segment_alloc), stats.num_device_alloc);
  EXPECT_EQ(count(TraceAction::segment_free), stats.num_device_free);
  EXPECT_EQ(count(TraceAction::allocate_failure), stats.num_ooms);
  EXPECT_EQ(stats.cache_hits, 1);
  EXPECT_EQ(stats.cache_misses, 3);  // the refused 100 MiB request asked the upstream too
  EXPECT_EQ(stats.reserved_bytes[kAll].peak, static_cast<std::int64_t>(22 * MiB));
  std::int64_t traced_upstream_ns = 0;
  for (const auto& r : rows) traced_upstream_ns += r.duration_ns;
  EXPECT_LE(traced_upstream_ns, stats.upstream_ns + 1);

  // The JSON summary carries exactly the pool's stats.
  Summary s;
  s.pid = 1;
  DeviceSummary d;
  d.device = kDevice;
  d.stats = stats;
  s.devices.push_back(d);
  Summary back;
  ASSERT_TRUE(from_json(to_json(s), &back, &err)) << err;
  ASSERT_EQ(back.devices.size(), 1u);
  EXPECT_EQ(flatten_stats(back.devices[0].stats), flatten_stats(stats));
  EXPECT_DOUBLE_EQ(back.hit_rate(), 1.0 / 4.0);
}

}  // namespace
}  // namespace cudapool
