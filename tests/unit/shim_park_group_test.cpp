// Parking in a group, on the fake driver (tests/fakecuda/share_app.cpp, scenario `turn`): three
// processes whose live memory together is far over the group's budget take turns, each parked
// while idle and restored at its next launch with every word intact; without group_park the same
// scenario runs out of memory. Also: a member is parked only once idle for group_park_idle_ms, a
// park that would pass group_park_host_mb is refused, and `cudapool top` shows who is parked.
// Every step waits (bounded) for the state it asserts: the processes say what they did, and the
// test reads it. Whom a request chooses: shim_park_choice_test.cpp.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "shim/group/group_ledger_layout.h"
#include "telemetry/share.h"
#include "tests/unit/shim_child.h"

namespace cudapool {
namespace {

using test::ChildResult;
using test::RunningChild;

constexpr std::size_t kMiB = 1 << 20;
const std::string kApp = std::string(CUDAPOOL_FAKECUDA_DIR) + "/share_app";
const std::string kGpu0 = "GPU-a5a6a7a8-a9aa-abac-adae-afb0b1b2b300";  // the fake's device 0

class GroupPark : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cudapool-park-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    machine_ = dir_ + "/machine";
    std::ofstream(machine_, std::ios::binary) << std::string(16, '\0');
  }
  void TearDown() override {
    for (RunningChild& c : running_)
      if (c.pid > 0) kill(c.pid, SIGKILL), test::finish(c);
    std::filesystem::remove_all(dir_);
  }

  // A 100 MiB budget; idle-cache release asked for only briefly (nobody here has idle cache).
  std::map<std::string, std::string> env(const std::string& extra) const {
    return {{"CUDAPOOL_SHM_DIR", dir_},
            {"FAKECUDA_MACHINE_FILE", machine_},
            {"CUDAPOOL_CONF",
             "group:park_test,group_budget_mb:100,group_release_wait_ms:20,group_outside_growth_mb:0,log_level:info," +
                 extra}};
  }

  RunningChild& start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& e,
                      unsigned alarm_s = 30) {
    running_.push_back(test::start_under_shim(argv, e, true, alarm_s));
    return running_.back();
  }
  // Reads the child's output until it holds `text` at or after `from` (up to `limit_s`; the child
  // itself is killed after 30 s unless started with more). false: the child ended or the time
  // ran out first.
  static bool wait_for(RunningChild& c, const std::string& text, std::size_t from = 0, int limit_s = 20) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
    char buf[4096];
    while (c.output.find(text, from) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pollfd p{c.fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = read(c.fd, buf, sizeof buf);
      if (n <= 0) return false;
      c.output.append(buf, static_cast<std::size_t>(n));
    }
    return true;
  }
  static ChildResult stop(RunningChild& c) {
    kill(c.pid, SIGTERM);
    ChildResult r = test::finish(c);
    c.pid = -1;
    return r;
  }
  std::string ledger() const { return dir_ + "/cudapool-" + std::to_string(geteuid()) + "-g-" + kGpu0 + "-park_test"; }
  // The slot of `pid` as the ledger says now (slot -1: no live slot).
  share::SlotView slot(int pid) const {
    share::SlotView out;
    out.slot = -1;
    const int fd = open(ledger().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return out;
    std::vector<unsigned char> buf(sizeof(share::Ledger));
    const ssize_t n = pread(fd, buf.data(), buf.size(), 0);
    close(fd);
    share::LedgerView v;
    std::string why;
    if (!share::parse_ledger(buf.data(), n > 0 ? static_cast<std::size_t>(n) : 0, geteuid(), &v, &why)) return out;
    for (const share::SlotView& s : v.live)
      if (s.pid == pid) out = s;
    return out;
  }
  // The fake driver's peak of device memory over every process (FAKECUDA_MACHINE_FILE).
  std::uint64_t machine_peak() const {
    std::uint64_t counts[2] = {};
    std::ifstream(machine_, std::ios::binary).read(reinterpret_cast<char*>(counts), sizeof counts);
    return counts[1];
  }

  std::string dir_, machine_;
  std::list<RunningChild> running_;  // stable references
};

