// CUDA IPC of pooled memory between processes, on the fake libcuda.so.1 (whose device memory is
// shared memory files, so another process maps the same bytes). Linked -lcuda style and run
// under LD_PRELOAD=libcudapool.so by tests/unit/shim_ipc_test.cpp, with the policy under test.
//
// `ipc_app <scenario>` is the exporting parent; it runs this program again (fork + exec) as
// importing children: `ipc_app child <op> ...`. The parent prints "FAIL file:line: expr" and
// exits 1 on the first failed check, "PASS <scenario>" when all passed; a child's failure shows
// as its exit status (its FAIL line goes to the shared stdout).
//
// Scenarios:
//   share     split 4 KiB blocks of one segment, 8 MiB and 64 MiB blocks: handles carry the
//             shim's marker, one handle per block (also for interior pointers), a child opens
//             each, checks range queries and every byte, opens one twice (same pointer, one
//             close keeps it), writes new bytes, closes all; the parent sees the new bytes.
//   held      a block freed while a child holds it stays allocated (six new blocks do not
//             overlap it, a second free is refused); it goes back to the pool after the close;
//             then its handle, and the handle of a block freed with no importer, are refused.
//   crash     the importer is killed while holding a freed block: the block still comes back.
//   gone      a handle whose exporter exited is refused.
//   noshim    a child without the shim gets an error from the driver for a shim handle.
//   foreign   (as root) an importer running as another user is refused by both ends.
//   reset     the exporter's context is reset: handles made before name nothing any more.
//   noexport  (run with FAKECUDA_VMM_NO_EXPORT=1 and expandable segments) the driver refused
//             exportable pages: the handle is refused with CUDA_ERROR_NOT_SUPPORTED.
//   stall     an "exporter" that never accepts (its queue of pending connections full): the
//             open of its handle fails after the connect timeout, and meanwhile another thread
//             opens, reads and closes a block of a working exporter without waiting for it.
//   evil      an "exporter" answering with crafted replies (offsets and sizes that wrap or lie
//             outside the segment or units, sizes the handle does not name, unit counts that
//             do not match their descriptors, unknown kinds): every open is refused and maps
//             nothing; a well-formed reply from it is accepted (the checks are not blanket).
//   emfile    the exporter runs out of file descriptors with a connection pending: its server
//             does not spin (CPU time over a second), and serves the importer once it has
//             descriptors again; an importer connected already that asks meanwhile is told to
//             ask again (busy) and is served once descriptors are back.
//   crowd     more idle connections than the exporter serves at once (a child without the shim
//             opens 1100 and says nothing), after an importer that holds a freed block open: a
//             legitimate importer is still served (idle connections that hold nothing made
//             room), and the holder keeps its connection and its bytes.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shim/cudapool.h"
#include "shim/ipc/ipc_wire.h"
#include "tests/fakecuda/fakecuda.h"
#define CUDAPOOL_TEST_APP_LCUDA
#include "tests/fakecuda/test_app.h"

using namespace cudaabi;

extern char** environ;

namespace {

constexpr std::size_t kMiB = 1u << 20;
constexpr CUresult kInvalidHandle = 400;
constexpr CUresult kNotPermitted = 800;
constexpr unsigned kLazyPeerAccess = 1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

void start() { start_primary(0); }

cudapool_stats stats() {
  auto fn = reinterpret_cast<int (*)(int, cudapool_stats*)>(dlsym(RTLD_DEFAULT, "cudapool_get_stats"));
  CHECK(fn != nullptr);
  cudapool_stats s{};
  CHECK(fn(0, &s) == 0);
  return s;
}

// Expandable segments are the default; the test sets expandable_segments:False for classic ones.
bool expandable() {
  const char* c = std::getenv("CUDAPOOL_CONF");
  return c == nullptr || std::strstr(c, "expandable_segments:False") == nullptr;
}

std::string hex(const CUipcMemHandle& h) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (char c : h.reserved) {
    const auto b = static_cast<unsigned char>(c);
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}
CUipcMemHandle unhex(const std::string& s) {
  CHECK(s.size() == 2 * sizeof(CUipcMemHandle::reserved));
  CUipcMemHandle h{};
  for (std::size_t i = 0; i < sizeof h.reserved; ++i)
    h.reserved[i] = static_cast<char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return h;
}

void fill(CUdeviceptr p, std::size_t n, int v) { std::memset(reinterpret_cast<void*>(p), v, n); }
bool holds(CUdeviceptr p, std::size_t n, int v) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (b[i] != static_cast<unsigned char>(v)) return false;
  return true;
}

// --- the parent's side: children and the pipes to them

struct Child {
  pid_t pid = -1;
  int from = -1;  // what the child writes to fd 3
  int to = -1;    // what the child reads from fd 4
};

