// Trace writer and reader without a pool: exact rows for scripted events, RMM column shape,
// strict reader errors with line numbers, and garbage that must not crash the reader.
#include <gtest/gtest.h>

#include <time.h>
#include <atomic>
#include <random>
#include <set>
#include <sstream>

#include <chrono>
#include <ctime>
#include <thread>

#include "telemetry/trace.h"
#include "telemetry_util.h"
#include "tests/unit/bounded_child.h"

namespace cudapool {
namespace {

using testing::read_lines;
using testing::split;
using testing::TempPath;

Event ev(EventKind k, std::uintptr_t ptr, std::size_t size, std::size_t requested, StreamId stream, int device = 0,
         std::int64_t dur = 0, bool on_stream = false) {
  return Event{k, device, ptr, size, requested, stream, dur, on_stream};
}

TEST(TelemetryTrace, HeaderStartsWithRmmColumns) {
  auto cols = split(trace_header(), ',');
  ASSERT_EQ(cols.size(), 11u);
  EXPECT_EQ(cols[10], "detail");
  const char* rmm[] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(cols[i], rmm[i]);
}

TEST(TelemetryTrace, ScriptedEventsGiveExactRows) {
  TempPath path;
  std::string err;
  auto w = TraceWriter::open(path.str(), &err);
  ASSERT_TRUE(w) << err;
  w->note_device(1, 141 * GiB, 4 * MiB);
  w->on_event(ev(EventKind::segment_alloc, 0x7f0000000000, 2 * MiB, 2 * MiB, 0, 1, 1500));
  w->on_event(ev(EventKind::allocate, 0x7f0000000000, 1024, 1000, 0, 1));
  w->on_event(ev(EventKind::allocate, 0x7f0000000400, 512, 3, 0x2, 1));
  w->on_event(ev(EventKind::free, 0x7f0000000000, 1024, 1000, 0, 1));
  w->on_event(ev(EventKind::free, 0x7f0000000400, 512, 3, 0x2, 1, 0, true));
  w->on_event(ev(EventKind::allocate_failure, 0, 100 * GiB, 100 * GiB, 0xdeadbeef, 1));
  w->on_event(ev(EventKind::segment_free, 0x7f0000000000, 2 * MiB, 2 * MiB, 0, 1, 700));
  w->on_event(ev(EventKind::empty_cache, 0, 2 * MiB, 0, 0, 1));
  w->note_stream(0x5000, true);
  EXPECT_EQ(w->rows(), 10u);
  w->flush();

  auto lines = read_lines(path.str());
  ASSERT_EQ(lines.size(), 11u);
  EXPECT_EQ(lines[0], trace_header());
  // Everything but Thread, Time and time_ns is determined by the events.
  const char* expect[] = {
      "device,0x0,151397597184,0x0,1,151397597184",
      "segment_alloc,0x7f0000000000,2097152,0x0,1,2097152",
      "allocate,0x7f0000000000,1024,0x0,1,1000",
      "allocate,0x7f0000000400,512,0x2,1,3",
      "free,0x7f0000000000,1024,0x0,1,1000",
      "free,0x7f0000000400,512,0x2,1,3",
      "allocate failure,0x0,107374182400,0xdeadbeef,1,107374182400",
      "segment_free,0x7f0000000000,2097152,0x0,1,2097152",
      "empty_cache,0x0,2097152,0x0,1,0",
      "stream,0x0,0,0x5000,0,0",
  };
  // The detail column: the free call's kind (cudaFree = sync, cudaFreeAsync = async), the stream's.
  const char* details[] = {"", "", "", "", "sync", "async", "", "", "", "non_blocking"};
  const std::int64_t durations[] = {0, 1500, 0, 0, 0, 0, 0, 700, 0, 0};
  std::int64_t prev_time = 0;
  // The device row's detail: the granularity and the pool's units, quoted (it holds commas).
  const std::string facts = "\"" + device_facts_text(4 * MiB) + "\"";
  EXPECT_EQ(facts.substr(0, 27), "\"granularity:4194304,min_bl");
  ASSERT_GT(lines[1].size(), facts.size());
  EXPECT_EQ(lines[1].substr(lines[1].size() - facts.size()), facts);
  lines[1].resize(lines[1].size() - facts.size());
  for (std::size_t i = 0; i < 10; ++i) {
    auto c = split(lines[i + 1], ',');
    ASSERT_EQ(c.size(), 11u) << lines[i + 1];
    std::string middle = c[2] + "," + c[3] + "," + c[4] + "," + c[5] + "," + c[6] + "," + c[7];
    EXPECT_EQ(middle, expect[i]);
    EXPECT_EQ(c[10], details[i]) << lines[i + 1];
    EXPECT_EQ(c[0].find_first_not_of("0123456789"), std::string::npos) << c[0];
    EXPECT_GT(std::stoull(c[0]), 0u);  // a real thread id
    EXPECT_EQ(std::stoll(c[9]), durations[i]);
    std::int64_t t = std::stoll(c[8]);
    EXPECT_GE(t, prev_time);  // one thread: times never go backwards
    prev_time = t;
    EXPECT_EQ(c[1].size(), 15u) << c[1];  // HH:MM:SS.uuuuuu
  }
}

TEST(TelemetryTrace, FormatRowRoundTripsThroughReader) {
  TraceRow r;
  r.thread = 4242;
  r.time_ns = 1'700'000'000'123'456'789LL;
  r.action = TraceAction::segment_map;
  r.ptr = 0x7fffdeadb000;
  r.size = 20 * MiB;
  r.stream = 0x55aa;
  r.device = 3;
  r.requested = 123;
  r.duration_ns = 99;
  std::istringstream in(std::string(trace_header()) + "\n" + format_trace_row(r) + "\n");
  TraceReader reader(in);
  TraceRow back;
  ASSERT_TRUE(reader.next(&back)) << reader.error();
  EXPECT_FALSE(reader.rmm_only());
  EXPECT_EQ(back.thread, r.thread);
  EXPECT_EQ(back.time_ns, r.time_ns);
  EXPECT_EQ(back.action, r.action);
  EXPECT_EQ(back.ptr, r.ptr);
  EXPECT_EQ(back.size, r.size);
  EXPECT_EQ(back.stream, r.stream);
  EXPECT_EQ(back.device, r.device);
  EXPECT_EQ(back.requested, r.requested);
  EXPECT_EQ(back.duration_ns, r.duration_ns);
  EXPECT_FALSE(reader.next(&back));
  EXPECT_EQ(reader.error(), "");
}

TEST(TelemetryTrace, PolicyAndFreeKindsRoundTripThroughReader) {
  // A policy with commas, brackets and a quote survives the quoted detail field.
  const std::string conf = "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4],log_file:/a\"b";
  TraceRow policy;
  policy.action = TraceAction::policy;
  policy.detail = TraceDetail::policy;
  TraceRow f1;
  f1.action = TraceAction::free;
  f1.detail = TraceDetail::free_sync;
  TraceRow f2 = f1;
  f2.detail = TraceDetail::free_async;
  TraceRow st;
  st.action = TraceAction::stream;
  st.detail = TraceDetail::stream_blocking;
  std::istringstream in(std::string(trace_header()) + "\n" + format_trace_row(policy, conf) + "\n" +
                        format_trace_row(f1) + "\n" + format_trace_row(f2) + "\n" + format_trace_row(st) + "\n");
  TraceReader reader(in);
  TraceRow back;
  ASSERT_TRUE(reader.next(&back)) << reader.error();
  EXPECT_EQ(back.action, TraceAction::policy);
  ASSERT_TRUE(reader.policy().has_value());
  EXPECT_EQ(*reader.policy(), conf);
  ASSERT_TRUE(reader.next(&back)) << reader.error();
  EXPECT_EQ(back.detail, TraceDetail::free_sync);
  ASSERT_TRUE(reader.next(&back)) << reader.error();
  EXPECT_EQ(back.detail, TraceDetail::free_async);
  ASSERT_TRUE(reader.next(&back)) << reader.error();
  EXPECT_EQ(back.action, TraceAction::stream);
  EXPECT_EQ(back.detail, TraceDetail::stream_blocking);
  EXPECT_FALSE(reader.next(&back));
  EXPECT_EQ(reader.error(), "");
  EXPECT_EQ(reader.columns(), 11);
}

TEST(TelemetryTrace, ReadsTracesWrittenBeforeTheDetailColumn) {
  std::istringstream in(
      "Thread,Time,Action,Pointer,Size,Stream,device,requested,time_ns,duration_ns\n"
      "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,0\n"
      "1,00:00:00.000002,free,0x10,512,0x0,0,500,2,0\n");
  TraceReader reader(in);
  TraceRow r;
  ASSERT_TRUE(reader.next(&r)) << reader.error();
  ASSERT_TRUE(reader.next(&r)) << reader.error();
  EXPECT_EQ(r.action, TraceAction::free);
  EXPECT_EQ(r.detail, TraceDetail::none);  // unknown: the old format does not say
  EXPECT_FALSE(reader.next(&r));
  EXPECT_EQ(reader.error(), "");
  EXPECT_EQ(reader.columns(), 10);
  EXPECT_FALSE(reader.policy().has_value());
}

// A policy row in a trace without the detail column is still a policy row (its text unknown):
// formatted again, it reads back in the current format.
TEST(TelemetryTrace, PolicyRowWithoutTheDetailColumnRoundTrips) {
  std::istringstream in(
      "Thread,Time,Action,Pointer,Size,Stream,device,requested,time_ns,duration_ns\n"
      "0,00:00:00.000001,policy,0x0,0,0x0,0,0,1,0\n");
  TraceReader reader(in);
  TraceRow r;
  ASSERT_TRUE(reader.next(&r)) << reader.error();
  EXPECT_EQ(r.action, TraceAction::policy);
  EXPECT_EQ(r.detail, TraceDetail::policy);
  EXPECT_FALSE(reader.policy().has_value());
  std::istringstream again(std::string(trace_header()) + "\n" + format_trace_row(r) + "\n");
  TraceReader r2(again);
  TraceRow back;
  ASSERT_TRUE(r2.next(&back)) << r2.error();
  EXPECT_EQ(back.action, TraceAction::policy);
}

TEST(TelemetryTrace, WriterPutsThePolicyRowFirst) {
  TempPath path;
  std::string err;
  auto w = TraceWriter::open(path.str(), &err);
  ASSERT_TRUE(w) << err;
  w->note_policy("max_split_size_mb:128,garbage_collection_threshold:0.8");
  w->on_event(ev(EventKind::allocate, 0x1000, 512, 500, 0));
  w->flush();
  std::vector<TraceRow> rows;
  TraceMeta meta;
  ASSERT_TRUE(read_trace_file(path.str(), &rows, &err, &meta)) << err;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].action, TraceAction::policy);
  ASSERT_TRUE(meta.policy.has_value());
  EXPECT_EQ(*meta.policy, "max_split_size_mb:128,garbage_collection_threshold:0.8");
  EXPECT_EQ(meta.columns, 11);
  EXPECT_LE(rows[0].time_ns, rows[1].time_ns);
}

