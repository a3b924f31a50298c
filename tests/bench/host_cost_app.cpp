// What cudaMalloc/cudaFree cost the program on the host, per pair, on the fake driver
// (tests/fakecuda/): run under LD_PRELOAD=libcudapool.so with a policy in CUDAPOOL_CONF, or alone
// (the fake's cuMemAlloc/cuMemFree: no cache), with FAKECUDA_CALL_COST_NS giving each driver call
// its host cost. It reaches the driver as cudart does (dlopen, cuGetProcAddress_v2, then every
// function by name and version), as tests/fakecuda/app.cpp's cudart build does.
// tests/bench/host_cost.sh runs it under each policy and makes the table and the CI gate.
//
// host_cost_app [--pairs N] [--chunks C] [--only SCENARIO,...] [--side-stream]
// host_cost_app --launches N [--chunks C]   (ns per cuLaunchKernel: see launches_only)
// --side-stream: one idle non-blocking stream exists before the first scenario, as in most
// programs: the pool's device fences must then cover it (host_cost.sh --side-stream: a table
// only, never the gate).
//
// Scenarios: pair_4k .. pair_64m (one thread, cuMemAlloc(n)/cuMemFree in a loop), cross (one
// thread allocates batches, another thread frees them, both running), mix (a fixed pseudo-random
// sequence of tensor-like sizes with 50-200 live), mix_async (the same through cuMemAllocAsync /
// cuMemFreeAsync on the legacy default stream), mix_torch (the same through the library's
// PyTorch pluggable-allocator entry points, when it is preloaded), mix_cudart (the same through a
// shared cudart's cudaMalloc / cudaFree: the fake one, which the preloaded library answers for),
// mix_streams (the mix through
// cuMemAlloc/cuMemFree with 16 idle non-blocking streams alive, as PyTorch keeps: the pool's
// fences must then cover them, in sweeps; run last, the streams stay). Each runs once untimed
// (the pool grows to its steady state), then C chunks of N pairs; next to each chunk the same
// pattern runs through `floor`, a minimal best-fit free list inside this program that pays one
// cuCtxGetCurrent per allocation like the shim's hook. The floor, timed in the same process right
// next to the scenario, is what the CI gate divides by, so that the speed of the machine cancels
// out.
//
// One line per scenario, tab-separated:
//   row SCENARIO PAIRS NS_PER_PAIR FLOOR_NS_PER_PAIR DRIVER_NS_PER_PAIR OWN_FLOOR_RATIO CALLS
// medians of the C chunks: wall time per pair, the floor's, the part of the pair's time the fake
// driver spent in its call costs, and the pair's own time (without those) over the floor's (see
// measure()). PAIRS: the pairs of all chunks; CALLS: name=count for every driver function those
// pairs called (fakecuda_calls), and sleeps=count for the times the timed thread went to sleep
// (voluntary context switches), when it did, in the scenarios timed by CPU time.
#include <dlfcn.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "shim/cuda_abi.h"
#include "tests/fakecuda/test_app.h"

using namespace cudaabi;

namespace {

struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  PFN_cuMemAlloc_v2 cuMemAlloc;
  PFN_cuMemFree_v2 cuMemFree;
  PFN_cuMemAllocAsync cuMemAllocAsync;
  PFN_cuMemFreeAsync cuMemFreeAsync;
  PFN_cuStreamCreate cuStreamCreate;
  PFN_cuGetProcAddress_v2 cuGetProcAddress;
  long (*calls)(const char*);     // fakecuda_calls
  const char* (*call_name)(int);  // fakecuda_call_name
  long (*charged_ns)(int);        // fakecuda_charged_ns
} api;

template <typename Fn>
void get(Fn& slot, const char* name, int version) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult st = -1;
  CHECK_OK(api.cuGetProcAddress(name, &p, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st));
  CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && p != nullptr);
  slot = reinterpret_cast<Fn>(p);
}

