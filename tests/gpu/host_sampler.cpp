// A sampling profiler of one thread's host time, by shared object, for machines without perf.
// Preloaded next to the program; the program brackets the part to profile with
// host_sampler_start() and host_sampler_stop(path) (tests/gpu/torch_cnn.py does when
// HOST_SAMPLER_OUT is set, through ctypes). Between them a CLOCK_MONOTONIC timer signals the
// thread that called start every HOST_SAMPLER_US microseconds (default 100); the handler stores
// the interrupted program counter and the return addresses of the stack (glibc's backtrace).
// stop() resolves them with dladdr and writes, as TSV:
//   total  SAMPLES  SECONDS
//   self   DSO  SAMPLES          (the leaf frame's object: where the time was spent)
//   incl   DSO  SAMPLES          (every object anywhere on the stack, once per sample: what the
//                                 time was spent under, e.g. libcudapool.so with the driver
//                                 calls it makes)
//   under  DSO  LEAF-DSO  SAMPLES  (for libcudapool.so and libcudart: where the time below them went)
//   sym    DSO  SYMBOL  SAMPLES  (leaf, the nearest exported symbol: approximate in stripped code)
//   off    OFFSET  SAMPLES         (libcudapool.so: the innermost of its frames, as an offset into
//                                 it, for addr2line on the unstripped build; the leaf or the call
//                                 that made the time below it)
// tests/gpu/host_profile.py turns the files of several processes into ms per step by object.
// Build: g++ -std=c++17 -O2 -shared -fPIC -o host_sampler.so tests/gpu/host_sampler.cpp -ldl
// Unwinding from a signal handler is not async-signal-safe in general (it may take the loader's
// lock): profile a steady state with no dlopen in it, and bound the process with a timeout.
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int kDepth = 24;                    // frames kept per sample (the leaf included)
constexpr std::size_t kMaxSamples = 1 << 17;  // about 13 s at 100 us
struct Sample {
  int n;
  std::uintptr_t pc[kDepth];
};
Sample* g_samples = nullptr;
std::atomic<std::size_t> g_count{0};
std::atomic<bool> g_on{false};
timer_t g_timer;
bool g_have_timer = false;
timespec g_t0;

void on_signal(int, siginfo_t*, void* ctx) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  const int saved = errno;
  const std::size_t i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i < kMaxSamples) {
    Sample& s = g_samples[i];
    void* frames[kDepth + 4];
    // backtrace's frames: this handler, the kernel's signal trampoline, then the interrupted
    // code's callers. The leaf itself comes from the context (backtrace may skip it).
    const int n = backtrace(frames, kDepth + 4);
    s.pc[0] = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_RIP]);
    // The interrupted frame is normally frames[2]; look for it among the first few, and start
    // at its caller.
    int j = 2;
    for (int m = 0; m < n && m < 5; ++m)
      if (reinterpret_cast<std::uintptr_t>(frames[m]) == s.pc[0]) j = m + 1;
    int k = 1;
    for (; j < n && k < kDepth; ++j) s.pc[k++] = reinterpret_cast<std::uintptr_t>(frames[j]);
    s.n = k;
  }
  errno = saved;
}

std::string base_name(const char* path) {
  if (path == nullptr || *path == 0) return "?";
  const char* slash = std::strrchr(path, '/');
  std::string b = slash != nullptr ? slash + 1 : path;
  // libcudart.so.13.0.48 -> libcudart.so: versions differ between machines, objects do not.
  const auto so = b.find(".so");
  if (so != std::string::npos) b.resize(so + 3);
  return b;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int host_sampler_start() {
  if (g_samples == nullptr) {
    void* m = mmap(nullptr, sizeof(Sample) * kMaxSamples, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    g_samples = static_cast<Sample*>(m);
  }
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside the handler
  struct sigaction sa = {};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, nullptr) != 0) return -1;
  sigevent ev = {};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = SIGPROF;
  ev._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
  if (timer_create(CLOCK_MONOTONIC, &ev, &g_timer) != 0) return -1;
  g_have_timer = true;
  const char* us_env = getenv("HOST_SAMPLER_US");
  long us = us_env != nullptr ? std::strtol(us_env, nullptr, 10) : 100;
  if (us < 20 || us > 100000) us = 100;
  itimerspec it = {};
  it.it_interval.tv_nsec = us * 1000;
  it.it_value.tv_nsec = us * 1000;
  g_count.store(0);
  clock_gettime(CLOCK_MONOTONIC, &g_t0);
  g_on.store(true);
  return timer_settime(g_timer, 0, &it, nullptr);
}

