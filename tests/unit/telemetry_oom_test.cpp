// OOM diagnosis: sizes formatted like PyTorch, every number present, the hint when (and only
// when) fragmentation is the likely cause.
#include <gtest/gtest.h>

#include "telemetry/oom.h"

namespace cudapool {
namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(TelemetryOom, FormatSize) {
  EXPECT_EQ(format_size(0), "0 bytes");
  EXPECT_EQ(format_size(1023), "1023 bytes");
  EXPECT_EQ(format_size(1024), "1.00 KiB");
  EXPECT_EQ(format_size(1536), "1.50 KiB");
  EXPECT_EQ(format_size(20 * MiB), "20.00 MiB");
  EXPECT_EQ(format_size(150'109'880'320ULL), "139.80 GiB");
  EXPECT_EQ(format_size(3 * 1024ULL * GiB), "3.00 TiB");
}

TEST(TelemetryOom, DiagnosisContainsTheNumbers) {
  Stats st;
  st.reserved_bytes[kAll].current = static_cast<std::int64_t>(6 * GiB);
  st.allocated_bytes[kAll].current = static_cast<std::int64_t>(2 * GiB);
  st.pending_bytes = static_cast<std::int64_t>(512 * MiB);
  PoolOptions opt;
  OomInfo info = make_oom_info(1, 1536 * MiB, 1536 * MiB + 2 * MiB, Refusal::device, st, opt, 300 * MiB, 8 * GiB);
  EXPECT_EQ(info.reserved, 6 * GiB);
  EXPECT_EQ(info.allocated, 2 * GiB);
  EXPECT_EQ(info.limit, kNoLimit);
  const std::string t = format_oom(info);
  EXPECT_TRUE(has(t, "CUDA out of memory. Tried to allocate 1.50 GiB")) << t;
  EXPECT_TRUE(has(t, "the pool asked to grow by 1.50 GiB")) << t;  // 1538 MiB prints as 1.50 GiB
  EXPECT_TRUE(has(t, "GPU 1 has a total capacity of 8.00 GiB of which 300.00 MiB is free")) << t;
  EXPECT_TRUE(has(t, "(6.00 GiB)")) << t;
  EXPECT_TRUE(has(t, "2.00 GiB is allocated and 4.00 GiB is reserved but unallocated")) << t;
  EXPECT_TRUE(has(t, "512.00 MiB")) << t;
  EXPECT_TRUE(has(t, "expandable_segments:True")) << t;  // 4 GiB idle, 1.5 GiB wanted
  EXPECT_FALSE(has(t, "limit")) << t;
  EXPECT_FALSE(has(t, "budget")) << t;
}

TEST(TelemetryOom, NoHintWhenCacheIsSmallOrExpandableIsOn) {
  Stats st;
  st.reserved_bytes[kAll].current = static_cast<std::int64_t>(4 * GiB);
  st.allocated_bytes[kAll].current = static_cast<std::int64_t>(4 * GiB - 2 * MiB);
  PoolOptions opt;
  std::string t = format_oom(make_oom_info(0, 1 * GiB, 1 * GiB, Refusal::device, st, opt, 0, 4 * GiB));
  EXPECT_FALSE(has(t, "expandable_segments")) << t;
  st.allocated_bytes[kAll].current = 0;
  opt.expandable_segments = true;
  t = format_oom(make_oom_info(0, 1 * GiB, 1 * GiB, Refusal::device, st, opt, 0, 4 * GiB));
  EXPECT_FALSE(has(t, "expandable_segments")) << t;
  opt.expandable_segments = false;
  t = format_oom(make_oom_info(0, 1 * GiB, 1 * GiB, Refusal::device, st, opt, 0, 4 * GiB));
  EXPECT_TRUE(has(t, "expandable_segments:True")) << t;
}

TEST(TelemetryOom, LimitFromFractionAndCap) {
  Stats st;
  st.reserved_bytes[kAll].current = static_cast<std::int64_t>(3 * GiB);
  st.allocated_bytes[kAll].current = static_cast<std::int64_t>(3 * GiB);
  PoolOptions opt;
  opt.per_process_memory_fraction = 0.5;
  OomInfo info = make_oom_info(0, 2 * GiB, 2 * GiB, Refusal::device, st, opt, 70 * GiB, 80 * GiB);
  EXPECT_EQ(info.limit, 40 * GiB);
  EXPECT_TRUE(has(format_oom(info), "limit is 40.00 GiB; the driver refused")) << format_oom(info);
  opt.max_reserved = 4 * GiB;
  info = make_oom_info(0, 2 * GiB, 2 * GiB, Refusal::limit, st, opt, 70 * GiB, 80 * GiB);
  EXPECT_EQ(info.limit, 4 * GiB);
  EXPECT_TRUE(has(format_oom(info), "limit is 4.00 GiB and it refused this growth")) << format_oom(info);
}

// The text says who refused, as the pool reported it: the group budget names itself.
TEST(TelemetryOom, TheGroupBudgetSaysItRefused) {
  Stats st;
  st.reserved_bytes[kAll].current = static_cast<std::int64_t>(1 * GiB);
  PoolOptions opt;
  const std::string t = format_oom(
      make_oom_info(0, 100 * MiB, 128 * MiB, Refusal::budget, st, opt, 70 * GiB, 80 * GiB));
  EXPECT_TRUE(has(t, "The group budget refused this growth")) << t;
  EXPECT_TRUE(has(t, "asked to grow by 128.00 MiB")) << t;
  EXPECT_FALSE(has(t, "limit")) << t;
  // With a cap set too, the text names the cap but does not say the driver refused.
  opt.max_reserved = 40 * GiB;
  const std::string c = format_oom(
      make_oom_info(0, 100 * MiB, 128 * MiB, Refusal::budget, st, opt, 70 * GiB, 80 * GiB));
  EXPECT_TRUE(has(c, "The pool's limit is 40.00 GiB.")) << c;
  EXPECT_FALSE(has(c, "driver refused")) << c;
  EXPECT_TRUE(has(c, "The group budget refused this growth")) << c;
}

// A refusal by the group budget names who holds it, and says when the request alone is more
// than the whole budget (then the device's free memory is beside the point).
TEST(TelemetryOom, TheGroupRefusalNamesWhoHoldsTheBudget) {
  Stats st;
  st.reserved_bytes[kAll].current = static_cast<std::int64_t>(32 * MiB);
  st.allocated_bytes[kAll].current = static_cast<std::int64_t>(32 * MiB);
  PoolOptions opt;
  OomInfo info = make_oom_info(0, 100 * MiB, 100 * MiB, Refusal::budget, st, opt, 992 * MiB, 1 * GiB);
  info.group_budget = 64 * MiB;
  info.group_own = 32 * MiB;
  std::string t = format_oom(info);
  EXPECT_TRUE(has(t, "992.00 MiB is free on the device, but the group budget is what refused")) << t;
  EXPECT_TRUE(has(t,
                  "The group budget (64.00 MiB) refused this growth: this process holds 32.00 MiB of it, no "
                  "other member holds any; 32.00 MiB of it is free."))
      << t;
  EXPECT_TRUE(has(t, "The request alone (100.00 MiB) is more than the whole budget")) << t;
  EXPECT_FALSE(has(t, "hold the rest")) << t;
  // Others and members that exited (still charged) are named with their shares.
  info.requested = info.asked = 16 * MiB;
  info.group_own = 8 * MiB;
  info.group_others = 40 * MiB;
  info.group_other_members = 2;
  info.group_exited = 12 * MiB;
  info.group_exited_members = 1;
  t = format_oom(info);
  EXPECT_TRUE(has(t,
                  "this process holds 8.00 MiB of it, the 2 other member(s) 40.00 MiB, 1 member(s) that exited "
                  "still 12.00 MiB (given back when the next member joins or is refused); 4.00 MiB of it is "
                  "free."))
      << t;
  EXPECT_FALSE(has(t, "The request alone")) << t;
  EXPECT_TRUE(has(t, "`cudapool top` shows who holds what")) << t;
}

// Memory the program mapped itself counts against the limit: with 36 GiB of it, 3 + 2 GiB of
// the pool's no longer fit under 40 GiB, and the diagnosis says why.
TEST(TelemetryOom, MemoryMappedByTheProgramCountsAgainstTheLimit) {
  Stats st;
  st.reserved_bytes[kAll].current = static_cast<std::int64_t>(3 * GiB);
  st.allocated_bytes[kAll].current = static_cast<std::int64_t>(3 * GiB);
  PoolOptions opt;
  opt.max_reserved = 40 * GiB;
  OomInfo info = make_oom_info(0, 2 * GiB, 2 * GiB, Refusal::limit, st, opt, 70 * GiB, 80 * GiB, 36 * GiB);
  const std::string text = format_oom(info);
  EXPECT_TRUE(has(text, "The program mapped 36.00 GiB itself (cuMemCreate), counted against the limit.")) << text;
  EXPECT_TRUE(has(text, "limit is 40.00 GiB and it refused")) << text;
}

}  // namespace
}  // namespace cudapool