TEST(TelemetryTrace, TimeColumnAgreesWithTimeNs) {
  TraceRow r;
  r.time_ns = 1'700'000'000'123'456'789LL;
  auto cols = split(format_trace_row(r), ',');
  // Time is local wall-clock time; compare the parts that do not depend on the time zone
  // offset (whole minutes in every zone this runs in) and the microseconds.
  EXPECT_EQ(cols[1].substr(6), "20.123456");  // 1'700'000'000 s = ...:13:20 UTC
  EXPECT_EQ(cols[8], "1700000000123456789");
}

TEST(TelemetryTrace, ReadsPlainRmmLog) {
  std::istringstream in(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "140573312345856,10:11:12.500000,allocate,0x7f8a40000000,1024,0x0\n"
      "140573312345856,10:11:12.600001,allocate failure,0x0,99999999999,0x2\n"
      "140573312345856,10:11:13.000000,free,0x7f8a40000000,1024,0x0\r\n");
  TraceReader reader(in);
  std::vector<TraceRow> rows;
  TraceRow r;
  while (reader.next(&r)) rows.push_back(r);
  ASSERT_EQ(reader.error(), "");
  EXPECT_TRUE(reader.rmm_only());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].action, TraceAction::allocate);
  EXPECT_EQ(rows[0].ptr, 0x7f8a40000000u);
  EXPECT_EQ(rows[0].requested, 1024u);  // RMM logs have no separate request size
  EXPECT_EQ(rows[0].time_ns, ((10 * 60 + 11) * 60 + 12) * 1'000'000'000LL + 500'000'000LL);
  EXPECT_EQ(rows[1].action, TraceAction::allocate_failure);
  EXPECT_EQ(rows[1].stream, 2u);
  EXPECT_EQ(rows[2].action, TraceAction::free);
  EXPECT_EQ(rows[2].time_ns - rows[0].time_ns, 500'000'000LL);
}