CUcontext start_cuda() {
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (libcuda == nullptr) std::printf("dlopen: %s\n", dlerror());
  CHECK(libcuda != nullptr);
  api.cuGetProcAddress = reinterpret_cast<PFN_cuGetProcAddress_v2>(dlsym(libcuda, "cuGetProcAddress_v2"));
  CHECK(api.cuGetProcAddress != nullptr);
  api.calls = reinterpret_cast<long (*)(const char*)>(dlsym(libcuda, "fakecuda_calls"));
  api.call_name = reinterpret_cast<const char* (*)(int)>(dlsym(libcuda, "fakecuda_call_name"));
  api.charged_ns = reinterpret_cast<long (*)(int)>(dlsym(libcuda, "fakecuda_charged_ns"));
  CHECK(api.calls != nullptr && api.call_name != nullptr && api.charged_ns != nullptr);  // the fake, not a GPU
  get(api.cuInit, "cuInit", 2000);
  get(api.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000);
  get(api.cuCtxSetCurrent, "cuCtxSetCurrent", 4000);
  get(api.cuCtxGetCurrent, "cuCtxGetCurrent", 4000);
  get(api.cuMemAlloc, "cuMemAlloc", 3020);
  get(api.cuMemFree, "cuMemFree", 3020);
  get(api.cuMemAllocAsync, "cuMemAllocAsync", 11020);
  get(api.cuMemFreeAsync, "cuMemFreeAsync", 11020);
  get(api.cuStreamCreate, "cuStreamCreate", 2000);
  CHECK_OK(api.cuInit(0));
  CUcontext ctx = nullptr;
  CHECK_OK(api.cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK_OK(api.cuCtxSetCurrent(ctx));
  return ctx;
}

// The driver functions the fake counts, by name (fakecuda_call_name), and their counts now.
const std::vector<std::string>& kinds() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> v;
    for (int i = 0; api.call_name(i) != nullptr; ++i) v.emplace_back(api.call_name(i));
    return v;
  }();
  return k;
}
std::vector<long> counts() {
  std::vector<long> c;
  for (const std::string& k : kinds()) {
    c.push_back(api.calls(k.c_str()));
    CHECK(c.back() >= 0);
  }
  return c;
}

// ---- the two allocators a scenario runs through ------------------------------------------------
// The program's cudaMalloc/cudaFree: the driver's entry points, which the shim (when preloaded)
// serves from its pool.
struct Driver {
  CUdeviceptr alloc(std::size_t n) {
    CUdeviceptr p = 0;
    CHECK_OK(api.cuMemAlloc(&p, n));
    return p;
  }
  void free(CUdeviceptr p) { CHECK_OK(api.cuMemFree(p)); }
};

// The program's cudaMallocAsync/cudaFreeAsync on the legacy default stream.
struct DriverAsync {
  CUdeviceptr alloc(std::size_t n) {
    CUdeviceptr p = 0;
    CHECK_OK(api.cuMemAllocAsync(&p, n, nullptr));
    return p;
  }
  void free(CUdeviceptr p) { CHECK_OK(api.cuMemFreeAsync(p, nullptr)); }
};

// PyTorch's pluggable allocator on the pool (cudapool.torch.use()): the library's
// cudapool_torch_alloc/cudapool_torch_free, as CUDAPluggableAllocator calls them for device 0 and
// the default stream. Present only when the library is preloaded.
struct Torch {
  using AllocFn = void* (*)(ssize_t, int, void*);
  using FreeFn = void (*)(void*, ssize_t, int, void*);
  AllocFn alloc_fn = reinterpret_cast<AllocFn>(dlsym(RTLD_DEFAULT, "cudapool_torch_alloc"));
  FreeFn free_fn = reinterpret_cast<FreeFn>(dlsym(RTLD_DEFAULT, "cudapool_torch_free"));
  std::unordered_map<CUdeviceptr, std::size_t> sizes;  // PyTorch passes the size back at free
  bool present() const { return alloc_fn != nullptr && free_fn != nullptr; }
  CUdeviceptr alloc(std::size_t n) {
    void* p = alloc_fn(static_cast<ssize_t>(n), 0, nullptr);
    CHECK(p != nullptr);
    const auto d = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
    sizes[d] = n;
    return d;
  }
  void free(CUdeviceptr p) {
    auto it = sizes.find(p);
    CHECK(it != sizes.end());
    free_fn(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)), static_cast<ssize_t>(it->second), 0, nullptr);
    sizes.erase(it);
  }
};