// Runs this program as `child args...`, with fd 3 (to the parent) and fd 4 (from the parent).
// `with_shim` false: without LD_PRELOAD (a program that does not run the shim).
Child spawn(const std::vector<std::string>& args, bool with_shim = true) {
  int up[2], down[2];
  CHECK(pipe2(up, O_CLOEXEC) == 0 && pipe2(down, O_CLOEXEC) == 0);  // only fds 3 and 4 reach the child
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (with_shim || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.emplace_back(*e);
  std::fflush(stdout);
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    dup2(up[1], 3);
    dup2(down[0], 4);
    std::vector<char*> argv{const_cast<char*>("/proc/self/exe"), const_cast<char*>("child")};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    execve("/proc/self/exe", argv.data(), envp.data());
    std::_Exit(127);
  }
  close(up[1]);
  close(down[0]);
  return Child{pid, up[0], down[1]};
}

// One byte from the child, within 10 s.
char hear(const Child& c) {
  pollfd p{c.from, POLLIN, 0};
  CHECK(poll(&p, 1, 10000) == 1);
  char b = 0;
  CHECK(read(c.from, &b, 1) == 1);
  return b;
}
void tell(const Child& c, char b) { CHECK(write(c.to, &b, 1) == 1); }

int wait_exit(Child& c) {
  int st = 0;
  for (int i = 0; i < 1000; ++i) {  // 10 s
    const pid_t r = waitpid(c.pid, &st, WNOHANG);
    if (r == c.pid) {
      close(c.from);
      close(c.to);
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(c.pid, SIGKILL);
  waitpid(c.pid, &st, 0);
  return -1;
}

int run_child(const std::vector<std::string>& args, bool with_shim = true) {
  Child c = spawn(args, with_shim);
  return wait_exit(c);
}

CUipcMemHandle export_of(CUdeviceptr p) {
  CUipcMemHandle h{};
  CHECK_OK(cuIpcGetMemHandle(&h, p));
  CHECK(std::memcmp(h.reserved, "CPOOLIPC", 8) == 0);  // the shim's handle, not the driver's
  return h;
}

// Until the pool's allocated bytes drop to `want` (a deferred free reaches the pool on the next
// hook after the importer let go; the exporter hears of that on its server thread).
bool allocated_drops_to(std::int64_t want) {
  for (int i = 0; i < 500; ++i) {  // 5 s
    CUdeviceptr t = 0;
    CHECK_OK(cuMemAlloc_v2(&t, 512));
    CHECK_OK(cuMemFree_v2(t));
    if (stats().allocated_bytes <= want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void scenario_share() {
  start();
  struct B {
    CUdeviceptr p;
    std::size_t n;
    int v;
  } b[4] = {{0, 4096, 0x11}, {0, 4096, 0x22}, {0, 8 * kMiB, 0x33}, {0, 64 * kMiB, 0x44}};
  for (auto& x : b) {
    CHECK_OK(cuMemAlloc_v2(&x.p, x.n));
    fill(x.p, x.n, x.v);
  }
  std::vector<std::string> args{"open", std::to_string(expandable() ? 0 : 3)};
  for (auto& x : b) {
    const CUipcMemHandle h = export_of(x.p);
    // One handle per block: asked again, or for an address inside the block, the same bytes.
    const CUipcMemHandle again = export_of(x.p + x.n / 2);
    CHECK(std::memcmp(h.reserved, again.reserved, sizeof h.reserved) == 0);
    args.push_back(hex(h));
    args.push_back(std::to_string(x.n));
    args.push_back(std::to_string(x.v));
  }
  // CUDA opens handles in other processes only.
  CUdeviceptr self = 0;
  CHECK(cuIpcOpenMemHandle_v2(&self, unhex(args[2]), kLazyPeerAccess) != CUDA_SUCCESS);
  CHECK(run_child(args) == 0);
  for (auto& x : b) CHECK(holds(x.p, x.n, x.v + 1));  // the child's writes
  for (auto& x : b) CHECK_OK(cuMemFree_v2(x.p));
  CHECK(stats().allocated_bytes == 0);
}

// An 8 MiB block of 0x5a bytes, exported and held open by a child ("hold"), which has said 'o'.
struct Held {
  static constexpr std::size_t n = 8 * kMiB;
  CUdeviceptr x = 0;
  CUipcMemHandle h{};
  Child c;
};
Held hold_in_child() {
  Held held;
  CHECK_OK(cuMemAlloc_v2(&held.x, Held::n));
  fill(held.x, Held::n, 0x5a);
  held.h = export_of(held.x);
  held.c = spawn({"hold", hex(held.h), std::to_string(Held::n), "90"});  // 0x5a
  CHECK(hear(held.c) == 'o');
  return held;
}

void scenario_held() {
  start();
  auto [x, h, c] = hold_in_child();
  const std::size_t n = Held::n;
  const std::int64_t before = stats().allocated_bytes;
  CHECK_OK(cuMemFree_v2(x));                           // deferred: the child still has it open
  CHECK(cuMemFree_v2(x) == CUDA_ERROR_INVALID_VALUE);  // and a second free is an error
  CHECK(stats().allocated_bytes == before);
  std::vector<CUdeviceptr> more(6);
  for (auto& m : more) {
    CHECK_OK(cuMemAlloc_v2(&m, n));
    CHECK(m + n <= x || m >= x + n);  // never the held bytes
    fill(m, n, 0xee);
  }
  tell(c, 'g');
  CHECK(hear(c) == 'c');
  CHECK(wait_exit(c) == 0);
  for (auto& m : more) CHECK_OK(cuMemFree_v2(m));
  CHECK(allocated_drops_to(0));  // the held block went back to the pool after the close
  // Its handle now names nothing; nor does one of a block freed with no importer.
  CHECK(run_child({"fail", hex(h), std::to_string(kInvalidHandle)}) == 0);
  CUdeviceptr z = 0;
  CHECK_OK(cuMemAlloc_v2(&z, kMiB));
  const CUipcMemHandle hz = export_of(z);
  CHECK_OK(cuMemFree_v2(z));
  CHECK(run_child({"fail", hex(hz), std::to_string(kInvalidHandle)}) == 0);
}

void scenario_crash() {
  start();
  auto [x, h, c] = hold_in_child();
  CHECK_OK(cuMemFree_v2(x));
  CHECK(stats().allocated_bytes == static_cast<std::int64_t>(Held::n));  // held
  kill(c.pid, SIGKILL);
  CHECK(wait_exit(c) == 128 + SIGKILL);
  CHECK(allocated_drops_to(0));  // the dead importer's hold ended with its connection
}

void scenario_gone() {
  start();  // the parent runs CUDA too, as exporters and importers do
  Child c = spawn({"export_exit"});
  std::string h;
  for (char b; (b = hear(c)) != '\n';) h += b;
  CHECK(wait_exit(c) == 0);
  CHECK(run_child({"fail", h, std::to_string(kInvalidHandle)}) == 0);
}

void scenario_noshim() {
  start();
  CUdeviceptr x = 0;
  CHECK_OK(cuMemAlloc_v2(&x, 4096));
  CHECK(run_child({"fail", hex(export_of(x)), "any"}, /*with_shim=*/false) == 0);
}

void scenario_foreign() {
  start();
  CUdeviceptr x = 0;
  CHECK_OK(cuMemAlloc_v2(&x, 4096));
  fill(x, 4096, 0x77);
  CHECK(run_child({"foreign", hex(export_of(x))}) == 0);
  CHECK(holds(x, 4096, 0x77));
}

// The exporter's context is reset: its pool and its exports end with it, so a handle made before
// names nothing afterwards, even in the next context with the same handle value.
void scenario_reset() {
  start();
  CUdeviceptr x = 0;
  CHECK_OK(cuMemAlloc_v2(&x, 4096));
  const CUipcMemHandle h = export_of(x);
  CHECK_OK(cuDevicePrimaryCtxReset_v2(0));
  start();
  CUdeviceptr y = 0;
  CHECK_OK(cuMemAlloc_v2(&y, 4096));  // a new pool; it may well hand out the same address
  CHECK(run_child({"fail", hex(h), std::to_string(kInvalidHandle)}) == 0);
}

void scenario_noexport() {
  start();
  CUdeviceptr x = 0;
  CHECK_OK(cuMemAlloc_v2(&x, 4 * kMiB));
  CUipcMemHandle h{};
  CHECK(cuIpcGetMemHandle(&h, x) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK_OK(cuMemFree_v2(x));
}

namespace w = cudapool::shim::ipc;

// A handle of the shim's format naming export `id` (of `size` bytes, of `kind`) of process `pid`,
// whose socket uses `nonce`.
CUipcMemHandle crafted(pid_t pid, std::uint64_t nonce, std::uint64_t id, std::uint64_t size, w::Kind kind) {
  w::Handle h{};
  std::memcpy(h.marker, w::kMarker, sizeof h.marker);
  h.version = w::kVersion;
  h.kind = kind;
  h.pid = static_cast<std::uint32_t>(pid);
  h.uid = static_cast<std::uint32_t>(getuid());
  h.nonce = nonce;
  h.id = id;
  h.size = size;
  CUipcMemHandle out{};
  w::encode(h, &out);
  return out;
}
constexpr std::uint64_t kFakeNonce = 0x5eed;

double seconds_since(const timespec& t0, clockid_t clock = CLOCK_MONOTONIC) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec - t0.tv_sec) + static_cast<double>(t.tv_nsec - t0.tv_nsec) * 1e-9;
}

// The descriptors this process has open (the directory's own included, the same in every count).
int open_fds() {
  DIR* d = opendir("/proc/self/fd");
  CHECK(d != nullptr);
  int n = 0;
  while (const dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// Waits (10 s at most) until the export server has closed what it no longer needs: a dropped
// connection, the duplicates it sent. It closes them after the peer may already have answered.
void wait_open_fds(int n) {
  for (int i = 0; i < 1000 && open_fds() != n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::printf("emfile: %d descriptors open, %d expected\n", open_fds(), n);
  CHECK(open_fds() == n);
}

std::string read_line(const Child& c) {
  std::string s;
  for (char b; (b = hear(c)) != '\n';) s += b;
  return s;
}

void scenario_stall() {
  start();
  Child good = spawn({"export_wait"});
  const CUipcMemHandle gh = unhex(read_line(good));
  Child stalled = spawn({"stall_server"}, /*with_shim=*/false);
  CHECK(hear(stalled) == 'r');
  CUresult stalled_result = CUDA_SUCCESS;
  double stalled_s = 0;
  std::thread t([&] {
    start();
    timespec t0{};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CUdeviceptr p = 0;
    stalled_result = cuIpcOpenMemHandle_v2(&p, crafted(stalled.pid, kFakeNonce, 1, 4096, w::Kind::classic),
                                           kLazyPeerAccess);
    stalled_s = seconds_since(t0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the thread waits on the stalled peer
  timespec t0{};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CUdeviceptr p = 0;
  CHECK_OK(cuIpcOpenMemHandle_v2(&p, gh, kLazyPeerAccess));
  CHECK(holds(p, 4096, 0x3c));
  CHECK_OK(cuIpcCloseMemHandle(p));
  const double good_s = seconds_since(t0);
  std::printf("stall: the working exporter's block took %.3f s\n", good_s);
  CHECK(good_s < 1.0);  // not behind the stalled connect
  t.join();
  std::printf("stall: the stalled open answered %d after %.3f s\n", static_cast<int>(stalled_result), stalled_s);
  CHECK(stalled_result == kInvalidHandle);
  CHECK(stalled_s > 2.0 && stalled_s < 8.0);
  tell(good, 'q');
  tell(stalled, 'q');
  CHECK(wait_exit(good) == 0);
  CHECK(wait_exit(stalled) == 0);
}

// The replies of child_evil_server, by export id (1..7); 7 is well-formed.
void scenario_evil() {
  start();
  Child evil = spawn({"evil_server"}, /*with_shim=*/false);
  CHECK(hear(evil) == 'r');
  for (std::uint64_t id = 1; id <= 7; ++id) {
    const w::Kind kind = id >= 4 && id <= 5 ? w::Kind::expandable : w::Kind::classic;
    CUdeviceptr p = 0;
    const CUresult r = cuIpcOpenMemHandle_v2(&p, crafted(evil.pid, kFakeNonce, id, 4096, kind), kLazyPeerAccess);
    std::printf("evil: reply %llu answered %d\n", static_cast<unsigned long long>(id), static_cast<int>(r));
    if (id == 7) {
      CHECK_OK(r);
      CHECK(holds(p, 4096, 0x6d));
      CHECK_OK(cuIpcCloseMemHandle(p));
    } else {
      CHECK(r == kInvalidHandle);
    }
    CHECK(fakecuda_ipc_mapped() == 0 && fakecuda_vmm_mapped_bytes() == 0);
  }
  tell(evil, 'q');
  CHECK(wait_exit(evil) == 0);
}

void scenario_emfile() {
  start();
  CUdeviceptr x = 0;
  CHECK_OK(cuMemAlloc_v2(&x, 4096));
  fill(x, 4096, 0x3c);
  const CUipcMemHandle h = export_of(x);  // starts the server
  const int before_c = open_fds();
  Child c = spawn({"open_on_go", hex(h), "4096", "60"});  // 0x3c
  rlimit old{};
  CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
  rlimit low = old;
  low.rlim_cur = 256;
  CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> filler;
  for (int f; (f = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(f);
  CHECK(errno == EMFILE);
  tell(c, 'g');  // the child connects and asks; the server cannot accept
  timespec cpu0{}, wall0{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
  clock_gettime(CLOCK_MONOTONIC, &wall0);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double cpu = seconds_since(cpu0, CLOCK_PROCESS_CPUTIME_ID), wall = seconds_since(wall0);
  for (int f : filler) close(f);
  CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
  std::printf("emfile: %.3f s of CPU in %.3f s while out of descriptors\n", cpu, wall);
  CHECK(cpu < 0.25 * wall);
  CHECK(hear(c) == 'o');  // served once descriptors were back
  tell(c, 'g');
  CHECK(hear(c) == 'c');
  CHECK(wait_exit(c) == 0);
  wait_open_fds(before_c);  // c's connection is gone

  // An importer connected already asks while the exporter has no descriptor to send it the
  // block's pages: it is told to ask again, and is served once descriptors are back.
  CUdeviceptr y = 0;
  CHECK_OK(cuMemAlloc_v2(&y, 4096));
  fill(y, 4096, 0x5a);
  const std::string hy = hex(export_of(y));
  const int before_d = open_fds();
  Child d = spawn({"open_second_on_go", hex(h), hy, "4096", "60", "90"});
  CHECK(hear(d) == 'o');  // the first block is open: the connection stands
  // Every descriptor but d's pipes (2) and its connection (1) closed: the duplicates the server
  // sent d are closed too, so none comes free while the process is out of descriptors.
  wait_open_fds(before_d + 3);
  CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  filler.clear();
  for (int f; (f = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(f);
  CHECK(errno == EMFILE);
  tell(d, 'g');
  // Out of descriptors, the exporter cannot send the block's pages: d is not served meanwhile
  // (a slow machine only delays an answer, so this cannot pass by luck or fail by load).
  pollfd early{d.from, POLLIN, 0};
  CHECK(poll(&early, 1, 300) == 0);
  for (int f : filler) close(f);
  CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK(hear(d) == 'o');
  tell(d, 'g');
  CHECK(hear(d) == 'c');
  CHECK(wait_exit(d) == 0);
  CHECK_OK(cuMemFree_v2(y));
  CHECK_OK(cuMemFree_v2(x));
}

// The soft descriptor limit raised to `want` (at most the hard limit); children inherit it.
rlim_t raise_nofile(rlim_t want) {
  rlimit l{};
  CHECK(getrlimit(RLIMIT_NOFILE, &l) == 0);
  if (l.rlim_cur < want) {
    l.rlim_cur = l.rlim_max == RLIM_INFINITY || l.rlim_max > want ? want : l.rlim_max;
    CHECK(setrlimit(RLIMIT_NOFILE, &l) == 0);
  }
  return l.rlim_cur;
}

constexpr int kCrowd = 1100;
constexpr int kServedAtOnce = 1024;  // the exporter's cap (shim/ipc/ipc_server.h)

void scenario_crowd() {
  // Enough descriptors here and in the crowd that the cap, not the limit, is what binds.
  CHECK(raise_nofile(4096) >= 2 * kCrowd);
  start();
  const std::size_t n = 4096;
  CUdeviceptr x = 0, y = 0;
  CHECK_OK(cuMemAlloc_v2(&x, n));
  CHECK_OK(cuMemAlloc_v2(&y, n));
  fill(x, n, 0x3c);
  fill(y, n, 0x5a);
  const CUipcMemHandle hy = export_of(y);
  Child holder = spawn({"hold", hex(export_of(x)), std::to_string(n), "60"});  // 0x3c
  CHECK(hear(holder) == 'o');
  CHECK_OK(cuMemFree_v2(x));  // deferred: the holder has it open
  Child crowd = spawn({"crowd", hex(hy), std::to_string(kCrowd)}, /*with_shim=*/false);
  CHECK(std::stol(read_line(crowd)) == kCrowd);  // connected, all of them, and silent
  // A legitimate importer, after them all: served (it reads 0x5a and writes 0x5b).
  CHECK(run_child({"open", expandable() ? "0" : "1", hex(hy), std::to_string(n), "90"}) == 0);
  CHECK(holds(y, n, 0x5b));
  // The holder's connection stood: its block was not handed out again, and its bytes are intact.
  std::vector<CUdeviceptr> more(6);
  for (auto& m : more) {
    CHECK_OK(cuMemAlloc_v2(&m, n));
    CHECK(m + n <= x || m >= x + n);
    fill(m, n, 0xee);
  }
  tell(holder, 'g');
  CHECK(hear(holder) == 'c');
  CHECK(wait_exit(holder) == 0);
  // The crowd lost at least the connections past the cap (the holder and the importer came too).
  tell(crowd, 'c');
  const long dropped = std::stol(read_line(crowd));
  std::printf("crowd: %d idle connections, %ld of them dropped by the exporter\n", kCrowd, dropped);
  CHECK(dropped >= kCrowd + 2 - kServedAtOnce);
  tell(crowd, 'q');
  CHECK(wait_exit(crowd) == 0);
  for (auto& m : more) CHECK_OK(cuMemFree_v2(m));
  CHECK_OK(cuMemFree_v2(y));
  CHECK(allocated_drops_to(0));  // the freed block went back once the holder closed it
}

// --- the children

CUdeviceptr open_checked(const std::string& hx, std::size_t n, int v) {
  CUdeviceptr p = 0;
  CHECK_OK(cuIpcOpenMemHandle_v2(&p, unhex(hx), kLazyPeerAccess));
  // Range queries answer for the block, wherever inside it they ask.
  for (std::size_t off : {std::size_t{0}, n / 2, n - 1}) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    CHECK_OK(cuMemGetAddressRange_v2(&base, &size, p + off));
    CHECK(base == p && size == n);
  }
  CUdeviceptr start_addr = 0;
  CHECK_OK(cuPointerGetAttribute(&start_addr, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + n / 2));
  CHECK(start_addr == p);
  CHECK(holds(p, n, v));
  return p;
}

// open SEGMENTS (HANDLE SIZE VALUE)...: SEGMENTS = legacy IPC mappings the driver should make
// (one per classic segment; 0 for expandable blocks, which are mapped from their pages).
int child_open(const std::vector<std::string>& a) {
  start();
  const long segments = std::stol(a[0]);
  struct Opened {
    CUdeviceptr p;
    std::size_t n;
    int v;
  };
  std::vector<Opened> o;
  for (std::size_t i = 1; i + 2 < a.size(); i += 3) {
    const std::size_t n = std::stoul(a[i + 1]);
    const int v = std::stoi(a[i + 2]);
    o.push_back({open_checked(a[i], n, v), n, v});
  }
  for (std::size_t i = 0; i < o.size(); ++i)
    for (std::size_t j = i + 1; j < o.size(); ++j) CHECK(o[i].p + o[i].n <= o[j].p || o[j].p + o[j].n <= o[i].p);
  CHECK(fakecuda_ipc_opens() == segments);
  // Opened twice: the same pointer; one close leaves it open.
  CUdeviceptr again = 0;
  CHECK_OK(cuIpcOpenMemHandle_v2(&again, unhex(a[1]), kLazyPeerAccess));
  CHECK(again == o[0].p);
  CHECK_OK(cuIpcCloseMemHandle(again));
  CHECK(holds(o[0].p, o[0].n, o[0].v));
  for (auto& x : o) fill(x.p, x.n, x.v + 1);
  for (auto& x : o) CHECK_OK(cuIpcCloseMemHandle(x.p));
  // Nothing stays mapped here.
  CHECK(fakecuda_ipc_mapped() == 0);
  CHECK(fakecuda_vmm_mapped_bytes() == 0);
  CHECK(cuIpcCloseMemHandle(o[0].p) != CUDA_SUCCESS);  // closed already: the driver's error
  return 0;
}

// hold HANDLE SIZE VALUE: opens, says 'o', waits for 'g', checks the bytes again, closes, 'c'.
int child_hold(const std::vector<std::string>& a) {
  start();
  const std::size_t n = std::stoul(a[1]);
  const int v = std::stoi(a[2]);
  const CUdeviceptr p = open_checked(a[0], n, v);
  char b = 'o';
  CHECK(write(3, &b, 1) == 1);
  pollfd pf{4, POLLIN, 0};
  CHECK(poll(&pf, 1, 10000) == 1);  // a parent that died or failed ends this child too
  CHECK(read(4, &b, 1) == 1 && b == 'g');
  CHECK(holds(p, n, v));  // the parent's new blocks did not take these bytes
  CHECK_OK(cuIpcCloseMemHandle(p));
  b = 'c';
  CHECK(write(3, &b, 1) == 1);
  return 0;
}

// fail HANDLE CODE|any: the open must fail (with CODE), and map nothing.
int child_fail(const std::vector<std::string>& a) {
  start();
  CUdeviceptr p = 0;
  const CUresult r = cuIpcOpenMemHandle_v2(&p, unhex(a[0]), kLazyPeerAccess);
  std::printf("child: open answered %d\n", static_cast<int>(r));
  CHECK(r != CUDA_SUCCESS);
  if (a[1] != "any") CHECK(r == static_cast<CUresult>(std::stoi(a[1])));
  CHECK(fakecuda_ipc_mapped() == 0 && fakecuda_vmm_mapped_bytes() == 0);
  return 0;
}

// export_exit: exports a block, sends its handle, exits (the handle outlives its exporter).
int child_export_exit() {
  start();
  CUdeviceptr x = 0;
  CHECK_OK(cuMemAlloc_v2(&x, 4096));
  CUipcMemHandle h{};
  CHECK_OK(cuIpcGetMemHandle(&h, x));
  const std::string s = hex(h) + "\n";
  CHECK(write(3, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
  return 0;
}

// export_wait: exports a 4 KiB block of 0x3c bytes, sends its handle, waits for a byte, exits.
int child_export_wait() {
  start();
  CUdeviceptr x = 0;
  CHECK_OK(cuMemAlloc_v2(&x, 4096));
  fill(x, 4096, 0x3c);
  CUipcMemHandle h{};
  CHECK_OK(cuIpcGetMemHandle(&h, x));
  const std::string s = hex(h) + "\n";
  CHECK(write(3, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
  pollfd pf{4, POLLIN, 0};
  poll(&pf, 1, 30000);
  return 0;
}

// open_on_go HANDLE SIZE VALUE: waits for 'g', then as `hold` (says 'o', waits 'g', closes, 'c').
int child_open_on_go(const std::vector<std::string>& a) {
  start();
  char b = 0;
  pollfd pf{4, POLLIN, 0};
  CHECK(poll(&pf, 1, 10000) == 1 && read(4, &b, 1) == 1 && b == 'g');
  return child_hold(a);
}

// open_second_on_go HANDLE1 HANDLE2 SIZE VALUE1 VALUE2: opens HANDLE1 and says 'o'; on 'g' opens
// HANDLE2 (the parent keeps its exporter out of descriptors meanwhile, and checks that no answer
// comes while it is), which must hold VALUE2, says 'o'; on 'g' closes both and says 'c'.
int child_open_second_on_go(const std::vector<std::string>& a) {
  start();
  const std::size_t n = std::stoul(a[2]);
  const CUdeviceptr p = open_checked(a[0], n, std::stoi(a[3]));
  char b = 'o';
  CHECK(write(3, &b, 1) == 1);
  pollfd pf{4, POLLIN, 0};
  CHECK(poll(&pf, 1, 10000) == 1 && read(4, &b, 1) == 1 && b == 'g');
  timespec t0{};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const CUdeviceptr q = open_checked(a[1], n, std::stoi(a[4]));
  const double took = seconds_since(t0);
  std::printf("child: the second open took %.3f s\n", took);
  b = 'o';
  CHECK(write(3, &b, 1) == 1);
  CHECK(poll(&pf, 1, 10000) == 1 && read(4, &b, 1) == 1 && b == 'g');
  CHECK_OK(cuIpcCloseMemHandle(q));
  CHECK_OK(cuIpcCloseMemHandle(p));
  b = 'c';
  CHECK(write(3, &b, 1) == 1);
  return 0;
}

// The socket an exporter with pid getpid() and kFakeNonce listens on, with a queue of `backlog`.
int fake_listen(int backlog) {
  const std::string name = w::socket_name(static_cast<std::uint32_t>(getuid()), static_cast<std::uint32_t>(getpid()),
                                          kFakeNonce);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), name.size());
  CHECK(bind(fd, reinterpret_cast<sockaddr*>(&a),
             static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) == 0);
  CHECK(listen(fd, backlog) == 0);
  return fd;
}

void wait_for_parent() {
  pollfd pf{4, POLLIN, 0};
  poll(&pf, 1, 30000);
}

// stall_server (without the shim): listens, never accepts, and fills its queue itself; says 'r'.
int child_stall_server() {
  const int lfd = fake_listen(0);
  const std::string name = w::socket_name(static_cast<std::uint32_t>(getuid()), static_cast<std::uint32_t>(getpid()),
                                          kFakeNonce);
  const int self = w::connect_abstract(name, 1000);  // takes the queue's one place
  CHECK(self >= 0);
  char b = 'r';
  CHECK(write(3, &b, 1) == 1);
  wait_for_parent();
  close(self);
  close(lfd);
  return 0;
}

// evil_server (without the shim, on the fake driver): answers each `open` by its export id.
int child_evil_server() {
  start();
  CUdeviceptr seg = 0;
  CHECK_OK(cuMemAlloc_v2(&seg, 4096));  // the driver's own allocation: 4 KiB
  fill(seg, 4096, 0x6d);
  CUipcMemHandle segh{};
  CHECK_OK(cuIpcGetMemHandle(&segh, seg));
  const int unit = memfd_create("evil-unit", MFD_CLOEXEC);  // one 4 MiB "physical unit"
  CHECK(unit >= 0 && ftruncate(unit, 4 << 20) == 0);
  const int lfd = fake_listen(16);
  char b = 'r';
  CHECK(write(3, &b, 1) == 1);
  std::vector<pollfd> fds{{lfd, POLLIN, 0}, {4, POLLIN, 0}};
  for (;;) {
    CHECK(poll(fds.data(), fds.size(), 30000) > 0);
    if (fds[1].revents != 0) break;  // the parent is done
    if ((fds[0].revents & POLLIN) != 0) fds.push_back({accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC), POLLIN, 0});
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      w::Request req;
      if (!w::recv_message(fds[i].fd, &req, sizeof req, 0)) {
        close(fds[i].fd);
        fds.erase(fds.begin() + static_cast<long>(i--));
        continue;
      }
      if (req.op != w::Op::open) continue;
      w::Reply rep;
      rep.status = w::Status::ok;
      rep.kind = w::Kind::classic;
      rep.size = 4096;
      rep.segment = segh;
      w::UnitBatch batch;
      int nfds = 0;
      switch (req.id) {
        case 1: rep.offset = ~std::uint64_t{0} - 2047; break;  // offset + size wraps to 2048
        case 2: rep.offset = kMiB; break;                      // past the 4 KiB segment
        case 3: rep.size = 8192; break;                        // not the size the handle names
        case 4:                                                // expandable, offset + size wraps
          rep.kind = w::Kind::expandable;
          rep.units = 1;
          rep.offset = ~std::uint64_t{0} - 4095;
          batch.count = 1;
          batch.bytes[0] = 4 << 20;
          nfds = 1;
          break;
        case 5:  // expandable: two units announced, one descriptor sent
          rep.kind = w::Kind::expandable;
          rep.units = 2;
          batch.count = 2;
          batch.bytes[0] = batch.bytes[1] = 4 << 20;
          nfds = 1;
          break;
        case 6: rep.kind = static_cast<w::Kind>(9); break;
        default: break;  // 7: the whole segment, well-formed
      }
      w::send_message(fds[i].fd, &rep, sizeof rep);
      if (nfds > 0) w::send_message(fds[i].fd, &batch, sizeof batch, &unit, nfds);
    }
    for (auto& f : fds) f.revents = 0;
  }
  return 0;
}

// foreign HANDLE (run as root): as user 65534, the open is refused by this side (the socket is
// not this user's), and the exporter refuses a connection from this user outright.
int child_foreign(const std::vector<std::string>& a) {
  CHECK(getuid() == 0);
  CHECK(setgid(65534) == 0 && setuid(65534) == 0);
  start();
  CUdeviceptr p = 0;
  CHECK(cuIpcOpenMemHandle_v2(&p, unhex(a[0]), kLazyPeerAccess) == kNotPermitted);
  w::Handle h{};
  CHECK(w::decode(unhex(a[0]), &h));
  const int fd = w::connect_abstract(w::socket_name(h.uid, h.pid, h.nonce));
  CHECK(fd >= 0);
  // The refusal comes unasked, right after the connection is accepted.
  w::Reply rep;
  CHECK(w::recv_message(fd, &rep, sizeof rep, 5000));
  CHECK(rep.magic == w::kWireMagic && rep.status == w::Status::refused_uid && rep.units == 0);
  close(fd);
  // Many more: each is refused, and the exporter's log does not grow with them.
  for (int i = 0; i < 50; ++i) {
    const int f = w::connect_abstract(w::socket_name(h.uid, h.pid, h.nonce));
    CHECK(f >= 0);
    CHECK(w::recv_message(f, &rep, sizeof rep, 5000) && rep.status == w::Status::refused_uid);
    close(f);
  }
  return 0;
}

// crowd HANDLE N (without the shim): N connections to the exporter of HANDLE, none of which ever
// sends anything; says N once all are connected. On 'c' says how many the exporter has closed (or
// answered) by then; exits on 'q'.
int child_crowd(const std::vector<std::string>& a) {
  w::Handle h{};
  CHECK(w::decode(unhex(a[0]), &h));
  const int n = std::stoi(a[1]);
  const std::string name = w::socket_name(h.uid, h.pid, h.nonce);
  std::vector<pollfd> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = w::connect_abstract(name, 10000);
    CHECK(fd >= 0);
    fds.push_back({fd, POLLIN, 0});
  }
  const std::string line = std::to_string(n) + "\n";
  CHECK(write(3, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  pollfd pf{4, POLLIN, 0};
  char b = 0;
  CHECK(poll(&pf, 1, 30000) == 1 && read(4, &b, 1) == 1 && b == 'c');
  CHECK(poll(fds.data(), fds.size(), 0) >= 0);
  long closed = 0;
  for (const auto& f : fds) closed += f.revents != 0 ? 1 : 0;
  const std::string count = std::to_string(closed) + "\n";
  CHECK(write(3, count.data(), count.size()) == static_cast<ssize_t>(count.size()));
  wait_for_parent();
  for (const auto& f : fds) close(f.fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "child") == 0) {
    const std::string op = argv[2];
    const std::vector<std::string> a(argv + 3, argv + argc);
    if (op == "open") return child_open(a);
    if (op == "hold") return child_hold(a);
    if (op == "fail") return child_fail(a);
    if (op == "export_exit") return child_export_exit();
    if (op == "foreign") return child_foreign(a);
    if (op == "export_wait") return child_export_wait();
    if (op == "open_on_go") return child_open_on_go(a);
    if (op == "open_second_on_go") return child_open_second_on_go(a);
    if (op == "stall_server") return child_stall_server();
    if (op == "evil_server") return child_evil_server();
    if (op == "crowd") return child_crowd(a);
    return 2;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scenario>\n", argv[0]);
    return 2;
  }
  const std::string s = argv[1];
  struct {
    const char* name;
    void (*fn)();
  } scenarios[] = {{"share", scenario_share},       {"held", scenario_held},     {"crash", scenario_crash},
                   {"gone", scenario_gone},         {"noshim", scenario_noshim}, {"foreign", scenario_foreign},
                   {"noexport", scenario_noexport}, {"reset", scenario_reset},   {"stall", scenario_stall},
                   {"evil", scenario_evil},         {"emfile", scenario_emfile}, {"crowd", scenario_crowd}};
  for (auto& sc : scenarios) {
    if (s == sc.name) {
      sc.fn();
      std::printf("PASS %s\n", sc.name);
      return 0;
    }
  }
  std::fprintf(stderr, "unknown scenario %s\n", argv[1]);
  return 2;
}