// A, B and C each keep 60 MiB live under a 100 MiB budget: any two of them are over it. Each
// fills its memory and goes idle; the next one's allocation parks the idle one; then each in turn
// touches its memory again (the fake's kernel checks and bumps every word, a copy reads it back),
// which restores it and parks whoever is idle. Every word is right after every turn, and the
// device never held more than the budget.
TEST_F(GroupPark, MembersTakeTurnsWithEveryByteIntact) {
  const auto e = env("group_park:on,group_park_idle_ms:0,group_park_wait_ms:20000");
  RunningChild& a = start({kApp, "turn", "1", "60"}, e);
  ASSERT_TRUE(wait_for(a, "turn 1: filled 60 MiB")) << a.output;
  RunningChild& b = start({kApp, "turn", "2", "60"}, e);
  ASSERT_TRUE(wait_for(b, "turn 2: filled 60 MiB")) << b.output;
  ASSERT_TRUE(wait_for(a, "parked for pid " + std::to_string(b.pid) + ",")) << a.output;
  EXPECT_TRUE(slot(a.pid).parked) << "A was parked for B";
  EXPECT_NE(b.output.find("asking pid " + std::to_string(a.pid) + " ("), std::string::npos) << b.output;
  RunningChild& c = start({kApp, "turn", "3", "60"}, e);
  ASSERT_TRUE(wait_for(c, "turn 3: filled 60 MiB")) << c.output;
  ASSERT_TRUE(wait_for(b, "parked for pid " + std::to_string(c.pid) + ",")) << b.output;
  EXPECT_EQ(c.output.find("asking pid " + std::to_string(a.pid) + " ("), std::string::npos) << "A is parked already: "
                                                                                               "not asked again\n"
                                                                                            << c.output;

  // Turns: each touch restores the one touching and parks whoever is idle and resident.
  struct Turn {
    RunningChild* who;
    int n;
    RunningChild* parked;  // the one resident and idle, parked for it
  };
  const Turn turns[] = {{&a, 1, &c}, {&b, 1, &a}, {&c, 1, &b}, {&a, 2, &c}};
  int k = 0;
  for (const Turn& t : turns) {
    SCOPED_TRACE("turn " + std::to_string(k++));
    const std::size_t parked_before = t.parked->output.size();
    kill(t.who->pid, SIGUSR2);
    const std::string id = t.who == &a ? "1" : t.who == &b ? "2" : "3";
    ASSERT_TRUE(wait_for(*t.who, "turn " + id + ": touched " + std::to_string(t.n) + " ")) << t.who->output;
    EXPECT_NE(t.who->output.find("turn " + id + ": touched " + std::to_string(t.n) + " ok"), std::string::npos)
        << t.who->output;
    ASSERT_TRUE(wait_for(*t.parked, "parked for pid " + std::to_string(t.who->pid) + ",", parked_before))
        << t.parked->output;
  }
  EXPECT_LE(machine_peak(), 100 * kMiB) << "the device never held more than the budget";
  for (RunningChild* r : {&a, &b, &c}) {
    ChildResult res = stop(*r);
    EXPECT_EQ(res.exit_status, 0) << res.output;
    EXPECT_EQ(res.output.find("BAD"), std::string::npos) << res.output;
    EXPECT_NE(res.output.find("parking: restored"), std::string::npos) << res.output;
  }
}

