// The SIGBUS guard of the shim's shared mappings (shim/sigbus_guard.h), in this process: a
// fault on a truncated mapping inside a guard becomes a return of false; the handler that was
// there before is back once the guard ends, and it still gets every SIGBUS the guard does not own
// (another address, one sent with raise); guards of many threads at once each get their own.
#include "shim/sigbus_guard.h"

#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace cudapool {
namespace {

// A shared mapping of a file of `pages` pages that the test truncates to 0 (so every access
// faults), as another process of the user could.
struct Truncated {
  explicit Truncated(std::size_t pages) : size(pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {
    char tmpl[] = "/tmp/cudapool-sigbus-XXXXXX";
    fd = mkstemp(tmpl);
    unlink(tmpl);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) return;
    void* a = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (a == MAP_FAILED) return;
    addr = static_cast<volatile std::uint64_t*>(a);
    addr[0] = 42;  // it reads before the truncation
    if (ftruncate(fd, 0) != 0) addr = nullptr;
  }
  ~Truncated() {
    if (addr != nullptr) munmap(const_cast<std::uint64_t*>(addr), size);
    if (fd >= 0) close(fd);
  }
  std::size_t size;
  int fd = -1;
  volatile std::uint64_t* addr = nullptr;
};

struct sigaction current_sigbus() {
  struct sigaction a {};
  sigaction(SIGBUS, nullptr, &a);
  return a;
}

// The program's own SIGBUS handler, as a program may have one: counts, and jumps out of a fault
// of its own when armed.
std::atomic<int> g_program_calls{0};
sigjmp_buf g_program_env;
volatile sig_atomic_t g_program_armed = 0;
void program_handler(int, siginfo_t*, void*) {
  g_program_calls.fetch_add(1);
  if (g_program_armed != 0) {
    g_program_armed = 0;
    siglongjmp(g_program_env, 1);
  }
}

class SigbusGuard : public ::testing::Test {
 protected:
  void SetUp() override { sigaction(SIGBUS, nullptr, &saved_); }
  void TearDown() override { sigaction(SIGBUS, &saved_, nullptr); }
  static void install_program_handler() {
    struct sigaction sa {};
    sa.sa_sigaction = &program_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGBUS, &sa, nullptr), 0);
  }
  struct sigaction saved_ {};
};

TEST_F(SigbusGuard, FaultOnTheGuardedRangeReturnsFalse) {
  Truncated t(2);
  ASSERT_NE(t.addr, nullptr);
  std::uint64_t seen = 7;
  bool after = false;
  const bool whole = shim::guarded(const_cast<std::uint64_t*>(t.addr), t.size, [&] {
    seen = t.addr[1];  // faults: the file has no page left
    after = true;
  });
  EXPECT_FALSE(whole);
  EXPECT_FALSE(after) << "the code after the faulting access does not run";
  EXPECT_EQ(seen, 7u);
  // Without a fault the code runs through.
  int runs = 0;
  EXPECT_TRUE(shim::guarded(const_cast<std::uint64_t*>(t.addr), t.size, [&] { ++runs; }));
  EXPECT_EQ(runs, 1);
  // Faults are caught again and again (the signal mask is restored by each jump).
  for (int i = 0; i < 5; ++i)
    EXPECT_FALSE(
        shim::guarded(const_cast<std::uint64_t*>(t.addr), t.size, [&] { t.addr[0] = static_cast<std::uint64_t>(i); }));
}