struct BadCase {
  std::string text;
  const char* expect;  // substring of the error
};

TEST(TelemetryTrace, ReaderRejectsMalformedInputWithLineNumber) {
  const std::string good_rmm = "Thread,Time,Action,Pointer,Size,Stream\n";
  const std::string good = std::string(trace_header()) + "\n";
  const std::string row = "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,0,\n";
  const std::string old_header = "Thread,Time,Action,Pointer,Size,Stream,device,requested,time_ns,duration_ns\n";
  const BadCase cases[] = {
      {"", "line 1: empty file"},
      {"Thread,Time,Action\n", "line 1: header is"},
      {"thread,time,action,pointer,size,stream\n", "line 1: header is"},
      {(good_rmm + "1,00:00:00.000001,allocate,0x10,512\n"), "line 2: has 5 columns, expected 6"},
      {(good_rmm + "1,00:00:00.000001,allocate,0x10,512,0x0,7\n"), "line 2: more than 6 columns"},
      {(good_rmm + "x,00:00:00.000001,allocate,0x10,512,0x0\n"), "line 2: column 1 (Thread)"},
      {(good_rmm + "1,0:00:00.000001,allocate,0x10,512,0x0\n"), "line 2: column 2 (Time)"},
      {(good_rmm + "1,25:00:00.000001,allocate,0x10,512,0x0\n"), "column 2 (Time)"},
      {(good_rmm + "1,00:00:00.000001,alloc,0x10,512,0x0\n"), "line 2: column 3 (Action)"},
      {(good_rmm + "1,00:00:00.000001,segment_alloc,0x10,512,0x0\n"), "cudapool action, but the header is RMM"},
      {(good_rmm + "1,00:00:00.000001,allocate,0xZZ,512,0x0\n"), "line 2: column 4 (Pointer)"},
      {(good_rmm + "1,00:00:00.000001,allocate,0x10,-5,0x0\n"), "line 2: column 5 (Size)"},
      {(good_rmm + "1,00:00:00.000001,allocate,0x10,99999999999999999999999,0x0\n"), "column 5 (Size)"},
      {(good_rmm + "1,00:00:00.000001,allocate,0x10,512,0xq\n"), "line 2: column 6 (Stream)"},
      {(good + row + row + "\n" + row), "line 4: empty line"},
      {(good + row + "1,00:00:00.000001,allocate,0x10,512,0x0,-1,500,1,0,\n"), "line 3: column 7 (device)"},
      {(good + "1,00:00:00.000001,allocate,0x10,512,0x0,0,,1,0,\n"), "line 2: column 8 (requested)"},
      {(good + "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1.5,0,\n"), "line 2: column 9 (time_ns)"},
      {(good + "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,-3,\n"), "line 2: column 10 (duration_ns)"},
      {(good + "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,0\n"), "line 2: has 10 columns, expected 11"},
      {(old_header + "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,0,\n"), "line 2: more than 10 columns"},
      {(good + "1,00:00:00.000001,free,0x10,512,0x0,0,500,1,0,later\n"),
       "column 11 (detail): 'later' is not a free kind"},
      {(good + "1,00:00:00.000001,stream,0x0,0,0x10,0,0,1,0,async\n"), "is not a stream kind"},
      {(good + "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,0,sync\n"), "must be empty for this action"},
      {(good + "1,00:00:00.000001,policy,0x0,0,0x0,0,0,1,0,max_split_size_mb:64\n"), "is not a quoted policy string"},
      {(good + "1,00:00:00.000001,policy,0x0,0,0x0,0,0,1,0,\"a\"b\"\n"), "lone '\"'"},
  };
  for (const BadCase& c : cases) {
    std::istringstream in(c.text);
    TraceReader reader(in);
    TraceRow r;
    while (reader.next(&r)) {
    }
    EXPECT_NE(reader.error().find(c.expect), std::string::npos) << "input:\n" << c.text << "error: " << reader.error();
  }
}

