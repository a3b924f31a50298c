// A fake libcuda.so.1 for tests without a GPU: "device memory" is host memory, streams and
// events are bookkeeping whose completion the test controls (fakecuda.h), and
// cuGetProcAddress(_v2) resolves by name, version and stream flavour like the real driver.
// It implements only what the shim and its test programs call, with the real driver's answers
// for the cases the tests depend on (capture rules, reset, IPC of an interior pointer).
// Device memory lives in shared memory files (memfd), so CUDA IPC works between processes as it
// does on a GPU: cuIpcGetMemHandle names an allocation's place in its process's file, and
// cuMemExportToShareableHandle hands out the file descriptor of a VMM handle.
#include "tests/fakecuda/fakecuda.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace cudaabi;

#define FAKE_API extern "C" __attribute__((visibility("default")))
// A counter or size of the fake's state, read under its lock, as a test control function.
#define FAKE_COUNTER(name, expr)       \
  FAKE_API long name() {               \
    std::lock_guard<std::mutex> l(mu); \
    return static_cast<long>(expr);    \
  }

// Entry points the calling thread made into this "driver" (fakecuda_thread_driver_calls): the
// shim's hot-path tests assert how many a pool hit costs. Per thread: no shared line in benches.
static thread_local long tl_driver_calls = 0;
#define FAKE_COUNT() (++tl_driver_calls)

// ---- calls by function, and their cost ----------------------------------------------------------
// The entry points whose number and cost make a pool's host cost: each call is counted by its
// function's name (without _v2/_ptsz; fakecuda_calls(name) sums every thread) and, when
// FAKECUDA_CALL_COST_NS names the function ("cuEventRecord=250,cuMemMap=5000,..."), spins on the
// steady clock for that many nanoseconds before doing its work, outside the fake's lock, as a
// real driver call costs the host (a spin reads the clock at least twice: ~25 ns each on a VM).
#define FAKE_CALL_KINDS(X)                                                                                           \
  X(cuCtxGetCurrent), X(cuCtxSetCurrent), X(cuCtxGetDevice), X(cuCtxPushCurrent), X(cuCtxPopCurrent),                \
      X(cuCtxSynchronize), X(cuEventCreate), X(cuEventDestroy), X(cuEventRecord), X(cuEventQuery), X(cuStreamQuery), \
      X(cuEventSynchronize), X(cuStreamWaitEvent), X(cuStreamIsCapturing), X(cuMemAlloc), X(cuMemFree),              \
      X(cuMemAllocAsync), X(cuMemFreeAsync), X(cuMemGetInfo), X(cuPointerGetAttribute), X(cuPointerGetAttributes),   \
      X(cuMemAddressReserve), X(cuMemAddressFree), X(cuMemCreate), X(cuMemRelease), X(cuMemMap), X(cuMemUnmap),      \
      X(cuMemSetAccess), X(cuMemHostAlloc), X(cuMemFreeHost), X(cuCtxRecordEvent), X(cuCtxWaitEvent)
namespace {
enum class Call : int {
#define FAKE_CALL_ENUM(name) name
  FAKE_CALL_KINDS(FAKE_CALL_ENUM)
#undef FAKE_CALL_ENUM
};
constexpr const char* kCallNames[] = {
#define FAKE_CALL_NAME(name) #name
    FAKE_CALL_KINDS(FAKE_CALL_NAME)
#undef FAKE_CALL_NAME
};
constexpr std::size_t kCallKinds = std::size(kCallNames);

int call_index(const char* name, std::size_t len) {
  for (std::size_t i = 0; i < kCallKinds; ++i)
    if (std::strlen(kCallNames[i]) == len && std::strncmp(kCallNames[i], name, len) == 0) return static_cast<int>(i);
  return -1;
}

// FAKECUDA_CALL_COST_NS, read once. A name the fake does not count or a malformed entry stops the
// process: a mistyped cost would otherwise make a benchmark measure something else in silence.
struct CallCosts {
  std::array<std::int64_t, kCallKinds> ns{};
  bool any = false;
};
CallCosts parse_call_costs() {
  CallCosts c;
  const char* spec = std::getenv("FAKECUDA_CALL_COST_NS");
  if (spec == nullptr) return c;
  for (const char* p = spec; *p != '\0';) {
    const char* end = std::strchr(p, ',');
    if (end == nullptr) end = p + std::strlen(p);
    const char* eq = static_cast<const char*>(std::memchr(p, '=', static_cast<std::size_t>(end - p)));
    char* num_end = nullptr;
    const int k = eq != nullptr ? call_index(p, static_cast<std::size_t>(eq - p)) : -1;
    const long long ns = eq != nullptr ? std::strtoll(eq + 1, &num_end, 10) : -1;
    if (end != p && (k < 0 || num_end != end || ns < 0)) {
      std::fprintf(stderr, "fakecuda: FAKECUDA_CALL_COST_NS: bad entry '%.*s' (want NAME=NS, NAME one of:",
                   static_cast<int>(end - p), p);
      for (const char* n : kCallNames) std::fprintf(stderr, " %s", n);
      std::fprintf(stderr, ")\n");
      std::_Exit(2);
    }
    if (end != p) {
      c.ns[static_cast<std::size_t>(k)] = ns;
      c.any = c.any || ns > 0;
    }
    p = *end == ',' ? end + 1 : end;
  }
  return c;
}
const CallCosts& call_costs() {
  static const CallCosts c = parse_call_costs();
  return c;
}

// Per-thread counts (no shared cache line on a hot path), each thread's block registered at its
// first call and kept after the thread exits (a few hundred bytes a thread), so that a reader can
// sum them and no destructor runs while the thread may still call.
struct ThreadCalls {
  std::array<std::atomic<long>, kCallKinds> n{};
  std::atomic<long> charged_ns{0};  // time spent in the spins of FAKECUDA_CALL_COST_NS
  std::atomic<long> nominal_ns{0};  // what those spins were asked for
};
std::mutex calls_mu;
std::vector<ThreadCalls*>& call_blocks() {
  static auto* v = new std::vector<ThreadCalls*>;  // never destroyed: threads may outlive statics
  return *v;
}
thread_local ThreadCalls* tl_calls = nullptr;

void fake_call(Call c) {
  if (tl_calls == nullptr) {
    tl_calls = new ThreadCalls;
    std::lock_guard<std::mutex> l(calls_mu);
    call_blocks().push_back(tl_calls);
  }
  const auto k = static_cast<std::size_t>(c);
  std::atomic<long>& n = tl_calls->n[k];
  n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // only this thread writes
  const CallCosts& costs = call_costs();
  if (!costs.any || costs.ns[k] == 0) return;
  const auto start = std::chrono::steady_clock::now(), until = start + std::chrono::nanoseconds(costs.ns[k]);
  auto now = start;
  while (now < until) now = std::chrono::steady_clock::now();
  const long spent = static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count());
  tl_calls->charged_ns.store(tl_calls->charged_ns.load(std::memory_order_relaxed) + spent, std::memory_order_relaxed);
  tl_calls->nominal_ns.store(tl_calls->nominal_ns.load(std::memory_order_relaxed) + static_cast<long>(costs.ns[k]),
                             std::memory_order_relaxed);
}
}  // namespace
#define FAKE_CALL(name) fake_call(Call::name)

// Nanoseconds every thread spent in the spins of FAKECUDA_CALL_COST_NS since load: the host time
// the "driver" took, which a benchmark can take out of its own. `nominal` != 0: the sum of the
// costs asked for instead, which leaves out the time another process took the CPU mid-spin (and
// the spins' overshoot, a clock read or so each).
FAKE_API long fakecuda_charged_ns(int nominal) {
  std::lock_guard<std::mutex> l(calls_mu);
  long total = 0;
  for (const ThreadCalls* t : call_blocks())
    total += (nominal != 0 ? t->nominal_ns : t->charged_ns).load(std::memory_order_relaxed);
  return total;
}
// The name of counted function i (0, 1, ... in a fixed order), nullptr past the last one.
FAKE_API const char* fakecuda_call_name(int i) {
  return i >= 0 && static_cast<std::size_t>(i) < kCallKinds ? kCallNames[i] : nullptr;
}
// Calls of `name` (a FAKE_CALL_KINDS name) by every thread since load; -1 for a name not counted.
FAKE_API long fakecuda_calls(const char* name) {
  const int k = name != nullptr ? call_index(name, std::strlen(name)) : -1;
  if (k < 0) return -1;
  std::lock_guard<std::mutex> l(calls_mu);
  long total = 0;
  for (const ThreadCalls* t : call_blocks()) total += t->n[static_cast<std::size_t>(k)].load(std::memory_order_relaxed);
  return total;
}

namespace {

constexpr int kDevices = 2;
constexpr std::size_t kDefaultTotal = 1024ull << 20;
constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901;
constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906;

struct Context {
  int device;
  bool primary;
  bool alive;
  int refs;
  bool charged = false;   // its FAKECUDA_CONTEXT_MB are counted as device memory in use
  bool launched = false;  // its first launch added FAKECUDA_LAUNCH_MB
};

struct Stream {
  Context* ctx = nullptr;
  unsigned flags = 0;  // 0 = blocking, CU_STREAM_NON_BLOCKING
  bool legacy = false;
  bool per_thread = false;
  bool held = false;
  unsigned long hold_gen = 0;  // bumped when a hold ends
  bool capturing = false;
  int capture_mode = 0;
  bool invalidated = false;
  // cuStreamWaitEvent: work issued on this stream from then on also waits for these (stream,
  // hold_gen) pairs, the ones the event stood for when the wait was made.
  std::vector<std::pair<Stream*, unsigned long>> deps;
  long records = 0;  // successful cuEventRecord calls on it
  long waits = 0;    // successful cuStreamWaitEvent calls that made it wait
};

struct Event {
  std::vector<std::pair<Stream*, unsigned long>> waits;  // (stream, hold_gen at record)
};

struct Alloc {
  std::size_t size;
  Context* ctx;
  bool imported = false;  // opened with cuIpcOpenMemHandle: mapped from another process's file
  int refs = 0;           // imported: opens not yet closed
};

// The "device memory" of cuMemAlloc: one shared memory file per arena, mapped whole, carved
// first-fit in pages. An arena made by a parent process is never carved by a forked child.
struct Arena {
  int fd = -1;
  std::uintptr_t base = 0;
  std::size_t size = 0;
  pid_t pid = 0;
  std::map<std::size_t, std::size_t> free_runs;  // offset -> bytes
};
constexpr std::size_t kArenaBytes = std::size_t{64} << 30;
constexpr std::size_t kArenaPage = 4096;
std::vector<Arena*> arenas;

Arena* new_arena() {
  const int fd = static_cast<int>(memfd_create("fakecuda-device-memory", MFD_CLOEXEC));
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(kArenaBytes)) != 0) {
    close(fd);
    return nullptr;
  }
  void* m = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  auto* a = new Arena;
  a->fd = fd;
  a->base = reinterpret_cast<std::uintptr_t>(m);
  a->size = kArenaBytes;
  a->pid = getpid();
  a->free_runs[0] = kArenaBytes;
  arenas.push_back(a);
  return a;
}