// A shared cudart's cudaMalloc/cudaFree (the fake one, tests/fakecuda/fakecudart.cpp, loaded with
// dlopen into the global scope, as PyTorch's libraries load theirs), looked up in the global
// scope: under the preload those are the library's own definitions, which answer plain calls
// without the cudart under them; without it, the fake cudart's, on the driver. Present when the
// fake cudart is on the library path.
struct Cudart {
  using MallocFn = int (*)(void**, std::size_t);
  using FreeFn = int (*)(void*);
  MallocFn malloc_fn = nullptr;
  FreeFn free_fn = nullptr;
  Cudart() {
    if (dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL) == nullptr) return;
    malloc_fn = reinterpret_cast<MallocFn>(dlsym(RTLD_DEFAULT, "cudaMalloc"));
    free_fn = reinterpret_cast<FreeFn>(dlsym(RTLD_DEFAULT, "cudaFree"));
  }
  bool present() const { return malloc_fn != nullptr && free_fn != nullptr; }
  CUdeviceptr alloc(std::size_t n) {
    void* p = nullptr;
    CHECK(malloc_fn(&p, n) == 0 && p != nullptr);
    return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  }
  void free(CUdeviceptr p) { CHECK(free_fn(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p))) == 0); }
};

// A test-and-test-and-set lock that yields after a few rounds: what a pool's lock costs when
// two threads take turns (a std::mutex would park them in the kernel at every hand-off).
class SpinLock {
 public:
  void lock() {
    for (int spins = 0; flag_.exchange(true, std::memory_order_acquire); ++spins) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

// The floor: a best-fit free list by (size, address) behind a spin lock, addresses made up (never
// touched), 512 B rounding, one cuCtxGetCurrent per allocation. About what any pool must do.
struct Floor {
  SpinLock mu;
  std::set<std::pair<std::size_t, CUdeviceptr>> free_set;
  std::unordered_map<CUdeviceptr, std::size_t> live;
  CUdeviceptr next = 1u << 20;
  CUdeviceptr alloc(std::size_t n) {
    CUcontext ctx = nullptr;
    CHECK_OK(api.cuCtxGetCurrent(&ctx));
    const std::size_t r = (n + 511) / 512 * 512;
    std::lock_guard<SpinLock> l(mu);
    CUdeviceptr p = 0;
    std::size_t size = r;
    if (auto it = free_set.lower_bound({r, 0}); it != free_set.end() && it->first <= 2 * r) {
      size = it->first;
      p = it->second;
      free_set.erase(it);
    } else {
      p = next;
      next += r;
    }
    live.emplace(p, size);
    return p;
  }
  void free(CUdeviceptr p) {
    std::lock_guard<SpinLock> l(mu);
    auto it = live.find(p);
    CHECK(it != live.end());
    free_set.emplace(it->second, p);
    live.erase(it);
  }
};

// ---- scenarios ---------------------------------------------------------------------------------
// Each returns the number of pairs it made; `A` is Driver or Floor.
template <typename A>
long pairs_loop(A& a, std::size_t size, long pairs) {
  for (long i = 0; i < pairs; ++i) a.free(a.alloc(size));
  return pairs;
}

// Thread A (the caller) allocates batches of kBatch, thread B frees them, through a ring of
// kSlots batches, both running at once: PyTorch's autograd thread freeing what the forward pass
// allocated. B is started once and lives through every run, of the floor and of the driver; each
// batch says which of the two it came from.
constexpr int kBatch = 64, kSlots = 4;
constexpr std::size_t kCrossSizes[] = {4u << 10, 64u << 10, 256u << 10, 2u << 20};
struct Cross {
  Driver& driver;
  Floor& floor;
  CUcontext ctx;
  CUdeviceptr ring[kSlots][kBatch] = {};
  bool from_floor[kSlots] = {};
  std::atomic<long> produced{0}, consumed{0};
  std::atomic<bool> stop{false};
  std::thread freer;
  Cross(Driver& d, Floor& f, CUcontext c) : driver(d), floor(f), ctx(c) {
    freer = std::thread([this] {
      CHECK_OK(api.cuCtxSetCurrent(ctx));
      for (long k = 0;; ++k) {
        while (produced.load(std::memory_order_acquire) == k) {
          if (stop.load(std::memory_order_acquire)) return;
          std::this_thread::yield();
        }
        for (CUdeviceptr p : ring[k % kSlots]) from_floor[k % kSlots] ? floor.free(p) : driver.free(p);
        consumed.store(k + 1, std::memory_order_release);
      }
    });
  }
  ~Cross() {
    stop.store(true, std::memory_order_release);
    freer.join();
  }
  Cross(const Cross&) = delete;
  Cross& operator=(const Cross&) = delete;
  template <typename A>
  long run(A& a, long pairs) {
    const long batches = std::max(1L, pairs / kBatch);
    long k = produced.load();
    for (long b = 0; b < batches; ++b, ++k) {
      while (k - consumed.load(std::memory_order_acquire) >= kSlots) std::this_thread::yield();
      const auto slot = static_cast<std::size_t>(k % kSlots);
      from_floor[slot] = std::is_same_v<A, Floor>;
      for (std::size_t i = 0; i < kBatch; ++i) ring[slot][i] = a.alloc(kCrossSizes[i % std::size(kCrossSizes)]);
      produced.store(k + 1, std::memory_order_release);
    }
    while (consumed.load(std::memory_order_acquire) != k) std::this_thread::yield();
    return batches * kBatch;
  }
};

// A PyTorch-like sequence: sizes mostly 512 B - 1 MiB, some 2 - 64 MiB, a few 128 - 512 MiB
// (log-uniform within each class, 256 B multiples), allocations and frees of random live tensors
// interleaved with 50 - 200 live. Fixed seed. One sequence for the whole scenario: each chunk
// goes on where the last one stopped, so every chunk sees the steady state.
struct MixOp {
  bool alloc;
  std::size_t value;  // alloc: the size; free: the index into the live list (swap-removed)
};
std::vector<MixOp> make_mix(long allocs) {
  std::uint64_t rng = 0x9e3779b97f4a7c15ull;
  auto next = [&rng] {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
  };
  auto unit = [&next] { return static_cast<double>(next() >> 11) / 9007199254740992.0; };
  auto log_uniform = [&unit](double lo, double hi) { return lo * std::pow(hi / lo, unit()); };
  std::vector<MixOp> ops;
  std::size_t live = 0;
  for (long made = 0; made < allocs;) {
    const bool alloc = live < 50 || (live < 200 && unit() < 0.5);
    if (alloc) {
      const double u = unit();
      const double bytes = u < 0.80   ? log_uniform(512, 1 << 20)
                           : u < 0.97 ? log_uniform(2 << 20, 64 << 20)
                                      : log_uniform(128 << 20, 512 << 20);
      ops.push_back({true, (static_cast<std::size_t>(bytes) + 255) / 256 * 256});
      ++live;
      ++made;
    } else {
      ops.push_back({false, static_cast<std::size_t>(next() % live)});
      --live;
    }
  }
  return ops;
}
// Replays the sequence through one allocator, `pairs` allocations (and the frees between them)
// per call; what is still live at the end is freed untimed.
template <typename A>
struct MixRun {
  A& a;
  const std::vector<MixOp>& ops;
  std::size_t pos = 0;
  std::vector<CUdeviceptr> live;
  MixRun(A& alloc, const std::vector<MixOp>& sequence) : a(alloc), ops(sequence) {}
  MixRun(const MixRun&) = delete;
  MixRun& operator=(const MixRun&) = delete;
  long run(long pairs) {
    long made = 0;
    for (; pos < ops.size(); ++pos) {
      const MixOp& op = ops[pos];
      if (op.alloc) {
        if (made == pairs) break;
        live.push_back(a.alloc(op.value));
        ++made;
      } else {
        a.free(live[op.value]);
        live[op.value] = live.back();
        live.pop_back();
      }
    }
    CHECK(made == pairs);
    return made;
  }
  ~MixRun() {
    for (CUdeviceptr p : live) a.free(p);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One timed run, per pair: wall time, the calling thread's CPU time, and the time the fake driver
// spent in its call costs (FAKECUDA_CALL_COST_NS, all threads), measured and as asked for; and how
// often the calling thread went to sleep (CPU time cannot see a wait that sleeps: this can).
struct Timing {
  double ns = 0, cpu_ns = 0, driver_ns = 0, nominal_ns = 0;
  long sleeps = 0;  // voluntary context switches of the calling thread: it blocked or slept
  long pairs = 0;
};
double thread_cpu_ns() {
  timespec ts{};
  CHECK(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}
long voluntary_switches() {
  rusage ru{};
  CHECK(getrusage(RUSAGE_THREAD, &ru) == 0);
  return ru.ru_nvcsw;
}
Timing timed(const std::function<long()>& run) {
  const long charged = api.charged_ns(0), nominal = api.charged_ns(1), switches = voluntary_switches();
  const double cpu0 = thread_cpu_ns();
  const auto t0 = std::chrono::steady_clock::now();
  const long pairs = run();
  const auto t1 = std::chrono::steady_clock::now();
  const double cpu1 = thread_cpu_ns();
  CHECK(pairs > 0);
  const auto n = static_cast<double>(pairs);
  return {std::chrono::duration<double, std::nano>(t1 - t0).count() / n,
          (cpu1 - cpu0) / n,
          static_cast<double>(api.charged_ns(0) - charged) / n,
          static_cast<double>(api.charged_ns(1) - nominal) / n,
          voluntary_switches() - switches,
          pairs};
}

// Warm-up of both, then `chunks` times the floor and the scenario right after each other (their
// order alternating), the scenario's driver calls counted. The ratio the CI gate watches is the
// scenario's own time (without the driver's call costs) over the floor's: CPU time of this thread
// less the costs as asked for, when the scenario runs on it alone (time another process took the
// CPU does not count), wall time less the spins' measured time when two threads take part
// (`two_threads`). Short chunks, many of them, and the median of the chunks' ratios: a chunk that
// something interrupted moves one ratio, not the median.
void measure(const char* name, int chunks, bool two_threads, const std::function<long()>& floor,
             const std::function<long()>& run) {
  floor();
  run();
  std::vector<double> ns, driver_ns, floor_ns, ratio;
  long pairs = 0;
  std::vector<long> calls(kinds().size(), 0);
  long sleeps = 0;
  for (int c = 0; c < chunks; ++c) {
    Timing f, t;
    if (c % 2 == 0) f = timed(floor);
    const std::vector<long> before = counts();
    t = timed(run);
    const std::vector<long> after = counts();
    if (c % 2 == 1) f = timed(floor);
    floor_ns.push_back(f.ns);
    ns.push_back(t.ns);
    driver_ns.push_back(t.driver_ns);
    ratio.push_back(two_threads ? (t.ns - t.driver_ns) / f.ns : (t.cpu_ns - t.nominal_ns) / f.cpu_ns);
    for (std::size_t i = 0; i < calls.size(); ++i) calls[i] += after[i] - before[i];
    if (!two_threads) sleeps += t.sleeps;  // two threads: wall time sees their waits, and they wait by design
    pairs += t.pairs;
  }
  std::printf("row\t%s\t%ld\t%.1f\t%.1f\t%.1f\t%.3f\t", name, pairs, median(ns), median(floor_ns), median(driver_ns),
              median(ratio));
  bool first = true;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (calls[i] == 0) continue;
    std::printf("%s%s=%ld", first ? "" : ",", kinds()[i].c_str(), calls[i]);
    first = false;
  }
  if (sleeps != 0) std::printf("%ssleeps=%ld", first ? "" : ",", sleeps);
  std::printf("%s\n", first && sleeps == 0 ? "-" : "");
  std::fflush(stdout);
}

bool wanted(const std::string& only, const char* name) {
  if (only.empty()) return true;
  const std::string list = "," + only + ",";
  return list.find("," + std::string(name) + ",") != std::string::npos;
}

}  // namespace

// --launches N: what a kernel launch costs the program on the host (a launch the fake driver
// answers at once), median of the chunks, one line "launch NS_PER_LAUNCH": under the shim every
// launch passes the parking door (shim/parking/parking.h), whose fast path this measures.
int launches_only(long n, int chunks) {
  start_cuda();
  using Launch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void**, void**);
  Launch launch = nullptr;
  get(launch, "cuLaunchKernel", 4000);
  // The thread's CPU time, not wall time: other processes taking the CPU do not count.
  const auto cpu_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
  };
  std::vector<double> per;
  for (int c = 0; c <= chunks; ++c) {  // chunk 0 warms up
    const double t0 = cpu_ns();
    for (long i = 0; i < n; ++i) CHECK_OK(launch(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
    const double t1 = cpu_ns();
    if (c > 0) per.push_back((t1 - t0) / static_cast<double>(n));
  }
  std::sort(per.begin(), per.end());
  std::printf("launch\t%.2f\n", per[per.size() / 2]);
  std::printf("PASS host_cost_app\n");
  return 0;
}

int main(int argc, char** argv) {
  long pairs = 4000;
  int chunks = 15;
  long launches = 0;
  std::string only;
  bool side_stream = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--launches" && i + 1 < argc) {
      launches = std::atol(argv[++i]);
    } else if (a == "--pairs" && i + 1 < argc) {
      pairs = std::atol(argv[++i]);
    } else if (a == "--chunks" && i + 1 < argc) {
      chunks = std::atoi(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--side-stream") {
      side_stream = true;
    } else {
      std::fprintf(stderr, "usage: %s [--pairs N] [--chunks C] [--only SCENARIO,...] [--side-stream] [--launches N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (launches > 0) return launches_only(launches, chunks);
  CHECK(pairs >= kBatch && chunks >= 1);
  const CUcontext ctx = start_cuda();
  Driver driver;
  Floor floor;
  CUstream side = nullptr;
  if (side_stream) CHECK_OK(api.cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));  // idle to the end
  const struct {
    const char* name;
    std::size_t size;
  } sizes[] = {{"pair_4k", 4u << 10},
               {"pair_256k", 256u << 10},
               {"pair_1m", 1u << 20},
               {"pair_4m", 4u << 20},
               {"pair_64m", 64u << 20}};
  for (const auto& s : sizes) {
    if (!wanted(only, s.name)) continue;
    measure(
        s.name, chunks, false, [&] { return pairs_loop(floor, s.size, pairs); },
        [&] { return pairs_loop(driver, s.size, pairs); });
  }
  if (wanted(only, "cross")) {
    Cross cross(driver, floor, ctx);
    measure(
        "cross", chunks, true, [&] { return cross.run(floor, pairs); }, [&] { return cross.run(driver, pairs); });
  }
  if (wanted(only, "mix")) {
    const std::vector<MixOp> ops = make_mix((chunks + 1) * pairs);  // the warm-up and every chunk
    MixRun<Floor> floor_mix(floor, ops);
    MixRun<Driver> driver_mix(driver, ops);
    measure(
        "mix", chunks, false, [&] { return floor_mix.run(pairs); }, [&] { return driver_mix.run(pairs); });
  }
  if (wanted(only, "mix_async")) {
    const std::vector<MixOp> ops = make_mix((chunks + 1) * pairs);
    MixRun<Floor> floor_mix(floor, ops);
    DriverAsync async;
    MixRun<DriverAsync> async_mix(async, ops);
    measure(
        "mix_async", chunks, false, [&] { return floor_mix.run(pairs); }, [&] { return async_mix.run(pairs); });
  }
  if (Torch torch; torch.present() && wanted(only, "mix_torch")) {
    const std::vector<MixOp> ops = make_mix((chunks + 1) * pairs);
    MixRun<Floor> floor_mix(floor, ops);
    MixRun<Torch> torch_mix(torch, ops);
    measure(
        "mix_torch", chunks, false, [&] { return floor_mix.run(pairs); }, [&] { return torch_mix.run(pairs); });
  }
  if (Cudart cudart; cudart.present() && wanted(only, "mix_cudart")) {
    const std::vector<MixOp> ops = make_mix((chunks + 1) * pairs);
    MixRun<Floor> floor_mix(floor, ops);
    MixRun<Cudart> cudart_mix(cudart, ops);
    measure(
        "mix_cudart", chunks, false, [&] { return floor_mix.run(pairs); }, [&] { return cudart_mix.run(pairs); });
  }
  // Last: the streams stay for the rest of the process (as PyTorch's do).
  if (wanted(only, "mix_streams")) {
    std::vector<CUstream> idle(16);
    for (CUstream& st : idle) CHECK_OK(api.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    const std::vector<MixOp> ops = make_mix((chunks + 1) * pairs);
    MixRun<Floor> floor_mix(floor, ops);
    MixRun<Driver> driver_mix(driver, ops);
    measure(
        "mix_streams", chunks, false, [&] { return floor_mix.run(pairs); }, [&] { return driver_mix.run(pairs); });
  }
  std::printf("PASS host_cost_app\n");
  return 0;
}
