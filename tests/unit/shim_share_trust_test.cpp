// The shared files of a group under hostile or careless hands, on the fake driver
// (tests/fakecuda/share_app.cpp): a ledger path this process cannot open or check (another
// user's file, a directory, a socket, a FIFO) fails closed with a message naming the file, its
// owner, its type and mode and the fix; a ledger truncated at the worst moment of a join (the
// fake truncates it while it is mapped, from inside the join's locked section) fails closed
// instead of killing the process with SIGBUS; stale stats records (empty, unfinished, of a
// process that is gone) are swept by `cudapool top` and by the next process that publishes,
// never another user's, never a young one; and forked children that exit at once leave none.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shim/group/group_ledger_layout.h"
#include "telemetry/share.h"
#include "tests/unit/shim_child.h"

namespace cudapool {
namespace {

using test::ChildResult;

const std::string kApp = std::string(CUDAPOOL_FAKECUDA_DIR) + "/share_app";
const std::string kGpu0 = "GPU-a5a6a7a8-a9aa-abac-adae-afb0b1b2b300";  // the fake's device 0
constexpr unsigned kNobody = 65534;

class ShareTrust : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cudapool-trust-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::map<std::string, std::string> env(const std::string& extra = "") const {
    return {{"CUDAPOOL_SHM_DIR", dir_},
            {"CUDAPOOL_CONF", "group:share_test,group_budget_mb:40,group_outside_growth_mb:0,log_level:info" + extra}};
  }
  std::string ledger(unsigned uid = geteuid()) const {
    return dir_ + "/cudapool-" + std::to_string(uid) + "-g-" + kGpu0 + "-share_test";
  }
  std::string record(int pid) const {
    return dir_ + "/cudapool-" + std::to_string(geteuid()) + "-p-" + std::to_string(pid);
  }
  // "owner uid 0 (root)": how the messages name the owner of a file.
  static std::string owner_text(unsigned uid) {
    const std::string name = share::user_name(uid);
    return "owner uid " + std::to_string(uid) + (name.empty() ? "" : " (" + name + ")");
  }
  // A pid that names no process.
  static int ghost_pid(int below = 4'000'000) {
    int p = below;
    while (kill(p, 0) == 0 || errno != ESRCH) --p;
    return p;
  }
  // An empty (or `bytes` zero bytes) file of this user, mode 0600, last written `age_s` seconds
  // ago (negative: in the future).
  static void plant(const std::string& path, std::size_t bytes, long age_s) {
    { std::ofstream(path, std::ios::binary) << std::string(bytes, '\0'); }
    ASSERT_EQ(chmod(path.c_str(), 0600), 0);
    timespec when[2] = {};
    clock_gettime(CLOCK_REALTIME, &when[0]);
    when[0].tv_sec -= age_s;
    when[1] = when[0];
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), when, AT_SYMLINK_NOFOLLOW), 0);
  }
  static bool has(const ChildResult& r, const std::string& s) { return r.output.find(s) != std::string::npos; }
  static bool exists(const std::string& path) {
    struct stat st {};
    return lstat(path.c_str(), &st) == 0;
  }

  std::string dir_;
};