Arena* arena_of(std::uintptr_t p) {
  for (Arena* a : arenas)
    if (p >= a->base && p < a->base + a->size) return a;
  return nullptr;
}

void* arena_alloc(std::size_t bytes) {
  const std::size_t n = (bytes + kArenaPage - 1) / kArenaPage * kArenaPage;
  const pid_t me = getpid();
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (Arena* a : arenas) {
      if (a->pid != me) continue;
      for (auto it = a->free_runs.begin(); it != a->free_runs.end(); ++it) {
        if (it->second < n) continue;
        const std::size_t off = it->first, len = it->second;
        a->free_runs.erase(it);
        if (len > n) a->free_runs[off + n] = len - n;
        return reinterpret_cast<void*>(a->base + off);
      }
    }
    if (new_arena() == nullptr) return nullptr;
  }
  return nullptr;
}

void arena_free(std::uintptr_t p, std::size_t bytes) {
  Arena* a = arena_of(p);
  if (a == nullptr || a->pid != getpid()) return;  // a parent's arena: not this process's to carve
  std::size_t off = p - a->base, n = (bytes + kArenaPage - 1) / kArenaPage * kArenaPage;
  fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off), static_cast<off_t>(n));
  auto next = a->free_runs.lower_bound(off);
  if (next != a->free_runs.end() && next->first == off + n) {
    n += next->second;
    next = a->free_runs.erase(next);
  }
  if (next != a->free_runs.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      n += prev->second;
      a->free_runs.erase(prev);
    }
  }
  a->free_runs[off] = n;
}

std::mutex mu;
// Page-locked host memory (cuMemHostAlloc, cuMemAllocHost): mmap'd pages, owned by the context
// current at allocation; destroying that context frees them, as the driver does.
struct HostAlloc {
  std::size_t size;
  Context* ctx;
  unsigned flags;
};
std::map<std::uintptr_t, HostAlloc> host_allocs;
long n_host_alloc = 0, n_host_free = 0, n_host_register = 0, n_host_unregister = 0;
Context primaries[kDevices] = {{0, true, false, 0}, {1, true, false, 0}};
std::map<std::uintptr_t, Alloc> allocs;
std::vector<Stream*> streams;  // every live stream, including per-thread ones
Stream legacy_stream;
thread_local Stream* tl_per_thread = nullptr;
thread_local std::vector<Context*> tl_ctx_stack;
thread_local Context* tl_current = nullptr;
bool initialised = false;
long n_alloc = 0, n_free = 0, n_graph = 0, n_records = 0, n_syncs = 0, n_trims = 0, n_stream_waits = 0;
long n_event_queries = 0;
long n_stream_queries = 0;
long n_capture_waits = 0;  // cuStreamWaitEvent on a capturing stream (the wait joins the graph)
long n_ctx_records = 0, n_ctx_waits = 0;
// cuCtxWaitEvent: work issued from then on, on any stream of the context (made before or after
// the call), also waits for these (stream, hold_gen) pairs.
std::map<const Context*, std::vector<std::pair<Stream*, unsigned long>>> ctx_deps;

std::size_t total_bytes() {
  const char* e = std::getenv("FAKECUDA_TOTAL_MB");
  return e != nullptr ? std::strtoull(e, nullptr, 10) << 20 : kDefaultTotal;
}

// FAKECUDA_MACHINE_FILE=path: device memory of every process using the fake, together, in a
// shared file (live bytes and their peak), as one GPU shared by several processes would see it.
struct MachineCounts {
  std::atomic<std::uint64_t> live;
  std::atomic<std::uint64_t> peak;
};
bool machine_gone = false;  // machine_exit ran: this process holds nothing any more
MachineCounts* machine() {
  static MachineCounts* m = []() -> MachineCounts* {
    const char* path = std::getenv("FAKECUDA_MACHINE_FILE");
    if (path == nullptr || *path == '\0') return nullptr;
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(MachineCounts)) != 0) return nullptr;
    void* a = mmap(nullptr, sizeof(MachineCounts), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return a == MAP_FAILED ? nullptr : static_cast<MachineCounts*>(a);
  }();
  return m;
}
void machine_add(std::size_t bytes) {
  if (MachineCounts* m = machine(); m != nullptr && !machine_gone) {
    const std::uint64_t now = m->live.fetch_add(bytes) + bytes;
    std::uint64_t p = m->peak.load();
    while (now > p && !m->peak.compare_exchange_weak(p, now)) {
    }
  }
}
void machine_sub(std::size_t bytes) {
  if (machine_gone) return;
  if (MachineCounts* m = machine()) m->live.fetch_sub(bytes);
}

// At process exit the driver frees what the process still holds (the machine's count drops).
void machine_exit();

// FAKECUDA_CONTEXT_MB=N: every live context holds N MiB of device memory of its own (the
// context, its modules and library workspaces on a real GPU: memory outside any allocation),
// shown by cuMemGetInfo and counted in the machine file.
std::size_t context_bytes() {
  static const std::size_t n = [] {
    const char* e = std::getenv("FAKECUDA_CONTEXT_MB");
    return e != nullptr ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) << 20 : std::size_t{0};
  }();
  return n;
}
// FAKECUDA_LAUNCH_MB=N: a context's first kernel launch adds N MiB to its memory (a real driver
// loads a module's code at its first launch, lazily: memory that appears after the process began).
std::size_t launch_bytes() {
  static const std::size_t n = [] {
    const char* e = std::getenv("FAKECUDA_LAUNCH_MB");
    return e != nullptr ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) << 20 : std::size_t{0};
  }();
  return n;
}
// What a charged context holds now.
std::size_t context_held(const Context* c) { return context_bytes() + (c->launched ? launch_bytes() : 0); }
std::vector<Context*> charged_contexts;
void charge_context(Context* c) {
  if (c->charged || context_bytes() == 0) return;
  c->charged = true;
  charged_contexts.push_back(c);
  machine_add(context_bytes());
}
void uncharge_context(Context* c) {
  if (!c->charged) return;
  c->charged = false;
  std::erase(charged_contexts, c);
  machine_sub(context_held(c));
}
// Under mu: the context's first launch.
void grow_on_launch(Context* c) {
  if (c == nullptr || c->launched || launch_bytes() == 0) return;
  if (!c->charged) {
    c->charged = true;
    charged_contexts.push_back(c);
    machine_add(context_bytes());
  }
  c->launched = true;
  machine_add(launch_bytes());
}

std::size_t vmm_used_on(int dev);  // physical VMM handles (below)
std::size_t used_on(int dev) {
  std::size_t u = vmm_used_on(dev);
  for (const Context* c : charged_contexts)
    if (c->device == dev) u += context_held(c);
  for (auto& [p, a] : allocs)
    if (a.ctx->device == dev && !a.imported) u += a.size;
  return u;
}

Stream* per_thread_stream() {
  if (tl_per_thread == nullptr) {
    tl_per_thread = new Stream;
    tl_per_thread->per_thread = true;
    streams.push_back(tl_per_thread);  // never removed: threads' streams outlive the tests
  }
  return tl_per_thread;
}

// `ptsz`: the call came through a _ptsz entry point (stream 0 = per-thread stream).
Stream* resolve(CUstream s, bool ptsz) {
  auto v = reinterpret_cast<std::uintptr_t>(s);
  if (v == 0) return ptsz ? per_thread_stream() : &legacy_stream;
  if (v == 1) return &legacy_stream;
  if (v == 2) return per_thread_stream();
  return reinterpret_cast<Stream*>(s);
}

bool global_capture_active() {
  for (Stream* s : streams)
    if (s->capturing && s->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL) return true;
  return false;
}

