// Warm-start plans (telemetry/warm_plan.h): the plan file's grammar and bounds, and the plan a
// trace's recorded segment rows give.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "allocator/types.h"
#include "telemetry/trace.h"
#include "telemetry/warm_plan.h"
#include "tests/unit/telemetry_util.h"

namespace cudapool {
namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string plan_text(const std::string& body) { return std::string(kWarmPlanMagic) + "\n" + body; }

std::string parse_error(const std::string& text) {
  WarmPlan p;
  std::string err;
  EXPECT_FALSE(parse_warm_plan(text, &p, &err)) << text;
  return err;
}

TEST(WarmPlan, RoundTripsThroughItsFile) {
  WarmPlan p;
  p.source = "trace run.csv, replayed";
  p.devices = {{0, 46 * MiB}, {3, 22 * MiB}};
  p.segments = {{0, false, false, 40 * MiB, {10 * MiB, 30 * MiB}},
                {0, true, false, 2 * MiB, {}},
                {0, false, true, 4 * MiB, {}},
                {3, true, true, 22 * MiB, {512, 22 * MiB - 512}}};
  const std::string text = format_warm_plan(p);
  WarmPlan back;
  std::string err;
  ASSERT_TRUE(parse_warm_plan(text, &back, &err)) << err << "\n" << text;
  EXPECT_EQ(back.source, p.source);
  ASSERT_EQ(back.devices.size(), 2u);
  EXPECT_EQ(back.devices[1].device, 3);
  EXPECT_EQ(back.devices[1].peak_reserved, 22 * MiB);
  ASSERT_EQ(back.segments.size(), p.segments.size());
  for (std::size_t i = 0; i < p.segments.size(); ++i) {
    EXPECT_EQ(back.segments[i].device, p.segments[i].device);
    EXPECT_EQ(back.segments[i].small, p.segments[i].small);
    EXPECT_EQ(back.segments[i].expandable, p.segments[i].expandable);
    EXPECT_EQ(back.segments[i].bytes, p.segments[i].bytes);
    EXPECT_EQ(back.segments[i].split, p.segments[i].split);
  }
  EXPECT_EQ(back.bytes(0), 46 * MiB);
  EXPECT_EQ(back.bytes(0, true), 2 * MiB);
  EXPECT_EQ(back.bytes(3, true), 22 * MiB);
  EXPECT_EQ(back.bytes(1), 0u);
}

// A source past the cap, full of bytes that need escaping or with a multi-byte character at
// the cut, is written as one line and reads back as written.
TEST(WarmPlan, ALongOrOddSourceReadsBackAsWritten) {
  const std::string sources[] = {std::string(1023, 'a') + "\xc3\xa9 tail", std::string(300, '\xff'),
                                 "two\nlines\r and a tab\t"};
  for (const std::string& src : sources) {
    WarmPlan p;
    p.source = src;
    p.segments = {{0, false, false, 20 * MiB, {}}};
    const std::string text = format_warm_plan(p);
    WarmPlan back;
    std::string err;
    ASSERT_TRUE(parse_warm_plan(text, &back, &err)) << err << "\n" << text;
    EXPECT_LE(back.source.size(), 1024u);
    EXPECT_EQ(back.source.find_first_of("\n\r\t"), std::string::npos) << back.source;
    EXPECT_EQ(format_warm_plan(back), text);
    ASSERT_EQ(back.segments.size(), 1u);
  }
}

TEST(WarmPlan, CommentsBlankLinesAndCrlfPass) {
  WarmPlan p;
  std::string err;
  ASSERT_TRUE(parse_warm_plan(plan_text("# a comment\r\n\r\n   \nsegment 0 large classic 20971520\r\n"), &p, &err))
      << err;
  ASSERT_EQ(p.segments.size(), 1u);
  EXPECT_EQ(p.segments[0].bytes, 20 * MiB);
}

TEST(WarmPlan, EachMistakeNamesItsLine) {
  EXPECT_TRUE(has(parse_error(""), "line 0: the file is empty")) << parse_error("");
  EXPECT_TRUE(has(parse_error("Thread,Time\n"), "line 1: the first line is 'Thread,Time'"));
  const std::string bad_device = parse_error(plan_text("# ok\nsegment 1024 large classic 20971520\n"));
  EXPECT_TRUE(has(bad_device, "line 3: device '1024' is not a device ordinal from 0 to 1023")) << bad_device;
  EXPECT_TRUE(has(parse_error(plan_text("segment -1 large classic 20971520\n")), "line 2: device '-1'"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 huge classic 20971520\n")), "pool kind 'huge'"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large paged 20971520\n")), "segment kind 'paged'"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic 1000\n")), "not a multiple of 512"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic 2199023256064\n")), "from 512 to 1 TiB"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic 99999999999999999999999\n")),
                  "is not a whole number of bytes"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic +20971520\n")), "is not a whole number"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 small classic 4194304\n")),
                  "a classic small-pool segment is 2097152 bytes"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic 20971520 split 10485760,10485248\n")),
                  "add up to 20971008 bytes, not the segment's 20971520"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic 20971520 split 20971520,\n")), "ends with a comma"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic 20971520 blocks 20971520\n")), "'blocks'"));
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic\n")), "expected 'segment DEVICE"));
  EXPECT_TRUE(has(parse_error(plan_text("device 0 peak_reserved 1\ndevice 0 peak_reserved 2\n")),
                  "line 3: device 0 is described twice"));
  // Binary garbage is shown escaped, never raw.
  const std::string bin = parse_error(plan_text("\x1b]0;owned\x07 rest\n"));
  EXPECT_TRUE(has(bin, "line 2: '\\x1b]0;owned\\x07 rest' is not a plan line")) << bin;
}

