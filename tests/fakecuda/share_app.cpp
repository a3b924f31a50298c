// Several processes in one group on one (fake) GPU: run by tests/unit/shim_share_test.cpp, one
// scenario per process:
//   random SEED ITERS   random allocations and frees; after every call the group ledger's total
//                       and the fake driver's machine-wide live bytes must stay under the budget
//   hold MIB            allocate MIB in 20 MiB blocks, free them (idle cache), print "ready", wait
//   hold-late MIB       as hold, but waits 400 ms after freeing the first block: when "ready"
//                       prints, the idle figure this member last published (every 250 ms) is
//                       that one block's 20 MiB
//   hold-live MIB       allocate MIB in 20 MiB blocks and keep them; on SIGTERM check that every
//                       one is still live in the driver
//   hold-vmm MIB        create MIB of device memory with cuMemCreate itself (as XLA does), print
//                       "ready", wait, release it
//   need MIB            allocate MIB in 20 MiB blocks; exit 3 at the first out-of-memory
//   info-first          cuMemGetInfo as the first call in a fresh primary context (before any
//                       allocation): prints "info-first total=BYTES free=BYTES"
//   lock-and-exit       take the group ledger's lock and exit holding it (a member that died
//                       inside the ledger's critical section); no CUDA
//   lock-and-wait       take the ledger's lock, print "ready" and hold it until SIGTERM (a
//                       member stopped inside it); no CUDA
//   fork-exit N         allocate, then fork N children one after the other, each allocating (its
//                       own pool, and so its own stats record) and ending with exit() at once;
//                       after each child ended, look for a stats record of its pid in
//                       CUDAPOOL_SHM_DIR: prints "fork-exit: N children, K records left"
//   turn ID MIB         allocate MIB in 20 MiB blocks (exit 3 at the first out-of-memory), fill
//                       each with a pattern of its own (cuMemcpyHtoD), print "turn ID: filled";
//                       then at each SIGUSR2 touch every block: the fake's test kernel checks
//                       and bumps each word, a cuMemcpyDtoH reads it back, print "turn ID:
//                       touched N ok" when every word (and the kernel's own count) is right. The
//                       memory is never freed (a member parked at exit would be restored first)
//   work ID MIB         fill as turn does, then from the first SIGUSR2 on touch the memory
//                       without a pause until SIGTERM (a member that always works), printing
//                       "work ID: round N ok" after each touch; exit 0, or 4 when a word was wrong
//   grow ID MIB MORE    fill as turn does; at SIGUSR2 allocate MORE MiB more in 20 MiB blocks (each
//                       allocation waits for memory as the group lets it; exit 3 at an
//                       out-of-memory), fill the new blocks only, touch every block once (the
//                       first blocks' words show whether a park lost them), print "grow ID: grew
//                       to N MiB, touched ok" (or BAD), free every block, print "grow ID: freed"
// The waiting scenarios end on SIGTERM (exit 0 when their checks hold).
#define CUDAPOOL_TEST_APP_LCUDA
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shim/group/group_ledger_layout.h"
#include "telemetry/share.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/fakecuda/test_app.h"

extern "C" {
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void**, void**);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void*, std::size_t);
CUresult cuMemcpyDtoH_v2(void*, CUdeviceptr, std::size_t);
}

namespace {

constexpr std::size_t kMiB = 1 << 20;
volatile sig_atomic_t g_term = 0;
void on_term(int) { g_term = 1; }

// The group's ledger in CUDAPOOL_SHM_DIR (there is one in the tests' private directory).
const cudapool::share::Ledger* find_ledger() {
  static const cudapool::share::Ledger* l = []() -> const cudapool::share::Ledger* {
    const std::string dir = cudapool::share::shm_dir();
    const std::string prefix = "cudapool-" + std::to_string(geteuid()) + "-g-";
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return nullptr;
    std::string path;
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) path = dir + "/" + e->d_name;
    closedir(d);
    if (path.empty()) return nullptr;
    cudapool::share::Mapping m = cudapool::share::map_file(path, sizeof(cudapool::share::Ledger), false);
    return static_cast<const cudapool::share::Ledger*>(m.addr);
  }();
  return l;
}