TEST(TelemetryTrace, ReaderHandlesManyWindowsAndAMissingFinalNewline) {
  // ~9 MB: rows straddle the reader's 1 MiB window boundaries many times.
  std::string text = std::string(trace_header()) + "\n";
  TraceRow r;
  r.thread = 7;
  r.time_ns = 1'700'000'000'000'000'000LL;
  constexpr int kRows = 100000;
  for (int i = 0; i < kRows; ++i) {
    r.ptr = 0x7f0000000000 + static_cast<std::uintptr_t>(i) * 512;
    r.size = static_cast<std::size_t>(i);
    text += format_trace_row(r);
    if (i + 1 < kRows) text += "\n";  // no newline after the last row
  }
  std::istringstream in(text);
  TraceReader reader(in);
  TraceRow got;
  int n = 0;
  while (reader.next(&got)) {
    ASSERT_EQ(got.size, static_cast<std::size_t>(n)) << "row " << n;
    ASSERT_EQ(got.ptr, 0x7f0000000000 + static_cast<std::uintptr_t>(n) * 512);
    ++n;
  }
  EXPECT_EQ(reader.error(), "");
  EXPECT_EQ(n, kRows);
  EXPECT_EQ(reader.line(), static_cast<std::size_t>(kRows + 1));
}

