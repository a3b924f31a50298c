// Processes sharing one GPU under the shim, on the fake driver (tests/fakecuda/share_app.cpp):
// the group budget holds under random allocation from four processes, idle cache is given back
// on demand (and only idle cache), a killed member's share is reclaimed, foreign ledgers fail
// closed (more hostile files: shim_share_trust_test.cpp), and `cudapool top` lists the processes
// with their figures.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <string>
#include <thread>
#include <tuple>
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
// The fake driver's device 0 (cuDeviceGetUuid in tests/fakecuda/fakecuda.cpp).
const std::string kGpu0 = "GPU-a5a6a7a8-a9aa-abac-adae-afb0b1b2b300";

// Each test gets its own directory for the shared files, so parallel runs never meet.
class Share : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cudapool-share-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (RunningChild& c : running_)
      if (c.pid > 0) kill(c.pid, SIGKILL), test::finish(c);
    std::filesystem::remove_all(dir_);
  }

  std::map<std::string, std::string> env(const std::string& conf, int budget_mb) {
    return {{"CUDAPOOL_SHM_DIR", dir_}, {"CUDAPOOL_CONF", conf}, {"SHARE_BUDGET_MB", std::to_string(budget_mb)}};
  }
  // The fake's contexts do not grow after their first allocation unless a test says so
  // (FAKECUDA_LAUNCH_MB), so nothing is held for growth unless a test asks for it.
  static std::string group_conf(int budget_mb, const std::string& extra = "") {
    return "group:share_test,group_budget_mb:" + std::to_string(budget_mb) + ",log_level:info" +
           (extra.find("group_outside_growth_mb") == std::string::npos ? ",group_outside_growth_mb:0" : "") +
           (extra.empty() ? "" : "," + extra);
  }
  std::string ledger() const { return dir_ + "/cudapool-" + std::to_string(geteuid()) + "-g-" + kGpu0 + "-share_test"; }

  // Starts a waiting scenario and reads its output until it says "ready".
  RunningChild& start_ready(const std::vector<std::string>& argv, const std::map<std::string, std::string>& e) {
    running_.push_back(test::start_under_shim(argv, e));
    RunningChild& c = running_.back();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    char buf[4096];
    while (c.output.find("ready") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{c.fd, POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        const ssize_t n = read(c.fd, buf, sizeof buf);
        if (n <= 0) break;
        c.output.append(buf, static_cast<std::size_t>(n));
      }
    }
    EXPECT_NE(c.output.find("ready"), std::string::npos) << c.output;
    return c;
  }
  static ChildResult stop(RunningChild& c) {
    kill(c.pid, SIGTERM);
    ChildResult r = test::finish(c);
    c.pid = -1;
    return r;
  }

  // The reserved bytes of `pid`'s slot in the ledger (-1: no live slot).
  long long slot_reserved(int pid) const {
    share::Mapping m = share::map_file(ledger(), sizeof(share::Ledger), false, 0);
    if (!m) return -2;
    const auto* l = static_cast<const share::Ledger*>(m.addr);
    long long r = -1;
    for (const share::LedgerSlot& s : l->slot)
      if (s.state.load() == share::kSlotLive && s.pid.load() == pid) r = static_cast<long long>(s.reserved.load());
    share::unmap(m);
    return r;
  }

  std::string dir_;
  std::list<RunningChild> running_;  // stable references
};

// Four processes allocate and free at random; together they want about three times the budget.
// After every call each one checks the ledger's total and the fake driver's machine-wide live
// bytes against the budget; the fake's peak is checked at the end. Without the group the same
// run goes over (so the check can fail).
TEST_F(Share, BudgetHoldsUnderRandomAllocationFromFourProcesses) {
  constexpr int kBudget = 160;
  auto run4 = [&](const std::string& conf, bool check_inside) {
    const std::string machine = dir_ + "/machine";
    { std::ofstream(machine, std::ios::binary) << std::string(16, '\0'); }
    std::vector<RunningChild> kids;
    for (int i = 0; i < 4; ++i) {
      auto e = env(conf, check_inside ? kBudget : 1 << 20);
      e["FAKECUDA_MACHINE_FILE"] = machine;
      kids.push_back(test::start_under_shim({kApp, "random", std::to_string(17 + i), "250"}, e));
    }
    int ooms = 0;
    for (RunningChild& k : kids) {
      ChildResult r = test::finish(k);
      EXPECT_EQ(r.exit_status, 0) << r.output;
      if (const auto at = r.output.find("ooms="); at != std::string::npos) ooms += std::atoi(r.output.c_str() + at + 5);
    }
    std::uint64_t counts[2] = {};
    std::ifstream(machine, std::ios::binary).read(reinterpret_cast<char*>(counts), sizeof counts);
    return std::make_pair(counts[1], ooms);  // the fake's machine-wide peak, the OOMs the programs saw
  };
  const auto [free_peak, free_ooms] = run4("log_level:warn", false);
  EXPECT_GT(free_peak, kBudget * kMiB) << "without a group the four processes should need more than the budget";
  EXPECT_EQ(free_ooms, 0);
  const auto [peak, ooms] = run4(group_conf(kBudget, "group_release_wait_ms:20,log_level:warn"), true);
  EXPECT_LE(peak, kBudget * kMiB);
  EXPECT_GT(peak, kBudget * kMiB / 2) << "the processes should have used much of the budget";
  EXPECT_GT(ooms, 0) << "the budget should have refused some allocations";
  // Everyone is gone: the next process reclaims every slot and the group starts empty again.
  ChildResult last = test::run_under_shim({kApp, "need", std::to_string(kBudget)}, env(group_conf(kBudget), kBudget));
  EXPECT_EQ(last.exit_status, 0) << last.output;
}