const std::uint64_t* machine_live() {
  static const std::uint64_t* p = []() -> const std::uint64_t* {
    const char* path = std::getenv("FAKECUDA_MACHINE_FILE");
    if (path == nullptr) return nullptr;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    void* a = mmap(nullptr, 16, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    return a == MAP_FAILED ? nullptr : static_cast<const std::uint64_t*>(a);
  }();
  return p;
}

std::uint64_t budget_bytes() { return std::strtoull(std::getenv("SHARE_BUDGET_MB"), nullptr, 10) * kMiB; }

void check_budget() {
  const std::uint64_t budget = budget_bytes();
  if (const cudapool::share::Ledger* l = find_ledger()) {
    const std::uint64_t total = l->total.load(std::memory_order_relaxed);
    if (total > budget)
      std::printf("ledger total %llu > budget %llu\n", (unsigned long long)total, (unsigned long long)budget);
    CHECK(total <= budget);
  }
  if (const std::uint64_t* live = machine_live()) {
    const std::uint64_t n = __atomic_load_n(live, __ATOMIC_RELAXED);
    if (n > budget) std::printf("machine live %llu > budget %llu\n", (unsigned long long)n, (unsigned long long)budget);
    CHECK(n <= budget);
  }
}

int random_run(unsigned seed, int iters) {
  start_primary(0);
  std::mt19937 rng(seed);
  std::vector<CUdeviceptr> live;
  int ooms = 0, oks = 0;
  for (int i = 0; i < iters; ++i) {
    if (!live.empty() && (live.size() >= 10 || rng() % 3 == 0)) {
      const std::size_t k = rng() % live.size();
      CHECK_OK(cuMemFree_v2(live[k]));
      live[k] = live.back();
      live.pop_back();
    } else {
      const std::size_t bytes = (1 + rng() % 48) * (kMiB / 2);
      CUdeviceptr p = 0;
      const CUresult r = cuMemAlloc_v2(&p, bytes);
      if (r == CUDA_SUCCESS) {
        ++oks;
        live.push_back(p);
      } else {
        CHECK(r == CUDA_ERROR_OUT_OF_MEMORY);
        ++ooms;
        for (std::size_t k = 0; k < live.size() / 2; ++k) CHECK_OK(cuMemFree_v2(live[k]));
        live.erase(live.begin(), live.begin() + static_cast<long>(live.size() / 2));
      }
    }
    check_budget();
  }
  for (CUdeviceptr p : live) CHECK_OK(cuMemFree_v2(p));
  std::printf("random done oks=%d ooms=%d\n", oks, ooms);
  return 0;
}

void wait_for_term() {
  while (!g_term) usleep(2000);
}

int hold(std::size_t mib, bool keep_live, useconds_t after_first_free_us = 0) {
  start_primary(0);
  std::vector<CUdeviceptr> blocks;
  for (std::size_t got = 0; got < mib; got += 20) {
    CUdeviceptr p = 0;
    CHECK_OK(cuMemAlloc_v2(&p, 20 * kMiB));
    blocks.push_back(p);
  }
  if (!keep_live)
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      CHECK_OK(cuMemFree_v2(blocks[i]));
      if (i == 0 && after_first_free_us != 0) usleep(after_first_free_us);
    }
  std::size_t f = 0, t = 0;
  CHECK_OK(cuMemGetInfo_v2(&f, &t));
  std::printf("ready pid=%d total=%zu free=%zu\n", getpid(), t, f);
  std::fflush(stdout);
  wait_for_term();
  if (keep_live) {
    for (CUdeviceptr p : blocks) CHECK(fakecuda_is_live(p) == 1);
    std::printf("live blocks intact\n");
  }
  return 0;
}

int hold_vmm(std::size_t mib) {
  start_primary(0);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  CHECK_OK(cuMemCreate(&h, mib * kMiB, &prop, 0));
  std::printf("ready pid=%d\n", getpid());
  std::fflush(stdout);
  wait_for_term();
  CHECK_OK(cuMemRelease(h));
  return 0;
}

int need(std::size_t mib) {
  start_primary(0);
  std::size_t got = 0;
  for (; got < mib; got += 20) {
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc_v2(&p, 20 * kMiB);
    if (r != CUDA_SUCCESS) {
      CHECK(r == CUDA_ERROR_OUT_OF_MEMORY);
      std::printf("need: out of memory after %zu MiB\n", got);
      return 3;
    }
  }
  std::printf("need: got %zu MiB\n", got);
  return 0;
}

// One block of MIB: with expandable segments the pool maps it unit by unit, so the budget refuses
// a unit, not the whole block.
int need_one(std::size_t mib) {
  start_primary(0);
  CUdeviceptr p = 0;
  const CUresult r = cuMemAlloc_v2(&p, mib * kMiB);
  if (r != CUDA_SUCCESS) {
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY);
    std::printf("need-one: out of memory\n");
    return 3;
  }
  std::printf("need-one: got %zu MiB\n", mib);
  return 0;
}

int info_first() {
  start_primary(0);
  std::size_t f = 0, t = 0;
  CHECK_OK(cuMemGetInfo_v2(&f, &t));
  std::printf("info-first total=%zu free=%zu\n", t, f);
  return 0;
}