extern "C" __attribute__((visibility("default"))) int host_sampler_stop(const char* path) {
  g_on.store(false);
  if (g_have_timer) {
    timer_delete(g_timer);
    g_have_timer = false;
  }
  timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double secs = static_cast<double>(t1.tv_sec - g_t0.tv_sec) +
                      1e-9 * static_cast<double>(t1.tv_nsec - g_t0.tv_nsec);
  const std::size_t n = std::min(g_count.load(), kMaxSamples);
  std::map<std::uintptr_t, std::pair<std::string, std::string>> where;  // pc -> (object, symbol)
  std::map<std::uintptr_t, std::uintptr_t> base;                        // pc -> its object's base
  auto resolve = [&](std::uintptr_t pc) -> const std::pair<std::string, std::string>& {
    auto it = where.find(pc);
    if (it != where.end()) return it->second;
    Dl_info info = {};
    std::pair<std::string, std::string> r{"?", "?"};
    if (dladdr(reinterpret_cast<void*>(pc), &info) != 0) {
      r.first = base_name(info.dli_fname);
      if (info.dli_sname != nullptr) r.second = info.dli_sname;
      base[pc] = reinterpret_cast<std::uintptr_t>(info.dli_fbase);
    }
    return where.emplace(pc, std::move(r)).first->second;
  };
  std::map<std::uintptr_t, long> ours;  // offsets into libcudapool.so
  std::map<std::string, long> self, incl;
  std::map<std::pair<std::string, std::string>, long> under, sym;
  for (std::size_t i = 0; i < n; ++i) {
    const Sample& s = g_samples[i];
    if (s.n <= 0) continue;
    const auto& leaf = resolve(s.pc[0]);
    ++self[leaf.first];
    ++sym[leaf];
    std::set<std::string> seen;
    bool found = false;
    for (int k = 0; k < s.n; ++k) {
      const std::string& o = resolve(s.pc[k]).first;
      seen.insert(o);
      if (!found && o == "libcudapool.so") {
        found = true;
        // a return address points after its call: one byte back is inside the call
        ++ours[s.pc[k] - base[s.pc[k]] - (k == 0 ? 0 : 1)];
      }
    }
    for (const auto& o : seen) {
      ++incl[o];
      if (o != leaf.first && (o == "libcudapool.so" || o.rfind("libcudart", 0) == 0)) ++under[{o, leaf.first}];
    }
  }
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return -1;
  std::fprintf(f, "total\t%zu\t%.4f\n", n, secs);
  for (const auto& [o, c] : self) std::fprintf(f, "self\t%s\t%ld\n", o.c_str(), c);
  for (const auto& [o, c] : incl) std::fprintf(f, "incl\t%s\t%ld\n", o.c_str(), c);
  for (const auto& [k, c] : under) std::fprintf(f, "under\t%s\t%s\t%ld\n", k.first.c_str(), k.second.c_str(), c);
  std::vector<std::pair<long, std::pair<std::string, std::string>>> top;
  for (const auto& [k, c] : sym) top.emplace_back(c, k);
  std::sort(top.rbegin(), top.rend());
  if (top.size() > 60) top.resize(60);
  for (const auto& [c, k] : top) std::fprintf(f, "sym\t%s\t%s\t%ld\n", k.first.c_str(), k.second.c_str(), c);
  for (const auto& [o, c] : ours) std::fprintf(f, "off\t0x%lx\t%ld\n", static_cast<unsigned long>(o), c);
  std::fclose(f);
  return 0;
}