TEST(TelemetryTrace, ReaderRefusesAnEndlessLine) {
  std::istringstream in(std::string(trace_header()) + "\n" + std::string(3 << 20, '7'));
  TraceReader reader(in);
  TraceRow r;
  EXPECT_FALSE(reader.next(&r));
  EXPECT_NE(reader.error().find("line 2: line longer than"), std::string::npos) << reader.error();
}

TEST(TelemetryTrace, ReadTraceFileNamesPathAndLine) {
  TempPath path;
  {
    std::ofstream out(path.str());
    out << trace_header() << "\n1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,0,\nbroken\n";
  }
  std::vector<TraceRow> rows;
  std::string err;
  EXPECT_FALSE(read_trace_file(path.str(), &rows, &err));
  EXPECT_EQ(err.rfind(path.str() + ":3: ", 0), 0u) << err;
  EXPECT_FALSE(read_trace_file(path.str() + ".missing", &rows, &err));
  EXPECT_NE(err.find("cannot open"), std::string::npos);
}

TEST(TelemetryTrace, GarbageNeverCrashesTheReader) {
  std::mt19937 rng(12345);
  const std::string alphabet = "0123456789abcdefx,:.\n\r -allocatefreeQ\xff";
  const std::string valid = std::string(trace_header()) + "\n" +
                            "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,0,\n1,00:00:00.000002,policy,0x0,0,0x0,0,"
                            "0,2,0,\"a:1,b\"\"c\"\n";
  int errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = valid;
    // Mutate a valid trace: flip, insert or delete characters.
    std::uniform_int_distribution<int> n_mut(1, 6);
    for (int m = n_mut(rng); m > 0; --m) {
      std::uniform_int_distribution<std::size_t> pos(0, text.size());
      std::size_t p = pos(rng);
      char c = alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
      switch (rng() % 3) {
        case 0:
          if (p < text.size()) text[p] = c;
          break;
        case 1: text.insert(text.begin() + static_cast<long>(p), c); break;
        default:
          if (p < text.size()) text.erase(p, 1);
          break;
      }
    }
    std::istringstream in(text);
    TraceReader reader(in);
    TraceRow r;
    std::size_t n = 0;
    while (reader.next(&r)) ++n;
    if (!reader.error().empty()) {
      ++errors;
      EXPECT_EQ(reader.error().rfind("line ", 0), 0u) << reader.error();
    }
    EXPECT_LE(n, 3u);
  }
  EXPECT_GT(errors, 1000);  // most mutations break something, and each is reported
}

TEST(TelemetryTrace, ConcurrentWritersLoseNothingAndFlushBySize) {
  TempPath path;
  std::string err;
  TraceWriter::Options opt;
  opt.buffer_records = 64;  // force many size-triggered flushes
  auto w = TraceWriter::open(path.str(), opt, &err);
  ASSERT_TRUE(w) << err;
  constexpr int kThreads = 4, kPerThread = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i)
        w->on_event(ev(EventKind::allocate, 0x1000u * static_cast<unsigned>(t * kPerThread + i + 1), 512, 512,
                       static_cast<StreamId>(t)));
    });
  }
  // Explicit flushes racing with producers, the formatter thread and back-pressure.
  std::atomic<bool> done{false};
  std::thread flusher([&] {
    while (!done.load()) w->flush();
  });
  for (auto& th : threads) th.join();
  done.store(true);
  flusher.join();
  w.reset();  // destructor flushes
  std::vector<TraceRow> rows;
  ASSERT_TRUE(read_trace_file(path.str(), &rows, &err)) << err;
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(kThreads * kPerThread));
  std::vector<int> per_stream(kThreads, 0);
  std::vector<std::uintptr_t> last_ptr(kThreads, 0);
  std::set<std::uintptr_t> ptrs;
  std::set<std::uint64_t> tids;
  for (const auto& r : rows) {
    ASSERT_LT(r.stream, static_cast<std::uintptr_t>(kThreads));
    ++per_stream[r.stream];
    // Each thread's events appear in the order it produced them (buffers stay FIFO).
    EXPECT_GT(r.ptr, last_ptr[r.stream]);
    last_ptr[r.stream] = r.ptr;
    ptrs.insert(r.ptr);
    tids.insert(r.thread);
  }
  for (int c : per_stream) EXPECT_EQ(c, kPerThread);
  EXPECT_EQ(ptrs.size(), rows.size());  // every event exactly once
  EXPECT_EQ(tids.size(), static_cast<std::size_t>(kThreads));
}