int lock_ledger(bool wait) {
  auto* l = const_cast<cudapool::share::Ledger*>(find_ledger());
  CHECK(l != nullptr);
  CHECK(pthread_mutex_lock(&l->mu) == 0);
  std::printf("ready: holding the ledger's lock\n");
  std::fflush(stdout);
  if (wait) wait_for_term();
  _exit(0);
}

int fork_exit(int children) {
  start_primary(0);
  CUdeviceptr p = 0;
  CHECK_OK(cuMemAlloc_v2(&p, kMiB));
  int left = 0;
  for (int i = 0; i < children; ++i) {
    std::fflush(stdout);
    const pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      CUdeviceptr q = 0;
      if (cuMemAlloc_v2(&q, kMiB) != CUDA_SUCCESS) std::_Exit(3);
      if (cuMemFree_v2(q) != CUDA_SUCCESS) std::_Exit(4);
      std::exit(0);  // at once: the exit handlers run while the child's publisher may be starting
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct stat st {};
    const std::string record = cudapool::share::record_path(geteuid(), pid);
    if (lstat(record.c_str(), &st) == 0) {
      ++left;
      std::printf("left: %s (%lld bytes)\n", record.c_str(), static_cast<long long>(st.st_size));
    }
  }
  CHECK_OK(cuMemFree_v2(p));
  std::printf("fork-exit: %d children, %d records left\n", children, left);
  return 0;
}

volatile sig_atomic_t g_touch = 0;
void on_touch(int) { g_touch = g_touch + 1; }

constexpr std::size_t kBlock = 20 * kMiB, kWords = kBlock / 4;

// Block b of process id starts as base(b) + i in word i; after N touches it holds base(b) + N + i.
std::uint32_t base(int id, std::size_t b) {
  return static_cast<std::uint32_t>(id) * 0x01000000u + static_cast<std::uint32_t>(b) * 0x00100000u;
}

// Allocates MIB in 20 MiB blocks and fills each with its pattern; false (having printed "TAG ID:
// out of memory after N MiB") at the first out-of-memory.
bool fill(const char* tag, int id, std::size_t mib, std::vector<CUdeviceptr>* blocks) {
  for (std::size_t got = 0; got < mib; got += 20) {
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc_v2(&p, kBlock);
    if (r != CUDA_SUCCESS) {
      CHECK(r == CUDA_ERROR_OUT_OF_MEMORY);
      std::printf("%s %d: out of memory after %zu MiB\n", tag, id, got);
      return false;
    }
    blocks->push_back(p);
  }
  std::vector<std::uint32_t> h(kWords);
  for (std::size_t b = 0; b < blocks->size(); ++b) {
    for (std::size_t i = 0; i < kWords; ++i) h[i] = base(id, b) + static_cast<std::uint32_t>(i);
    CHECK_OK(cuMemcpyHtoD_v2((*blocks)[b], h.data(), kBlock));
  }
  std::printf("%s %d: filled %zu MiB\n", tag, id, mib);
  return true;
}

// The touch number `done` (from 1): the fake's test kernel checks and bumps every word of every
// block, a cuMemcpyDtoH reads each back. Returns the words found wrong (0: all right).
long touch(int id, const std::vector<CUdeviceptr>& blocks, int done) {
  long bad = 0;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    CUdeviceptr p = blocks[b];
    std::size_t words = kWords;
    std::uint32_t want = base(id, b) + static_cast<std::uint32_t>(done - 1);
    void* args[] = {&p, &words, &want};
    CHECK_OK(cuLaunchKernel(fakecuda_test_kernel(), 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  }
  std::vector<std::uint32_t> h(kWords);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    CHECK_OK(cuMemcpyDtoH_v2(h.data(), blocks[b], kBlock));
    for (std::size_t i = 0; i < kWords; ++i)
      if (h[i] != base(id, b) + static_cast<std::uint32_t>(done) + static_cast<std::uint32_t>(i)) ++bad;
  }
  return bad + fakecuda_kernel_mismatches();
}

// Blocks SIGUSR2 and SIGTERM until sigsuspend; the threads started from here on (the fake's
// kernel worker) inherit the mask, so the signals reach this thread. *old: the mask to wait with.
void hold_signals(sigset_t* old) {
  signal(SIGUSR2, on_touch);
  sigset_t held;
  sigemptyset(&held);
  sigaddset(&held, SIGUSR2);
  sigaddset(&held, SIGTERM);
  sigprocmask(SIG_BLOCK, &held, old);
}

