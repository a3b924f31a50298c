// The shared fakes behave as documented (other engineers' tests rely on them).
#include <gtest/gtest.h>

#include "tests/support/fake_fence.h"
#include "tests/support/fake_upstream.h"

using namespace cudapool;
using cudapool::testing::FakeFence;
using cudapool::testing::FakeUpstream;

TEST(FakeUpstream, CountsAndCapacity) {
  FakeUpstream up(10 * MiB);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(up.allocate(8 * MiB, &a), UpstreamStatus::ok);
  EXPECT_EQ(up.allocate(4 * MiB, &b), UpstreamStatus::out_of_memory);
  EXPECT_EQ(up.bytes_held(), 8 * MiB);
  std::size_t f = 0, t = 0;
  up.mem_info(&f, &t);
  EXPECT_EQ(f, 2 * MiB);
  EXPECT_EQ(t, 10 * MiB);
  up.release(a, 8 * MiB);
  EXPECT_EQ(up.bytes_held(), 0u);
  up.release(a, 8 * MiB);  // second release of the same base is a caller bug, counted
  EXPECT_EQ(up.bad_calls(), 1u);
  up.fail_next(1);
  EXPECT_EQ(up.allocate(512, &b), UpstreamStatus::out_of_memory);
  EXPECT_EQ(up.allocate(512, &b), UpstreamStatus::ok);
  EXPECT_EQ(up.allocate_calls(), 4u);
  up.release(b, 512);
  EXPECT_EQ(up.segments_held(), 0u);
}

TEST(FakeUpstream, BackedMemoryIsWritableAndSegmentsDoNotTouch) {
  FakeUpstream up(64 * MiB, true);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(up.allocate(2 * MiB, &a), UpstreamStatus::ok);
  ASSERT_EQ(up.allocate(2 * MiB, &b), UpstreamStatus::ok);
  static_cast<char*>(a)[2 * MiB - 1] = 7;
  EXPECT_EQ(static_cast<char*>(a)[2 * MiB - 1], 7);
  up.release(a, 2 * MiB);
  up.release(b, 2 * MiB);
  EXPECT_EQ(up.bad_calls(), 0u);
}

TEST(FakeUpstream, MapUnmapAccounting) {
  FakeUpstream up(64 * MiB);
  up.set_granularity(2 * MiB);
  void* r = nullptr;
  ASSERT_EQ(up.reserve(32 * MiB, 2 * MiB, &r), UpstreamStatus::ok);
  auto* base = static_cast<char*>(r);
  ASSERT_EQ(up.map(base + 2 * MiB, 4 * MiB), UpstreamStatus::ok);  // one 4 MiB unit
  ASSERT_EQ(up.map(base + 6 * MiB, 2 * MiB), UpstreamStatus::ok);  // and a 2 MiB one
  EXPECT_EQ(up.bytes_mapped(), 6 * MiB);
  EXPECT_EQ(up.map(base + 4 * MiB, 2 * MiB), UpstreamStatus::error);  // already mapped
  EXPECT_EQ(up.map(base, 4 * MiB), UpstreamStatus::error);            // overlaps the first unit
  up.unmap(base + 2 * MiB, 2 * MiB);                                  // half of a physical allocation: refused
  EXPECT_EQ(up.bytes_mapped(), 6 * MiB);
  EXPECT_EQ(up.bad_calls(), 3u);
  up.unmap(base + 6 * MiB, 2 * MiB);
  EXPECT_EQ(up.bytes_mapped(), 4 * MiB);
  up.unreserve(r, 32 * MiB);  // still a unit mapped: refused
  EXPECT_EQ(up.bad_calls(), 4u);
  up.unmap(base + 2 * MiB, 4 * MiB);
  up.unreserve(r, 32 * MiB);
  EXPECT_EQ(up.reservations_held(), 0u);
  EXPECT_EQ(up.bad_calls(), 4u);
}