CUresult do_alloc(CUdeviceptr* dptr, std::size_t size) {
  if (dptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (tl_current == nullptr || !tl_current->alive) return CUDA_ERROR_INVALID_CONTEXT;
  if (used_on(tl_current->device) + size > total_bytes()) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = arena_alloc(size);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  allocs[reinterpret_cast<std::uintptr_t>(p)] = {size, tl_current};
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  ++n_alloc;
  machine_add(size);
  return CUDA_SUCCESS;
}

CUresult do_free(CUdeviceptr p) {
  auto it = allocs.find(static_cast<std::uintptr_t>(p));
  if (it == allocs.end() || it->second.imported) return CUDA_ERROR_INVALID_VALUE;
  arena_free(it->first, it->second.size);
  machine_sub(it->second.size);
  allocs.erase(it);
  ++n_free;
  return CUDA_SUCCESS;
}

const Alloc* containing(CUdeviceptr p, std::uintptr_t* base) {
  auto it = allocs.upper_bound(static_cast<std::uintptr_t>(p));
  if (it == allocs.begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.size) return nullptr;
  *base = it->first;
  return &it->second;
}

void destroy_context(Context* c) {
  ctx_deps.erase(c);
  for (auto it = allocs.begin(); it != allocs.end();) {
    if (it->second.ctx == c) {
      if (it->second.imported)
        munmap(reinterpret_cast<void*>(it->first), it->second.size);
      else {
        arena_free(it->first, it->second.size);
        machine_sub(it->second.size);
      }
      it = allocs.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = host_allocs.begin(); it != host_allocs.end();) {
    if (it->second.ctx == c) {
      munmap(reinterpret_cast<void*>(it->first), it->second.size);
      it = host_allocs.erase(it);
    } else {
      ++it;
    }
  }
  uncharge_context(c);
  c->alive = false;
  c->refs = 0;
  if (tl_current == c) tl_current = nullptr;
}

void end_hold(Stream* s) {
  if (!s->held) return;
  s->held = false;
  ++s->hold_gen;
}

bool event_done(const Event* e) {
  for (auto& [s, gen] : e->waits)
    if (s->held && s->hold_gen == gen) return false;
  return true;
}

bool pair_pending(const std::pair<Stream*, unsigned long>& p) { return p.first->held && p.first->hold_gen == p.second; }

// Each (stream, hold) pair once: a program that records and waits in a loop while a stream stays
// held would otherwise grow these lists by copies of themselves.
void unique_pairs(std::vector<std::pair<Stream*, unsigned long>>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// Everything work issued now on `s` would wait for: its own earlier work, what it was made to
// wait for (cuStreamWaitEvent), and the implicit order of the legacy stream (it waits for every
// blocking and per-thread stream; those wait for it).
std::vector<std::pair<Stream*, unsigned long>> waits_of(Stream* s) {
  std::vector<std::pair<Stream*, unsigned long>> out;
  auto add = [&](Stream* x) {
    if (x->held) out.push_back({x, x->hold_gen});
    for (auto& d : x->deps)
      if (pair_pending(d)) out.push_back(d);
  };
  add(s);
  // The legacy and per-thread streams belong to whichever context is current.
  const Context* c = s->ctx != nullptr ? s->ctx : tl_current;
  if (auto it = ctx_deps.find(c); it != ctx_deps.end())
    for (auto& d : it->second)
      if (pair_pending(d)) out.push_back(d);
  if (s->legacy) {
    for (Stream* o : streams)
      if (o->flags == 0 && o != s) add(o);
  } else if (s->flags == 0) {
    add(&legacy_stream);
  }
  unique_pairs(out);
  return out;
}

// An operation enqueued on the legacy stream runs after the work pending on every blocking and
// per-thread stream, and later legacy-stream work runs after that operation: the legacy stream
// keeps those dependencies (so blocking streams, which follow it, inherit them too).
void absorb_implicit(Stream* s) {
  if (!s->legacy) return;
  for (Stream* o : streams) {
    if (o->flags != 0 || o == s) continue;
    if (o->held) s->deps.push_back({o, o->hold_gen});
    for (auto& d : o->deps)
      if (pair_pending(d)) s->deps.push_back(d);
  }
  unique_pairs(s->deps);
}

CUresult record(CUevent ev, CUstream hs, bool ptsz) {
  FAKE_COUNT();
  FAKE_CALL(cuEventRecord);
  std::lock_guard<std::mutex> lock(mu);
  auto* e = reinterpret_cast<Event*>(ev);
  Stream* s = resolve(hs, ptsz);
  if (s->legacy) {
    // The legacy stream may not depend on a capturing blocking stream: the capture breaks.
    for (Stream* o : streams) {
      if (o->capturing && o->flags == 0 && !o->per_thread) {
        o->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      }
    }
  }
  absorb_implicit(s);
  e->waits = waits_of(s);
  ++n_records;
  ++s->records;
  return CUDA_SUCCESS;
}

}  // namespace

// ---- initialisation, devices, contexts --------------------------------------------------------
FAKE_API CUresult cuInit(unsigned) {
  std::lock_guard<std::mutex> lock(mu);
  // Exportable VMM handles are files here: allow as many as the hard limit does.
  rlimit rl{};
  if (!initialised && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  legacy_stream.legacy = true;
  initialised = true;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuDeviceGetCount(int* n) {
  *n = kDevices;
  return CUDA_SUCCESS;
}
// Every fake device can reach every other one (as GPUs on one NVLink switch can).
FAKE_API CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (can == nullptr || dev < 0 || dev >= kDevices || peer < 0 || peer >= kDevices) return CUDA_ERROR_INVALID_VALUE;
  *can = dev != peer ? 1 : 0;
  return CUDA_SUCCESS;
}
// Device d's UUID: 16 fixed bytes ending in the ordinal (FAKECUDA_UUID_SEED changes the rest, so
// tests can stand for different machines).
FAKE_API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  if (uuid == nullptr || dev < 0 || dev >= kDevices) return CUDA_ERROR_INVALID_VALUE;
  const char* seed = std::getenv("FAKECUDA_UUID_SEED");
  const unsigned char base = seed != nullptr ? static_cast<unsigned char>(std::atoi(seed)) : 0xa5;
  for (int i = 0; i < 16; ++i) uuid->bytes[i] = static_cast<char>(base + i);
  uuid->bytes[15] = static_cast<char>(dev);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }
FAKE_API CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= kDevices) return CUDA_ERROR_INVALID_VALUE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  std::lock_guard<std::mutex> lock(mu);
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || dev >= kDevices) return CUDA_ERROR_INVALID_VALUE;
  Context& c = primaries[dev];
  c.alive = true;  // same handle after a reset, as the real driver often gives
  charge_context(&c);
  ++c.refs;
  *pctx = reinterpret_cast<CUcontext>(&c);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  std::lock_guard<std::mutex> lock(mu);
  Context& c = primaries[dev];
  if (c.refs <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c.refs == 0) destroy_context(&c);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  std::lock_guard<std::mutex> lock(mu);
  destroy_context(&primaries[dev]);
  return CUDA_SUCCESS;
}
// A reset the shim cannot see (as through cudart's private tables): not an interposable symbol.
FAKE_API void fakecuda_reset_primary_unseen(CUdevice dev) {
  std::lock_guard<std::mutex> lock(mu);
  destroy_context(&primaries[dev]);
}
// The v1 entry points of the real driver have the same signatures and (here) the same effect.
FAKE_API CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }
FAKE_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
FAKE_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned* flags, int* active) {
  std::lock_guard<std::mutex> lock(mu);
  *flags = 0;
  *active = primaries[dev].alive ? 1 : 0;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKE_COUNT();
  FAKE_CALL(cuCtxSetCurrent);
  tl_current = reinterpret_cast<Context*>(ctx);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuCtxGetCurrent(CUcontext* ctx) {
  FAKE_COUNT();
  FAKE_CALL(cuCtxGetCurrent);
  *ctx = reinterpret_cast<CUcontext>(tl_current);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuCtxGetDevice(CUdevice* dev) {
  FAKE_COUNT();
  FAKE_CALL(cuCtxGetDevice);
  if (tl_current == nullptr || !tl_current->alive) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = tl_current->device;
  return CUDA_SUCCESS;
}
// Peer access from the current context to `peer` (the fake keeps no state: every device reaches
// every other one); counted, and refused like the driver's for a bad context or a repeat.
std::set<std::pair<Context*, Context*>> peer_enabled;
long peer_enables = 0;
FAKE_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
  FAKE_COUNT();
  std::lock_guard<std::mutex> lock(mu);
  auto* p = reinterpret_cast<Context*>(peer);
  if (tl_current == nullptr || !tl_current->alive) return CUDA_ERROR_INVALID_CONTEXT;
  if (p == nullptr || !p->alive || p->device == tl_current->device || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!peer_enabled.insert({tl_current, p}).second) return 704;  // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
  ++peer_enables;
  return CUDA_SUCCESS;
}
FAKE_COUNTER(fakecuda_peer_enables, peer_enables)
FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FAKE_COUNT();
  FAKE_CALL(cuCtxPushCurrent);
  tl_ctx_stack.push_back(tl_current);
  tl_current = reinterpret_cast<Context*>(ctx);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  FAKE_COUNT();
  FAKE_CALL(cuCtxPopCurrent);
  if (ctx != nullptr) *ctx = reinterpret_cast<CUcontext>(tl_current);
  if (tl_ctx_stack.empty()) {
    tl_current = nullptr;
  } else {
    tl_current = tl_ctx_stack.back();
    tl_ctx_stack.pop_back();
  }
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  std::lock_guard<std::mutex> lock(mu);
  destroy_context(reinterpret_cast<Context*>(ctx));
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }
static CUresult create_context(CUcontext* ctx, int dev) {
  std::lock_guard<std::mutex> lock(mu);
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx == nullptr || dev < 0 || dev >= kDevices) return CUDA_ERROR_INVALID_VALUE;
  auto* c = new Context{dev, false, true, 1};
  charge_context(c);
  tl_current = c;
  *ctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}
FAKE_API CUresult fakecuda_create_context(CUcontext* ctx, int dev) { return create_context(ctx, dev); }
// A new context on `dev`, current from now on (the flags are not modelled).
FAKE_API CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned, CUdevice dev) { return create_context(ctx, dev); }

// ---- memory ------------------------------------------------------------------------------------
FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t size) {
  FAKE_COUNT();
  FAKE_CALL(cuMemAlloc);
  std::lock_guard<std::mutex> lock(mu);
  if (global_capture_active()) {
    for (Stream* s : streams)
      if (s->capturing) s->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return do_alloc(dptr, size);
}
FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, std::size_t* pitch, std::size_t w, std::size_t h,
                                     unsigned elem) {
  if (elem != 4 && elem != 8 && elem != 16) return CUDA_ERROR_INVALID_VALUE;
  // Sizes that do not fit in size_t: out of memory, as for any impossible size.
  if (w == 0 || h == 0) return CUDA_ERROR_INVALID_VALUE;
  if (w > SIZE_MAX - 511 || h > SIZE_MAX / ((w + 511) / 512 * 512)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(mu);
  *pitch = (w + 511) / 512 * 512;
  return do_alloc(dptr, *pitch * h);
}
FAKE_API CUresult cuMemAllocManaged(CUdeviceptr* dptr, std::size_t size, unsigned) {
  std::lock_guard<std::mutex> lock(mu);
  return do_alloc(dptr, size);
}
FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) {
  FAKE_COUNT();
  FAKE_CALL(cuMemFree);
  std::lock_guard<std::mutex> lock(mu);
  if (p == 0) return CUDA_SUCCESS;
  return do_free(p);
}
static CUresult alloc_async(CUdeviceptr* dptr, std::size_t size, CUstream hs, bool ptsz) {
  FAKE_COUNT();
  FAKE_CALL(cuMemAllocAsync);
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = resolve(hs, ptsz);
  CUresult r = do_alloc(dptr, size);
  if (r == CUDA_SUCCESS && s->capturing) ++n_graph;
  return r;
}
FAKE_API CUresult cuMemAllocAsync(CUdeviceptr* d, std::size_t n, CUstream s) { return alloc_async(d, n, s, false); }
FAKE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr* d, std::size_t n, CUstream s) { return alloc_async(d, n, s, true); }
FAKE_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream) {
  FAKE_COUNT();
  FAKE_CALL(cuMemFreeAsync);
  std::lock_guard<std::mutex> lock(mu);
  return do_free(p);
}
FAKE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream) {
  FAKE_COUNT();
  FAKE_CALL(cuMemFreeAsync);
  std::lock_guard<std::mutex> lock(mu);
  return do_free(p);
}
// FAKECUDA_TRUNCATE_MAPPED=PATH: the first cuMemGetInfo_v2 made while PATH is mapped into this
// process truncates it to 0 bytes, as another process of the user could at the worst moment (a
// group member measures the device under the ledger's lock while it joins).
static void truncate_if_mapped() {
  static const char* path = std::getenv("FAKECUDA_TRUNCATE_MAPPED");
  static std::atomic<bool> done{false};
  if (path == nullptr || *path == '\0' || done.load()) return;
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return;
  char line[4096];
  bool mapped = false;
  const std::size_t n = std::strlen(path);
  while (!mapped && std::fgets(line, sizeof line, maps) != nullptr) {
    const char* at = std::strstr(line, path);
    mapped = at != nullptr && (at[n] == '\n' || at[n] == '\0');
  }
  std::fclose(maps);
  if (mapped && !done.exchange(true)) {
    if (::truncate(path, 0) == 0) std::fprintf(stderr, "fakecuda: truncated %s while it was mapped\n", path);
  }
}

