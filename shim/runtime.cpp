#include "shim/runtime.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "config/path_pattern.h"
#include "config/version.h"
#include "shim/fences/streams.h"
#include "shim/group/group.h"
#include "shim/log.h"
#include "shim/log_audit.h"
#include "shim/parking/parking.h"
#include "shim/signal_dump.h"
#include "sys/secure.h"
#include "telemetry/logging.h"
#include "telemetry/summary.h"
#include "telemetry/trace.h"

namespace cudapool::shim {

std::atomic<Runtime*> Runtime::instance_{nullptr};
std::atomic<bool> Runtime::exiting_{false};

const char* to_string(PassKind k) noexcept {
  switch (k) {
    case PassKind::backend: return "backend";
    case PassKind::foreign_pointer: return "foreign_pointer";
    case PassKind::capture: return "capture";
    case PassKind::no_context: return "no_context";
    case PassKind::exiting: return "exiting";
    case PassKind::count_: break;
  }
  return "?";
}

Runtime::Runtime(const RealDriver& d, Policy p, bool native)
    : driver_(d), policy_(std::move(p)), pool_options_(policy_.pool), native_(native) {}

namespace {

std::mutex& start_mutex() {
  static auto* mu = new std::mutex;  // leaked: usable at exit, never destroyed
  return *mu;
}

std::int64_t now_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string command_line() {
  std::string out;
  if (FILE* f = std::fopen("/proc/self/cmdline", "r")) {
    int c;
    while ((c = std::fgetc(f)) != EOF) out += c == '\0' ? ' ' : static_cast<char>(c);
    std::fclose(f);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Per-thread lookup state: the last context → pool answer, and the last pool that allocated or
// owned a freed pointer (the cudaFree fast path). Both valid only while `generation` matches
// Runtime::generation_, which every retire (context destroy/reset) and fork bumps, so a reset
// context whose new primary context reuses the old handle can never hit a stale entry.
struct PoolLookupCache {
  CUcontext ctx = nullptr;
  ContextPool* pool = nullptr;
  unsigned generation = 0;
  ContextPool* owner = nullptr;
  unsigned owner_generation = 0;
};
thread_local PoolLookupCache tl_lookup;

std::atomic<int> g_next_shard{0};
std::atomic<int> g_exit_status{-1};  // the status given to exit(), once the on_exit handler ran
thread_local int tl_shard = -1;

// Loads the policy; on failure follows CUDAPOOL_ON_ERROR. Returns false to mean "pass through".
// *secure: loaded in secure mode (sys/secure.h), *ignored: the variables that mode ignored.
bool load(Policy* out, bool* secure, std::vector<std::string>* ignored) {
  PolicyResult r = load_policy_from_environment();
  *secure = r.secure;
  *ignored = std::move(r.ignored);
  if (r.policy) {
    *out = *r.policy;
    if (*secure) {
      // What secure mode means for the shim, whatever the loader handed over: no file written.
      out->log_file.clear();
      out->trace_file.clear();
      out->stats_file.clear();
      out->warm_start.clear();
      out->publish_stats = false;
      out->dump_signal = 0;
      out->group.clear();
    }
    return true;
  }
  if (r.on_error == OnError::passthrough) {
    std::fprintf(stderr,
                 "cudapool: invalid policy: %s\ncudapool: CUDAPOOL_ON_ERROR=passthrough: "
                 "every allocation goes straight to the driver\n",
                 r.error.c_str());
    *out = Policy{};
    out->backend = Backend::passthrough;
    return false;
  }
  // Before the first allocation, so the program has not computed anything with our memory yet.
  std::fprintf(stderr,
               "cudapool: invalid policy: %s\ncudapool: stopping (exit status %d); set "
               "CUDAPOOL_ON_ERROR=passthrough to run without the pool instead\n",
               r.error.c_str(), kPolicyErrorExitStatus);
  std::fflush(stderr);
  _exit(kPolicyErrorExitStatus);
}

// The dump signal's text (shim/signal_dump.h): the runtime's figures and its pools' snapshots,
// gathered with CPU-only pool calls, never CUDA.
std::string dump_text(int signo) {
  Runtime* rt = Runtime::peek();
  if (rt == nullptr) return {};
  Summary s;
  s.pid = getpid();
  s.backend = rt->native() ? "native" : "passthrough";
  s.policy = to_conf_string(rt->policy());
  s.wall_time_s = seconds_since_start();
  std::vector<DeviceSnapshot> snapshots;
  rt->for_each_pool([&](ContextPool& cp) {
    DeviceSummary d;
    d.device = cp.device;
    d.stats = cp.pool.stats();
    d.driver_total_bytes = cp.driver_total;
    s.devices.push_back(d);
    snapshots.push_back(DeviceSnapshot{cp.device, cp.pool.snapshot()});
  });
  for (int k = 0; k < static_cast<int>(PassKind::count_); ++k) {
    const std::int64_t n = rt->passes(static_cast<PassKind>(k));
    if (n > 0) s.passthrough[to_string(static_cast<PassKind>(k))] = n;
  }
  return format_dump(signo, s, snapshots);
}

// The runtime's pools as the group's helper threads see them (shim/group/group.h).
class GroupView final : public group::ProcessPools {
 public:
  explicit GroupView(Runtime& rt) : rt_(rt) {}
  void for_each(const std::function<void(int device, DevicePool& pool)>& fn) override {
    rt_.for_each_pool([&](ContextPool& cp) { fn(cp.device, cp.pool); });
  }
  bool exiting() const noexcept override { return Runtime::exiting(); }

 private:
  Runtime& rt_;
};

// The runtime's pools as parking sees them (shim/parking/parking.h).
class ParkView final : public park::Pools {
 public:
  explicit ParkView(Runtime& rt) : rt_(rt) {}
  const RealDriver& driver() const noexcept override { return rt_.driver(); }
  void for_each(const std::function<void(ContextPool&)>& fn) override { rt_.for_each_pool(fn); }

 private:
  Runtime& rt_;
};

// One for the process (there is one runtime), never destroyed: helper threads outlive exit.
group::ProcessPools& group_view(Runtime& rt) {
  static auto* view = new GroupView(rt);
  return *view;
}

// The options of every pool: the policy's, and the one choice the shim makes itself, which no
// policy key sets. Under free_sync:immediate thread caches engage from a pool's first thread, so
// a single-threaded program gets their hit path too (the stream-local reuse PyTorch programs rely
// on; fenced frees keep the pool's own batches). A traced run has an event sink, which turns the
// caches off, so a replay of its trace still places blocks as it did. Said once, at info, when
// the pool runs (`native`).
PoolOptions pool_options_for(const Policy& policy, bool native) {
  PoolOptions opt = policy.pool;
  if (!opt.cache_from_first_thread && opt.free_sync == FreeSync::immediate) {
    opt.cache_from_first_thread = true;
    if (native)
      log_info(
          "thread caches engage from a pool's first thread (free_sync:immediate): a single-threaded program gets "
          "their hit path too");
  }
  return opt;
}

// What loading the policy noted, said once logging is set up: secure mode (a warning when it
// ignored something the user set, else only at info) and the policy's own warnings.
void announce_policy(const Policy& policy, bool secure, const std::vector<std::string>& ignored) {
  if (secure && !ignored.empty()) log_warn("{}", secure_mode_message(ignored));
  if (secure && ignored.empty()) log_info("{}", secure_mode_message(ignored));
  for (const auto& w : policy.warnings) log_warn("policy: {}", w);
}

// PyTorch users bring their habit: that variable configures PyTorch's allocator, never this pool.
void warn_pytorch_conf(bool native) {
  const char* pt = ::secure_getenv("PYTORCH_CUDA_ALLOC_CONF");
  if (!native || pt == nullptr || *pt == '\0') return;
  const char* own = ::secure_getenv("CUDAPOOL_CONF");
  log_warn(
      "PYTORCH_CUDA_ALLOC_CONF={} configures PyTorch's own caching allocator, not cudapool ({}); "
      "cudapool reads only CUDAPOOL_CONF{}: to carry the keys over, set CUDAPOOL_CONF=\"{}\" "
      "(`cudapool check --conf '{}'` shows what cudapool accepts)",
      pt,
      ::secure_getenv("PYTORCH_NO_CUDA_MEMORY_CACHING") != nullptr ? "which PYTORCH_NO_CUDA_MEMORY_CACHING turns off"
                                                                   : "which sits in front of it",
      own != nullptr && *own != '\0' ? "" : " (unset here: the defaults)", pt, pt);
}

// The policy a trace records, so that a replay of it defaults to it. Where the process wrote its
// files is no part of how its pool behaved, and a replay must not write there.
Policy recorded_policy(const Policy& policy) {
  Policy recorded = policy;
  recorded.log_level = Policy{}.log_level;
  recorded.log_file.clear();
  recorded.trace_file.clear();
  recorded.stats_file.clear();
  recorded.warm_start.clear();        // read at start, not how the pool behaves afterwards
  recorded.trace_call_sites = false;  // how the trace was written, not how the pool ran
  recorded.dump_signal = 0;
  return recorded;
}

// The trace of a policy with a trace_file, its policy written first; nullptr without one, or
// when it cannot be opened (said). Leaked with the runtime; flushed at exit.
TraceWriter* open_trace(const Policy& policy) {
  if (policy.trace_file.empty()) return nullptr;
  std::string err;
  auto writer = TraceWriter::open(policy.trace_file, &err);
  if (!writer) {
    log_warn("trace file: {}", err);
    return nullptr;
  }
  writer->note_policy(to_conf_string(recorded_policy(policy)));
  writer->record_call_sites(policy.trace_call_sites);
  return writer.release();
}

}  // namespace

Runtime* Runtime::start() noexcept {
  const RealDriver* d = real_driver();
  if (d == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(start_mutex());
  if (Runtime* rt = instance_.load(std::memory_order_acquire)) return rt;
  Policy policy;
  bool secure = false;
  std::vector<std::string> ignored;
  bool ok = load(&policy, &secure, &ignored);
  const bool native = ok && policy.backend == Backend::native;
  std::string why = init_logging(policy);
  if (!why.empty()) log_warn("logging: {}", why);
  announce_policy(policy, secure, ignored);
  warn_pytorch_conf(native);
  auto* rt = new Runtime(*d, std::move(policy), native);  // leaked on purpose: no teardown at exit
  rt->start_unix_ns_ = now_ns(CLOCK_REALTIME);
  rt->start_mono_ns_ = now_ns(CLOCK_MONOTONIC);
  if (TraceWriter* trace = open_trace(rt->policy_)) {
    rt->call_sites_ = rt->policy_.trace_call_sites;
    rt->sink_ = trace;
  }
  rt->sink_ = start_audit(rt->policy_, native, rt->sink_, &dump_text);  // start report, dump signal, log sink
  log_info("cudapool {} started: backend={} policy={}", kVersion, native ? "native" : "passthrough",
           to_conf_string(rt->policy_));
  rt->pool_options_ = pool_options_for(rt->policy_, native);
  pthread_atfork(nullptr, nullptr, &Runtime::on_fork_child);
  // on_exit rather than atexit: its handler gets the status the program passes to exit() (or
  // returns from main), which the summary reports.
  ::on_exit(&Runtime::on_exit_status, nullptr);
  instance_.store(rt, std::memory_order_release);
  if (native) {
    if (auto* view = new (std::nothrow) ParkView(*rt)) park::set_pools(view);  // never destroyed, as the runtime
  }
  return rt;
}

void Runtime::on_exit_status(int status, void*) noexcept {
  g_exit_status.store(status, std::memory_order_relaxed);
  on_exit();
}

void Runtime::on_exit() noexcept {
  // From here on no hook calls CUDA for pool memory: libcuda may already be tearing down.
  exiting_.store(true, std::memory_order_relaxed);
  group::on_exit();
  if (Runtime* rt = instance_.load(std::memory_order_acquire)) rt->write_exit_summary();
  flush_logs();
}

void Runtime::write_exit_summary() noexcept {
  // A forked child that never used CUDA itself has nothing of its own to report (the parent's
  // pools are not its own): no summary, so it cannot hide or replace the parent's.
  if (forked_ && count_.load(std::memory_order_acquire) == 0) return;
  // Only the pools' own counters: no CUDA call (the driver totals were taken at pool creation).
  try {
    Summary s;
    s.pid = getpid();
    s.command = command_line();
    s.policy = to_conf_string(policy_);
    s.backend = native_ ? "native" : "passthrough";
    s.start_unix_ns = start_unix_ns_;
    s.wall_time_s = static_cast<double>(now_ns(CLOCK_MONOTONIC) - start_mono_ns_) / 1e9;
    s.exit_status = g_exit_status.load(std::memory_order_relaxed);
    // Retired pools too: a program that releases its context before exiting (driver-API
    // programs often do) must still find its allocations in the summary.
    for_each_pool(
        [&](ContextPool& cp) {
          DeviceSummary d;
          d.device = cp.device;
          d.stats = cp.pool.stats();
          d.driver_total_bytes = cp.driver_total;
          const CudaFences::CallCounts c = cp.fences.call_counts();
          d.driver_calls = {{"cuEventRecord", c.event_record},      {"cuEventQuery", c.event_query},
                            {"cuEventSynchronize", c.event_sync},   {"cuStreamWaitEvent", c.stream_wait},
                            {"context_switches", c.context_switch}, {"non_blocking_streams", c.non_blocking_streams},
                            {"cuStreamQuery", c.stream_query},      {"sweeps", c.sweeps},
                            {"cuCtxRecordEvent", c.context_record}, {"cuCtxWaitEvent", c.context_wait}};
          s.devices.push_back(d);
        },
        /*include_retired=*/true);
    if (SummaryPart part = summary_part_.load(std::memory_order_acquire)) part(s);
    for (int k = 0; k < static_cast<int>(PassKind::count_); ++k) {
      const std::int64_t n = passes(static_cast<PassKind>(k));
      if (n > 0) s.passthrough[to_string(static_cast<PassKind>(k))] = n;
    }
    if (const std::int64_t n = served(RuntimeApiCall::cuda_malloc); n > 0) s.runtime_api["cudaMalloc"] = n;
    if (const std::int64_t n = served(RuntimeApiCall::cuda_free); n > 0) s.runtime_api["cudaFree"] = n;
    log_info("exit summary\n{}", format_summary_table(s));
    // stats_file (CUDAPOOL_STATS included: config/load.cpp puts it there). A forked child's
    // summary goes to a file of its own beside the parent's, never over it.
    std::string stats_path = policy_.stats_file;
    if (forked_ && !stats_path.empty()) stats_path = per_process_pattern(stats_path);
    if (!stats_path.empty()) {
      std::string err = write_summary_file(stats_path, s);
      if (!err.empty()) log_warn("stats file: {}", err);
    }
  } catch (...) {
    // At exit nothing may escape; a summary that cannot be written is only lost.
  }
}

void Runtime::on_fork_child() noexcept {
  // The child never touches the parent's pools (their memory belongs to the parent's contexts).
  // Forget them without locking anything a parent thread may have held at fork; the child
  // starts fresh pools if it initialises CUDA itself.
  Runtime* rt = instance_.load(std::memory_order_relaxed);
  reset_captures_in_child();
  group::on_fork_child();
  if (rt == nullptr) return;
  rt->count_.store(0, std::memory_order_relaxed);
  rt->generation_.fetch_add(1, std::memory_order_relaxed);
  // The child's summary covers the child: its own start, its own pass-throughs.
  rt->forked_ = true;
  rt->start_unix_ns_ = now_ns(CLOCK_REALTIME);
  rt->start_mono_ns_ = now_ns(CLOCK_MONOTONIC);
  for (PassShard& shard : rt->shards_)
    for (auto& n : shard.n) n.store(0, std::memory_order_relaxed);
  new (&start_mutex()) std::mutex;
}

ContextPool* Runtime::find_pool(CUcontext ctx) noexcept {
  ContextPool* found = nullptr;
  for_each_pool([&](ContextPool& cp) {
    if (found == nullptr && cp.ctx == ctx) found = &cp;
  });
  return found;
}

// expandable_peer_access: every other device that can reach this one (cuDeviceCanAccessPeer)
// gets access to the pool's pages, as cudaMalloc memory would once the program enables peer
// access. Asked once per pool; devices that cannot reach it are left out (granting them would
// make cuMemSetAccess fail for the whole mapping).
void Runtime::grant_peers(ContextPool& cp) noexcept {
  int n = 0;
  if (driver_.cuDeviceGetCount == nullptr || driver_.cuDeviceCanAccessPeer == nullptr ||
      driver_.cuDeviceGetCount(&n) != CUDA_SUCCESS) {
    log_warn("expandable_peer_access: the driver cannot list peers; device {} only", cp.device);
    return;
  }
  std::string granted;
  for (int d = 0; d < n; ++d) {
    int can = 0;
    if (d == cp.device || driver_.cuDeviceCanAccessPeer(&can, d, cp.device) != CUDA_SUCCESS || can == 0) continue;
    cp.upstream.grant_peer_access(d);
    granted += (granted.empty() ? "" : ", ") + std::to_string(d);
  }
  log_info("expandable_peer_access: pages of device {} are also mapped for device(s) {}", cp.device,
           granted.empty() ? std::string("none (no peer can reach it)") : granted);
}

void Runtime::peer_access_enabled(CUcontext peer, int accessor) noexcept {
  if (peer == nullptr || accessor < 0 || !native_) return;
  ContextPool* cp = nullptr;
  {
    std::lock_guard<std::mutex> lock(start_mutex());
    cp = find_pool(peer);
    try {
      bool known = false;
      for (const PeerGrant& g : peer_grants_) known = known || (g.peer == peer && g.accessor == accessor);
      if (!known) peer_grants_.push_back(PeerGrant{peer, accessor});
    } catch (const std::bad_alloc&) {
    }
  }
  if (cp == nullptr || !cp->pool.options().expandable_segments || cp->device == accessor) return;
  const CUresult r = cp->upstream.grant_peer_access(accessor);
  if (r != CUDA_SUCCESS)
    log_warn("peer access: pages of device {} could not be mapped for device {} (CUDA error {})", cp->device, accessor,
             static_cast<int>(r));
  else
    log_info("peer access: pages of device {} are also mapped for device {}", cp->device, accessor);
}

ContextPool* Runtime::create_pool(CUcontext ctx) noexcept {
  std::lock_guard<std::mutex> lock(start_mutex());
  if (ContextPool* cp = find_pool(ctx)) return cp;
  const int n = count_.load(std::memory_order_relaxed);
  if (n >= kMaxPools) {
    log_warn("more than {} CUDA contexts: context {} runs without the pool", kMaxPools, static_cast<void*>(ctx));
    return nullptr;
  }
  CUdevice dev = -1;
  if (driver_.cuCtxGetDevice(&dev) != CUDA_SUCCESS || dev < 0) return nullptr;
  try {
    const PoolOptions& opt = pool_options_;
    auto* cp = new ContextPool(driver_, ctx, dev, opt, sink_);
    if (opt.expandable_segments && policy_.expandable_peer_access) grant_peers(*cp);
    if (opt.expandable_segments)
      for (const PeerGrant& g : peer_grants_)
        if (g.peer == ctx && g.accessor != dev) cp->upstream.grant_peer_access(g.accessor);
    std::size_t free_bytes = 0;
    cp->upstream.mem_info(&free_bytes, &cp->driver_total);
    // With the page size of expandable segments, so that a replay maps pages as this device does.
    if (TraceWriter* tw = trace_writer_of(sink_)) tw->note_device(dev, cp->driver_total, cp->upstream.granularity());
    // The group budget gates every physical allocation of the pool, from the first one on.
    if (group::Member* m = group::member_for(policy_, driver_, dev, cp->driver_total)) {
      cp->member = m;
      cp->upstream.set_gate(group::gate_of(m));
    }
    // Preallocated by the first allocation, on its thread and stream (not here: this may be a
    // stream's creation, and the start mutex is held).
    cp->warm_pending.store(!policy_.warm_start.empty(), std::memory_order_relaxed);
    slots_[n].store(cp, std::memory_order_release);
    count_.store(n + 1, std::memory_order_release);
    group::on_pool_created(group_view(*this), policy_, cp->device);
    log_info("pool for device {} (context {}) started", dev, static_cast<void*>(ctx));
    return cp;
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

int Runtime::shard_index() noexcept {
  int i = tl_shard;
  if (i < 0) i = tl_shard = g_next_shard.fetch_add(1, std::memory_order_relaxed) % kShards;
  return i;
}

std::int64_t Runtime::passes(PassKind k) const noexcept {
  std::int64_t n = 0;
  for (const PassShard& s : shards_) n += s.n[static_cast<int>(k)].load(std::memory_order_relaxed);
  return n;
}

ContextPool* Runtime::last_owner() const noexcept {
  const PoolLookupCache& c = tl_lookup;
  return c.owner_generation == generation_.load(std::memory_order_acquire) ? c.owner : nullptr;
}

std::int64_t Runtime::served(RuntimeApiCall c) const noexcept {
  std::int64_t n = 0;
  for (const PassShard& s : shards_) n += s.served[static_cast<int>(c)].load(std::memory_order_relaxed);
  return n;
}

ContextPool* Runtime::current_pool(bool create) noexcept {
  // The one driver call of the allocation path: the current context can change under us through
  // calls the shim never sees (cudart's private entry points), so it is read every time.
  CUcontext ctx = nullptr;
  if (driver_.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return nullptr;
  const unsigned g = generation_.load(std::memory_order_acquire);
  PoolLookupCache& c = tl_lookup;
  if (c.ctx == ctx && c.generation == g) {
    c.owner = c.pool;  // the next cudaFree most likely returns memory of this pool
    c.owner_generation = g;
    return c.pool;
  }
  ContextPool* cp = find_pool(ctx);
  if (cp == nullptr && create) cp = create_pool(ctx);
  if (cp != nullptr) c = {ctx, cp, g, cp, g};
  return cp;
}

ContextPool* Runtime::owner_of(const void* p) noexcept {
  const unsigned g = generation_.load(std::memory_order_acquire);
  PoolLookupCache& c = tl_lookup;
  ContextPool* last = c.owner_generation == g ? c.owner : nullptr;
  if (last != nullptr && !last->retired.load(std::memory_order_acquire) && last->pool.owns(p)) return last;
  ContextPool* found = nullptr;
  for_each_pool([&](ContextPool& cp) {
    if (found == nullptr && &cp != last && cp.pool.owns(p)) found = &cp;
  });
  if (found != nullptr) {
    c.owner = found;
    c.owner_generation = g;
  }
  return found;
}

void Runtime::retire(ContextPool* cp) noexcept {
  cp->pool.abandon();
  cp->fences.abandon();
  cp->upstream.drop_gated();  // the context's memory went with it
  cp->retired.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);  // every thread's cached lookups miss
  log_info("context {} of device {} is gone: its pool was dropped", static_cast<void*>(cp->ctx), cp->device);
}

}  // namespace cudapool::shim