// A move takes whole units and keeps each one's size at the new address, like cuMemUnmap +
// cuMemMap of the same handles; anything else is a bad call and changes nothing.
TEST(FakeUpstream, MovesKeepUnits) {
  FakeUpstream up(64 * MiB);
  up.set_granularity(2 * MiB);
  void* r = nullptr;
  ASSERT_EQ(up.reserve(64 * MiB, 2 * MiB, &r), UpstreamStatus::ok);
  auto* base = static_cast<char*>(r);
  ASSERT_EQ(up.map(base, 4 * MiB), UpstreamStatus::ok);
  ASSERT_EQ(up.map(base + 4 * MiB, 2 * MiB), UpstreamStatus::ok);
  EXPECT_EQ(up.move(base, base + 32 * MiB, 2 * MiB), UpstreamStatus::error);  // half a unit
  EXPECT_EQ(up.move(base, base + 4 * MiB, 4 * MiB), UpstreamStatus::error);   // onto a mapped unit
  EXPECT_EQ(up.bad_calls(), 2u);
  ASSERT_EQ(up.move(base, base + 32 * MiB, 6 * MiB), UpstreamStatus::ok);
  EXPECT_EQ(up.units_moved(), 2u);
  EXPECT_EQ(up.unit_sizes(), (std::vector<std::size_t>{4 * MiB, 2 * MiB}));
  EXPECT_EQ(up.bytes_mapped(), 6 * MiB);
  up.unmap(base + 32 * MiB, 4 * MiB);  // the moved 4 MiB unit, whole
  up.unmap(base + 36 * MiB, 2 * MiB);
  EXPECT_EQ(up.bytes_mapped(), 0u);
  EXPECT_EQ(up.bad_calls(), 2u);
}

// A range reserved with a larger page is mapped and unmapped only in whole pages of it, at page
// offsets from its base: anything else breaks the pool's promise and counts as a bad call.
TEST(FakeUpstream, LargePagesAreMappedWhole) {
  FakeUpstream up(256 * MiB);
  up.set_granularity(2 * MiB);
  void* r = nullptr;
  EXPECT_EQ(up.reserve(100 * MiB, 3 * MiB, &r), UpstreamStatus::error);   // not a multiple of 2 MiB
  EXPECT_EQ(up.reserve(100 * MiB, 40 * MiB, &r), UpstreamStatus::error);  // does not divide the range
  EXPECT_EQ(up.bad_calls(), 2u);
  ASSERT_EQ(up.reserve(100 * MiB, 20 * MiB, &r), UpstreamStatus::ok);
  auto* base = static_cast<char*>(r);
  EXPECT_EQ(up.map(base + 2 * MiB, 20 * MiB), UpstreamStatus::error);  // not at a page offset
  EXPECT_EQ(up.map(base, 2 * MiB), UpstreamStatus::error);             // part of a page
  EXPECT_EQ(up.bad_calls(), 4u);
  ASSERT_EQ(up.map(base + 20 * MiB, 20 * MiB), UpstreamStatus::ok);
  ASSERT_EQ(up.map(base + 40 * MiB, 20 * MiB), UpstreamStatus::ok);
  EXPECT_EQ(up.pages_mapped(), 2u);
  up.unmap(base + 20 * MiB, 2 * MiB);  // part of a page: refused, nothing unmapped
  EXPECT_EQ(up.bad_calls(), 5u);
  EXPECT_EQ(up.bytes_mapped(), 40 * MiB);
  up.unmap(base + 40 * MiB, 20 * MiB);
  EXPECT_EQ(up.bytes_mapped(), 20 * MiB);
  EXPECT_EQ(up.reservation_pages(), std::vector<std::size_t>{20 * MiB});
}

TEST(FakeFence, CompletesOnlyWhenTold) {
  FakeFence f;
  FenceHandle start = f.next_handle();
  FenceHandle d = f.record_device();
  FenceHandle s = f.record_stream(7);
  EXPECT_GE(d, start);
  EXPECT_FALSE(f.query(d));
  EXPECT_FALSE(f.covered(start, 7));
  f.complete(s);
  EXPECT_TRUE(f.covered(start, 7));
  EXPECT_FALSE(f.covered(start, 8));
  EXPECT_FALSE(f.covered(start, std::nullopt));
  f.wait(d);
  EXPECT_TRUE(f.query(d));
  EXPECT_TRUE(f.covered(start, 8));
  EXPECT_FALSE(f.covered(f.next_handle(), 8));
  EXPECT_EQ(f.waits(), 1u);
  f.release(d);
  f.release(s);
  EXPECT_EQ(f.outstanding(), 0u);
  f.release(s);
  EXPECT_EQ(f.bad_calls(), 1u);
}

TEST(FakeFence, AutoComplete) {
  FakeFence f(true);
  FenceHandle h = f.record_stream(1);
  EXPECT_TRUE(f.query(h));
  f.release(h);
}