TEST(WarmPlan, BoundsHold) {
  // A split into more blocks than a plan may list.
  std::string split;
  for (std::size_t i = 0; i <= kMaxWarmSplit; ++i) split += (i ? "," : "") + std::to_string(512);
  const std::size_t bytes = (kMaxWarmSplit + 1) * 512;
  EXPECT_TRUE(has(parse_error(plan_text("segment 0 large classic " + std::to_string(bytes) + " split " + split + "\n")),
                  "more than 4096 blocks"));
  // A line longer than a plan line can be.
  EXPECT_TRUE(has(parse_error(plan_text("# " + std::string(kMaxWarmPlanLine, 'x') + "\n")), "line 2: longer than"));
  // More than 64 TiB on one device.
  std::string many;
  for (int i = 0; i < 65; ++i) many += "segment 0 large classic 1099511627776\n";
  EXPECT_TRUE(has(parse_error(plan_text(many)), "line 66: device 0's segments add up to more than 64 TiB"));
  // More segments than a plan may hold.
  std::string lots;
  for (std::size_t i = 0; i <= kMaxWarmSegments; ++i) lots += "segment 1 large classic 512\n";
  EXPECT_TRUE(has(parse_error(plan_text(lots)), "more than 100000 segments"));
}

// ---- from a trace ----------------------------------------------------------------------------

std::string trace_of(const std::vector<TraceRow>& rows) {
  std::string t = std::string(trace_header()) + "\n";
  std::int64_t ns = 1764424987000000000;
  for (TraceRow r : rows) {
    r.time_ns = ns += 1000;
    if (r.action == TraceAction::free) r.detail = TraceDetail::free_sync;
    t += format_trace_row(r) + "\n";
  }
  return t;
}

TraceRow row(TraceAction a, std::uintptr_t ptr, std::size_t size, int device = 0) {
  TraceRow r;
  r.thread = 7;
  r.action = a;
  r.ptr = ptr;
  r.size = size;
  r.requested = size;
  r.device = device;
  return r;
}