FAKE_API CUresult cuMemGetInfo_v2(std::size_t* free_bytes, std::size_t* total) {
  FAKE_COUNT();
  FAKE_CALL(cuMemGetInfo);
  truncate_if_mapped();
  std::lock_guard<std::mutex> lock(mu);
  if (tl_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const std::size_t t = total_bytes();
  // With a machine file the device is shared: free is what no process holds, as on a GPU.
  std::size_t used = used_on(tl_current->device);
  if (MachineCounts* m = machine(); m != nullptr && !machine_gone) used = std::max<std::size_t>(used, m->live.load());
  if (free_bytes != nullptr) *free_bytes = t - std::min(used, t);
  if (total != nullptr) *total = t;
  return CUDA_SUCCESS;
}
// CUDA 3.1's form: 32-bit figures, saturated here at 4 GiB - 1.
FAKE_API CUresult cuMemGetInfo(unsigned* free_bytes, unsigned* total) {
  FAKE_COUNT();
  FAKE_CALL(cuMemGetInfo);
  std::lock_guard<std::mutex> lock(mu);
  if (tl_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const std::size_t t = total_bytes(), f = t - used_on(tl_current->device);
  if (free_bytes != nullptr) *free_bytes = static_cast<unsigned>(std::min<std::size_t>(f, UINT_MAX));
  if (total != nullptr) *total = static_cast<unsigned>(std::min<std::size_t>(t, UINT_MAX));
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, std::size_t* psize, CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(mu);
  std::uintptr_t base = 0;
  const Alloc* a = containing(p, &base);
  if (a == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = base;
  if (psize != nullptr) *psize = a->size;
  return CUDA_SUCCESS;
}
static bool vmm_attribute(void* data, CUpointer_attribute attr, CUdeviceptr p, CUresult* r);
static CUresult attribute(void* data, CUpointer_attribute attr, CUdeviceptr p) {
  std::uintptr_t base = 0;
  const Alloc* a = containing(p, &base);
  if (CUresult r = CUDA_SUCCESS; a == nullptr && vmm_attribute(data, attr, p, &r)) return r;
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(a->ctx); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = p; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = a->ctx->device; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *static_cast<int*>(data) = 1; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<std::size_t*>(data) = a->size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<int*>(data) = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr p) {
  FAKE_COUNT();
  FAKE_CALL(cuPointerGetAttribute);
  std::lock_guard<std::mutex> lock(mu);
  return attribute(data, attr, p);
}
FAKE_API CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute* attrs, void** data, CUdeviceptr p) {
  FAKE_COUNT();
  FAKE_CALL(cuPointerGetAttributes);
  std::lock_guard<std::mutex> lock(mu);
  for (unsigned i = 0; i < n; ++i) {
    CUresult r = attribute(data[i], attrs[i], p);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}
// A legacy IPC handle of the fake: where the allocation lies in its process's arena file.
namespace {
struct FakeIpcHandle {
  char magic[8];
  std::uint32_t pid;
  std::int32_t fd;
  std::uint64_t offset;
  std::uint64_t size;
};
constexpr char kFakeIpcMagic[8] = {'F', 'A', 'K', 'E', 'I', 'P', 'C', '1'};
long n_ipc_opens = 0;                              // cuIpcOpenMemHandle calls that mapped memory (first opens)
std::map<std::string, std::uintptr_t> ipc_opened;  // exporter's pid/fd/offset -> mapping here
}  // namespace
FAKE_API CUresult cuIpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(mu);
  std::uintptr_t base = 0;
  const Alloc* a = containing(p, &base);
  if (a == nullptr || a->imported) return CUDA_ERROR_INVALID_VALUE;
  const Arena* ar = arena_of(base);
  if (ar == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Like the real driver: an interior pointer yields the handle of the whole allocation.
  FakeIpcHandle f{};
  std::memcpy(f.magic, kFakeIpcMagic, sizeof f.magic);
  f.pid = static_cast<std::uint32_t>(ar->pid);
  f.fd = ar->fd;
  f.offset = base - ar->base;
  f.size = a->size;
  static_assert(sizeof f <= sizeof h->reserved);
  std::memset(h, 0, sizeof *h);
  std::memcpy(h->reserved, &f, sizeof f);
  return CUDA_SUCCESS;
}
static CUresult ipc_open(CUdeviceptr* out, CUipcMemHandle h, unsigned) {
  std::lock_guard<std::mutex> lock(mu);
  FakeIpcHandle f{};
  std::memcpy(&f, h.reserved, sizeof f);
  if (out == nullptr || std::memcmp(f.magic, kFakeIpcMagic, sizeof f.magic) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (tl_current == nullptr || !tl_current->alive) return CUDA_ERROR_INVALID_CONTEXT;
  if (f.pid == static_cast<std::uint32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  // The same allocation opened again in this context: the same pointer, counted.
  const std::string key = std::to_string(f.pid) + "/" + std::to_string(f.fd) + "/" + std::to_string(f.offset);
  if (auto it = ipc_opened.find(key); it != ipc_opened.end()) {
    auto a = allocs.find(it->second);
    if (a != allocs.end() && a->second.ctx == tl_current) {
      ++a->second.refs;
      *out = it->second;
      return CUDA_SUCCESS;
    }
  }
  const std::string path = "/proc/" + std::to_string(f.pid) + "/fd/" + std::to_string(f.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporter is gone
  void* m = mmap(nullptr, f.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(f.offset));
  close(fd);
  if (m == MAP_FAILED) return CUDA_ERROR_INVALID_HANDLE;
  const auto p = reinterpret_cast<std::uintptr_t>(m);
  allocs[p] = Alloc{f.size, tl_current, true, 1};
  ipc_opened[key] = p;
  ++n_ipc_opens;
  *out = p;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* out, CUipcMemHandle h, unsigned flags) {
  return ipc_open(out, h, flags);
}
FAKE_API CUresult cuIpcOpenMemHandle(CUdeviceptr* out, CUipcMemHandle h, unsigned flags) {
  return ipc_open(out, h, flags);
}
FAKE_API CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocs.find(static_cast<std::uintptr_t>(p));
  if (it == allocs.end() || !it->second.imported) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs > 0) return CUDA_SUCCESS;
  munmap(reinterpret_cast<void*>(it->first), it->second.size);
  std::erase_if(ipc_opened, [&](const auto& kv) { return kv.second == it->first; });
  allocs.erase(it);
  return CUDA_SUCCESS;
}
FAKE_COUNTER(fakecuda_ipc_opens, n_ipc_opens)
FAKE_API long fakecuda_ipc_mapped() {
  std::lock_guard<std::mutex> l(mu);
  long n = 0;
  for (auto& [p, a] : allocs) n += a.imported ? 1 : 0;
  return n;
}
FAKE_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  *pool = reinterpret_cast<CUmemoryPool>(static_cast<std::uintptr_t>(0x1000 + 16 * dev));
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemPoolTrimTo(CUmemoryPool, std::size_t) {
  std::lock_guard<std::mutex> lock(mu);
  ++n_trims;
  return CUDA_SUCCESS;
}

// ---- page-locked host memory -------------------------------------------------------------------
static CUresult host_alloc(void** pp, std::size_t size, unsigned flags) {
  FAKE_COUNT();
  FAKE_CALL(cuMemHostAlloc);
  if (pp == nullptr || size == 0 || (flags & ~7u) != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu);
  if (tl_current == nullptr || !tl_current->alive) return CUDA_ERROR_INVALID_CONTEXT;
  void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  host_allocs[reinterpret_cast<std::uintptr_t>(m)] = {size, tl_current, flags};
  ++n_host_alloc;
  *pp = m;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemHostAlloc(void** pp, std::size_t size, unsigned flags) { return host_alloc(pp, size, flags); }
FAKE_API CUresult cuMemAllocHost_v2(void** pp, std::size_t size) { return host_alloc(pp, size, 0); }
FAKE_API CUresult cuMemAllocHost(void** pp, unsigned size) { return host_alloc(pp, size, 0); }
// Pinned memory the shim cannot see being made (as a library's private driver table would).
FAKE_API CUresult fakecuda_host_alloc_unseen(void** pp, std::size_t size) { return host_alloc(pp, size, 0); }
FAKE_API CUresult cuMemFreeHost(void* p) {
  FAKE_COUNT();
  FAKE_CALL(cuMemFreeHost);
  std::lock_guard<std::mutex> lock(mu);
  auto it = host_allocs.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == host_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.size);
  host_allocs.erase(it);
  ++n_host_free;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemHostGetFlags(unsigned* flags, void* p) {
  std::lock_guard<std::mutex> lock(mu);
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  auto it = host_allocs.upper_bound(q);
  if (flags == nullptr || it == host_allocs.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (q >= it->first + it->second.size) return CUDA_ERROR_INVALID_VALUE;
  *flags = it->second.flags;
  return CUDA_SUCCESS;
}
// Registration of the program's own memory: counted; nothing else is modelled.
FAKE_API CUresult cuMemHostRegister_v2(void* p, std::size_t size, unsigned) {
  std::lock_guard<std::mutex> lock(mu);
  if (p == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  ++n_host_register;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemHostUnregister(void* p) {
  std::lock_guard<std::mutex> lock(mu);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ++n_host_unregister;
  return CUDA_SUCCESS;
}
FAKE_COUNTER(fakecuda_host_alloc_calls, n_host_alloc)
FAKE_COUNTER(fakecuda_host_free_calls, n_host_free)
FAKE_COUNTER(fakecuda_host_register_calls, n_host_register)
FAKE_COUNTER(fakecuda_host_unregister_calls, n_host_unregister)
FAKE_API std::size_t fakecuda_host_live_bytes() {
  std::lock_guard<std::mutex> l(mu);
  std::size_t n = 0;
  for (auto& [p, a] : host_allocs) n += a.size;
  return n;
}
FAKE_API int fakecuda_host_is_live(const void* p) {
  std::lock_guard<std::mutex> l(mu);
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  auto it = host_allocs.upper_bound(q);
  if (it == host_allocs.begin()) return 0;
  --it;
  return q < it->first + it->second.size ? 1 : 0;
}

// ---- VMM (for expandable segments) ---------------------------------------------------------------
// Address space from mmap(PROT_NONE); a "physical" handle is bookkeeping (its bytes count as used
// device memory until released); cuMemMap makes its range read/write, cuMemUnmap drops the pages
// and makes it PROT_NONE again. Rules the real driver enforces and the tests rely on: sizes and
// addresses are multiples of the granularity, a map lies inside a reservation and over nothing
// mapped, an unmap covers whole mappings, set-access covers mapped memory only. Violations return
// CUDA_ERROR_INVALID_VALUE and are counted (fakecuda_vmm_bad_calls).
namespace {
struct VmmHandle {
  std::size_t size;
  int device;
  int maps;
  int fd = -1;            // created exportable (a shared memory file), or imported from one
  bool imported = false;  // cuMemImportFromShareableHandle: another process's memory
};
struct VmmMapping {
  std::size_t size;
  unsigned long long handle;
  unsigned access = 0;  // bit d: device d may read and write (cuMemSetAccess)
};
std::map<std::uintptr_t, std::size_t> vmm_ranges;     // reservations
std::map<unsigned long long, VmmHandle> vmm_handles;  // live physical handles
std::map<std::uintptr_t, VmmMapping> vmm_maps;        // live mappings
unsigned long long vmm_next_handle = 1;
long vmm_create_calls = 0;  // successful cuMemCreate calls (handles ever made)
long vmm_bad = 0, vmm_map_calls = 0, vmm_unmap_calls = 0, vmm_access_calls = 0, vmm_peer_descs = 0;

std::size_t vmm_granularity() {
  const char* e = std::getenv("FAKECUDA_VMM_GRANULARITY_KB");
  return e != nullptr ? std::strtoull(e, nullptr, 10) << 10 : (4u << 20);
}
CUresult vmm_bad_call() {
  ++vmm_bad;
  return CUDA_ERROR_INVALID_VALUE;
}
bool vmm_in_range(std::uintptr_t p, std::size_t size) {
  auto it = vmm_ranges.upper_bound(p);
  if (it == vmm_ranges.begin()) return false;
  --it;
  return p >= it->first && p + size <= it->first + it->second;
}
bool vmm_overlaps_mapping(std::uintptr_t p, std::size_t size) {
  auto it = vmm_maps.lower_bound(p);
  if (it != vmm_maps.end() && it->first < p + size) return true;
  if (it == vmm_maps.begin()) return false;
  --it;
  return it->first + it->second.size > p;
}
// The mapping that holds address p, or vmm_maps.end(). Called with mu held.
std::map<std::uintptr_t, VmmMapping>::iterator vmm_mapping_at(std::uintptr_t p) {
  auto it = vmm_maps.upper_bound(p);
  if (it == vmm_maps.begin()) return vmm_maps.end();
  --it;
  return p < it->first + it->second.size ? it : vmm_maps.end();
}
// Whether every byte of [p, p+size) is mapped. Called with mu held.
bool vmm_all_mapped(std::uintptr_t p, std::size_t size) {
  for (std::uintptr_t q = p; q < p + size;) {
    auto it = vmm_mapping_at(q);
    if (it == vmm_maps.end()) return false;
    q = it->first + it->second.size;
  }
  return true;
}
std::size_t vmm_used_on(int dev) {
  std::size_t u = 0;
  for (auto& [h, v] : vmm_handles)
    if (v.device == dev && !v.imported) u += v.size;
  return u;
}

void machine_exit() {
  if (machine() == nullptr || machine_gone) return;
  std::lock_guard<std::mutex> lock(mu);
  std::size_t held = 0;
  for (auto& [p, a] : allocs)
    if (!a.imported) held += a.size;
  for (int d = 0; d < kDevices; ++d) held += vmm_used_on(d);
  for (const Context* c : charged_contexts) held += context_held(c);
  machine_sub(held);
  machine_gone = true;
}
__attribute__((destructor)) void on_unload() { machine_exit(); }
}  // namespace

// ---- kernels and copies ------------------------------------------------------------------------
// One test kernel (fakecuda_test_kernel()'s handle) runs for real, in launch order, on the fake's
// one worker thread, as a GPU runs work after the launch returned: it reads and writes the memory
// its arguments point to, so a launch against a page that is not mapped faults (SIGSEGV) as a
// GPU's illegal address would. Its arguments (kernelParams): CUdeviceptr of 32-bit words, their
// count (std::size_t), the value each must hold (std::uint32_t); it counts the words that differ
// (fakecuda_kernel_mismatches) and adds one to each. cuCtxSynchronize and the copies and sets
// below wait for the queued kernels first. At most 16 wait: a launch past that blocks.
namespace {
struct KernelQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
  bool busy = false;
  bool started = false;
  long done = 0;
  long mismatches = 0;
};
KernelQueue& kq() {
  static auto* q = new KernelQueue;  // never destroyed: the worker outlives statics
  return *q;
}
void kernel_worker() {
  KernelQueue& q = kq();
  std::unique_lock<std::mutex> l(q.mu);
  for (;;) {
    q.cv.wait(l, [&] { return !q.jobs.empty(); });
    std::function<void()> job = std::move(q.jobs.front());
    q.jobs.pop_front();
    q.busy = true;
    l.unlock();
    job();
    l.lock();
    q.busy = false;
    ++q.done;
    q.cv.notify_all();
  }
}
void kernel_enqueue(std::function<void()> job) {
  KernelQueue& q = kq();
  std::unique_lock<std::mutex> l(q.mu);
  q.cv.wait(l, [&] { return q.jobs.size() < 16; });  // a full launch queue blocks, as a GPU's does
  if (!q.started) {
    std::thread(kernel_worker).detach();
    q.started = true;
  }
  q.jobs.push_back(std::move(job));
  q.cv.notify_all();
}
void kernels_drain() {
  KernelQueue& q = kq();
  std::unique_lock<std::mutex> l(q.mu);
  q.cv.wait(l, [&] { return q.jobs.empty() && !q.busy; });
}
CUfunction test_kernel_handle() { return reinterpret_cast<CUfunction>(std::uintptr_t{0xC0DE0001}); }
CUresult launch(CUfunction f, void** params) {
  FAKE_COUNT();
  if (launch_bytes() != 0) {
    std::lock_guard<std::mutex> lock(mu);
    grow_on_launch(tl_current);
  }
  if (f != test_kernel_handle()) return CUDA_SUCCESS;  // any other kernel does nothing
  if (params == nullptr || params[0] == nullptr || params[1] == nullptr || params[2] == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  const CUdeviceptr p = *static_cast<CUdeviceptr*>(params[0]);
  const std::size_t n = *static_cast<std::size_t*>(params[1]);
  const std::uint32_t want = *static_cast<std::uint32_t*>(params[2]);
  kernel_enqueue([p, n, want] {
    auto* w = reinterpret_cast<std::uint32_t*>(static_cast<std::uintptr_t>(p));
    long bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (w[i] != want + static_cast<std::uint32_t>(i)) ++bad;
      w[i] = want + static_cast<std::uint32_t>(i) + 1;
    }
    std::lock_guard<std::mutex> l(kq().mu);
    kq().mismatches += bad;
  });
  return CUDA_SUCCESS;
}
CUresult copy_bytes(void* dst, const void* src, std::size_t n) {
  FAKE_COUNT();
  kernels_drain();
  if (n != 0 && (dst == nullptr || src == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (n != 0) std::memmove(dst, src, n);
  return CUDA_SUCCESS;
}
void* as_host(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }
CUresult set_bytes(CUdeviceptr p, const void* value, std::size_t width, std::size_t n) {
  FAKE_COUNT();
  kernels_drain();
  if (n != 0 && p == 0) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < n; ++i) std::memcpy(static_cast<char*>(as_host(p)) + i * width, value, width);
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_API CUfunction fakecuda_test_kernel() { return test_kernel_handle(); }
FAKE_API long fakecuda_kernel_mismatches() {
  std::lock_guard<std::mutex> l(kq().mu);
  return kq().mismatches;
}
FAKE_API long fakecuda_kernels_done() {
  std::lock_guard<std::mutex> l(kq().mu);
  return kq().done;
}
FAKE_API CUresult cuLaunchKernel(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 CUstream, void** params, void**) {
  return launch(f, params);
}
FAKE_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, CUstream, void** params, void**) {
  return launch(f, params);
}
FAKE_API CUresult cuGraphLaunch(CUgraphExec, CUstream) { return CUDA_SUCCESS; }
FAKE_API CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream) { return CUDA_SUCCESS; }
FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* h, std::size_t n) { return copy_bytes(as_host(d), h, n); }
FAKE_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void* h, std::size_t n) {
  return copy_bytes(as_host(d), h, n);
}
FAKE_API CUresult cuMemcpyDtoH_v2(void* h, CUdeviceptr d, std::size_t n) { return copy_bytes(h, as_host(d), n); }
FAKE_API CUresult cuMemcpyDtoH_v2_ptds(void* h, CUdeviceptr d, std::size_t n) { return copy_bytes(h, as_host(d), n); }
FAKE_API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, std::size_t n) {
  return copy_bytes(as_host(d), as_host(s), n);
}
FAKE_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, std::size_t n) {
  return copy_bytes(as_host(d), as_host(s), n);
}
FAKE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, std::size_t n, CUstream) {
  return copy_bytes(as_host(d), h, n);
}
FAKE_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void* h, std::size_t n, CUstream) {
  return copy_bytes(as_host(d), h, n);
}
FAKE_API CUresult cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, std::size_t n, CUstream) {
  return copy_bytes(h, as_host(d), n);
}
FAKE_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void* h, CUdeviceptr d, std::size_t n, CUstream) {
  return copy_bytes(h, as_host(d), n);
}
FAKE_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, std::size_t n, CUstream) {
  return copy_bytes(as_host(d), as_host(s), n);
}
FAKE_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, std::size_t n, CUstream) {
  return copy_bytes(as_host(d), as_host(s), n);
}
FAKE_API CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, std::size_t n) {
  return copy_bytes(as_host(d), as_host(s), n);
}
FAKE_API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, std::size_t n, CUstream) {
  return copy_bytes(as_host(d), as_host(s), n);
}
FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, std::size_t n) { return set_bytes(d, &v, 1, n); }
FAKE_API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, std::size_t n, CUstream) {
  return set_bytes(d, &v, 1, n);
}
FAKE_API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, std::size_t n) { return set_bytes(d, &v, 4, n); }

