// Replay on hand-built traces with known answers (PyTorch's size rules), the simulated device
// and fences, and the round trip: a trace the pool recorded replays to the recorded peak.
#include <gtest/gtest.h>

#include <sstream>

#include "tools/policies.h"
#include "tools/replay.h"
#include "tools/sim_device.h"
#include "tools/synth.h"
#include "tools_util.h"

namespace cudapool::tools {
namespace {

using testing::TraceBuilder;

// These tests state classic segments' rules (PyTorch's segment sizes, splitting), so `conf` runs
// over expandable_segments:False unless it names the key; run_default() replays the defaults.
ReplayResult replay_with(const TraceBuilder& b, const std::string& conf, std::optional<std::size_t> memory,
                         std::int64_t latency_ns, FreeMode free_mode) {
  ReplayConfig cfg;
  cfg.free_mode = free_mode;
  std::string err;
  EXPECT_TRUE(pool_options_from_conf(conf, &cfg.pool, &err)) << err;
  cfg.device_memory = memory;
  cfg.fence_latency_ns = latency_ns;
  return replay_trace(prepare_trace(b.rows()), cfg);
}
ReplayResult run(const TraceBuilder& b, const std::string& conf = "", std::optional<std::size_t> memory = {},
                 std::int64_t latency_ns = 0, FreeMode free_mode = FreeMode::async) {
  const bool names_kind = conf.find("expandable_segments") != std::string::npos;
  return replay_with(b, names_kind ? conf : join_conf("expandable_segments:False", conf), memory, latency_ns,
                     free_mode);
}
ReplayResult run_default(const TraceBuilder& b) { return replay_with(b, "", {}, 0, FreeMode::async); }

std::int64_t peak_reserved(const ReplayResult& r) { return r.stats.reserved_bytes[kAll].peak; }

TEST(ToolsReplay, SegmentSizesFollowPyTorch) {
  TraceBuilder b;
  // Largest first, so that no request fits in the remainder of an earlier segment.
  b.alloc(0x30, 12 * MiB + 16).alloc(0x20, 5 * MiB).alloc(0x10, 1 * MiB);
  ReplayResult r = run(b);
  // 1 MiB -> 2 MiB small segment, 5 MiB -> 20 MiB, 12 MiB + 16 B -> 14 MiB.
  EXPECT_EQ(peak_reserved(r), static_cast<std::int64_t>(36 * MiB));
  EXPECT_EQ(r.failed_allocations, 0u);
  EXPECT_EQ(r.ops, 3u);
}

// The defaults replay expandable segments: the same trace as above maps pages for what is live
// instead of three PyTorch-sized segments.
TEST(ToolsReplay, DefaultsAreExpandableSegments) {
  TraceBuilder b;
  b.alloc(0x30, 12 * MiB + 16).alloc(0x20, 5 * MiB).alloc(0x10, 1 * MiB);
  const std::int64_t def = peak_reserved(run_default(b));
  EXPECT_EQ(def, peak_reserved(run(b, "expandable_segments:True")));
  EXPECT_LT(def, static_cast<std::int64_t>(36 * MiB));  // the classic peak (SegmentSizesFollowPyTorch)
  EXPECT_GE(def, static_cast<std::int64_t>(18 * MiB));  // at least what is live
}

// "upstream calls" is the pool's own count (tools/metrics.h), what a run under the library
// reports too; the simulated device, which sees every call, must count the same.
TEST(ToolsReplay, UpstreamCallsAreThePoolsOwnCount) {
  TraceBuilder b;
  b.device(256 * MiB);
  for (int round = 0; round < 3; ++round) {
    b.alloc(0x100, 60 * MiB).alloc(0x200, 5 * MiB).free(0x100, 60 * MiB).alloc(0x300, 90 * MiB);
    b.free(0x200, 5 * MiB).free(0x300, 90 * MiB).add(TraceAction::empty_cache, 0, 0, 0);
  }
  for (const char* conf : {"", "expandable_segments:False", "expandable_unit_mb:0,expandable_page_mb:20"}) {
    ReplayResult r = replay_with(b, conf, {}, 0, FreeMode::async);
    EXPECT_GT(r.upstream_calls, 0u) << conf;
    EXPECT_EQ(r.upstream_calls, r.device_calls) << conf;
    if (*conf == '\0') {
      EXPECT_GT(r.stats.num_device_map, 0) << "the defaults map expandable pages";
    }
  }
}

TEST(ToolsReplay, SweepOfMaxSplitSizeChangesWhatItMust) {
  // A 100 MiB block is cached, then a 30 MiB request comes: by default it splits the cached
  // block; with max_split_size_mb:64 the block is oversize and the request needs a new segment.
  TraceBuilder b;
  b.alloc(0x1, 100 * MiB).free(0x1, 100 * MiB).alloc(0x2, 30 * MiB);
  std::vector<NamedConf> confs;
  std::string err;
  ASSERT_TRUE(expand_sweep("", "max_split_size_mb=64,128", &confs, &err)) << err;
  ASSERT_EQ(confs.size(), 2u);
  EXPECT_EQ(confs[0].conf, "max_split_size_mb:64");
  EXPECT_EQ(peak_reserved(run(b)), static_cast<std::int64_t>(100 * MiB));
  EXPECT_EQ(peak_reserved(run(b, confs[0].conf)), static_cast<std::int64_t>(130 * MiB));
  // 100 MiB is below 128 MiB: not oversize, so the split happens again.
  EXPECT_EQ(peak_reserved(run(b, confs[1].conf)), static_cast<std::int64_t>(100 * MiB));
}

TEST(ToolsReplay, ExpandSweepKeepsBracketsAndRejectsJunk) {
  std::vector<NamedConf> confs;
  std::string err;
  ASSERT_TRUE(expand_sweep("garbage_collection_threshold:0.8", "roundup_power2_divisions=[256:1,>:4],8", &confs, &err));
  ASSERT_EQ(confs.size(), 2u);
  EXPECT_EQ(confs[0].conf, "garbage_collection_threshold:0.8,roundup_power2_divisions:[256:1,>:4]");
  EXPECT_EQ(confs[1].name, "roundup_power2_divisions=8");
  EXPECT_FALSE(expand_sweep("", "max_split_size_mb", &confs, &err));
  EXPECT_FALSE(expand_sweep("", "max_split_size_mb=64,,128", &confs, &err));
}

TEST(ToolsReplay, SmallDeviceRunsOutOfMemory) {
  TraceBuilder b;
  b.alloc(0x1, GiB).alloc(0x2, GiB).alloc(0x3, GiB).free(0x3, GiB).free(0x1, GiB);
  ReplayResult r = run(b, "", 2 * GiB + 10 * MiB);
  EXPECT_EQ(r.failed_allocations, 1u);
  EXPECT_EQ(r.stats.num_ooms, 1);
  EXPECT_EQ(r.bad_frees, 0u);  // the free of the failed allocation is skipped, not sent to the pool
  EXPECT_EQ(peak_reserved(r), static_cast<std::int64_t>(2 * GiB));
  // The recorded device size is the default.
  TraceBuilder d;
  d.device(GiB + 20 * MiB).alloc(0x1, GiB).alloc(0x2, GiB);
  ReplayResult rd = run(d);
  EXPECT_EQ(rd.device_memory, GiB + 20 * MiB);
  EXPECT_EQ(rd.failed_allocations, 1u);
}

TEST(ToolsReplay, RecordedFailureIsRetried) {
  TraceBuilder b;
  b.alloc(0x1, MiB).failure(2 * GiB);
  EXPECT_EQ(run(b).recorded_failures_served, 1u);
  EXPECT_EQ(run(b, "", GiB).recorded_failures_served, 0u);
}

TEST(ToolsReplay, SyncFreeReuseWaitsForTheFenceModel) {
  // A cudaFree'd block is reusable once a device fence recorded after the free has completed.
  // The pool records that fence at the next allocation (the 1 KiB one); in the model it completes
  // by the event after, so with no simulated latency the 100 MiB block is reused. Under
  // free_sync:fenced with 1 s of latency it is still pending and the request needs a segment of
  // its own; under the default (gpu_wait) it is reused at once, the simulated GPU waiting.
  TraceBuilder b;
  b.alloc(0x1, 100 * MiB, 1).free(0x1, 100 * MiB, 1).alloc(0x2, KiB, 1).alloc(0x3, 100 * MiB, 1);
  const std::int64_t small = 2 * MiB;
  EXPECT_EQ(peak_reserved(run(b, "free_sync:fenced", std::nullopt, 0, FreeMode::sync)),
            static_cast<std::int64_t>(100 * MiB) + small);
  EXPECT_EQ(peak_reserved(run(b, "free_sync:fenced", std::nullopt, 1'000'000'000, FreeMode::sync)),
            static_cast<std::int64_t>(200 * MiB) + small);
  EXPECT_EQ(peak_reserved(run(b, "", std::nullopt, 1'000'000'000, FreeMode::sync)),
            static_cast<std::int64_t>(100 * MiB) + small);
  // free_sync:immediate makes the block reusable on its stream at once, whatever the GPU does.
  EXPECT_EQ(peak_reserved(run(b, "free_sync:immediate", std::nullopt, 1'000'000'000, FreeMode::sync)),
            static_cast<std::int64_t>(100 * MiB) + small);
}

TEST(ToolsReplay, PrepareCountsWhatItSkips) {
  TraceBuilder b;
  b.alloc(0x1, MiB, 0, 0)
      .alloc(0x1, MiB, 0, 1)
      .alloc(0x2, MiB, 0, 1)
      .free(0x9, MiB, 0, 1)  // never allocated
      .free(0x1, MiB, 0, 1);
  PreparedTrace p = prepare_trace(b.rows());
  EXPECT_EQ(p.facts.device, 1);  // the busiest device
  ASSERT_EQ(p.facts.other_devices.size(), 1u);
  EXPECT_EQ(p.facts.other_devices[0], 0);
  EXPECT_EQ(p.facts.allocations, 2u);
  EXPECT_EQ(p.facts.unmatched_frees, 1u);
  EXPECT_TRUE(p.facts.rmm_only);
  EXPECT_FALSE(p.facts.recorded_peak_reserved);
  EXPECT_EQ(p.facts.recorded_peak_allocated, 2 * MiB);
}

TEST(ToolsSimDevice, UpstreamLimitsAndFenceModel) {
  SimUpstream up(10 * MiB);
  void* a = nullptr;
  void* b = nullptr;
  EXPECT_EQ(up.allocate(8 * MiB, &a), UpstreamStatus::ok);
  EXPECT_EQ(up.allocate(4 * MiB, &b), UpstreamStatus::out_of_memory);
  up.release(a, 8 * MiB);
  EXPECT_EQ(up.allocate(4 * MiB, &b), UpstreamStatus::ok);
  EXPECT_NE(a, b);  // addresses are never reused
  std::size_t free_bytes = 0, total = 0;
  up.mem_info(&free_bytes, &total);
  EXPECT_EQ(total, 10 * MiB);
  EXPECT_EQ(free_bytes, 6 * MiB);

  SimFences f(500);
  f.advance(5, 1000);
  FenceHandle h = f.record_stream(3);
  EXPECT_FALSE(f.query(h));  // same event
  f.advance(6, 1200);
  EXPECT_FALSE(f.query(h));  // later event, but the GPU is still 300 ns behind
  f.advance(7, 1500);
  EXPECT_TRUE(f.query(h));
  FenceHandle h2 = f.record_device();
  f.wait(h2);
  EXPECT_TRUE(f.query(h2));
  EXPECT_EQ(f.waits(), 1u);
  f.release(h);
  f.release(h2);
  EXPECT_EQ(f.live(), 0u);
}

// A trace the pool recorded (the sample-trace generator) replays to exactly what it recorded.
void round_trip(const std::string& pattern, const std::string& conf) {
  SynthOptions o;
  o.pattern = pattern;
  o.steps = pattern == "train" ? 3 : 60;
  o.layers = 4;
  PoolOptions pool;
  std::string err;
  ASSERT_TRUE(pool_options_from_conf(conf, &pool, &err)) << err;
  SynthResult s;
  ASSERT_TRUE(synthesize_trace(o, pool, &s, &err)) << err;
  // Through the CSV text and the strict reader, as a file would go.
  std::string csv = std::string(trace_header()) + "\n";
  for (const auto& r : s.rows) csv += format_trace_row(r) + "\n";
  std::istringstream in(csv);
  TraceReader reader(in);
  std::vector<TraceRow> rows;
  TraceRow row;
  while (reader.next(&row)) rows.push_back(row);
  ASSERT_EQ(reader.error(), "");
  ASSERT_EQ(rows.size(), s.rows.size());
  PreparedTrace p = prepare_trace(rows);
  ASSERT_TRUE(p.facts.recorded_peak_reserved);
  ASSERT_GT(*p.facts.recorded_peak_reserved, 0u);
  ReplayConfig cfg;
  cfg.pool = pool;
  ReplayResult r = replay_trace(p, cfg);
  EXPECT_EQ(r.device_memory, o.device_memory);
  EXPECT_EQ(static_cast<std::size_t>(r.stats.reserved_bytes[kAll].peak), *p.facts.recorded_peak_reserved)
      << pattern << " " << conf;
  EXPECT_EQ(r.bad_frees, 0u);
  EXPECT_EQ(r.failed_allocations, 0u);
}

// A cudaFree'd block asked for at once by another stream: under the default free_sync:gpu_wait
// the pool hands it over (the GPU waits for the fence), while a cudaFreeAsync'd one stays with
// its stream until its fence completes (here never: 1 s of latency). Replaying as recorded must
// follow each row's call.
TEST(ToolsReplay, FreesReplayAsTheTraceRecordsThem) {
  TraceBuilder b;
  b.alloc(0x1, 10 * MiB, 7).free_as(0x1, 10 * MiB, 7, true).alloc(0x2, 10 * MiB, 9).free_as(0x2, 10 * MiB, 9, false);
  b.alloc(0x3, 10 * MiB, 7);
  PreparedTrace p = prepare_trace(b.rows());
  EXPECT_EQ(p.facts.sync_frees, 1u);
  EXPECT_EQ(p.facts.async_frees, 1u);
  EXPECT_EQ(p.facts.unknown_frees, 0u);
  const std::int64_t lag = 1'000'000'000;
  ReplayResult recorded = run(b, "", {}, lag, FreeMode::recorded);
  ReplayResult as_sync = run(b, "", {}, lag, FreeMode::sync);
  ReplayResult as_async = run(b, "", {}, lag, FreeMode::async);
  // As recorded: 0x2 reuses 0x1's block (sync free); 0x3 on stream 7 cannot take 0x2's (async
  // free on stream 9, fence pending): two segments.
  EXPECT_EQ(peak_reserved(recorded), static_cast<std::int64_t>(20 * MiB));
  // All async: 0x2 cannot take 0x1's block; 0x3 takes 0x1's again (its own stream): two too, but
  // all sync: every block is handed on: one segment.
  EXPECT_EQ(peak_reserved(as_sync), static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(peak_reserved(as_async), static_cast<std::int64_t>(20 * MiB));
  EXPECT_GT(recorded.stats.gpu_waits, 0);  // the sync free was handed over with a GPU wait
  EXPECT_EQ(as_async.stats.gpu_waits, 0);
}

TEST(ToolsReplay, RoundTripReproducesRecordedPeakReserved) {
  round_trip("train", "");
  round_trip("serve", "");
  round_trip("train", "max_split_size_mb:64");
  round_trip("serve", "roundup_power2_divisions:4");
}

}  // namespace
}  // namespace cudapool::tools

namespace cudapool::tools {
namespace {

TEST(ToolsSynth, SameSeedSameTraceAndPatternsDiffer) {
  SynthOptions o;
  o.steps = 2;
  o.layers = 2;
  SynthResult a, b, c;
  std::string err;
  ASSERT_TRUE(synthesize_trace(o, PoolOptions{}, &a, &err));
  ASSERT_TRUE(synthesize_trace(o, PoolOptions{}, &b, &err));
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (std::size_t i = 0; i < a.rows.size(); ++i)
    ASSERT_EQ(format_trace_row(a.rows[i]), format_trace_row(b.rows[i])) << i;
  EXPECT_EQ(a.rows.front().action, TraceAction::device);
  o.seed = 99;  // another seed picks other sequence lengths
  ASSERT_TRUE(synthesize_trace(o, PoolOptions{}, &c, &err));
  bool differ = c.rows.size() != a.rows.size();
  for (std::size_t i = 0; !differ && i < a.rows.size(); ++i) differ = a.rows[i].size != c.rows[i].size;
  EXPECT_TRUE(differ);
  o.pattern = "bogus";
  EXPECT_FALSE(synthesize_trace(o, PoolOptions{}, &c, &err));
  EXPECT_NE(err.find("bogus"), std::string::npos);
}

}  // namespace
}  // namespace cudapool::tools