TEST_F(SigbusGuard, PreviousHandlerIsBackAndGetsWhatIsNotTheGuards) {
  install_program_handler();
  Truncated guarded_file(1), other_file(1);
  ASSERT_NE(guarded_file.addr, nullptr);
  ASSERT_NE(other_file.addr, nullptr);
  g_program_calls = 0;
  bool reached_end = false;
  bool program_jumped = false;
  const bool whole = shim::guarded(const_cast<std::uint64_t*>(guarded_file.addr), guarded_file.size, [&] {
    // Inside the guard, the shim's handler is installed.
    EXPECT_NE(current_sigbus().sa_sigaction, &program_handler);
    // A SIGBUS sent to the process is the program's.
    raise(SIGBUS);
    // A fault at an address the guard did not register is the program's too.
    g_program_armed = 1;
    if (sigsetjmp(g_program_env, 1) == 0) {
      (void)other_file.addr[0];
    } else {
      program_jumped = true;
    }
    reached_end = true;
  });
  EXPECT_TRUE(whole);
  EXPECT_TRUE(reached_end);
  EXPECT_TRUE(program_jumped);
  EXPECT_EQ(g_program_calls.load(), 2) << "the sent signal and the foreign fault";
  const struct sigaction after = current_sigbus();
  EXPECT_TRUE((after.sa_flags & SA_SIGINFO) != 0 && after.sa_sigaction == &program_handler) << "the program's handler "
                                                                                               "is back once the guard "
                                                                                               "ended";
}

TEST_F(SigbusGuard, DefaultActionIsBackAfterTheGuard) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ASSERT_EQ(sigaction(SIGBUS, &dfl, nullptr), 0);
  Truncated t(1);
  ASSERT_NE(t.addr, nullptr);
  EXPECT_FALSE(shim::guarded(const_cast<std::uint64_t*>(t.addr), t.size, [&] { (void)t.addr[0]; }));
  const struct sigaction after = current_sigbus();
  EXPECT_TRUE((after.sa_flags & SA_SIGINFO) == 0 && after.sa_handler == SIG_DFL);
  // Outside a guard a fault kills as before.
  EXPECT_EXIT((void)t.addr[0], ::testing::KilledBySignal(SIGBUS), "");
}

// The shim's helper threads block every signal; a fault there must still reach the guard (a
// fault raised while SIGBUS is blocked kills the process without any handler), and the thread's
// mask is as before once the guard ended.
TEST_F(SigbusGuard, FaultInAThreadThatBlocksSignalsIsCaught) {
  Truncated t(1);
  ASSERT_NE(t.addr, nullptr);
  bool whole = true, still_blocked = false;
  std::thread helper([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    whole = shim::guarded(const_cast<std::uint64_t*>(t.addr), t.size, [&] { (void)t.addr[0]; });
    sigset_t now;
    pthread_sigmask(SIG_SETMASK, nullptr, &now);
    still_blocked = sigismember(&now, SIGBUS) == 1;
  });
  helper.join();
  EXPECT_FALSE(whole);
  EXPECT_TRUE(still_blocked) << "the thread's mask is put back";
}

// Many threads fault in guards at once, each on its own truncated mapping, while others run
// guards that do not fault: every fault goes to its own thread's guard.
TEST_F(SigbusGuard, ThreadsEachCatchTheirOwnFaults) {
  constexpr int kThreads = 8, kRounds = 200;
  std::vector<std::unique_ptr<Truncated>> files;
  for (int i = 0; i < kThreads; ++i) {
    files.push_back(std::make_unique<Truncated>(1));
    ASSERT_NE(files.back()->addr, nullptr);
  }
  std::atomic<int> caught{0}, clean{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      Truncated& f = *files[static_cast<std::size_t>(i)];
      for (int r = 0; r < kRounds; ++r) {
        const bool faulting = (r + i) % 2 == 0;
        const bool whole = shim::guarded(const_cast<std::uint64_t*>(f.addr), f.size, [&] {
          if (faulting) (void)f.addr[0];
        });
        if (whole == faulting) wrong.fetch_add(1);
        (whole ? clean : caught).fetch_add(1);
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(caught.load(), kThreads * kRounds / 2);
  EXPECT_EQ(clean.load(), kThreads * kRounds / 2);
  const struct sigaction after = current_sigbus();
  EXPECT_EQ(after.sa_handler, saved_.sa_handler) << "the handler from before the guards is back";
}

}  // namespace
}  // namespace cudapool