// Members that all work at once take turns. A, B and C each keep 40 MiB live under a 100 MiB
// budget (any two fit, not three) and, once all three are filled, touch their memory without a
// pause: none is ever idle for group_park_idle_ms. A parked member's restore waits that long, then
// asks the member resident longest to park after the call it is in; every member goes on
// working, every word right, and the device never holds more than the budget. Without turns the
// restore would wait for an idle member that never comes and fail after group_park_wait_ms.
TEST_F(GroupPark, MembersThatAllWorkTakeTurns) {
  // Generous bounds (the work of each round grows with the machine's slowness): only a member
  // that stops being served fails, after minutes.
  const auto e = env("group_park:on,group_park_idle_ms:300,group_park_wait_ms:120000");
  constexpr unsigned kAlarmS = 600;
  constexpr int kWaitS = 180;
  RunningChild* w[3];
  for (int i = 0; i < 3; ++i) {
    w[i] = &start({kApp, "work", std::to_string(i + 1), "40"}, e, kAlarmS);
    ASSERT_TRUE(wait_for(*w[i], "work " + std::to_string(i + 1) + ": filled 40 MiB", 0, kWaitS)) << w[i]->output;
  }
  for (RunningChild* r : w) kill(r->pid, SIGUSR2);
  // Each works through rounds while the others work too: at least one park and restore of each.
  for (int round = 1; round <= 3; ++round)
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(
          wait_for(*w[i], "work " + std::to_string(i + 1) + ": round " + std::to_string(round) + " ", 0, kWaitS))
          << w[i]->output;
  std::string all;
  for (RunningChild* r : w) {
    ChildResult res = stop(*r);
    EXPECT_EQ(res.exit_status, 0) << res.output;
    EXPECT_EQ(res.output.find("BAD"), std::string::npos) << res.output;
    all += res.output;
  }
  EXPECT_NE(all.find(") to park"), std::string::npos) << all;
  EXPECT_NE(all.find("in turn: every member works"), std::string::npos) << "a working member was asked in turn\n"
                                                                        << all;
  EXPECT_NE(all.find("parked for pid "), std::string::npos) << all;
  EXPECT_LE(machine_peak(), 100 * kMiB) << "the device never held more than the budget";
}