// A directory, a socket or a FIFO at the ledger's name: the process cannot open it as a ledger,
// so it refuses the group's allocations (out of memory at the first one) instead of running
// without the budget, says what is there and whose it is, and never blocks on the FIFO.
TEST_F(ShareTrust, NonRegularFileAtTheLedgerPathFailsClosed) {
  const std::string me = owner_text(geteuid());
  struct Case {
    const char* kind;
    std::function<bool()> make;
  };
  const std::vector<Case> cases = {
      {"a directory", [&] { return mkdir(ledger().c_str(), 0755) == 0 && chmod(ledger().c_str(), 0755) == 0; }},
      {"a FIFO", [&] { return mkfifo(ledger().c_str(), 0600) == 0; }},
      {"a socket",
       [&] {
         const int s = socket(AF_UNIX, SOCK_STREAM, 0);
         sockaddr_un a{};
         a.sun_family = AF_UNIX;
         if (ledger().size() >= sizeof a.sun_path) return false;
         std::strcpy(a.sun_path, ledger().c_str());
         const bool ok = s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
         if (s >= 0) close(s);
         return ok;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.kind);
    std::filesystem::remove_all(ledger());
    ASSERT_TRUE(c.make()) << std::strerror(errno);
    ChildResult r = test::run_under_shim({kApp, "need", "20"}, env());
    EXPECT_EQ(r.signal, 0) << r.output;
    EXPECT_EQ(r.exit_status, 3) << "refused at the first allocation\n" << r.output;
    EXPECT_TRUE(has(r, "out of memory after 0 MiB")) << r.output;
    EXPECT_TRUE(has(r, "the group ledger " + ledger() + " is not a regular file (" + c.kind + ")")) << r.output;
    EXPECT_TRUE(has(r, me + ", " + c.kind + ", mode ")) << r.output;
    EXPECT_TRUE(has(r, "Fix: remove it")) << r.output;
    EXPECT_FALSE(has(r, "keeps only its own caps")) << r.output;
  }
}

// Another user's file at the ledger's name (in a sticky directory anyone can create files in).
// As root the process can open it and refuses it for its owner; a process of an ordinary user
// cannot open a 0600 or 0644 file of another user at all, which must fail closed the same way.
TEST_F(ShareTrust, LedgerOfAnotherUserFailsClosed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give files to another user and to run as one";
  ASSERT_EQ(chmod(dir_.c_str(), 01777), 0);  // like /dev/shm
  // Root's view: a file of uid 65534 at root's ledger name.
  for (const mode_t mode : {0600u, 0644u}) {
    SCOPED_TRACE(mode);
    std::filesystem::remove(ledger());
    { std::ofstream(ledger()) << std::string(sizeof(share::Ledger), 'x'); }
    ASSERT_EQ(chmod(ledger().c_str(), mode), 0);
    if (chown(ledger().c_str(), kNobody, kNobody) != 0) GTEST_SKIP() << "chown not permitted here";
    ChildResult r = test::run_under_shim({kApp, "need", "20"}, env());
    EXPECT_EQ(r.exit_status, 3) << r.output;
    EXPECT_TRUE(has(r, "belongs to uid 65534")) << r.output;
    EXPECT_TRUE(has(r, owner_text(kNobody) + ", a regular file, mode 0" + (mode == 0600 ? "600" : "644"))) << r.output;
    EXPECT_TRUE(has(r, "remove it (as its owner or root)")) << r.output;
  }
  // An ordinary user's view (uid 65534 through setpriv): root's file at its ledger name, which it
  // may not open for writing.
  const char* setpriv = "/usr/bin/setpriv";
  if (access(setpriv, X_OK) != 0) GTEST_SKIP() << "setpriv (util-linux) is needed to run as another user";
  // uid 65534 must reach the program, the library and the fake driver: a checkout in a private
  // directory (as mktemp -d makes) keeps it out, and then only root's view above is checked.
  const std::string reach = std::string(setpriv) + " --reuid=65534 --regid=65534 --clear-groups sh -c 'test -x " +
                            kApp + " && test -r " + CUDAPOOL_SHIM_SO + " && test -r " + CUDAPOOL_FAKECUDA_DIR +
                            "/libcuda.so.1'";
  if (std::system(reach.c_str()) != 0)
    GTEST_SKIP() << "uid 65534 cannot reach " << kApp << ": the ordinary user's view is not checked";
  for (const mode_t mode : {0600u, 0644u}) {
    SCOPED_TRACE(mode);
    const std::string path = ledger(kNobody);
    std::filesystem::remove(path);
    { std::ofstream(path) << std::string(sizeof(share::Ledger), 'x'); }
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    ChildResult r = test::run_under_shim({setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", kApp, "need",
                                          "20"},
                                         env());
    EXPECT_EQ(r.signal, 0) << r.output;
    EXPECT_EQ(r.exit_status, 3) << "refused at the first allocation, not run without the budget\n" << r.output;
    EXPECT_TRUE(has(r, "out of memory after 0 MiB")) << r.output;
    EXPECT_TRUE(has(r, "the group ledger " + path + " cannot be opened: Permission denied")) << r.output;
    EXPECT_TRUE(has(r, owner_text(0) + ", a regular file, mode 0" + (mode == 0600 ? "600" : "644"))) << r.output;
    EXPECT_TRUE(has(r, "remove it (as its owner or root)")) << r.output;
    EXPECT_FALSE(has(r, "keeps only its own caps")) << r.output;
  }
}

// The ledger is truncated at the worst moment of a join: inside its locked section, after the
// size checks, when the member measures the device (the fake truncates the file at the first
// cuMemGetInfo made while it is mapped). The process used to die of SIGBUS there; it now refuses
// the group's allocations with a message that says what happened, whether it created the ledger
// or joined one that was there. The next process finds the empty file and fails closed too.
TEST_F(ShareTrust, LedgerTruncatedWhileJoiningFailsClosed) {
  for (const bool existing : {false, true}) {
    SCOPED_TRACE(existing ? "joining a ledger that was there" : "creating the ledger");
    std::filesystem::remove(ledger());
    if (existing) {
      ChildResult make = test::run_under_shim({kApp, "need", "20"}, env());
      ASSERT_EQ(make.exit_status, 0) << make.output;
    }
    auto e = env();
    e["FAKECUDA_TRUNCATE_MAPPED"] = ledger();
    ChildResult r = test::run_under_shim({kApp, "need", "20"}, e);
    EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << "\n" << r.output;
    EXPECT_TRUE(has(r, "fakecuda: truncated " + ledger())) << "the fake truncated it inside the join\n" << r.output;
    EXPECT_EQ(r.exit_status, 3) << r.output;
    EXPECT_TRUE(has(r, "out of memory after 0 MiB")) << r.output;
    EXPECT_TRUE(has(r, "the group ledger " + ledger() +
                           " was truncated by another process of this user while this process joined"))
        << r.output;
    EXPECT_TRUE(has(r, "stop the group's processes and remove it")) << r.output;
  }
  ChildResult next = test::run_under_shim({kApp, "need", "20"}, env());
  EXPECT_EQ(next.exit_status, 3) << next.output;
  EXPECT_TRUE(has(next, "has 0 bytes, not the " + std::to_string(sizeof(share::Ledger)) + " bytes")) << next.output;
}

// The ledger is truncated while a joining process waits for its lock (another member holds it):
// the lock is polled, never waited for in the kernel (glibc ends the process when a futex wait
// fails with EFAULT; a futex wait already asleep just runs to its timeout, and the process then
// runs without the budget), so the poll's fault is caught and the process fails closed.
TEST_F(ShareTrust, LedgerTruncatedWhileWaitingForItsLockFailsClosed) {
  ChildResult make = test::run_under_shim({kApp, "need", "20"}, env());
  ASSERT_EQ(make.exit_status, 0) << make.output;
  test::RunningChild holder = test::start_under_shim({kApp, "lock-and-wait"}, env(), false);
  std::string said;
  char buf[4096];
  for (int i = 0; i < 400 && said.find("ready") == std::string::npos; ++i) {
    pollfd p{holder.fd, POLLIN, 0};
    if (poll(&p, 1, 25) > 0) {
      const ssize_t n = read(holder.fd, buf, sizeof buf);
      if (n <= 0) break;
      said.append(buf, static_cast<std::size_t>(n));
    }
  }
  ASSERT_NE(said.find("ready"), std::string::npos) << said;
  const auto t0 = std::chrono::steady_clock::now();
  test::RunningChild joiner = test::start_under_shim({kApp, "need", "20"}, env());
  // The joiner has mapped the ledger: it is about to take the lock or polling for it. (Whatever
  // it is doing then, the code before polling failed: a fault on the mapping outside any guard,
  // a futex wait that fails with EFAULT, or one that sleeps to its timeout and runs on without
  // the budget.)
  auto mapped = [&] {
    std::ifstream maps("/proc/" + std::to_string(joiner.pid) + "/maps");
    std::string line;
    while (std::getline(maps, line))
      if (line.find(ledger()) != std::string::npos) return true;
    return false;
  };
  for (int i = 0; i < 10000 && !mapped(); ++i) poll(nullptr, 0, 1);
  ASSERT_TRUE(mapped()) << test::finish(joiner).output;
  ASSERT_EQ(truncate(ledger().c_str(), 0), 0);
  const auto truncated_after = std::chrono::steady_clock::now() - t0;
  ChildResult r = test::finish(joiner);
  kill(holder.pid, SIGTERM);
  test::finish(holder);
  // The joiner gives up on the lock 2 s after it began to wait; only a test stalled that long
  // before it truncated can see that, whatever the code does.
  if (has(r, "could not be locked (held for more than 2 s)") && truncated_after > std::chrono::milliseconds(1500))
    GTEST_SKIP() << "this test was stalled past the joiner's 2 s for the lock before it truncated the ledger";
  EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << "\n" << r.output;
  EXPECT_EQ(r.exit_status, 3) << r.output;
  EXPECT_TRUE(has(r, "was truncated by another process of this user while this process joined")) << r.output;
}

// A file of this user at the ledger's name that is not a ledger of this layout (too short, or
// the right size with no magic) cannot be checked: it fails closed too.
TEST_F(ShareTrust, CorruptLedgerFailsClosed) {
  for (const std::size_t size : {sizeof(share::Ledger), std::size_t{100}}) {
    std::filesystem::remove(ledger());
    { std::ofstream(ledger(), std::ios::binary) << std::string(size, 'x'); }
    ASSERT_EQ(chmod(ledger().c_str(), 0600), 0);
    ChildResult r = test::run_under_shim({kApp, "need", "20"}, env());
    EXPECT_EQ(r.exit_status, 3) << r.output;
    EXPECT_TRUE(has(r, "out of memory after 0 MiB")) << r.output;
    EXPECT_TRUE(has(r, "the group ledger " + ledger())) << r.output;
    EXPECT_TRUE(has(r, size == 100 ? "has 100 bytes" : "bad magic")) << r.output;
    EXPECT_TRUE(has(r, "stop the group's processes and remove it")) << r.output;
  }
}

// Stale stats records: `cudapool top` removes the empty and unfinished ones that have not been
// written for a while and those of processes that are gone, without a warning for each; it keeps
// a young empty one (its creator may be sizing it right now), another user's (whatever its name),
// and a damaged record of a live process (and names it). The next process that publishes its
// own record sweeps the same way.
TEST_F(ShareTrust, StaleStatsRecordsAreSwept) {
  const int dead1 = ghost_pid(), dead2 = ghost_pid(dead1 - 1), dead3 = ghost_pid(dead2 - 1),
            dead4 = ghost_pid(dead3 - 1);
  plant(record(dead1), 0, 3600);                          // empty, an hour old: stale
  plant(record(dead2), sizeof(share::ProcRecord), 3600);  // unfinished (no magic), old: stale
  plant(record(dead3), 0, -3600);                         // empty, written "now": may be in creation
  plant(record(1), 0, 3600);                              // empty and old, though pid 1 lives
  plant(record(getpid()), 100, 3600);                     // damaged, of a live process: kept, named
  bool foreign = false;
  if (geteuid() == 0) {
    plant(record(dead4), 0, 3600);
    foreign = chown(record(dead4).c_str(), kNobody, kNobody) == 0;
  }
  ChildResult t = test::run_under_shim({CUDAPOOL_BIN_PATH, "top", "--once", "--json", "-"},
                                       {{"CUDAPOOL_SHM_DIR", dir_}}, false);
  EXPECT_EQ(t.exit_status, 0) << t.output;
  EXPECT_FALSE(exists(record(dead1))) << t.output;
  EXPECT_FALSE(exists(record(dead2))) << t.output;
  EXPECT_FALSE(exists(record(1))) << t.output;
  EXPECT_TRUE(exists(record(dead3))) << "a young empty record may be being created";
  EXPECT_TRUE(exists(record(getpid()))) << "a live process's record stays";
  EXPECT_TRUE(!foreign || exists(record(dead4))) << "another user's file is never removed";
  EXPECT_FALSE(has(t, "-p-" + std::to_string(dead1) + " ")) << t.output;
  EXPECT_FALSE(has(t, "-p-" + std::to_string(dead3) + " ")) << "no warning for a young empty record\n" << t.output;
  EXPECT_TRUE(has(t, record(getpid()) + " has 100 bytes")) << t.output;

  // The next process of the user that publishes a record sweeps before it creates its own: once
  // its record is there (its magic written), the sweep is done.
  plant(record(dead1), 0, 3600);
  plant(record(dead2), sizeof(share::ProcRecord), 3600);
  test::RunningChild b = test::start_under_shim({kApp, "hold", "20"}, env());
  auto published = [&] {
    const int fd = open(record(b.pid).c_str(), O_RDONLY | O_CLOEXEC);
    std::uint64_t magic = 0;
    const bool read = fd >= 0 && pread(fd, &magic, sizeof magic, offsetof(share::ProcRecord, magic)) == sizeof magic;
    if (fd >= 0) close(fd);
    return read && magic == share::kRecordMagic;
  };
  for (int i = 0; i < 400 && !published(); ++i) poll(nullptr, 0, 25);  // up to 10 s for the state
  EXPECT_TRUE(published());
  EXPECT_FALSE(exists(record(dead1)));
  EXPECT_FALSE(exists(record(dead2)));
  EXPECT_TRUE(exists(record(dead3)));
  EXPECT_TRUE(!foreign || exists(record(dead4)));
  kill(b.pid, SIGTERM);
  ChildResult br = test::finish(b);
  EXPECT_EQ(br.exit_status, 0) << br.output;
  EXPECT_TRUE(has(br, "removed 2 stale stats record(s)")) << br.output;
  EXPECT_FALSE(exists(record(b.pid))) << "a process removes its own record at exit";
}

// Forked children that allocate and exit at once (their exit handlers log the summary while
// their stats thread starts) leave no record behind: exit removes the record or makes sure none
// is created after it. (Before, some children left an empty or unfinished record each time.)
TEST_F(ShareTrust, ForkedChildrenThatExitAtOnceLeaveNoRecords) {
  auto vars = env();
  // ThreadSanitizer sleeps a second at every exit by default (atexit_sleep_ms): 40 children
  // would pass the child's time limit. Ignored outside that build.
  vars["TSAN_OPTIONS"] = "die_after_fork=0:atexit_sleep_ms=0";
  ChildResult r = test::run_under_shim({kApp, "fork-exit", "40"}, vars);
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_TRUE(has(r, "fork-exit: 40 children, 0 records left")) << r.output;
}

}  // namespace
}  // namespace cudapool