// B holds 80 MiB of idle cache; A needs 60 MiB under a 100 MiB budget. Without asking (wait 0)
// A runs out; with cooperative release B gives its cache back and A gets everything.
TEST_F(Share, IdleCacheIsReleasedOnDemand) {
  RunningChild& b = start_ready({kApp, "hold", "80"}, env(group_conf(100), 100));
  const int bpid = b.pid;
  EXPECT_NE(b.output.find("total=104857600"), std::string::npos) << "cuMemGetInfo reports the budget as total\n"
                                                                 << b.output;
  EXPECT_EQ(slot_reserved(bpid), static_cast<long long>(80 * kMiB));

  ChildResult no_ask = test::run_under_shim({kApp, "need", "60"}, env(group_conf(100, "group_release_wait_ms:0"), 100));
  EXPECT_EQ(no_ask.exit_status, 3) << no_ask.output;
  EXPECT_NE(no_ask.output.find("out of memory after 20 MiB"), std::string::npos) << no_ask.output;
  EXPECT_EQ(slot_reserved(bpid), static_cast<long long>(80 * kMiB)) << "nobody asked B";

  const auto t0 = std::chrono::steady_clock::now();
  ChildResult a = test::run_under_shim({kApp, "need", "60"}, env(group_conf(100), 100));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(a.exit_status, 0) << a.output;
  EXPECT_NE(a.output.find("need: got 60 MiB"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("asked 1 other member"), std::string::npos) << a.output;
  EXPECT_LT(ms, 5000);
  // A was short of 40 MiB: B gave back at least that, the longest-cached first, and kept the rest.
  const long long kept = slot_reserved(bpid);
  EXPECT_GT(kept, 0) << "B kept what A did not need";
  EXPECT_LE(kept, static_cast<long long>(40 * kMiB)) << "B gave back at least A's shortfall";
  ChildResult br = stop(b);
  EXPECT_EQ(br.exit_status, 0) << br.output;
  EXPECT_NE(br.output.find("of idle cached memory on request"), std::string::npos) << br.output;
}

// An allocation the budget refuses says who holds the budget: this process, the other members
// (B's 80 MiB of idle cache here, with no release asked for), and, for a request larger than the
// whole budget, that no release could make room; not that the device has memory free.
TEST_F(Share, RefusalNamesWhoHoldsTheBudget) {
  RunningChild& b = start_ready({kApp, "hold", "80"}, env(group_conf(100), 100));
  ChildResult a = test::run_under_shim({kApp, "need", "60"}, env(group_conf(100, "group_release_wait_ms:0"), 100));
  EXPECT_EQ(a.exit_status, 3) << a.output;
  EXPECT_NE(a.output.find("The group budget (100.00 MiB) refused this growth: this process holds "), std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find(", the 1 other member(s) 80.00 MiB"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("is free on the device, but the group budget is what refused"), std::string::npos)
      << a.output;
  EXPECT_EQ(a.output.find("hold the rest"), std::string::npos) << a.output;
  ChildResult alone = test::run_under_shim({kApp, "need-one", "120"}, env(group_conf(100), 100));
  EXPECT_EQ(alone.exit_status, 3) << alone.output;
  EXPECT_NE(alone.output.find("The request alone (120.00 MiB) is more than the whole budget"), std::string::npos)
      << alone.output;
  ChildResult br = stop(b);
  EXPECT_EQ(br.exit_status, 0) << br.output;
}

// The group's share shows from a member's first cuMemGetInfo, before it allocated anything: B
// keeps 100 MiB live under a 300 MiB budget, so A's fresh context reports 300 MiB total and
// 200 MiB free.
TEST_F(Share, BudgetShareIsVisibleFromTheFirstCall) {
  RunningChild& b = start_ready({kApp, "hold-live", "100"}, env(group_conf(300), 300));
  ChildResult a = test::run_under_shim({kApp, "info-first"}, env(group_conf(300), 300));
  EXPECT_EQ(a.exit_status, 0) << a.output;
  EXPECT_NE(a.output.find("info-first total=" + std::to_string(300 * kMiB) + " free=" + std::to_string(200 * kMiB)),
            std::string::npos)
      << a.output;
  ChildResult br = stop(b);
  EXPECT_EQ(br.exit_status, 0) << br.output;
}

// One block of many physical units: the budget refuses a unit at a time, yet the holder is asked
// for the block's whole excess at once and answers in one or two rounds, not one unit per round.
// B's published idle figure is stale: one 20 MiB block of its 200 MiB idle, so a round that
// asked B for no more than its published share would take three rounds or more.
TEST_F(Share, OneLargeBlockAsksForItsWholeExcess) {
  RunningChild& b = start_ready({kApp, "hold-late", "200"}, env(group_conf(240), 240));
  const int bpid = b.pid;
  ChildResult a = test::run_under_shim({kApp, "need-one", "160"}, env(group_conf(240), 240));
  EXPECT_EQ(a.exit_status, 0) << a.output;
  EXPECT_NE(a.output.find("need-one: got 160 MiB"), std::string::npos) << a.output;
  EXPECT_GT(slot_reserved(bpid), 0) << "B kept what A did not need";
  ChildResult br = stop(b);
  EXPECT_EQ(br.exit_status, 0) << br.output;
  std::size_t answers = 0;
  for (std::size_t at = 0; (at = br.output.find("of idle cached memory on request", at)) != std::string::npos; ++at)
    ++answers;
  EXPECT_GE(answers, 1u) << br.output;
  EXPECT_LE(answers, 2u) << "B gave back a unit per request instead of what A needed\n" << br.output;
}

// The first round asks only as many members as cover the shortfall, the largest idle cache
// first: C's small cache is left alone when B's covers the need.
TEST_F(Share, FirstRoundAsksTheLargestIdleCacheOnly) {
  RunningChild& b = start_ready({kApp, "hold", "60"}, env(group_conf(120), 120));
  RunningChild& c = start_ready({kApp, "hold", "20"}, env(group_conf(120), 120));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // both published their idle bytes
  ChildResult a = test::run_under_shim({kApp, "need", "60"}, env(group_conf(120), 120));
  EXPECT_EQ(a.exit_status, 0) << a.output;
  EXPECT_NE(a.output.find("asked 1 other member"), std::string::npos) << a.output;
  // A was short of 20 MiB: B, the largest idle cache, gave back that much (whole units) and kept
  // the rest; C was not asked.
  EXPECT_LE(slot_reserved(b.pid), static_cast<long long>(40 * kMiB)) << "B gave back at least the shortfall";
  EXPECT_GT(slot_reserved(b.pid), 0) << "B kept what A did not need";
  EXPECT_EQ(slot_reserved(c.pid), static_cast<long long>(20 * kMiB)) << "C was not asked";
  stop(b);
  stop(c);
}

// B's 80 MiB are live: A asks, B has nothing idle to give, A runs out within the wait, and every
// one of B's blocks is still live in the driver.
TEST_F(Share, LiveMemoryIsNeverReleased) {
  RunningChild& b = start_ready({kApp, "hold-live", "80"}, env(group_conf(100), 100));
  const auto t0 = std::chrono::steady_clock::now();
  ChildResult a = test::run_under_shim({kApp, "need", "60"}, env(group_conf(100, "group_release_wait_ms:300"), 100));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(a.exit_status, 3) << a.output;
  EXPECT_NE(a.output.find("asked 1 other member"), std::string::npos) << a.output;
  EXPECT_LT(ms, 3000) << "the wait is bounded";
  EXPECT_EQ(slot_reserved(b.pid), static_cast<long long>(80 * kMiB));
  ChildResult br = stop(b);
  EXPECT_EQ(br.exit_status, 0) << br.output;
  EXPECT_NE(br.output.find("live blocks intact"), std::string::npos) << br.output;
}

// A member killed with SIGKILL leaves its slot behind; the next process that needs the budget
// finds it dead (pid and start time) and takes its share back.
TEST_F(Share, KilledMembersShareIsReclaimed) {
  RunningChild& b = start_ready({kApp, "hold-live", "80"}, env(group_conf(100), 100));
  const int bpid = b.pid;
  EXPECT_EQ(slot_reserved(bpid), static_cast<long long>(80 * kMiB));
  kill(bpid, SIGKILL);
  ChildResult br = test::finish(b);
  b.pid = -1;
  EXPECT_EQ(br.signal, SIGKILL);
  EXPECT_EQ(slot_reserved(bpid), static_cast<long long>(80 * kMiB)) << "the dead slot stays until someone needs it";
  ChildResult a = test::run_under_shim({kApp, "need", "100"}, env(group_conf(100), 100));
  EXPECT_EQ(a.exit_status, 0) << a.output;
  EXPECT_NE(a.output.find("reclaimed the slot of pid " + std::to_string(bpid)), std::string::npos) << a.output;
  EXPECT_EQ(slot_reserved(bpid), -1);
}

// A ledger another user could have written (wrong mode, wrong owner) or a symbolic link at its
// name fails closed: the allocation is refused, with an error naming the file, its owner and the
// fix; the file is left untouched.
TEST_F(Share, ForeignLedgerFailsClosed) {
  // A valid ledger but writable by others.
  {
    ChildResult make = test::run_under_shim({kApp, "need", "20"}, env(group_conf(40), 40));
    ASSERT_EQ(make.exit_status, 0) << make.output;
  }
  ASSERT_EQ(chmod(ledger().c_str(), 0666), 0);
  ChildResult a = test::run_under_shim({kApp, "need", "20"}, env(group_conf(40), 40));
  EXPECT_EQ(a.exit_status, 3) << "refused at the first allocation\n" << a.output;
  EXPECT_NE(a.output.find("out of memory after 0 MiB"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("the group ledger " + ledger() + " has mode 0666"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("owner uid " + std::to_string(geteuid())), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("give this group another name"), std::string::npos) << a.output;
  struct stat st {};
  ASSERT_EQ(stat(ledger().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u) << "refused, not repaired";
  ASSERT_EQ(chmod(ledger().c_str(), 0600), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(ledger().c_str(), 4321, 4321), 0);
    ChildResult o = test::run_under_shim({kApp, "need", "20"}, env(group_conf(40), 40));
    EXPECT_EQ(o.exit_status, 3) << o.output;
    EXPECT_NE(o.output.find("belongs to uid 4321"), std::string::npos) << o.output;
    EXPECT_NE(o.output.find("owner uid 4321"), std::string::npos) << o.output;
  }
  std::filesystem::remove(ledger());
  const std::string target = dir_ + "/elsewhere";
  { std::ofstream(target) << "x"; }
  ASSERT_EQ(symlink(target.c_str(), ledger().c_str()), 0);
  ChildResult l = test::run_under_shim({kApp, "need", "20"}, env(group_conf(40), 40));
  EXPECT_EQ(l.exit_status, 3) << l.output;
  EXPECT_NE(l.output.find("is a symbolic link"), std::string::npos) << l.output;
  std::ifstream in(target);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "x") << "the link's target is never written";
}

// The owner check compares with the uid it is given (the effective uid unless a caller says
// otherwise), so it is tested without a second user: a file of this user is foreign to any other.
TEST_F(Share, LedgerOfAnotherOwnerIsRefused) {
  const std::string path = dir_ + "/owned";
  share::Mapping mine = share::map_file(path, 4096, true);
  ASSERT_TRUE(mine) << mine.error;
  share::unmap(mine);
  const long other = static_cast<long>(geteuid()) + 1;
  share::Mapping m = share::map_file(path, 4096, false, 0, other);
  EXPECT_FALSE(m);
  EXPECT_TRUE(m.foreign);
  EXPECT_NE(m.error.find("belongs to uid " + std::to_string(geteuid()) + ", not to this user (uid " +
                         std::to_string(other) + ")"),
            std::string::npos)
      << m.error;
  share::Mapping again = share::map_file(path, 4096, false, 0);
  EXPECT_TRUE(again) << again.error;
  share::unmap(again);
}

// A slot left by a member in another PID namespace (a container sharing /dev/shm): its pid names
// no process here, yet it may well live. It is not reclaimed, so the budget holds; a slot of this
// namespace whose process is gone is.
TEST_F(Share, SlotOfAnotherPidNamespaceIsNotReclaimed) {
  ChildResult make = test::run_under_shim({kApp, "need", "20"}, env(group_conf(100), 100));
  ASSERT_EQ(make.exit_status, 0) << make.output;
  // A pid that names no process here.
  int ghost = 4'000'000;
  while (kill(ghost, 0) == 0 || errno != ESRCH) --ghost;
  auto plant = [&](std::uint64_t ns) {
    share::Mapping m = share::map_file(ledger(), sizeof(share::Ledger), false, 0);
    ASSERT_TRUE(m) << m.error;
    auto* l = static_cast<share::Ledger*>(m.addr);
    share::LedgerSlot* free_slot = nullptr;
    for (share::LedgerSlot& sl : l->slot)
      if (sl.state.load() != share::kSlotLive && free_slot == nullptr) free_slot = &sl;
    ASSERT_NE(free_slot, nullptr);
    free_slot->pid.store(ghost);
    free_slot->start_time.store(12345);
    free_slot->pid_ns.store(ns);
    free_slot->reserved.store(80 * kMiB);
    free_slot->state.store(share::kSlotLive);
    l->total.store(l->total.load() + 80 * kMiB);
    share::unmap(m);
  };
  plant(share::pid_namespace() + 1);
  ChildResult a = test::run_under_shim({kApp, "need", "40"}, env(group_conf(100), 100));
  EXPECT_EQ(a.exit_status, 3) << "the other namespace's 80 MiB still count\n" << a.output;
  EXPECT_EQ(a.output.find("reclaimed the slot of pid " + std::to_string(ghost)), std::string::npos) << a.output;
  EXPECT_EQ(slot_reserved(ghost), static_cast<long long>(80 * kMiB));
  std::filesystem::remove(ledger());
  ChildResult remake = test::run_under_shim({kApp, "need", "20"}, env(group_conf(100), 100));
  ASSERT_EQ(remake.exit_status, 0) << remake.output;
  plant(share::pid_namespace());
  ChildResult b = test::run_under_shim({kApp, "need", "40"}, env(group_conf(100), 100));
  EXPECT_EQ(b.exit_status, 0) << b.output;
  EXPECT_NE(b.output.find("reclaimed the slot of pid " + std::to_string(ghost)), std::string::npos) << b.output;
}

// Another process of the user truncates the ledger and the stats record under a running member:
// the member leaves the group with a warning and stops publishing, instead of dying of SIGBUS on
// its next touch of the mapping; `top` reads the short record without harm.
TEST_F(Share, TruncatedLedgerAndRecordDoNotKillTheMember) {
  RunningChild& b = start_ready({kApp, "hold", "40"}, env(group_conf(100), 100));
  const std::string record = dir_ + "/cudapool-" + std::to_string(geteuid()) + "-p-" + std::to_string(b.pid);
  // The helper thread creates the record with the first pool, sizes it, then writes its first
  // contents, the magic last; wait for the magic (truncated before, the writes would size the
  // record again, and nothing would be seen truncated).
  auto written = [&] {
    const int fd = open(record.c_str(), O_RDONLY | O_CLOEXEC);
    std::uint64_t magic = 0;
    const bool read = fd >= 0 && pread(fd, &magic, sizeof magic, offsetof(share::ProcRecord, magic)) == sizeof magic;
    if (fd >= 0) close(fd);
    return read && magic == share::kRecordMagic;
  };
  for (int i = 0; i < 100 && !written(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(written());
  // Right after the record, the helper publishes B's figures in the ledger, then sleeps 250 ms.
  // Touching the ledger's mapping after a truncation raises SIGBUS, and the size check before
  // each touch leaves a window of a few stores (group_ledger.h); truncating at the moment of the
  // publication would aim at that window, so the files are truncated while the helper sleeps.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(truncate(ledger().c_str(), 0), 0);
  ASSERT_EQ(truncate(record.c_str(), 100), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // publications touch both
  ChildResult t = test::run_under_shim({CUDAPOOL_BIN_PATH, "top", "--once", "--json", "-"},
                                       {{"CUDAPOOL_SHM_DIR", dir_}}, false);
  EXPECT_EQ(t.exit_status, 0) << t.output;
  EXPECT_NE(t.output.find("has 100 bytes"), std::string::npos) << t.output;
  ChildResult br = stop(b);
  EXPECT_EQ(br.signal, 0) << "killed by signal " << br.signal << "\n" << br.output;
  EXPECT_EQ(br.exit_status, 0) << br.output;
  EXPECT_NE(br.output.find("was truncated by another process of this user"), std::string::npos) << br.output;
  EXPECT_NE(br.output.find("the stats record " + record + " was truncated"), std::string::npos) << br.output;
}

// A member that died holding the ledger's lock wedges nothing: the next one gets EOWNERDEAD,
// recounts the total from the slots and goes on under the budget.
TEST_F(Share, MemberThatDiedHoldingTheLockWedgesNothing) {
  // ThreadSanitizer does not follow a robust mutex recovered with EOWNERDEAD from another
  // process (it reports the unlock as one of a mutex this thread never locked).
  if (std::string(CUDAPOOL_SAN_PRELOAD).find("tsan") != std::string::npos)
    GTEST_SKIP() << "robust mutexes across processes are outside ThreadSanitizer's model";
  ChildResult make = test::run_under_shim({kApp, "need", "40"}, env(group_conf(100), 100));
  ASSERT_EQ(make.exit_status, 0) << make.output;
  ChildResult die = test::run_under_shim({kApp, "lock-and-exit"}, env(group_conf(100), 100), false);
  ASSERT_EQ(die.exit_status, 0) << die.output;
  ASSERT_NE(die.output.find("holding the ledger's lock"), std::string::npos) << die.output;
  ChildResult a = test::run_under_shim({kApp, "need", "100"}, env(group_conf(100), 100));
  EXPECT_EQ(a.exit_status, 0) << a.output;
  EXPECT_NE(a.output.find("a member died holding the ledger's lock"), std::string::npos) << a.output;
  ChildResult over = test::run_under_shim({kApp, "need", "120"}, env(group_conf(100), 100));
  EXPECT_EQ(over.exit_status, 3) << "the budget still holds after the recovery\n" << over.output;
}

// A member stopped while holding the lock: the others give up on the ledger after 2 s with a
// warning and run on their own caps instead of hanging.
TEST_F(Share, LockHeldByAStoppedMemberTimesOut) {
  ChildResult make = test::run_under_shim({kApp, "need", "20"}, env(group_conf(40), 40));
  ASSERT_EQ(make.exit_status, 0) << make.output;
  RunningChild& holder = start_ready({kApp, "lock-and-wait"}, env(group_conf(40), 40));
  const auto t0 = std::chrono::steady_clock::now();
  ChildResult a = test::run_under_shim({kApp, "need", "60"}, env(group_conf(40), 40));
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(a.exit_status, 0) << a.output;
  EXPECT_NE(a.output.find("could not be locked (held for more than 2 s)"), std::string::npos) << a.output;
  EXPECT_LT(s, 10);
  stop(holder);
}

// `cudapool top --once --json -` lists the live processes with their reserved bytes (and the
// memory a member created itself with cuMemCreate, which the group's ledger counts), drops a
// killed one and removes its record.
TEST_F(Share, TopListsLiveProcessesWithTheirFigures) {
  RunningChild& b = start_ready({kApp, "hold", "40"}, env(group_conf(200), 200));
  RunningChild& c = start_ready({kApp, "hold-live", "60"}, env("log_level:warn", 200));
  RunningChild& v = start_ready({kApp, "hold-vmm", "24"}, env(group_conf(200), 200));
  const int bpid = b.pid, cpid = c.pid, vpid = v.pid;
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // two publications
  auto top = [&] {
    return test::run_under_shim({CUDAPOOL_BIN_PATH, "top", "--once", "--json", "-"}, {{"CUDAPOOL_SHM_DIR", dir_}},
                                false);
  };
  ChildResult t = top();
  ASSERT_EQ(t.exit_status, 0) << t.output;
  auto entry = [&](int pid) {
    const auto at = t.output.find("{\"pid\":" + std::to_string(pid) + ",");
    if (at == std::string::npos) return std::string();
    return t.output.substr(at, t.output.find("]}", at) - at);
  };
  // Each process republishes every 250 ms; on a loaded machine the group's total in b's record
  // may still predate v's creation. Ask again for up to 5 s.
  for (int i = 0; i < 20 && entry(bpid).find("\"group_reserved_bytes\":67108864") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    t = top();
  }
  const std::string be = entry(bpid), ce = entry(cpid);
  EXPECT_NE(be.find("\"reserved_bytes\":41943040,\"allocated_bytes\":0,\"cached_bytes\":41943040"), std::string::npos)
      << t.output;
  EXPECT_NE(be.find("\"group\":\"share_test\""), std::string::npos) << t.output;
  // The group's total: b's 40 MiB and the 24 MiB v created itself.
  EXPECT_NE(be.find("\"group_budget_bytes\":209715200,\"group_reserved_bytes\":67108864"), std::string::npos)
      << t.output;
  EXPECT_NE(ce.find("\"reserved_bytes\":62914560,\"allocated_bytes\":62914560,\"cached_bytes\":0"), std::string::npos)
      << t.output;
  EXPECT_NE(ce.find("\"group\":\"\""), std::string::npos) << t.output;
  EXPECT_NE(ce.find("share_app hold-live 60"), std::string::npos) << t.output;
  const std::string ve = entry(vpid);
  EXPECT_NE(ve.find("\"reserved_bytes\":0,\"allocated_bytes\":0,\"cached_bytes\":0,\"external_bytes\":25165824"),
            std::string::npos)
      << t.output;
  EXPECT_NE(ve.find("\"group_reserved_bytes\":67108864"), std::string::npos) << t.output;  // 40 + 24 MiB

  kill(cpid, SIGKILL);
  test::finish(c);
  c.pid = -1;
  const std::string record = dir_ + "/cudapool-" + std::to_string(geteuid()) + "-p-" + std::to_string(cpid);
  EXPECT_TRUE(std::filesystem::exists(record));
  t = top();
  EXPECT_EQ(t.output.find("\"pid\":" + std::to_string(cpid) + ","), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("\"pid\":" + std::to_string(bpid) + ","), std::string::npos) << t.output;
  EXPECT_FALSE(std::filesystem::exists(record)) << "top removes the records of processes that are gone";
  ChildResult vr = stop(v);
  EXPECT_EQ(vr.exit_status, 0) << vr.output;  // its cuMemRelease went through
  ChildResult br = stop(b);
  EXPECT_EQ(br.exit_status, 0);
  const std::string brecord = dir_ + "/cudapool-" + std::to_string(geteuid()) + "-p-" + std::to_string(bpid);
  EXPECT_FALSE(std::filesystem::exists(brecord)) << "a process removes its own record at exit";
}

// The fake driver gives every context 30 MiB of its own (FAKECUDA_CONTEXT_MB), outside any
// allocation, as a CUDA context and its libraries take on a GPU. Under a 200 MiB budget A keeps
// 100 MiB live and B asks for 100 MiB more. Counting the whole footprint (the default), B gets
// only what is left after both contexts (40 MiB) and the device never holds more than the
// budget; counting the pools only, B gets its 100 MiB and the device holds 260 MiB.
TEST_F(Share, BudgetBoundsTheWholeFootprint) {
  auto run = [&](const std::string& extra) {
    const std::string machine = dir_ + "/machine";
    { std::ofstream(machine, std::ios::binary | std::ios::trunc) << std::string(16, '\0'); }
    std::filesystem::remove(ledger());
    auto e = env(group_conf(200, extra), 1 << 20);
    e["FAKECUDA_MACHINE_FILE"] = machine;
    e["FAKECUDA_CONTEXT_MB"] = "30";
    RunningChild& a = start_ready({kApp, "hold-live", "100"}, e);
    ChildResult b = test::run_under_shim({kApp, "need", "100"}, e);
    ChildResult t = test::run_under_shim({CUDAPOOL_BIN_PATH, "top", "--once", "--json", "-"},
                                         {{"CUDAPOOL_SHM_DIR", dir_}}, false);
    stop(a);
    std::uint64_t counts[2] = {};
    std::ifstream(machine, std::ios::binary).read(reinterpret_cast<char*>(counts), sizeof counts);
    return std::make_tuple(b, counts[1], t.output);
  };
  const auto [b, peak, top] = run("");
  EXPECT_EQ(b.exit_status, 3) << b.output;
  EXPECT_NE(b.output.find("out of memory after 40 MiB"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("30.0 MiB outside the pool charged"), std::string::npos) << b.output;
  EXPECT_LE(peak, 200 * kMiB);
  EXPECT_EQ(peak, 200 * kMiB) << "the budget was used up to the byte";
  // top: the group's pool and outside bytes against its budget (A's 100 MiB and context; B left).
  EXPECT_NE(top.find("\"budget_bytes\":209715200,\"reserved_bytes\":104857600,\"outside_bytes\":31457280"),
            std::string::npos)
      << top;
  EXPECT_NE(top.find("\"outside_bytes\":31457280,\"inactive_split_bytes\""), std::string::npos) << top;
  EXPECT_NE(top.find("\"gone_members\":1"), std::string::npos) << "B exited; its slot waits\n" << top;

  const auto [pb, ppeak, ptop] = run("group_budget_counts:pool");
  EXPECT_EQ(pb.exit_status, 0) << pb.output;
  EXPECT_EQ(ppeak, 260 * kMiB) << "counting the pools only, the contexts come on top of the budget";
}

// A context grows after its process joined (a real driver loads a kernel's module at its first
// launch): FAKECUDA_LAUNCH_MB adds 20 MiB at a context's first launch. Under a 200 MiB budget with
// 30 MiB contexts, A holds 60 MiB, B as much as the budget lets it, then A launches. Holding
// group_outside_growth_mb:20 for each from its join, B gets 20 MiB less and the device never holds
// more than the budget; holding nothing, B gets those 20 MiB and A's launch takes the device 20 MiB
// over it (the budget can only follow growth it did not hold for).
TEST_F(Share, ContextGrowthStaysInsideTheBudget) {
  auto run = [&](int growth_mb, int b_mib) {
    const std::string machine = dir_ + "/machine";
    { std::ofstream(machine, std::ios::binary | std::ios::trunc) << std::string(16, '\0'); }
    std::filesystem::remove(ledger());
    auto e = env(group_conf(200, "group_outside_growth_mb:" + std::to_string(growth_mb)), 1 << 20);
    e["FAKECUDA_MACHINE_FILE"] = machine;
    e["FAKECUDA_CONTEXT_MB"] = "30";
    e["FAKECUDA_LAUNCH_MB"] = "20";
    running_.push_back(test::start_under_shim({kApp, "turn", "1", "60"}, e));
    RunningChild& a = running_.back();
    auto read_until = [](RunningChild& c, const std::string& text) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      char buf[4096];
      while (c.output.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
        pollfd p{c.fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        const ssize_t n = read(c.fd, buf, sizeof buf);
        if (n <= 0) break;
        c.output.append(buf, static_cast<std::size_t>(n));
      }
      return c.output.find(text) != std::string::npos;
    };
    EXPECT_TRUE(read_until(a, "turn 1: filled 60 MiB")) << a.output;
    // What is left for a second member is what B then takes.
    ChildResult probe = test::run_under_shim({kApp, "need", std::to_string(b_mib + 20)}, e);
    EXPECT_NE(probe.output.find("need: out of memory after " + std::to_string(b_mib) + " MiB"), std::string::npos)
        << probe.output;
    RunningChild& b = start_ready({kApp, "hold-live", std::to_string(b_mib)}, e);
    kill(a.pid, SIGUSR2);  // A's first launch: its context grows by 20 MiB
    EXPECT_TRUE(read_until(a, "turn 1: touched 1 ok")) << a.output;
    ChildResult ar = stop(a), br = stop(b);
    EXPECT_EQ(ar.exit_status, 0) << ar.output;
    EXPECT_EQ(br.exit_status, 0) << br.output;
    std::uint64_t counts[2] = {};
    std::ifstream(machine, std::ios::binary).read(reinterpret_cast<char*>(counts), sizeof counts);
    return counts[1];
  };
  // A: 30 + 20 held + 60; B: 30 + 20 held + 40 = the budget (B is refused a 60th MiB). After A's
  // launch the device holds 180.
  EXPECT_LE(run(20, 40), 200 * kMiB) << "the growth was held for";
  // Nothing held: B fits 80 MiB, and A's launch takes the device to 220 MiB.
  EXPECT_EQ(run(0, 80), 220 * kMiB) << "the control: growth nobody held for passes the budget";
}

// A process whose own context does not fit what the group has left is refused at its first
// allocation, with a warning that says why and what to change.
TEST_F(Share, ProcessWhoseContextDoesNotFitIsRefusedAtOnce) {
  const std::string machine = dir_ + "/machine";
  { std::ofstream(machine, std::ios::binary) << std::string(16, '\0'); }
  auto e = env(group_conf(50), 1 << 20);
  e["FAKECUDA_MACHINE_FILE"] = machine;
  e["FAKECUDA_CONTEXT_MB"] = "30";
  RunningChild& a = start_ready({kApp, "hold-live", "20"}, e);
  ChildResult b = test::run_under_shim({kApp, "need", "20"}, e);
  EXPECT_EQ(b.exit_status, 3) << b.output;
  EXPECT_NE(b.output.find("out of memory after 0 MiB"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("brings the group to 80.0 MiB of its 50.0 MiB budget"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("group_budget_counts:pool"), std::string::npos) << b.output;
  stop(a);
  // A fixed charge instead of the measured one (group_outside_mb:N, for a GPU shared with
  // processes outside the group): 5 MiB each, so both fit, whatever the device shows.
  std::filesystem::remove(ledger());
  auto f = e;
  f["CUDAPOOL_CONF"] = group_conf(50, "group_outside_mb:5");
  RunningChild& a2 = start_ready({kApp, "hold-live", "20"}, f);
  ChildResult c = test::run_under_shim({kApp, "need", "20"}, f);
  EXPECT_EQ(c.exit_status, 0) << c.output;
  EXPECT_NE(c.output.find("5.0 MiB outside the pool charged"), std::string::npos) << c.output;
  stop(a2);
}

// A program that never touches CUDA starts nothing: no thread, no file.
TEST_F(Share, ProcessWithoutCudaIsUndisturbed) {
  ChildResult r = test::run_under_shim({"/bin/sh", "-c", "ls /proc/self/task | wc -l"}, env(group_conf(100), 100));
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "no ledger and no stats record";
}

}  // namespace
}  // namespace cudapool