TEST(WarmPlanFromTrace, ClassicSegmentsAtThePeak) {
  using A = TraceAction;
  const std::string t = trace_of({row(A::segment_alloc, 0x1000000, 20 * MiB), row(A::allocate, 0x1000000, 5 * MiB),
                                  row(A::segment_alloc, 0x9000000, 2 * MiB), row(A::allocate, 0x9000000, 4096),
                                  row(A::free, 0x1000000, 5 * MiB), row(A::segment_free, 0x1000000, 20 * MiB),
                                  row(A::segment_alloc, 0x20000000, 40 * MiB), row(A::allocate, 0x20000000, 40 * MiB),
                                  row(A::segment_alloc, 0x40000000, 20 * MiB), row(A::allocate, 0x40000000, 6 * MiB),
                                  row(A::free, 0x20000000, 40 * MiB), row(A::segment_free, 0x20000000, 40 * MiB),
                                  // Another device, smaller.
                                  row(A::segment_alloc, 0x80000000, 2 * MiB, 1)});
  std::istringstream in(t);
  WarmPlan p;
  std::string err;
  ASSERT_TRUE(warm_plan_from_trace(in, &p, &err)) << err;
  ASSERT_EQ(p.devices.size(), 2u);
  EXPECT_EQ(p.devices[0].peak_reserved, 62 * MiB);
  EXPECT_EQ(p.devices[1].peak_reserved, 2 * MiB);
  ASSERT_EQ(p.segments.size(), 4u);
  EXPECT_EQ(p.segments[0].bytes, 40 * MiB);  // device 0, largest first
  EXPECT_FALSE(p.segments[0].small);
  EXPECT_EQ(p.segments[1].bytes, 20 * MiB);
  EXPECT_EQ(p.segments[2].bytes, 2 * MiB);
  EXPECT_TRUE(p.segments[2].small);
  EXPECT_EQ(p.segments[3].device, 1);
  EXPECT_EQ(p.bytes(0), 62 * MiB);
  // What a plan file of it reads back to.
  WarmPlan back;
  ASSERT_TRUE(parse_warm_plan(format_warm_plan(p), &back, &err)) << err;
  EXPECT_EQ(back.bytes(0, false), 60 * MiB);
}

TEST(WarmPlanFromTrace, MappedPagesTakeTheKindOfTheirAllocation) {
  using A = TraceAction;
  // Small range at 0x10000000, large at 0x90000000: the rows do not say which is which; the
  // allocation each map was made for does.
  const std::string t = trace_of({row(A::segment_map, 0x10000000, 2 * MiB), row(A::allocate, 0x10000000, 4096),
                                  row(A::segment_map, 0x90000000, 16 * MiB), row(A::segment_map, 0x91000000, 16 * MiB),
                                  row(A::allocate, 0x90000000, 30 * MiB), row(A::segment_map, 0x10200000, 2 * MiB),
                                  row(A::allocate, 0x10200000, MiB), row(A::free, 0x90000000, 30 * MiB),
                                  row(A::segment_unmap, 0x90000000, 32 * MiB)});
  std::istringstream in(t);
  WarmPlan p;
  std::string err;
  ASSERT_TRUE(warm_plan_from_trace(in, &p, &err)) << err;
  EXPECT_EQ(p.devices.at(0).peak_reserved, 36 * MiB);
  EXPECT_EQ(p.bytes(0, true), 4 * MiB);    // two adjacent small runs, one stretch
  EXPECT_EQ(p.bytes(0, false), 32 * MiB);  // two adjacent large runs, one stretch
  ASSERT_EQ(p.segments.size(), 2u);
  for (const WarmSegment& s : p.segments) EXPECT_TRUE(s.expandable);
}

TEST(WarmPlanFromTrace, RefusesTracesWithoutSegmentsAndBadRows) {
  using A = TraceAction;
  std::istringstream none(trace_of({row(A::allocate, 0x1000, 4096), row(A::free, 0x1000, 4096)}));
  WarmPlan p;
  std::string err;
  EXPECT_FALSE(warm_plan_from_trace(none, &p, &err));
  EXPECT_TRUE(has(err, "records no segment")) << err;
  std::istringstream bad(trace_of({row(A::segment_alloc, 0x1000, 20 * MiB)}) + "garbage\n");
  EXPECT_FALSE(warm_plan_from_trace(bad, &p, &err));
  EXPECT_TRUE(has(err, "line 3:")) << err;
  std::istringstream huge(trace_of({row(A::segment_alloc, 0x1000, std::size_t{2} << 40)}));
  EXPECT_FALSE(warm_plan_from_trace(huge, &p, &err));
  EXPECT_TRUE(has(err, "line 2: a segment of 2199023255552 bytes, more than 1 TiB")) << err;
}