int turn(int id, std::size_t mib) {
  sigset_t old;
  hold_signals(&old);
  start_primary(0);
  std::vector<CUdeviceptr> blocks;
  if (!fill("turn", id, mib, &blocks)) return 3;
  int done = 0;
  for (;;) {
    while (!g_term && done == g_touch) sigsuspend(&old);
    if (done == g_touch) break;  // SIGTERM, nothing left to do
    ++done;
    const long bad = touch(id, blocks, done);
    std::printf("turn %d: touched %d %s (%ld wrong words)\n", id, done, bad == 0 ? "ok" : "BAD", bad);
  }
  std::printf("turn %d: done\n", id);
  return 0;
}

// Fills like `turn`, then from the first SIGUSR2 on touches its memory without a pause until
// SIGTERM (a member that always works), printing "work ID: round N ok" (or BAD) after each touch.
// Exit 0 when every word was right every time, 4 when not, 3 at an out-of-memory of the fill.
int work(int id, std::size_t mib) {
  sigset_t old;
  hold_signals(&old);
  start_primary(0);
  std::vector<CUdeviceptr> blocks;
  if (!fill("work", id, mib, &blocks)) return 3;
  while (!g_term && g_touch == 0) sigsuspend(&old);
  sigprocmask(SIG_SETMASK, &old, nullptr);  // SIGTERM now ends the loop below (no sigsuspend there)
  long bad = 0;
  for (int done = 1; !g_term; ++done) {
    const long b = touch(id, blocks, done);
    bad += b;
    std::printf("work %d: round %d %s (%ld wrong words)\n", id, done, b == 0 ? "ok" : "BAD", b);
  }
  return bad == 0 ? 0 : 4;
}

int grow(int id, std::size_t mib, std::size_t more) {
  sigset_t old;
  hold_signals(&old);
  start_primary(0);
  std::vector<CUdeviceptr> blocks;
  if (!fill("grow", id, mib, &blocks)) return 3;
  while (!g_term && g_touch == 0) sigsuspend(&old);
  if (g_term) return 0;
  std::vector<std::uint32_t> h(kWords);
  for (std::size_t got = 0; got < more; got += 20) {
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc_v2(&p, kBlock);
    if (r != CUDA_SUCCESS) {
      CHECK(r == CUDA_ERROR_OUT_OF_MEMORY);
      std::printf("grow %d: out of memory after %zu MiB more\n", id, got);
      return 3;
    }
    blocks.push_back(p);
    for (std::size_t i = 0; i < kWords; ++i) h[i] = base(id, blocks.size() - 1) + static_cast<std::uint32_t>(i);
    CHECK_OK(cuMemcpyHtoD_v2(p, h.data(), kBlock));
  }
  const long bad = touch(id, blocks, 1);
  std::printf("grow %d: grew to %zu MiB, touched %s (%ld wrong words)\n", id, mib + more, bad == 0 ? "ok" : "BAD", bad);
  for (CUdeviceptr p : blocks) CHECK_OK(cuMemFree_v2(p));
  std::printf("grow %d: freed\n", id);
  while (!g_term) sigsuspend(&old);
  return bad == 0 ? 0 : 4;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGTERM, on_term);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "work" && argc == 4) return work(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10));
  if (what == "random" && argc == 4) return random_run(static_cast<unsigned>(std::atoi(argv[2])), std::atoi(argv[3]));
  if (what == "hold" && argc == 3) return hold(std::strtoull(argv[2], nullptr, 10), false);
  if (what == "hold-late" && argc == 3) return hold(std::strtoull(argv[2], nullptr, 10), false, 400'000);
  if (what == "hold-live" && argc == 3) return hold(std::strtoull(argv[2], nullptr, 10), true);
  if (what == "hold-vmm" && argc == 3) return hold_vmm(std::strtoull(argv[2], nullptr, 10));
  if (what == "need" && argc == 3) return need(std::strtoull(argv[2], nullptr, 10));
  if (what == "need-one" && argc == 3) return need_one(std::strtoull(argv[2], nullptr, 10));
  if (what == "info-first") return info_first();
  if (what == "lock-and-exit") return lock_ledger(false);
  if (what == "lock-and-wait") return lock_ledger(true);
  if (what == "fork-exit" && argc == 3) return fork_exit(std::atoi(argv[2]));
  if (what == "turn" && argc == 4) return turn(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10));
  if (what == "grow" && argc == 5)
    return grow(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10));
  std::printf(
      "usage: share_app random SEED ITERS | hold MIB | hold-live MIB | hold-vmm MIB | need MIB | need-one MIB | "
      "lock-and-exit | "
      "lock-and-wait | fork-exit N | turn ID MIB | work ID MIB | grow ID MIB MORE\n");
  return 2;
}