TEST(TelemetryTrace, RowsReachTheFileWithoutAnExplicitFlush) {
  // The formatter thread writes recent rows periodically, so `tail -f` and a crash that skips
  // every exit path (SIGKILL) still see nearly everything.
  TempPath path;
  std::string err;
  auto w = TraceWriter::open(path.str(), &err);
  ASSERT_TRUE(w) << err;
  for (std::uintptr_t i = 0; i < 10; ++i) w->on_event(ev(EventKind::allocate, 0x1000 + i, 512, 512, 0));
  std::size_t lines = 0;
  for (int tries = 0; tries < 100 && lines < 11; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    lines = read_lines(path.str()).size();
  }
  EXPECT_EQ(lines, 11u);  // header + 10 rows, within 2 s (the period is 200 ms)
}

std::int64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

TEST(TelemetryTrace, TimeNsIsWallClockTime) {
  TempPath path;
  std::string err;
  // open() pairs the wall clock with the stamp clock, flush() takes the second anchor of the
  // interpolation: a thread preempted inside either shifts every row by up to that long, so
  // their bracketing windows widen the slack by exactly as much as a loaded machine costs.
  const std::int64_t open_before = realtime_ns();
  auto w = TraceWriter::open(path.str(), &err);
  const std::int64_t open_ns = realtime_ns() - open_before;
  ASSERT_TRUE(w) << err;
  std::vector<std::pair<std::int64_t, std::int64_t>> windows;  // [before, after] each event
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3 + 7 * i));
    const std::int64_t before = realtime_ns();
    w->on_event(ev(EventKind::allocate, 0x1000 + static_cast<std::uintptr_t>(i), 512, 512, 0));
    windows.emplace_back(before, realtime_ns());
  }
  const std::int64_t flush_before = realtime_ns();
  w->flush();
  const std::int64_t flush_ns = realtime_ns() - flush_before;
  std::vector<TraceRow> rows;
  ASSERT_TRUE(read_trace_file(path.str(), &rows, &err)) << err;
  ASSERT_EQ(rows.size(), 5u);
  // 2 ms for interpolation and the writer thread's own anchors, plus the measured windows. What
  // the test proves needs far less precision: wall-clock time, not some other clock (a monotonic
  // clock is off by the machine's uptime, days), each row inside its own window (the rows are 10 ms
  // or more apart, so a row stamped with another event's time fails while the machine is idle).
  const std::int64_t slack = 2'000'000 + open_ns + flush_ns;
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_GE(rows[i].time_ns, windows[i].first - slack) << i << " (slack " << slack << " ns)";
    EXPECT_LE(rows[i].time_ns, windows[i].second + slack) << i << " (slack " << slack << " ns)";
    if (i > 0) {
      EXPECT_GE(rows[i].time_ns, rows[i - 1].time_ns) << i;
    }
  }
}

TEST(TelemetryTrace, OpenFailsWithReason) {
  std::string err;
  auto w = TraceWriter::open("/dev/null/x/trace.csv", &err);
  EXPECT_FALSE(w);
  EXPECT_NE(err.find("/dev/null/x/trace.csv"), std::string::npos) << err;
}