TEST(WarmPlanFile, ReadsPlansAndTracesAndRefusesOtherFiles) {
  testing::TempPath plan(".plan"), trace(".csv"), fifo(".fifo");
  std::ofstream(plan.str()) << plan_text("segment 0 large classic 20971520\n");
  std::ofstream(trace.str()) << trace_of({row(TraceAction::segment_alloc, 0x1000000, 40 * MiB)});
  WarmPlan p;
  std::string err;
  ASSERT_TRUE(load_warm_plan(plan.str(), &p, &err)) << err;
  EXPECT_EQ(p.bytes(0), 20 * MiB);
  ASSERT_TRUE(load_warm_plan(trace.str(), &p, &err)) << err;
  EXPECT_EQ(p.bytes(0), 40 * MiB);
  EXPECT_TRUE(has(p.source, "trace ")) << p.source;
  // A FIFO would block a reader forever; a directory is no file.
  ASSERT_EQ(::mkfifo(fifo.str().c_str(), 0600), 0);
  EXPECT_FALSE(load_warm_plan(fifo.str(), &p, &err));
  EXPECT_TRUE(has(err, "not a regular file")) << err;
  EXPECT_FALSE(load_warm_plan("/", &p, &err));
  EXPECT_TRUE(has(err, "not a regular file")) << err;
  EXPECT_FALSE(load_warm_plan(plan.str() + ".missing", &p, &err));
  EXPECT_TRUE(has(err, "cannot open")) << err;
  // A malformed plan names the path and the line.
  std::ofstream(plan.str()) << plan_text("segment 0 large classic 7\n");
  EXPECT_FALSE(load_warm_plan(plan.str(), &p, &err));
  EXPECT_TRUE(has(err, plan.str() + ":2: segment size '7'")) << err;
  // A trace too long to read at a pool's start (sparse: no disk used) points at `cudapool plan`.
  ASSERT_EQ(::truncate(trace.str().c_str(), static_cast<off_t>(kMaxWarmTraceFile + 1)), 0);
  EXPECT_FALSE(load_warm_plan(trace.str(), &p, &err));
  EXPECT_TRUE(has(err, trace.str() + ":1: a trace of 64 MiB is more than a warm start reads")) << err;
  EXPECT_TRUE(has(err, "cudapool plan TRACE -o PLAN")) << err;
  // A gzipped trace (as tests/traces ships them): the shim does not decompress, it says so.
  std::ofstream(trace.str(), std::ios::trunc) << std::string("\x1f\x8b\x08\x00", 4) << "compressed bytes";
  EXPECT_FALSE(load_warm_plan(trace.str(), &p, &err));
  EXPECT_TRUE(has(err, trace.str() + ":1: the file is compressed with gzip")) << err;
  EXPECT_TRUE(has(err, "cudapool plan TRACE -o PLAN")) << err;
}

TEST(WarmPlanFile, SaysWhatAFileOfNeitherKindIs) {
  testing::TempPath file(".plan");
  WarmPlan p;
  std::string err;
  // A plan with lines ahead of its magic line (a summary caught by the same redirection): where
  // the plan begins, not the trace reader's complaint about a CSV header.
  std::ofstream(file.str()) << "device 0: 1 segments, 20 MiB at the peak\nnote\n"
                            << plan_text("segment 0 large classic 20971520\n");
  EXPECT_FALSE(load_warm_plan(file.str(), &p, &err));
  EXPECT_TRUE(has(err, file.str() + ":3: a warm-start plan begins here, not on line 1")) << err;
  EXPECT_FALSE(has(err, "header")) << err;
  // Neither a plan nor a trace: both first lines it could have had.
  std::ofstream(file.str(), std::ios::trunc) << "junk\n";
  EXPECT_FALSE(load_warm_plan(file.str(), &p, &err));
  EXPECT_TRUE(has(err, file.str() + ":1: neither a warm-start plan")) << err;
  EXPECT_TRUE(has(err, "it begins 'junk'")) << err;
  // A trace with a header the reader does not know keeps the reader's own message.
  std::ofstream(file.str(), std::ios::trunc) << "Thread,Time,Action,Pointer,Size,Stream,x\n";
  EXPECT_FALSE(load_warm_plan(file.str(), &p, &err));
  EXPECT_TRUE(has(err, "header")) << err;
}

}  // namespace
}  // namespace cudapool
