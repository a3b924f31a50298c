// `cudapool top` prints other processes' command lines and group names: text a hostile process
// chose. Its table carries them escaped, so no escape sequence reaches the terminal.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace cudapool::tools