// Members that all wait for memory at once: A and B each hold 40 MiB under a 100 MiB budget and
// then each want 40 MiB more, which neither can have while the other holds its 40. Nobody is idle
// (group_park_idle_ms is longer than the test) and nobody works, so nobody can be asked to park:
// the one resident longest (A, which joined first) parks itself, B grows, touches every word and
// frees; A is restored, grows and touches; every word right, the device never over the budget.
// Before members gave way they waited for each other until group_park_wait_ms and both ran out
// of memory.
TEST_F(GroupPark, MembersThatAllWaitForMemoryGiveWay) {
  const auto e = env("group_park:on,group_park_idle_ms:3600000,group_park_wait_ms:120000");
  constexpr unsigned kAlarmS = 600;
  constexpr int kWaitS = 180;
  RunningChild& a = start({kApp, "grow", "1", "40", "40"}, e, kAlarmS);
  ASSERT_TRUE(wait_for(a, "grow 1: filled 40 MiB", 0, kWaitS)) << a.output;
  RunningChild& b = start({kApp, "grow", "2", "40", "40"}, e, kAlarmS);
  ASSERT_TRUE(wait_for(b, "grow 2: filled 40 MiB", 0, kWaitS)) << b.output;
  kill(a.pid, SIGUSR2);
  kill(b.pid, SIGUSR2);
  ASSERT_TRUE(wait_for(b, "grow 2: freed", 0, kWaitS)) << b.output;
  ASSERT_TRUE(wait_for(a, "grow 1: freed", 0, kWaitS)) << a.output;
  EXPECT_NE(a.output.find("grow 1: grew to 80 MiB, touched ok"), std::string::npos) << a.output;
  EXPECT_NE(b.output.find("grow 2: grew to 80 MiB, touched ok"), std::string::npos) << b.output;
  EXPECT_NE(a.output.find("parks so that the others can go on"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("parking: restored"), std::string::npos) << a.output;
  EXPECT_EQ(b.output.find("parks so that the others can go on"), std::string::npos) << "only A gave way\n"
                                                                                    << b.output << a.output;
  EXPECT_LE(machine_peak(), 100 * kMiB) << "the device never held more than the budget";
  for (RunningChild* r : {&a, &b}) {
    ChildResult res = stop(*r);
    EXPECT_EQ(res.exit_status, 0) << res.output;
  }
}

// A member asked to park that ends before it answers (killed here in the middle of its park: its
// drain spins for 300 s on the fake, so the kill always comes first) will never answer: the asker
// sees its process gone, takes its slot back and goes on, instead of waiting group_park_wait_ms
// (five minutes here) for the answer.
TEST_F(GroupPark, AnAskedMemberThatEndsDoesNotHoldUpTheAsker) {
  auto e = env("group_park:on,group_park_idle_ms:0,group_park_wait_ms:300000");
  // Without the machine file the fake's cuMemGetInfo counts this process alone: a killed process
  // cannot take its bytes out of that file, where a real driver frees them.
  e.erase("FAKECUDA_MACHINE_FILE");
  auto slow = e;
  slow["FAKECUDA_CALL_COST_NS"] = "cuCtxSynchronize=300000000000";
  RunningChild& a = start({kApp, "turn", "1", "60"}, slow, 600);
  ASSERT_TRUE(wait_for(a, "turn 1: filled 60 MiB", 0, 180)) << a.output;
  RunningChild& b = start({kApp, "turn", "2", "60"}, e, 600);
  ASSERT_TRUE(wait_for(b, "asking pid " + std::to_string(a.pid) + " (", 0, 180)) << b.output;
  const int apid = a.pid;
  kill(a.pid, SIGKILL);
  test::finish(a);
  a.pid = -1;
  ASSERT_TRUE(wait_for(b, "turn 2: filled 60 MiB", 0, 180)) << b.output;
  EXPECT_NE(b.output.find("pid " + std::to_string(apid) + " ended before it answered"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("reclaimed the slot of pid " + std::to_string(apid)), std::string::npos) << b.output;
  ChildResult br = stop(b);
  EXPECT_EQ(br.exit_status, 0) << br.output;
}

// The control: the same start without group_park. B's allocation is refused once A's 60 MiB and
// its own 40 fill the budget, and A is never parked.
TEST_F(GroupPark, WithoutParkingTheSameTurnRunsOutOfMemory) {
  const auto e = env("group_park:off");
  RunningChild& a = start({kApp, "turn", "1", "60"}, e);
  ASSERT_TRUE(wait_for(a, "turn 1: filled 60 MiB")) << a.output;
  ChildResult b = test::run_under_shim({kApp, "turn", "2", "60"}, e);
  EXPECT_EQ(b.exit_status, 3) << b.output;
  EXPECT_NE(b.output.find("turn 2: out of memory after 40 MiB"), std::string::npos) << b.output;
  EXPECT_FALSE(slot(a.pid).parked);
  ChildResult ar = stop(a);
  EXPECT_EQ(ar.exit_status, 0) << ar.output;
  EXPECT_EQ(ar.output.find("parked for"), std::string::npos) << ar.output;
}

// A member that worked within group_park_idle_ms is never parked: B waits its group_park_wait_ms,
// then gets out-of-memory with a line that names who holds the budget and since when it is active.
TEST_F(GroupPark, AMemberNotIdleLongEnoughIsNotParked) {
  const auto e = env("group_park:on,group_park_idle_ms:3600000,group_park_wait_ms:300");
  RunningChild& a = start({kApp, "turn", "1", "60"}, e);
  ASSERT_TRUE(wait_for(a, "turn 1: filled 60 MiB")) << a.output;
  ChildResult b = test::run_under_shim({kApp, "turn", "2", "60"}, e);
  EXPECT_EQ(b.exit_status, 3) << b.output;
  const auto line = b.output.find("within group_park_wait_ms (300 ms); who holds it: pid " + std::to_string(a.pid) +
                                  " holds ");
  ASSERT_NE(line, std::string::npos) << b.output;
  EXPECT_NE(b.output.find("(last active ", line), std::string::npos) << b.output;
  EXPECT_EQ(b.output.find("asking pid"), std::string::npos) << b.output;
  ChildResult ar = stop(a);
  EXPECT_EQ(ar.output.find("parked for"), std::string::npos) << ar.output;
}

// A park whose bytes would pass group_park_host_mb is refused by the member asked (it knows its own
// host memory's use); the asker runs out of memory after its wait and says why in its log.
TEST_F(GroupPark, AParkOverTheHostLimitIsRefused) {
  const auto e = env("group_park:on,group_park_idle_ms:0,group_park_wait_ms:300,group_park_host_mb:10");
  RunningChild& a = start({kApp, "turn", "1", "60"}, e);
  ASSERT_TRUE(wait_for(a, "turn 1: filled 60 MiB")) << a.output;
  ChildResult b = test::run_under_shim({kApp, "turn", "2", "60"}, e);
  EXPECT_EQ(b.exit_status, 3) << b.output;
  EXPECT_NE(b.output.find("pid " + std::to_string(a.pid) + " refused: its parked data would pass group_park_host_mb"),
            std::string::npos)
      << b.output;
  ASSERT_TRUE(wait_for(a, "passes group_park_host_mb (10.0 MiB)")) << a.output;
  EXPECT_FALSE(slot(a.pid).parked);
  stop(a);
}

// `cudapool top` shows a parked member's bytes in host memory and its parking counts; the group
// line counts it.
TEST_F(GroupPark, TopShowsWhoIsParked) {
  const auto e = env("group_park:on,group_park_idle_ms:0,group_park_wait_ms:20000");
  RunningChild& a = start({kApp, "turn", "1", "60"}, e);
  ASSERT_TRUE(wait_for(a, "turn 1: filled 60 MiB")) << a.output;
  RunningChild& b = start({kApp, "turn", "2", "60"}, e);
  ASSERT_TRUE(wait_for(b, "turn 2: filled 60 MiB")) << b.output;
  ASSERT_TRUE(wait_for(a, "parked for pid " + std::to_string(b.pid) + ",")) << a.output;
  auto top = [&] {
    return test::run_under_shim({CUDAPOOL_BIN_PATH, "top", "--once", "--json", "-"}, {{"CUDAPOOL_SHM_DIR", dir_}},
                                false);
  };
  // The number after `key` in A's entry of top's JSON (-1: not there).
  auto field = [&](const std::string& json, const std::string& key) -> long long {
    const auto at = json.find("{\"pid\":" + std::to_string(a.pid) + ",");
    if (at == std::string::npos) return -1;
    const auto k = json.find("\"" + key + "\":", at);
    return k == std::string::npos ? -1 : std::atoll(json.c_str() + k + key.size() + 3);
  };
  // A's record is rewritten every 250 ms: ask until it shows the park (bounded).
  const std::string parked = "\"parking\":{\"parked\":true,";
  ChildResult t = top();
  for (int i = 0; i < 40 && t.output.find(parked) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    t = top();
  }
  EXPECT_NE(t.output.find(parked), std::string::npos) << t.output;
  EXPECT_GE(field(t.output, "parked_bytes"), static_cast<long long>(60 * kMiB)) << t.output;
  EXPECT_EQ(field(t.output, "parks"), 1) << t.output;
  EXPECT_EQ(field(t.output, "unparks"), 0) << t.output;
  EXPECT_GE(field(t.output, "bytes_out"), static_cast<long long>(60 * kMiB)) << t.output;
  EXPECT_NE(t.output.find("\"parked_members\":1,"), std::string::npos) << t.output;
  ChildResult table = test::run_under_shim({CUDAPOOL_BIN_PATH, "top", "--once"}, {{"CUDAPOOL_SHM_DIR", dir_}}, false);
  EXPECT_NE(table.output.find("PARKED"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("1 parked, "), std::string::npos) << table.output;
  stop(b);
  stop(a);
}

}  // namespace
}  // namespace cudapool