TEST(TelemetryTrace, RefusesToWriteThroughASymbolicLink) {
  testing::Victim victim;
  TempPath path;
  ASSERT_EQ(::symlink(victim.str().c_str(), path.str().c_str()), 0);
  std::string err;
  auto w = TraceWriter::open(path.str(), &err);
  EXPECT_FALSE(w);
  EXPECT_NE(err.find("'" + path.str() + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("refusing to write through a symbolic link"), std::string::npos) << err;
  EXPECT_TRUE(victim.untouched());
  EXPECT_TRUE(testing::is_symlink(path.str()));
}

// A FIFO at the trace's path would block open(2) until someone reads it: refused at once.
TEST(TelemetryTrace, RefusesAFifoWithoutBlocking) {
  TempPath path;
  ASSERT_EQ(::mkfifo(path.str().c_str(), 0600), 0);
  const testing::BoundedRun r = testing::run_bounded([&] {
    std::string err;
    return TraceWriter::open(path.str(), &err) ? std::string("opened") : err;
  });
  ASSERT_TRUE(r.finished) << r.describe();
  EXPECT_EQ(r.answer, "cannot open trace file '" + path.str() +
                          "': not a regular file (a FIFO): give the path of a regular file");
  // Reading a FIFO as a trace would block the same way.
  const testing::BoundedRun read = testing::run_bounded([&] {
    std::vector<TraceRow> rows;
    std::string err;
    return read_trace_file(path.str(), &rows, &err) ? std::string("read") : err;
  });
  ASSERT_TRUE(read.finished) << read.describe();
  EXPECT_NE(read.answer.find("not a regular file (a FIFO)"), std::string::npos) << read.answer;
}

// Another user's file at the trace's path (mode 0666, in /tmp) is neither emptied nor written.
TEST(TelemetryTrace, NeverWritesAnotherUsersFile) {
  testing::ForeignFile theirs(".csv");
  if (!theirs.given()) GTEST_SKIP() << "cannot give a file to uid 65534 (needs root)";
  std::string err;
  auto w = TraceWriter::open(theirs.str(), &err);
  EXPECT_FALSE(w);
  EXPECT_NE(err.find("cannot open trace file '" + theirs.str() + "': owned by uid 65534"), std::string::npos) << err;
  EXPECT_NE(err.find("remove it or choose another path"), std::string::npos) << err;
  EXPECT_TRUE(theirs.untouched());
}

TEST(TelemetryTrace, NewFileIsTheOwnersOnlyAndClosedOnExec) {
  TempPath path;
  std::string err;
  auto w = TraceWriter::open(path.str(), &err);
  ASSERT_TRUE(w) << err;
  EXPECT_EQ(testing::file_mode(path.str()) & 077, 0);  // no access for group or others, whatever the umask
  EXPECT_EQ(testing::file_mode(path.str()) & 0600, 0600);
  EXPECT_EQ(testing::cloexec_of_open_file(path.str()), 1);
}

TEST(TelemetryTrace, PathPatternIsExpanded) {
  TempPath base;
  std::string err;
  auto w = TraceWriter::open(base.str() + ".%p", &err);
  ASSERT_TRUE(w) << err;
  EXPECT_EQ(w->path(), base.str() + "." + std::to_string(::getpid()));
  std::string p = w->path();
  w.reset();
  EXPECT_EQ(testing::read_lines(p).size(), 1u);  // the header
  std::remove(p.c_str());
  // %t: the Unix time in seconds, as for the log and summary files.
  const long long before = std::time(nullptr);
  w = TraceWriter::open(base.str() + ".%t", &err);
  ASSERT_TRUE(w) << err;
  p = w->path();
  w.reset();
  std::remove(p.c_str());
  const std::string stamp = p.substr(base.str().size() + 1);
  ASSERT_FALSE(stamp.empty());
  ASSERT_EQ(stamp.find_first_not_of("0123456789"), std::string::npos) << p;
  EXPECT_GE(std::stoll(stamp), before);
  EXPECT_LE(std::stoll(stamp), before + 5);
}

TEST(TelemetryTrace, ACutLastLineEndsTheReadWithAWarning) {
  // A program killed while its trace was written leaves a partial last row, without a newline.
  const std::string row = "1,00:00:00.000001,allocate,0x10,512,0x0,0,500,1,0,\n";
  const std::string text = std::string(trace_header()) + "\n" + row + row + "1,00:00:00.000001,allocate,0x10,51";
  std::istringstream in(text);
  TraceReader reader(in);
  TraceRow r;
  int n = 0;
  while (reader.next(&r)) ++n;
  EXPECT_EQ(n, 2);
  EXPECT_EQ(reader.error(), "");
  EXPECT_NE(reader.warning().find("line 4: the last line is cut short"), std::string::npos) << reader.warning();
  EXPECT_NE(reader.warning().find("read up to line 3"), std::string::npos) << reader.warning();
  // The same bytes with a newline after them are a malformed row, not a cut one.
  std::istringstream whole(text + "\n");
  TraceReader strict(whole);
  while (strict.next(&r)) {
  }
  EXPECT_NE(strict.error().find("line 4:"), std::string::npos) << strict.error();
  EXPECT_EQ(strict.warning(), "");
}

TEST(TelemetryTrace, ABinaryHeaderIsShownEscaped) {
  std::istringstream in(
      std::string("\x7f"
                  "ELF\x02\x01\x01\x1b[2J\xff\n",
                  14));
  TraceReader reader(in);
  TraceRow r;
  EXPECT_FALSE(reader.next(&r));
  EXPECT_NE(reader.error().find("'\\x7fELF\\x02\\x01\\x01\\x1b[2J\\xff'"), std::string::npos) << reader.error();
  for (char c : reader.error()) EXPECT_TRUE(c == '\n' || (static_cast<unsigned char>(c) >= 0x20)) << reader.error();
  EXPECT_EQ(reader.error().find('\x1b'), std::string::npos);
}

TEST(TelemetryTrace, DeviceFactsRoundTripThroughReader) {
  TraceRow dev;
  dev.action = TraceAction::device;
  dev.device = 3;
  dev.size = 16 * GiB;
  dev.requested = dev.size;
  dev.detail = TraceDetail::device_facts;
  const std::string text = std::string(trace_header()) + "\n" + format_trace_row(dev, device_facts_text(4 * MiB)) +
                           "\n1,00:00:00.000001,device,0x0,100,0x0,5,100,1,0,\n";
  std::istringstream in(text);
  TraceReader reader(in);
  TraceRow r;
  ASSERT_TRUE(reader.next(&r)) << reader.error();
  EXPECT_EQ(r.detail, TraceDetail::device_facts);
  ASSERT_TRUE(reader.next(&r)) << reader.error();  // an older device row: no facts
  EXPECT_EQ(r.detail, TraceDetail::none);
  EXPECT_FALSE(reader.next(&r));
  EXPECT_EQ(reader.error(), "");
  ASSERT_EQ(reader.device_facts().size(), 1u);
  EXPECT_EQ(reader.device_facts().at(3), device_facts_text(4 * MiB));
  EXPECT_NE(device_facts_text(4 * MiB).find("granularity:4194304,min_block:512,"), std::string::npos);
}

TEST(TelemetryTrace, CallSitesRoundTripOncePerSite) {
  TraceRow a;
  a.action = TraceAction::allocate;
  a.ptr = 0x1000;
  a.size = 512;
  a.requested = 500;
  a.site = 1;
  const std::string site = "app+0x6464 main;libc.so.6+0x27249";
  std::string text = std::string(trace_header()) + "\n" + format_trace_row(a, site) + "\n";
  a.ptr = 0x2000;
  text += format_trace_row(a, site) + "\n";
  a.ptr = 0x3000;
  text += format_trace_row(a, "app+0x10") + "\n";
  a.site = 0;
  text += format_trace_row(a) + "\n";
  std::istringstream in(text);
  TraceReader reader(in);
  TraceRow r;
  std::vector<std::uint32_t> ids;
  while (reader.next(&r)) ids.push_back(r.site);
  ASSERT_EQ(reader.error(), "");
  EXPECT_EQ(ids, (std::vector<std::uint32_t>{1, 1, 2, 0}));
  ASSERT_EQ(reader.sites().size(), 2u);
  EXPECT_EQ(reader.sites()[0], site);
  EXPECT_EQ(reader.sites()[1], "app+0x10");
}

// Pinned host memory rows: their own actions, written and read back like any row.
TEST(TraceFormat, PinnedRowsRoundTrip) {
  for (TraceAction a : {TraceAction::pinned_allocate, TraceAction::pinned_free}) {
    TraceRow row;
    row.thread = 9;
    row.time_ns = 1764424987512345678;
    row.action = a;
    row.ptr = 0x7f0000001000;
    row.size = 20480;
    row.requested = 20000;
    row.device = 3;
    const std::string line = format_trace_row(row);
    EXPECT_NE(line.find(std::string(",") + trace_action_name(a) + ",0x7f0000001000,20480,0x0,3,20000,"),
              std::string::npos)
        << line;
    std::istringstream in(std::string(trace_header()) + "\n" + line + "\n");
    TraceReader reader(in);
    TraceRow back;
    ASSERT_TRUE(reader.next(&back)) << reader.error();
    EXPECT_EQ(back.action, a);
    EXPECT_EQ(back.ptr, row.ptr);
    EXPECT_EQ(back.size, row.size);
    EXPECT_EQ(back.requested, row.requested);
    EXPECT_EQ(back.device, 3);
  }
}

}  // namespace
}  // namespace cudapool
