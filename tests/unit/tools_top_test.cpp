// `cudapool top` prints other processes' command lines and group names: text a hostile process
// chose. Its table carries them escaped, so no escape sequence reaches the terminal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tools/top.h"

namespace cudapool::tools {
namespace {

bool has_control(const std::string& s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n') || u == 0x7f) return true;
  }
  return false;
}

TEST(Top, TableEscapesEveryStringOfARecord) {
  share::ProcInfo p;
  p.pid = 4242;
  p.command = "python \x1b]0;owned\x07train.py \x1b[2J\r";
  p.group = "g\x1b[31m";
  share::RecordDevice d{};
  d.device = 0;
  d.reserved = 64ull << 20;
  d.allocated = 32ull << 20;
  p.devices.push_back(d);
  share::ProcInfo q;  // a record without devices takes the other line format
  q.pid = 4243;
  q.command =
      "\xc2\x9b"
      "2J";  // C1 CSI, which some terminals obey
  const std::string t = top_table({p, q});
  EXPECT_FALSE(has_control(t)) << t;
  EXPECT_NE(t.find("python \\x1b]0;owned\\x07train.py \\x1b[2J\\x0d"), std::string::npos) << t;
  EXPECT_NE(t.find("g\\x1b[31m"), std::string::npos) << t;
  EXPECT_NE(t.find("\\xc2\\x9b2J"), std::string::npos) << t;
  EXPECT_NE(t.find("4242"), std::string::npos) << t;
  // Plain text passes unchanged.
  p.command = "python train.py --lr 0.1 héllo";
  p.group = "team-a";
  const std::string plain = top_table({p});
  EXPECT_NE(plain.find("python train.py --lr 0.1 héllo"), std::string::npos) << plain;
  EXPECT_NE(plain.find("team-a"), std::string::npos) << plain;
}

// FRAG is the free share of segments that also hold live blocks: memory that is all cache, in
// whole segments, is not fragmented.
TEST(Top, FragCountsSplitFreeMemoryNotCache) {
  share::ProcInfo p;
  p.pid = 4244;
  share::RecordDevice d{};
  d.reserved = 64ull << 20;
  d.cached = 64ull << 20;  // nothing allocated: all cache
  p.devices.push_back(d);
  EXPECT_EQ(top_fragmentation(d), 0.0);
  const std::string t = top_table({p});
  EXPECT_NE(t.find(" 0.0% "), std::string::npos) << t;
  EXPECT_EQ(t.find("100.0%"), std::string::npos) << t;
  d.allocated = 32ull << 20;
  d.cached = 32ull << 20;
  d.inactive_split = 16ull << 20;  // half the cache is a free piece of a live segment
  EXPECT_DOUBLE_EQ(top_fragmentation(d), 0.25);
}

// The group line's terms add up to its total: members that exited are still charged until their
// slots are reclaimed, and the line shows how much.
TEST(Top, GroupLineShowsTheChargeOfExitedMembers) {
  share::LedgerView l;
  l.group = "team";
  l.gpu = "GPU-1";
  l.budget = 64ull << 20;
  l.total = 64ull << 20;
  share::SlotView me;
  me.pid = static_cast<int>(::getpid());
  me.start_time = share::process_start_time(me.pid);
  me.pid_ns = share::pid_namespace();
  me.reserved = 32ull << 20;
  share::SlotView gone;
  gone.slot = 1;
  gone.pid = -1;  // no process has it: certainly gone
  gone.pid_ns = share::pid_namespace();
  gone.reserved = 24ull << 20;
  gone.outside = 8ull << 20;
  l.live = {me, gone};
  const std::string line = top_group_lines({l});
  EXPECT_NE(line.find("pool 32 MiB + outside the pools 0 MiB + exited members 32 MiB = 64 of 64 MiB (1 member(s); 1 "
                      "exited"),
            std::string::npos)
      << line;
}

// PARKED: a parked process's bytes in host memory; one that its group would park but cannot be
// parked now says why, in another process's words, escaped; the group line counts the parked.
TEST(Top, ParkedProcessesAndWhyOthersCannotBe) {
  share::ProcInfo p;
  p.pid = 4245;
  p.command = "serve.py";
  p.parking.parked = true;
  p.parking.parkable = share::kRecordParkNotNow;  // "already parked": not shown for a parked one
  p.parking.why = "already parked";
  p.parking.parked_bytes = 1024ull << 20;
  p.devices.push_back(share::RecordDevice{});
  share::ProcInfo q;
  q.pid = 4246;
  q.command = "train.py";
  q.parking.parkable = share::kRecordParkNotNow;
  q.parking.why = "a graph capture is in progress\x1b[2J";
  q.devices.push_back(share::RecordDevice{});
  share::ProcInfo r;  // parking off: nothing said
  r.pid = 4247;
  r.command = "other.py";
  r.devices.push_back(share::RecordDevice{});
  const std::string t = top_table({p, q, r});
  EXPECT_FALSE(has_control(t)) << t;
  EXPECT_NE(t.find(" PARKED "), std::string::npos) << t;
  EXPECT_NE(t.find("     1024  serve.py"), std::string::npos) << t;
  EXPECT_EQ(t.find("already parked"), std::string::npos) << t;
  EXPECT_NE(t.find("        -  [not parkable: a graph capture is in progress\\x1b[2J] train.py"), std::string::npos)
      << t;
  EXPECT_NE(t.find("        -  other.py"), std::string::npos) << t;

  share::LedgerView l;
  l.group = "serve";
  l.gpu = "GPU-1";
  l.budget = 64ull << 20;
  share::SlotView me;
  me.pid = static_cast<int>(::getpid());
  me.start_time = share::process_start_time(me.pid);
  me.pid_ns = share::pid_namespace();
  me.parked = true;
  me.parked_bytes = 48ull << 20;
  l.live = {me};
  const std::string line = top_group_lines({l});
  EXPECT_NE(line.find("(1 member(s); 1 parked, 48 MiB in host memory)"), std::string::npos) << line;
}

}  // namespace
}  // namespace cudapool::tools