// Queued test kernels finish first; then, as before, a context-wide sync only counts.
long n_ctx_syncs = 0;
FAKE_API CUresult cuCtxSynchronize() {
  FAKE_CALL(cuCtxSynchronize);
  kernels_drain();
  std::lock_guard<std::mutex> lock(mu);
  if (tl_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  ++n_ctx_syncs;
  return CUDA_SUCCESS;
}
FAKE_COUNTER(fakecuda_ctx_syncs, n_ctx_syncs)
FAKE_API CUresult cuMemGetAllocationGranularity(std::size_t* g, const CUmemAllocationProp* prop, int option) {
  std::lock_guard<std::mutex> lock(mu);
  if (g == nullptr || prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 || prop->location.id >= kDevices ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return vmm_bad_call();
  *g = vmm_granularity();
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemAddressReserve(CUdeviceptr* p, std::size_t size, std::size_t, CUdeviceptr, unsigned long long) {
  FAKE_CALL(cuMemAddressReserve);
  std::lock_guard<std::mutex> lock(mu);
  const std::size_t g = vmm_granularity();
  if (size == 0 || size % g != 0) return vmm_bad_call();
  // Over-reserve to hand out a granularity-aligned base, then trim the slack.
  void* m = mmap(nullptr, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto raw = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t base = (raw + g - 1) / g * g;
  if (base > raw) munmap(m, base - raw);
  if (base + size < raw + size + g) munmap(reinterpret_cast<void*>(base + size), raw + size + g - (base + size));
  vmm_ranges[base] = size;
  *p = base;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemAddressFree(CUdeviceptr p, std::size_t size) {
  FAKE_CALL(cuMemAddressFree);
  std::lock_guard<std::mutex> lock(mu);
  auto it = vmm_ranges.find(p);
  if (it == vmm_ranges.end() || it->second != size || vmm_overlaps_mapping(p, size)) return vmm_bad_call();
  munmap(reinterpret_cast<void*>(p), size);
  vmm_ranges.erase(it);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemCreate(unsigned long long* handle, std::size_t size, const CUmemAllocationProp* prop,
                              unsigned long long) {
  FAKE_CALL(cuMemCreate);
  std::lock_guard<std::mutex> lock(mu);
  if (prop == nullptr || size == 0 || size % vmm_granularity() != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 || prop->location.id >= kDevices)
    return vmm_bad_call();
  if (used_on(prop->location.id) + size > total_bytes()) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = -1;
  if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
    // FAKECUDA_VMM_NO_EXPORT=1: a driver (container) that refuses exportable memory.
    if (std::getenv("FAKECUDA_VMM_NO_EXPORT") != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    fd = static_cast<int>(memfd_create("fakecuda-vmm-handle", MFD_CLOEXEC));
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
      if (fd >= 0) close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  *handle = vmm_next_handle++;
  ++vmm_create_calls;
  vmm_handles[*handle] = VmmHandle{size, prop->location.id, 0, fd, false};
  machine_add(size);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemRelease(unsigned long long handle) {
  FAKE_CALL(cuMemRelease);
  std::lock_guard<std::mutex> lock(mu);
  // The real driver frees the memory once the handle is released and its last mapping is gone;
  // the fake counts it gone at release (the shim always unmaps first).
  auto it = vmm_handles.find(handle);
  if (it == vmm_handles.end()) return vmm_bad_call();
  if (it->second.fd >= 0) close(it->second.fd);  // mappings keep the file's pages
  if (!it->second.imported) machine_sub(it->second.size);
  vmm_handles.erase(it);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemMap(CUdeviceptr p, std::size_t size, std::size_t offset, unsigned long long handle,
                           unsigned long long) {
  FAKE_CALL(cuMemMap);
  std::lock_guard<std::mutex> lock(mu);
  ++vmm_map_calls;
  auto h = vmm_handles.find(handle);
  const std::size_t g = vmm_granularity();
  if (h == vmm_handles.end() || size == 0 || p % g != 0 || size % g != 0 || offset + size > h->second.size ||
      !vmm_in_range(p, size) || vmm_overlaps_mapping(p, size))
    return vmm_bad_call();
  if (h->second.fd >= 0) {
    // A shared memory file: every process that maps it sees the same bytes.
    if (mmap(reinterpret_cast<void*>(p), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, h->second.fd,
             static_cast<off_t>(offset)) == MAP_FAILED)
      return vmm_bad_call();
  } else if (mprotect(reinterpret_cast<void*>(p), size, PROT_READ | PROT_WRITE) != 0) {
    return vmm_bad_call();
  }
  ++h->second.maps;
  vmm_maps[p] = VmmMapping{size, handle};
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemSetAccess(CUdeviceptr p, std::size_t size, const CUmemAccessDesc* desc, std::size_t count) {
  FAKE_CALL(cuMemSetAccess);
  std::lock_guard<std::mutex> lock(mu);
  ++vmm_access_calls;
  if (desc == nullptr || count == 0) return vmm_bad_call();
  if (!vmm_all_mapped(p, size)) return vmm_bad_call();
  unsigned mask = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
        desc[i].location.id >= kDevices || desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return vmm_bad_call();
    mask |= 1u << desc[i].location.id;
  }
  // Every mapping from the one holding p (checked above) to the end of the range.
  for (auto it = std::prev(vmm_maps.upper_bound(p)); it != vmm_maps.end() && it->first < p + size; ++it)
    it->second.access = mask;
  vmm_peer_descs += static_cast<long>(count) - 1;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemUnmap(CUdeviceptr p, std::size_t size) {
  FAKE_CALL(cuMemUnmap);
  std::lock_guard<std::mutex> lock(mu);
  ++vmm_unmap_calls;
  // Whole mappings only, and [p, p+size) must be covered without gaps.
  std::uintptr_t q = p;
  auto it = vmm_maps.find(p);
  while (q < p + size) {
    if (it == vmm_maps.end() || it->first != q || q + it->second.size > p + size) return vmm_bad_call();
    q += it->second.size;
    ++it;
  }
  for (auto m = vmm_maps.find(p); m != vmm_maps.end() && m->first < p + size;) {
    auto h = vmm_handles.find(m->second.handle);
    if (h != vmm_handles.end()) --h->second.maps;
    m = vmm_maps.erase(m);
  }
  // Back to reserved, inaccessible address space (a file mapping is replaced, a private one dropped).
  mmap(reinterpret_cast<void*>(p), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return CUDA_SUCCESS;
}
// Shareable handles: the file descriptor of an exportable handle, and a handle made from one.
FAKE_API CUresult cuMemExportToShareableHandle(void* shareable, unsigned long long handle, int type,
                                               unsigned long long) {
  std::lock_guard<std::mutex> lock(mu);
  auto h = vmm_handles.find(handle);
  if (shareable == nullptr || h == vmm_handles.end()) return vmm_bad_call();
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || h->second.fd < 0) return CUDA_ERROR_NOT_PERMITTED;
  const int fd = fcntl(h->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}
// The handle mapped at an address (the real driver counts a reference the caller releases; the
// fake does not), and a dma-buf of a mapped range (a descriptor of /dev/null: nothing reads it).
FAKE_API CUresult cuMemRetainAllocationHandle(unsigned long long* handle, void* addr) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = vmm_mapping_at(reinterpret_cast<std::uintptr_t>(addr));
  if (handle == nullptr || it == vmm_maps.end()) return CUDA_ERROR_INVALID_VALUE;
  *handle = it->second.handle;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr p, std::size_t size, int type,
                                                unsigned long long) {
  std::lock_guard<std::mutex> lock(mu);
  if (handle == nullptr || size == 0 || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || !vmm_all_mapped(p, size))
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(handle) = fd;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemImportFromShareableHandle(unsigned long long* handle, void* os_handle, int type) {
  std::lock_guard<std::mutex> lock(mu);
  if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return vmm_bad_call();
  if (tl_current == nullptr || !tl_current->alive) return CUDA_ERROR_INVALID_CONTEXT;
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
  const off_t size = lseek(fd, 0, SEEK_END);
  if (size <= 0 || static_cast<std::size_t>(size) % vmm_granularity() != 0) return CUDA_ERROR_INVALID_VALUE;
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *handle = vmm_next_handle++;
  vmm_handles[*handle] = VmmHandle{static_cast<std::size_t>(size), tl_current->device, 0, own, true};
  return CUDA_SUCCESS;
}
FAKE_API std::size_t fakecuda_vmm_mapped_bytes() {
  std::lock_guard<std::mutex> lock(mu);
  std::size_t n = 0;
  for (auto& [p, m] : vmm_maps) n += m.size;
  return n;
}
FAKE_COUNTER(fakecuda_vmm_live_handles, vmm_handles.size())
FAKE_API std::size_t fakecuda_vmm_handle_bytes() {
  std::lock_guard<std::mutex> lock(mu);
  std::size_t n = 0;
  for (auto& [h, v] : vmm_handles) n += v.size;
  return n;
}
FAKE_API std::size_t fakecuda_vmm_reserved_bytes() {
  std::lock_guard<std::mutex> lock(mu);
  std::size_t n = 0;
  for (auto& [p, sz] : vmm_ranges) n += sz;
  return n;
}
FAKE_COUNTER(fakecuda_vmm_ranges, vmm_ranges.size())
FAKE_API std::size_t fakecuda_vmm_granularity() { return vmm_granularity(); }
FAKE_COUNTER(fakecuda_vmm_bad_calls, vmm_bad)
FAKE_COUNTER(fakecuda_vmm_create_calls, vmm_create_calls)
FAKE_COUNTER(fakecuda_vmm_map_calls, vmm_map_calls)
FAKE_COUNTER(fakecuda_vmm_unmap_calls, vmm_unmap_calls)
FAKE_COUNTER(fakecuda_vmm_peer_descs, vmm_peer_descs)
FAKE_COUNTER(fakecuda_vmm_access_calls, vmm_access_calls)
// Attributes of an address in a live mapping (cuMemCreate memory), as the driver answers them:
// the handle's device, no context and no legacy IPC, the mapping as the range. False when p is
// not mapped. Called with mu held.
static bool vmm_attribute(void* data, CUpointer_attribute attr, CUdeviceptr p, CUresult* r) {
  auto it = vmm_mapping_at(p);
  if (it == vmm_maps.end()) return false;
  auto h = vmm_handles.find(it->second.handle);
  if (h == vmm_handles.end()) return false;
  *r = CUDA_SUCCESS;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = nullptr; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = p; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = h->second.device; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *static_cast<int*>(data) = 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = it->first; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<std::size_t*>(data) = it->second.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<int*>(data) = 1; break;
    default: *r = CUDA_ERROR_INVALID_VALUE;
  }
  return true;
}
FAKE_API int fakecuda_vmm_access_ok(CUdeviceptr p, std::size_t bytes, int dev) {
  std::lock_guard<std::mutex> l(mu);
  for (std::uintptr_t q = p; q < p + bytes;) {
    auto it = vmm_maps.upper_bound(q);
    if (it == vmm_maps.begin()) return 0;
    --it;
    if (it->first + it->second.size <= q || (it->second.access & (1u << dev)) == 0) return 0;
    q = it->first + it->second.size;
  }
  return 1;
}
FAKE_API std::size_t fakecuda_vmm_device_bytes(int dev) {
  std::lock_guard<std::mutex> l(mu);
  return vmm_used_on(dev);
}
FAKE_API int fakecuda_vmm_is_mapped(CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(mu);
  return vmm_overlaps_mapping(p, 1) ? 1 : 0;
}
// ---- streams, capture, events ------------------------------------------------------------------
// The exported entry points call these, never each other: an exported symbol called from inside
// the library resolves to the shim's wrapper, which would then see one call twice.
// FAKECUDA_MAX_STREAMS=N: stream creations after the first N fail (out of resources), as a
// driver short of them would.
static CUresult create_stream(CUstream* ph, unsigned flags) {
  std::lock_guard<std::mutex> lock(mu);
  static const long max_streams = [] {
    const char* e = std::getenv("FAKECUDA_MAX_STREAMS");
    return e != nullptr ? std::atol(e) : -1;
  }();
  static long created = 0;
  if (max_streams >= 0 && created >= max_streams) return CUDA_ERROR_OUT_OF_MEMORY;
  ++created;
  auto* s = new Stream;
  s->ctx = tl_current;
  s->flags = flags;
  streams.push_back(s);
  *ph = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}
static CUresult destroy_stream(CUstream hs);
FAKE_API CUresult cuStreamCreateWithPriority(CUstream* ph, unsigned flags, int) { return create_stream(ph, flags); }
FAKE_API CUresult cuStreamCreate(CUstream* ph, unsigned flags) { return create_stream(ph, flags); }
FAKE_API CUresult cuStreamDestroy(CUstream hs) { return destroy_stream(hs); }
FAKE_API CUresult cuStreamDestroy_v2(CUstream hs) { return destroy_stream(hs); }
static CUresult destroy_stream(CUstream hs) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = streams.begin(); it != streams.end(); ++it) {
    if (*it == reinterpret_cast<Stream*>(hs)) {
      streams.erase(it);  // the object is leaked: events may still point at it
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_HANDLE;
}
static CUresult is_capturing(CUstream hs, CUstreamCaptureStatus* st, bool ptsz) {
  FAKE_COUNT();
  FAKE_CALL(cuStreamIsCapturing);
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = resolve(hs, ptsz);
  *st = !s->capturing    ? CU_STREAM_CAPTURE_STATUS_NONE
        : s->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                         : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* st) { return is_capturing(s, st, false); }
FAKE_API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* st) { return is_capturing(s, st, true); }
static CUresult begin_capture(CUstream hs, CUstreamCaptureMode mode, bool ptsz) {
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = resolve(hs, ptsz);
  if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  s->capturing = true;
  s->invalidated = false;
  s->capture_mode = mode;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) { return begin_capture(s, m, false); }
FAKE_API CUresult cuStreamBeginCapture(CUstream s) { return begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, false); }
FAKE_API CUresult cuStreamBeginCapture_ptsz(CUstream s) {
  return begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}
FAKE_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) { return begin_capture(s, m, true); }
// CUDA 12.3's capture into an existing graph: the graph and its dependencies are not modelled.
FAKE_API CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph, const void*, const void*, std::size_t,
                                              CUstreamCaptureMode m) {
  return begin_capture(s, m, false);
}
FAKE_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph, const void*, const void*, std::size_t,
                                                   CUstreamCaptureMode m) {
  return begin_capture(s, m, true);
}
static CUresult end_capture(CUstream hs, CUgraph* g, bool ptsz) {
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = resolve(hs, ptsz);
  if (!s->capturing) return CUDA_ERROR_INVALID_VALUE;
  s->capturing = false;
  if (g != nullptr) *g = reinterpret_cast<CUgraph>(0x6);
  return s->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}
FAKE_API CUresult cuStreamEndCapture(CUstream s, CUgraph* g) { return end_capture(s, g, false); }
FAKE_API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) { return end_capture(s, g, true); }

FAKE_API CUresult cuEventCreate(CUevent* e, unsigned) {
  FAKE_COUNT();
  FAKE_CALL(cuEventCreate);
  *e = reinterpret_cast<CUevent>(new Event);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuEventDestroy_v2(CUevent e) {
  FAKE_CALL(cuEventDestroy);
  delete reinterpret_cast<Event*>(e);
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuEventRecord(CUevent e, CUstream s) { return record(e, s, false); }
FAKE_API CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return record(e, s, true); }
// The context-wide calls of CUDA 12.5. FAKECUDA_NO_CONTEXT_EVENTS=1: both answer
// CUDA_ERROR_NOT_SUPPORTED (an older driver's absence, for the shim's other path). On a context
// with a stream capturing, the driver refuses them and invalidates every such capture.
namespace {
CUresult context_wide_refusal() {
  static const bool off = std::getenv("FAKECUDA_NO_CONTEXT_EVENTS") != nullptr;
  if (off) return CUDA_ERROR_NOT_SUPPORTED;
  bool capturing = false;
  for (Stream* o : streams) {
    if (!o->capturing) continue;
    o->invalidated = true;
    capturing = true;
  }
  return capturing ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}
bool in_context(const Stream* s, const Context* c) { return s->ctx == c || s->per_thread; }
// The handles of a context-wide call, checked (under mu), or the call's error.
CUresult context_wide_args(CUcontext hc, CUevent ev, Context** c, Event** e) {
  *c = reinterpret_cast<Context*>(hc);
  *e = reinterpret_cast<Event*>(ev);
  if (*c == nullptr || *e == nullptr || !(*c)->alive) return CUDA_ERROR_INVALID_HANDLE;
  return context_wide_refusal();
}
}  // namespace
// Everything issued so far on every stream of the context, the legacy stream included.
FAKE_API CUresult cuCtxRecordEvent(CUcontext hc, CUevent ev) {
  FAKE_COUNT();
  FAKE_CALL(cuCtxRecordEvent);
  std::lock_guard<std::mutex> lock(mu);
  Context* c = nullptr;
  Event* e = nullptr;
  if (CUresult r = context_wide_args(hc, ev, &c, &e); r != CUDA_SUCCESS) return r;
  e->waits = waits_of(&legacy_stream);
  for (Stream* o : streams) {
    if (!in_context(o, c)) continue;
    for (auto& w : waits_of(o)) e->waits.push_back(w);
  }
  unique_pairs(e->waits);
  ++n_ctx_records;
  return CUDA_SUCCESS;
}
// Work issued from now on, on every stream of the context (made now or later), waits for `ev`.
FAKE_API CUresult cuCtxWaitEvent(CUcontext hc, CUevent ev) {
  FAKE_COUNT();
  FAKE_CALL(cuCtxWaitEvent);
  std::lock_guard<std::mutex> lock(mu);
  Context* c = nullptr;
  Event* e = nullptr;
  if (CUresult r = context_wide_args(hc, ev, &c, &e); r != CUDA_SUCCESS) return r;
  auto& deps = ctx_deps[c];
  std::erase_if(deps, [](const auto& d) { return !pair_pending(d); });
  for (auto& w : e->waits)
    if (pair_pending(w)) deps.push_back(w);
  unique_pairs(deps);
  ++n_ctx_waits;
  return CUDA_SUCCESS;
}
static CUresult stream_wait_event(CUstream hs, CUevent ev, bool ptsz) {
  FAKE_COUNT();
  FAKE_CALL(cuStreamWaitEvent);
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = resolve(hs, ptsz);
  auto* e = reinterpret_cast<Event*>(ev);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capturing) {
    // A real capture would take the wait into its graph (an external-event node, or an error):
    // either way the graph is not what the program captured.
    ++n_capture_waits;
    s->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (s->legacy) {
    for (Stream* o : streams) {
      if (o->capturing && o->flags == 0 && !o->per_thread) {
        o->invalidated = true;
        ++n_capture_waits;
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      }
    }
  }
  absorb_implicit(s);
  std::erase_if(s->deps, [](const auto& d) { return !pair_pending(d); });
  for (auto& w : e->waits)
    if (pair_pending(w)) s->deps.push_back(w);
  ++n_stream_waits;
  ++s->waits;
  return CUDA_SUCCESS;
}
FAKE_API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned) { return stream_wait_event(s, e, false); }
FAKE_API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned) { return stream_wait_event(s, e, true); }
FAKE_API CUresult cuEventQuery(CUevent e) {
  FAKE_COUNT();
  FAKE_CALL(cuEventQuery);
  std::lock_guard<std::mutex> lock(mu);
  ++n_event_queries;
  return event_done(reinterpret_cast<Event*>(e)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
// Done when nothing issued so far on the stream is still pending (its own work, what it waits for).
CUresult stream_query(CUstream hs, bool ptsz) {
  FAKE_COUNT();
  FAKE_CALL(cuStreamQuery);
  std::lock_guard<std::mutex> lock(mu);
  ++n_stream_queries;
  return waits_of(resolve(hs, ptsz)).empty() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FAKE_API CUresult cuStreamQuery(CUstream s) { return stream_query(s, false); }
FAKE_API CUresult cuStreamQuery_ptsz(CUstream s) { return stream_query(s, true); }
FAKE_API CUresult cuEventSynchronize(CUevent ev) {
  FAKE_COUNT();
  FAKE_CALL(cuEventSynchronize);
  std::lock_guard<std::mutex> lock(mu);
  auto* e = reinterpret_cast<Event*>(ev);
  if (event_done(e)) return CUDA_SUCCESS;
  // The host waits until the GPU is done: in the fake, the pending work finishes now.
  ++n_syncs;
  for (auto& [s, gen] : e->waits)
    if (s->hold_gen == gen) end_hold(s);
  return CUDA_SUCCESS;
}

// ---- test controls -----------------------------------------------------------------------------
FAKE_API void fakecuda_hold_stream(CUstream s) {
  std::lock_guard<std::mutex> lock(mu);
  resolve(s, false)->held = true;
}
FAKE_API void fakecuda_release_stream(CUstream s) {
  std::lock_guard<std::mutex> lock(mu);
  end_hold(resolve(s, false));
}
FAKE_COUNTER(fakecuda_alloc_calls, n_alloc)
FAKE_COUNTER(fakecuda_free_calls, n_free)
FAKE_COUNTER(fakecuda_live_allocations, allocs.size())
FAKE_API std::size_t fakecuda_live_bytes() {
  std::lock_guard<std::mutex> l(mu);
  return tl_current != nullptr ? used_on(tl_current->device) : 0;
}
FAKE_COUNTER(fakecuda_graph_allocs, n_graph)
FAKE_COUNTER(fakecuda_event_records, n_records)
FAKE_COUNTER(fakecuda_event_syncs, n_syncs)
FAKE_COUNTER(fakecuda_event_queries, n_event_queries)
FAKE_COUNTER(fakecuda_stream_queries, n_stream_queries)
FAKE_COUNTER(fakecuda_stream_waits, n_stream_waits)
FAKE_COUNTER(fakecuda_capture_waits, n_capture_waits)
FAKE_COUNTER(fakecuda_ctx_records, n_ctx_records)
FAKE_COUNTER(fakecuda_ctx_waits, n_ctx_waits)
FAKE_API int fakecuda_would_wait(CUstream s, CUstream held) {
  std::lock_guard<std::mutex> lock(mu);
  Stream* h = resolve(held, false);
  if (!h->held) return -1;
  for (auto& w : waits_of(resolve(s, false)))
    if (w.first == h && w.second == h->hold_gen) return 1;
  return 0;
}
FAKE_API long fakecuda_thread_driver_calls() { return tl_driver_calls; }
FAKE_API long fakecuda_records_on(CUstream s) {
  std::lock_guard<std::mutex> lock(mu);
  return resolve(s, false)->records;
}
FAKE_API long fakecuda_waits_by(CUstream s) {
  std::lock_guard<std::mutex> lock(mu);
  return resolve(s, false)->waits;
}
FAKE_COUNTER(fakecuda_trim_calls, n_trims)
// Live device memory at p: a cuMemAlloc allocation or a mapped cuMemCreate page.
FAKE_API int fakecuda_is_live(CUdeviceptr p) {
  std::lock_guard<std::mutex> l(mu);
  std::uintptr_t base = 0;
  return containing(p, &base) != nullptr || vmm_overlaps_mapping(p, 1) ? 1 : 0;
}

// ---- cuGetProcAddress --------------------------------------------------------------------------
namespace {
// A second entry point for cuMemFree_v2 that is not the exported symbol: real drivers may hand
// out internal addresses, and the shim must still recognise the function by name and version.
CUresult internal_mem_free(CUdeviceptr p) { return cuMemFree_v2(p); }

struct ProcEntry {
  const char* name;
  int min_version;
  void* legacy;
  void* per_thread;  // nullptr: same as legacy
};
FAKE_API CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
FAKE_API CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t);
#define P(fn) reinterpret_cast<void*>(&fn)
const ProcEntry kProcs[] = {
    {"cuGetProcAddress", 12000, P(cuGetProcAddress_v2), nullptr},
    {"cuInit", 2000, P(cuInit), nullptr},
    {"cuDriverGetVersion", 2020, P(cuDriverGetVersion), nullptr},
    {"cuDeviceGet", 2000, P(cuDeviceGet), nullptr},
    {"cuDeviceGetUuid", 9020, P(cuDeviceGetUuid), nullptr},
    {"cuDeviceGetUuid", 11040, P(cuDeviceGetUuid_v2), nullptr},
    {"cuDeviceGetCount", 2000, P(cuDeviceGetCount), nullptr},
    {"cuDeviceCanAccessPeer", 4000, P(cuDeviceCanAccessPeer), nullptr},
    {"cuDevicePrimaryCtxRetain", 7000, P(cuDevicePrimaryCtxRetain), nullptr},
    {"cuDevicePrimaryCtxRelease", 7000, P(cuDevicePrimaryCtxRelease), nullptr},
    {"cuDevicePrimaryCtxRelease", 11000, P(cuDevicePrimaryCtxRelease_v2), nullptr},
    {"cuDevicePrimaryCtxReset", 7000, P(cuDevicePrimaryCtxReset), nullptr},
    {"cuDevicePrimaryCtxReset", 11000, P(cuDevicePrimaryCtxReset_v2), nullptr},
    {"cuDevicePrimaryCtxGetState", 7000, P(cuDevicePrimaryCtxGetState), nullptr},
    {"cuCtxSetCurrent", 4000, P(cuCtxSetCurrent), nullptr},
    {"cuCtxGetCurrent", 4000, P(cuCtxGetCurrent), nullptr},
    {"cuCtxEnablePeerAccess", 4000, P(cuCtxEnablePeerAccess), nullptr},
    {"cuCtxCreate", 3020, P(cuCtxCreate_v2), nullptr},
    {"cuCtxDestroy", 2000, P(cuCtxDestroy), nullptr},
    {"cuCtxDestroy", 4000, P(cuCtxDestroy_v2), nullptr},
    {"cuMemAlloc", 3020, P(cuMemAlloc_v2), nullptr},
    {"cuMemAllocPitch", 3020, P(cuMemAllocPitch_v2), nullptr},
    {"cuMemAllocManaged", 6000, P(cuMemAllocManaged), nullptr},
    {"cuMemFree", 3020, P(internal_mem_free), nullptr},
    {"cuMemAllocAsync", 11020, P(cuMemAllocAsync), P(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, P(cuMemFreeAsync), P(cuMemFreeAsync_ptsz)},
    {"cuMemGetInfo", 2000, P(cuMemGetInfo), nullptr},
    {"cuMemGetInfo", 3020, P(cuMemGetInfo_v2), nullptr},
    {"cuMemGetAddressRange", 3020, P(cuMemGetAddressRange_v2), nullptr},
    {"cuMemAllocHost", 2000, P(cuMemAllocHost), nullptr},
    {"cuMemAllocHost", 3020, P(cuMemAllocHost_v2), nullptr},
    {"cuMemHostAlloc", 2020, P(cuMemHostAlloc), nullptr},
    {"cuMemFreeHost", 2000, P(cuMemFreeHost), nullptr},
    {"cuMemHostGetFlags", 2030, P(cuMemHostGetFlags), nullptr},
    {"cuMemHostRegister", 6050, P(cuMemHostRegister_v2), nullptr},
    {"cuMemHostUnregister", 4000, P(cuMemHostUnregister), nullptr},
    {"cuPointerGetAttribute", 4000, P(cuPointerGetAttribute), nullptr},
    {"cuPointerGetAttributes", 7000, P(cuPointerGetAttributes), nullptr},
    {"cuIpcGetMemHandle", 4010, P(cuIpcGetMemHandle), nullptr},
    {"cuIpcOpenMemHandle", 4010, P(cuIpcOpenMemHandle), nullptr},
    {"cuIpcOpenMemHandle", 11000, P(cuIpcOpenMemHandle_v2), nullptr},
    {"cuIpcCloseMemHandle", 4010, P(cuIpcCloseMemHandle), nullptr},
    {"cuMemPoolTrimTo", 11020, P(cuMemPoolTrimTo), nullptr},
    {"cuDeviceGetDefaultMemPool", 11020, P(cuDeviceGetDefaultMemPool), nullptr},
    {"cuStreamCreate", 2000, P(cuStreamCreate), nullptr},
    {"cuStreamCreateWithPriority", 5050, P(cuStreamCreateWithPriority), nullptr},
    {"cuStreamDestroy", 2000, P(cuStreamDestroy), nullptr},
    {"cuStreamDestroy", 4000, P(cuStreamDestroy_v2), nullptr},
    {"cuStreamIsCapturing", 10000, P(cuStreamIsCapturing), P(cuStreamIsCapturing_ptsz)},
    {"cuStreamBeginCapture", 10000, P(cuStreamBeginCapture), P(cuStreamBeginCapture_ptsz)},
    {"cuStreamBeginCapture", 10010, P(cuStreamBeginCapture_v2), P(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamBeginCaptureToGraph", 12030, P(cuStreamBeginCaptureToGraph), P(cuStreamBeginCaptureToGraph_ptsz)},
    {"cuStreamEndCapture", 10000, P(cuStreamEndCapture), P(cuStreamEndCapture_ptsz)},
    {"cuEventCreate", 2000, P(cuEventCreate), nullptr},
    {"cuEventRecord", 2000, P(cuEventRecord), P(cuEventRecord_ptsz)},
    {"cuEventQuery", 2000, P(cuEventQuery), nullptr},
    {"cuStreamQuery", 2000, P(cuStreamQuery), P(cuStreamQuery_ptsz)},
    {"cuStreamWaitEvent", 3020, P(cuStreamWaitEvent), P(cuStreamWaitEvent_ptsz)},
    {"cuEventSynchronize", 2000, P(cuEventSynchronize), nullptr},
    {"cuEventDestroy", 4000, P(cuEventDestroy_v2), nullptr},
    {"cuLaunchKernel", 4000, P(cuLaunchKernel), P(cuLaunchKernel_ptsz)},
    {"cuGraphLaunch", 10000, P(cuGraphLaunch), P(cuGraphLaunch_ptsz)},
    {"cuMemcpyHtoD", 3020, P(cuMemcpyHtoD_v2), P(cuMemcpyHtoD_v2_ptds)},
    {"cuMemcpyDtoH", 3020, P(cuMemcpyDtoH_v2), P(cuMemcpyDtoH_v2_ptds)},
    {"cuMemcpyDtoD", 3020, P(cuMemcpyDtoD_v2), P(cuMemcpyDtoD_v2_ptds)},
    {"cuMemcpyHtoDAsync", 3020, P(cuMemcpyHtoDAsync_v2), P(cuMemcpyHtoDAsync_v2_ptsz)},
    {"cuMemcpyDtoHAsync", 3020, P(cuMemcpyDtoHAsync_v2), P(cuMemcpyDtoHAsync_v2_ptsz)},
    {"cuMemcpyDtoDAsync", 3020, P(cuMemcpyDtoDAsync_v2), P(cuMemcpyDtoDAsync_v2_ptsz)},
    {"cuMemsetD8", 3020, P(cuMemsetD8_v2), nullptr},
};
// With FAKECUDA_PROC_EXACT_NAMES=1, exported variants are also found by their own names, as a
// driver may resolve them; otherwise only base names resolve.
const ProcEntry kExactNames[] = {
    {"cuMemGetInfo_v2", 3020, P(cuMemGetInfo_v2), nullptr},
    {"cuMemAlloc_v2", 3020, P(cuMemAlloc_v2), nullptr},
};
#undef P
}  // namespace

FAKE_API CUresult cuGetProcAddress_v2(const char* name, void** pfn, int version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult* status) {
  if (name == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  // Like the driver: the newest variant whose version is <= the one asked for.
  bool found_name = false;
  const ProcEntry* best = nullptr;
  for (const ProcEntry& e : kProcs) {
    if (std::strcmp(e.name, name) != 0) continue;
    found_name = true;
    if (version >= e.min_version && (best == nullptr || e.min_version > best->min_version)) best = &e;
  }
  if (best != nullptr) {
    const bool ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    *pfn = ptds && best->per_thread != nullptr ? best->per_thread : best->legacy;
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (!found_name && std::getenv("FAKECUDA_PROC_EXACT_NAMES") != nullptr) {
    for (const ProcEntry& e : kExactNames) {
      if (std::strcmp(e.name, name) != 0 || version < e.min_version) continue;
      *pfn = e.legacy;
      if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  // cuGetProcAddress itself, asked for with an 11.x version: the 4-argument one.
  if (found_name && std::strcmp(name, "cuGetProcAddress") == 0 && version >= 11030) {
    *pfn = reinterpret_cast<void*>(&cuGetProcAddress);
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (status != nullptr)
    *status = found_name ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  // FAKECUDA_TRACE=1 lists what a program asked for and did not get (to extend the fake).
  if (std::getenv("FAKECUDA_TRACE") != nullptr)
    std::fprintf(stderr, "fakecuda: no %s (version %d, flags %llu)\n", name, version,
                 static_cast<unsigned long long>(flags));
  return CUDA_ERROR_NOT_FOUND;
}
FAKE_API CUresult cuGetProcAddress(const char* name, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(name, pfn, version, flags, nullptr);
}
