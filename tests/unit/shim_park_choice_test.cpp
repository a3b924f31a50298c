// Whom a park request chooses (share::choose_to_park and, when every member works,
// share::choose_turn; shim/group/group_ledger_layout.h): plain code over
// the figures other members published, so it is tested here on figures made up for it; the
// processes that act on the choice are tested in shim_park_group_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "shim/group/group_ledger_layout.h"

namespace cudapool {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// Whom a request chooses: the least recently active of the members that may be parked, as many
// as cover the need, never one that is parked, waiting itself, already asked, not parkable, silent
// or not idle long enough.
TEST(ChooseToPark, LeastRecentlyActiveFirstUntilTheNeedIsCovered) {
  constexpr std::int64_t s = 1'000'000'000;
  const std::int64_t now = 100 * s;
  auto member = [&](int slot, std::int64_t active_ago, std::uint64_t mib) {
    share::ParkCandidate c;
    c.slot = slot;
    c.live = true;
    c.parkable = share::kParkable;
    c.reserved = mib * kMiB;
    c.active_ns = now - active_ago;
    c.heartbeat_ns = now - s / 4;
    return c;
  };
  std::vector<share::ParkCandidate> c = {member(3, 10 * s, 40), member(5, 30 * s, 40), member(7, 20 * s, 40),
                                         member(9, 1 * s, 100)};
  int chosen[64];
  share::Passed passed[64];
  // 60 MiB: the two least recently active (slot 5, then 7), not the most idle-ness-free.
  ASSERT_EQ(share::choose_to_park(c.data(), 4, 60 * kMiB, now, 2 * s, chosen, passed), 2);
  EXPECT_EQ(chosen[0], 5);
  EXPECT_EQ(chosen[1], 7);
  EXPECT_EQ(passed[0], share::Passed::spare);     // slot 3 was not needed
  EXPECT_EQ(passed[3], share::Passed::not_idle);  // slot 9 worked 1 s ago, under the 2 s threshold
  // More than all of them hold: every one that may be parked.
  EXPECT_EQ(share::choose_to_park(c.data(), 4, 1000 * kMiB, now, 2 * s, chosen, passed), 3);
  // With no idle threshold the one that worked a second ago is fair game too.
  EXPECT_EQ(share::choose_to_park(c.data(), 4, 1000 * kMiB, now, 0, chosen, passed), 4);
  // Each reason to pass a member over.
  c[0].parked = true;  // its bytes went out of the ledger
  c[0].reserved = 0;
  c[0].parked_bytes = 40 * kMiB;
  c[1].asking = true;
  c[2].pending = true;
  c[3].parkable = share::kParkNotNow;
  EXPECT_EQ(share::choose_to_park(c.data(), 4, 10 * kMiB, now, 0, chosen, passed), 0);
  EXPECT_EQ(passed[0], share::Passed::parked);
  EXPECT_EQ(passed[1], share::Passed::busy_asking);
  EXPECT_EQ(passed[2], share::Passed::pending);
  EXPECT_EQ(passed[3], share::Passed::not_parkable);
  EXPECT_FALSE(share::may_park_later(c[0], passed[0])) << "parked, its bytes are not in the ledger";
  EXPECT_TRUE(share::may_park_later(c[1], passed[1]));
  EXPECT_TRUE(share::may_park_later(c[3], passed[3])) << "the mechanism may allow it later";
  c[3].parkable = share::kParkOff;
  EXPECT_FALSE(share::may_park_later(c[3], share::Passed::not_parkable)) << "its policy never will";
  // Restored, but its parked flag not cleared yet: its bytes are back in the ledger.
  c[0].reserved = 40 * kMiB;
  EXPECT_TRUE(share::may_park_later(c[0], share::Passed::parked));
  // Silent (no publication for over 2 s, or none yet) and empty members.
  share::ParkCandidate quiet = member(1, 10 * s, 40);
  quiet.heartbeat_ns = now - 3 * s;
  share::ParkCandidate empty = member(2, 10 * s, 0);
  share::ParkCandidate refused = member(4, 10 * s, 40);  // refused this process a moment ago
  refused.refused = true;
  const share::ParkCandidate three[] = {quiet, empty, refused};
  EXPECT_EQ(share::choose_to_park(three, 3, kMiB, now, 0, chosen, passed), 0);
  EXPECT_EQ(passed[0], share::Passed::silent);
  EXPECT_EQ(passed[1], share::Passed::empty);
  EXPECT_EQ(passed[2], share::Passed::refused);
  EXPECT_TRUE(share::may_park_later(quiet, passed[0]));
  EXPECT_FALSE(share::may_park_later(empty, passed[1]));
  EXPECT_TRUE(share::may_park_later(refused, passed[2]));
}

// Every member works: none is idle for the threshold, so choose_to_park finds nobody; taking
// turns picks among them the one whose memory has been on the device longest, as many as cover
// the need, never one restored less than the threshold ago (its turn has just begun) and never
// one passed over for another reason.
TEST(ChooseTurn, TheMemberResidentLongestParksWhenEveryoneWorks) {
  constexpr std::int64_t s = 1'000'000'000;
  const std::int64_t now = 100 * s;
  auto working = [&](int slot, std::int64_t resident_for, std::uint64_t mib) {
    share::ParkCandidate c;
    c.slot = slot;
    c.live = true;
    c.parkable = share::kParkable;
    c.reserved = mib * kMiB;
    c.active_ns = now - s / 10;  // worked 100 ms ago
    c.heartbeat_ns = now - s / 4;
    c.resident_ns = now - resident_for;
    return c;
  };
  std::vector<share::ParkCandidate> c = {working(2, 5 * s, 40), working(4, 30 * s, 40), working(6, s / 2, 40),
                                         working(8, 12 * s, 40)};
  int chosen[64];
  share::Passed passed[64];
  ASSERT_EQ(share::choose_to_park(c.data(), 4, 30 * kMiB, now, 2 * s, chosen, passed), 0) << "nobody is idle";
  // 30 MiB: slot 4 alone, on the device for 30 s.
  ASSERT_EQ(share::choose_turn(c.data(), 4, 30 * kMiB, now, 2 * s, chosen, passed), 1);
  EXPECT_EQ(chosen[0], 4);
  EXPECT_EQ(passed[3], share::Passed::spare);
  // 70 MiB: slot 4, then slot 8 (12 s), then nobody else needed.
  share::choose_to_park(c.data(), 4, 70 * kMiB, now, 2 * s, chosen, passed);
  ASSERT_EQ(share::choose_turn(c.data(), 4, 70 * kMiB, now, 2 * s, chosen, passed), 2);
  EXPECT_EQ(chosen[0], 4);
  EXPECT_EQ(chosen[1], 8);
  // More than they all hold: slot 6, restored half a second ago, keeps its turn.
  share::choose_to_park(c.data(), 4, 1000 * kMiB, now, 2 * s, chosen, passed);
  EXPECT_EQ(share::choose_turn(c.data(), 4, 1000 * kMiB, now, 2 * s, chosen, passed), 3);
  EXPECT_EQ(passed[2], share::Passed::not_idle);
  // A member that did not say since when it is resident counts as resident since ever; a time
  // past the clock reads the same.
  c[0].resident_ns = 0;
  c[2].resident_ns = now + 50 * s;
  share::choose_to_park(c.data(), 4, 50 * kMiB, now, 2 * s, chosen, passed);
  ASSERT_EQ(share::choose_turn(c.data(), 4, 50 * kMiB, now, 2 * s, chosen, passed), 2);
  EXPECT_EQ(chosen[0], 2);  // slot 2 and 6 both "since ever": the lower slot first
  EXPECT_EQ(chosen[1], 6);
  // Passed over for another reason: never taken in turn.
  c[0].asking = true;
  c[1].parkable = share::kParkNotNow;
  c[2].pending = true;
  c[3].reserved = 0;
  share::choose_to_park(c.data(), 4, 10 * kMiB, now, 2 * s, chosen, passed);
  EXPECT_EQ(share::choose_turn(c.data(), 4, 10 * kMiB, now, 2 * s, chosen, passed), 0);
}

// Members that all wait for memory: the one resident longest that holds memory and may be parked
// gives way; nobody does while another member works or will answer a request.
TEST(YieldToWaiting, TheWaitingMemberResidentLongestParksItself) {
  constexpr std::int64_t s = 1'000'000'000;
  const std::int64_t now = 100 * s;
  auto member = [&](int slot, std::int64_t resident_ago, std::uint64_t mib) {
    share::ParkCandidate c;
    c.slot = slot;
    c.live = true;
    c.asking = true;
    c.parkable = share::kParkable;
    c.reserved = mib * kMiB;
    c.active_ns = now - 50 * s;
    c.heartbeat_ns = now - s / 4;
    c.resident_ns = now - resident_ago;
    return c;
  };
  // Others: slot 2 (resident 30 s) and slot 6 (10 s), both waiting; this process: slot 4, 20 s.
  std::vector<share::ParkCandidate> c = {member(2, 30 * s, 40), member(6, 10 * s, 40)};
  share::ParkCandidate self = member(4, 20 * s, 40);
  int chosen[64];
  share::Passed passed[64];
  ASSERT_EQ(share::choose_to_park(c.data(), 2, 10 * kMiB, now, 2 * s, chosen, passed), 0);
  EXPECT_FALSE(share::yield_to_waiting(c.data(), 2, passed, self, now)) << "slot 2 has been resident longer";
  self.resident_ns = now - 40 * s;
  EXPECT_TRUE(share::yield_to_waiting(c.data(), 2, passed, self, now));
  // Ties go to the lower slot; a time past the clock reads as resident since ever.
  self.resident_ns = c[0].resident_ns;
  EXPECT_FALSE(share::yield_to_waiting(c.data(), 2, passed, self, now)) << "slot 2 before slot 4";
  self.resident_ns = now + 5 * s;
  EXPECT_TRUE(share::yield_to_waiting(c.data(), 2, passed, self, now));
  // An earlier member that cannot give way (holds nothing, or may not be parked) is passed over.
  self.resident_ns = now - 20 * s;
  c[0].parkable = share::kParkNotNow;
  share::choose_to_park(c.data(), 2, 10 * kMiB, now, 2 * s, chosen, passed);
  EXPECT_TRUE(share::yield_to_waiting(c.data(), 2, passed, self, now));
  c[0].parkable = share::kParkable;
  c[0].reserved = 0;
  share::choose_to_park(c.data(), 2, 10 * kMiB, now, 2 * s, chosen, passed);
  EXPECT_TRUE(share::yield_to_waiting(c.data(), 2, passed, self, now));
  // Nobody gives way while a member works (not idle) or a request to it is pending; parked
  // members wait for nothing the others hold.
  c[0] = member(2, 30 * s, 40);
  c[0].asking = false;
  c[0].active_ns = now - s / 10;
  share::choose_to_park(c.data(), 2, 10 * kMiB, now, 2 * s, chosen, passed);
  ASSERT_EQ(passed[0], share::Passed::not_idle);
  EXPECT_FALSE(share::yield_to_waiting(c.data(), 2, passed, self, now));
  c[0].pending = true;
  share::choose_to_park(c.data(), 2, 10 * kMiB, now, 2 * s, chosen, passed);
  EXPECT_FALSE(share::yield_to_waiting(c.data(), 2, passed, self, now));
  c[0] = member(2, 30 * s, 0);
  c[0].parked = true;
  c[0].parked_bytes = 40 * kMiB;
  share::choose_to_park(c.data(), 2, 10 * kMiB, now, 2 * s, chosen, passed);
  EXPECT_TRUE(share::yield_to_waiting(c.data(), 2, passed, self, now)) << "slot 6 waits, slot 2 is parked";
  // This process gives way only holding memory it may park.
  self.parkable = share::kParkNotNow;
  EXPECT_FALSE(share::yield_to_waiting(c.data(), 2, passed, self, now));
  self.parkable = share::kParkable;
  self.reserved = 0;
  EXPECT_FALSE(share::yield_to_waiting(c.data(), 2, passed, self, now));
}

}  // namespace
}  // namespace cudapool
