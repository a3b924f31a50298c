// Pinned host memory (policy pinned_cache): cuMemHostAlloc, cuMemAllocHost(_v2) and
// cuMemFreeHost, which cudart's cudaHostAlloc, cudaMallocHost and cudaFreeHost call (static and
// shared cudart alike: they resolve the driver through cuGetProcAddress), served from one
// process-wide HostPool (allocator/host_pool.h). cuMemHostRegister (cudaHostRegister) is the
// program's own pinning of its own memory and is never touched.
//
// cudaFreeHost waits for the whole device before it returns; a pooled free instead records a
// device fence in every context the shim has a pool for (the current one is given a pool first)
// and the block is handed out again only once all of them completed. Everything else — the
// feature off, another backend, no current context, odd arguments, a pointer the pool does not
// own — goes to the driver untouched.
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "allocator/host_pool.h"
#include "shim/cudapool.h"
#include "shim/export.h"
#include "shim/hooks/hooked.h"
#include "shim/hooks/hooks.h"
#include "shim/log.h"
#include "shim/log_audit.h"
#include "telemetry/summary.h"
#include "telemetry/trace.h"

namespace cudapool::shim {
namespace {

constexpr unsigned kHostAllocPortable = 1, kHostAllocDeviceMap = 2, kHostAllocWriteCombined = 4;
constexpr unsigned kHostAllocFlags = kHostAllocPortable | kHostAllocDeviceMap | kHostAllocWriteCombined;
// cuMemHostRegister's flags for the same meanings (4 is CU_MEMHOSTREGISTER_IOMEMORY there).
constexpr unsigned kRegisterPortable = 1, kRegisterDeviceMap = 2;

std::int64_t elapsed_ns(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// Pinned memory from the driver: cuMemHostAlloc, or (pinned_use_cuda_host_register) pages the
// shim maps and faults in itself, then cuMemHostRegister.
class CudaHostUpstream final : public HostUpstream {
 public:
  CudaHostUpstream(const RealDriver& d, const HostPoolOptions& o) : d_(d), opt_(o) {}

  HostUpstreamResult allocate(std::size_t bytes, unsigned flags) override {
    const auto t0 = std::chrono::steady_clock::now();
    void* p = nullptr;
    const bool reg = opt_.use_host_register && (flags & kHostAllocWriteCombined) == 0 &&
                     d_.cuMemHostRegister_v2 != nullptr && d_.cuMemHostUnregister != nullptr;
    CUresult r = CUDA_SUCCESS;
    if (reg) {
      void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
      } else {
        fault_in(static_cast<char*>(m), bytes);
        unsigned rf = 0;
        if ((flags & kHostAllocPortable) != 0) rf |= kRegisterPortable;
        if ((flags & kHostAllocDeviceMap) != 0) rf |= kRegisterDeviceMap;
        r = d_.cuMemHostRegister_v2(m, bytes, rf);
        if (r == CUDA_SUCCESS) {
          p = m;
          try {
            registered_.insert(p);
          } catch (const std::bad_alloc&) {
            d_.cuMemHostUnregister(p);
            munmap(p, bytes);
            p = nullptr;
            r = CUDA_ERROR_OUT_OF_MEMORY;
          }
        } else {
          munmap(m, bytes);
        }
      }
    } else {
      r = d_.cuMemHostAlloc(&p, bytes, flags);
      if (r != CUDA_SUCCESS) p = nullptr;
    }
    if (p != nullptr)
      log_info("pinned host memory: {} {} bytes (flags {}) in {} us", reg ? "registered" : "allocated", bytes, flags,
               elapsed_ns(t0) / 1000);
    else
      log_debug("pinned host memory: {} bytes refused by the driver (CUDA error {})", bytes, static_cast<int>(r));
    return {p, p != nullptr ? CUDA_SUCCESS : r};
  }

  void release(void* p, std::size_t bytes, unsigned flags, std::uintptr_t owner) override {
    const auto t0 = std::chrono::steady_clock::now();
    ScopedContext scope(d_, reinterpret_cast<CUcontext>(owner));
    CUresult r = CUDA_SUCCESS;
    if (registered_.erase(p) != 0) {
      r = d_.cuMemHostUnregister(p);
      munmap(p, bytes);
    } else {
      r = d_.cuMemFreeHost(p);
    }
    if (r != CUDA_SUCCESS)
      log_warn("pinned host memory: giving back {} ({} bytes, flags {}) failed: CUDA error {}", p, bytes, flags,
               static_cast<int>(r));
    else
      log_info("pinned host memory: gave back {} bytes in {} us", bytes, elapsed_ns(t0) / 1000);
  }

  void forget(void* p, std::size_t bytes) override {
    // The context took the registration along; the pages are still ours to unmap.
    if (registered_.erase(p) != 0) munmap(p, bytes);
  }

 private:
  // The pages are touched before registration, split over pinned_num_register_threads threads
  // (registering pins what is resident; faulting 4 KiB pages one by one is the slow part).
  void fault_in(char* m, std::size_t bytes) const {
    constexpr std::size_t kPage = 4096;
    const std::size_t pages = (bytes + kPage - 1) / kPage;
    // At least 4 MiB a thread: below that, starting a thread costs more than the faults it saves.
    const std::size_t n = std::min(static_cast<std::size_t>(std::max(1, opt_.register_threads)),
                                   std::max<std::size_t>(1, pages / 1024));
    auto touch = [&](std::size_t from, std::size_t to) {
      for (std::size_t i = from; i < to; ++i) m[i * kPage] = 0;
    };
    if (n == 1) {
      touch(0, pages);
      return;
    }
    std::vector<std::thread> ts;
    const std::size_t per = (pages + n - 1) / n;
    try {
      for (std::size_t t = 1; t < n && t * per < pages; ++t)
        ts.emplace_back(touch, t * per, std::min(pages, (t + 1) * per));
    } catch (...) {
      // No thread: this one touches the rest below.
    }
    touch(0, std::min(pages, per));
    for (std::size_t t = ts.size() + 1; t < n && t * per < pages; ++t) touch(t * per, std::min(pages, (t + 1) * per));
    for (std::thread& t : ts) t.join();
  }

  const RealDriver& d_;
  const HostPoolOptions opt_;
  std::unordered_set<void*> registered_;  // called under the pool's lock only
};

// A device fence of the whole process: one device fence in every context the shim has a pool
// for. Complete when all of them are (a context that went away counts as complete: its fences
// report so after it was abandoned).
class AllContextsFences final : public FenceProvider {
 public:
  explicit AllContextsFences(Runtime& rt) : rt_(rt) {}

  FenceHandle record_device() override {
    Parts parts;
    rt_.for_each_pool([&](ContextPool& cp) {
      if (const FenceHandle h = cp.fences.record_device(); h != 0) parts.push_back({&cp, h});
    });
    std::lock_guard<std::mutex> lock(mu_);
    const FenceHandle id = next_++;
    fences_[id] = std::move(parts);
    return id;
  }
  FenceHandle record_stream(StreamId) override { return record_device(); }
  bool query(FenceHandle fence) override { return ask(fence, false); }
  // Each context's fences sweep their streams now rather than at their next gap.
  bool query_urgent(FenceHandle fence) override { return ask(fence, true); }
  bool can_wait(FenceHandle fence) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fences_.find(fence);
    if (it == fences_.end()) return true;
    for (auto& [cp, h] : it->second)
      if (!cp->fences.can_wait(h)) return false;
    return true;
  }
  void wait(FenceHandle fence) override {
    Parts parts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = fences_.find(fence);
      if (it == fences_.end()) return;
      parts.swap(it->second);
    }
    for (auto& [cp, h] : parts) {
      cp->fences.wait(h);
      cp->fences.release(h);
    }
  }
  void release(FenceHandle fence) override {
    Parts parts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = fences_.find(fence);
      if (it == fences_.end()) return;
      parts.swap(it->second);
      fences_.erase(it);
    }
    for (auto& [cp, h] : parts) cp->fences.release(h);
  }

 private:
  bool ask(FenceHandle fence, bool urgent) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fences_.find(fence);
    if (it == fences_.end()) return true;
    Parts& parts = it->second;
    while (!parts.empty()) {
      auto& [cp, h] = parts.back();
      if (!(urgent ? cp->fences.query_urgent(h) : cp->fences.query(h))) return false;
      cp->fences.release(h);
      parts.pop_back();
    }
    return true;
  }

  using Parts = std::vector<std::pair<ContextPool*, FenceHandle>>;
  Runtime& rt_;
  std::mutex mu_;
  FenceHandle next_ = 1;
  std::unordered_map<FenceHandle, Parts> fences_;
};

struct HostState {
  CudaHostUpstream upstream;
  AllContextsFences fences;
  HostPool pool;
  HostState(Runtime& rt, const HostPoolOptions& o) : upstream(rt.driver(), o), fences(rt), pool(o, upstream, fences) {}
  // With a trace: what each live pooled block's rows say (its free row repeats its allocation's
  // size and device). As many entries as live pinned blocks; empty without a trace.
  struct Traced {
    std::size_t size, requested;
    int device;
  };
  std::mutex traced_mu;
  std::unordered_map<void*, Traced> traced;
};

// pinned_allocate / pinned_free rows (docs/trace-format.md): only when a trace is written.
void trace_pinned_alloc(HostState& h, void* p, std::size_t bytes, int device) noexcept {
  TraceWriter* tw = trace_writer_of(nullptr);
  if (tw == nullptr) return;
  const std::size_t size = host_class_size(bytes, h.pool.options().max_round_threshold);
  try {
    std::lock_guard<std::mutex> lock(h.traced_mu);
    h.traced[p] = HostState::Traced{size, bytes, device};
  } catch (...) {
    return;  // out of host memory: the row is left out rather than written unmatched
  }
  tw->note_pinned(true, device, reinterpret_cast<std::uintptr_t>(p), size, bytes);
}

void trace_pinned_free(HostState& h, void* p) noexcept {
  TraceWriter* tw = trace_writer_of(nullptr);
  if (tw == nullptr) return;
  HostState::Traced t{};
  {
    std::lock_guard<std::mutex> lock(h.traced_mu);
    auto it = h.traced.find(p);
    if (it == h.traced.end()) return;
    t = it->second;
    h.traced.erase(it);
  }
  tw->note_pinned(false, t.device, reinterpret_cast<std::uintptr_t>(p), t.size, t.requested);
}

std::atomic<HostState*> g_host{nullptr};

void on_fork_child() noexcept {
  // The parent's pinned memory and fences are not the child's to reuse: start afresh (leaked).
  g_host.store(nullptr, std::memory_order_relaxed);
}

void log_at_exit() noexcept {
  // Only the pool's counters: no CUDA at exit.
  HostState* h = g_host.load(std::memory_order_acquire);
  if (h == nullptr) return;
  try {
    const HostStats s = h->pool.stats();
    log_info(
        "pinned host pool at exit: requested {} B live (peak {}), blocks {} B (peak {}), held {} B (peak {}), "
        "cached {} B; {} hits, {} misses, {} skipped for running fences; driver: {} allocations, {} releases, "
        "{} us; {} bad frees",
        s.requested_bytes.current, s.requested_bytes.peak, s.allocated_bytes.current, s.allocated_bytes.peak,
        s.reserved_bytes.current, s.reserved_bytes.peak, s.cached_bytes.current, s.cache_hits, s.cache_misses,
        s.fence_skips, s.upstream_allocs, s.upstream_frees, s.upstream_ns / 1000, s.bad_frees);
  } catch (...) {
  }
}

// The pool's counters in the exit summary (Runtime::set_summary_part): nothing when it never
// started (or a forked child did not start its own).
void host_summary(Summary& summary) noexcept {
  std::map<std::string, std::int64_t>* out = &summary.pinned_host;
  HostState* h = g_host.load(std::memory_order_acquire);
  if (h == nullptr) return;
  try {
    const HostStats s = h->pool.stats();
    auto counter = [&](const char* name, const StatCounter& c) {
      (*out)[std::string(name) + ".current"] = c.current;
      (*out)[std::string(name) + ".peak"] = c.peak;
      (*out)[std::string(name) + ".allocated"] = c.allocated;
      (*out)[std::string(name) + ".freed"] = c.freed;
    };
    counter("requested_bytes", s.requested_bytes);
    counter("allocated_bytes", s.allocated_bytes);
    counter("reserved_bytes", s.reserved_bytes);
    counter("cached_bytes", s.cached_bytes);
    counter("blocks", s.blocks);
    (*out)["cache_hits"] = s.cache_hits;
    (*out)["cache_misses"] = s.cache_misses;
    (*out)["fence_skips"] = s.fence_skips;
    (*out)["num_host_alloc"] = s.upstream_allocs;
    (*out)["num_host_free"] = s.upstream_frees;
    (*out)["upstream_ns"] = s.upstream_ns;
    (*out)["fence_waits"] = s.fence_waits;
    (*out)["bad_frees"] = s.bad_frees;
    (*out)["bound_releases"] = s.bound_releases;
    (*out)["bound_waits"] = s.bound_waits;
  } catch (...) {
    out->clear();  // at exit nothing may escape; the summary goes without it
  }
}

// The pool, started with the first pooled allocation; nullptr when the policy keeps pinned memory
// with the driver.
HostState* host_state(Runtime& rt) {
  if (HostState* h = g_host.load(std::memory_order_acquire)) return h;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (HostState* h = g_host.load(std::memory_order_acquire)) return h;
  HostState* h = new (std::nothrow) HostState(rt, rt.policy().pinned);  // leaked: no teardown at exit
  if (h == nullptr) return nullptr;
  static std::once_flag once;
  std::call_once(once, [&rt] {
    pthread_atfork(nullptr, nullptr, &on_fork_child);
    std::atexit(&log_at_exit);
    rt.set_summary_part(&host_summary);
  });
  const HostPoolOptions& o = rt.policy().pinned;
  log_info("pinned host pool started (host_register={}, reserve {} B, cap {})", o.use_host_register, o.reserve_segment,
           o.max_cached == kNoLimit ? std::string("none") : std::to_string(o.max_cached) + " B");
  g_host.store(h, std::memory_order_release);
  return h;
}

// The pooled allocation, or kPassThrough for the driver's own.
CUresult pooled_alloc(void** pp, std::size_t bytes, unsigned flags) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr || !rt->native() || !rt->policy().pinned.enabled || Runtime::exiting()) return kPassThrough;
  if (pp == nullptr || bytes == 0 || (flags & ~kHostAllocFlags) != 0) return kPassThrough;
  // The current context owns the memory, and must be covered by the fences of later frees.
  ContextPool* cp = rt->current_pool();
  if (cp == nullptr) return kPassThrough;
  HostState* h = host_state(*rt);
  if (h == nullptr) return kPassThrough;
  const HostPool::Result r = h->pool.allocate(bytes, flags, reinterpret_cast<HostPool::Owner>(cp->ctx));
  switch (r.status) {
    case AllocStatus::ok:
      *pp = r.ptr;
      trace_pinned_alloc(*h, r.ptr, bytes, cp->device);
      return CUDA_SUCCESS;
    case AllocStatus::invalid_size: return kPassThrough;  // absurd sizes: the driver's answer
    case AllocStatus::out_of_memory:
    case AllocStatus::upstream_error: break;
  }
  const CUresult error = r.upstream_error != CUDA_SUCCESS ? r.upstream_error : CUDA_ERROR_OUT_OF_MEMORY;
  log_warn("pinned host memory: {} bytes could not be had (CUDA error {}), with the pool's cache given back first",
           bytes, static_cast<int>(error));
  return error;
}

}  // namespace

void host_forget_context(CUcontext ctx) noexcept {
  if (HostState* h = g_host.load(std::memory_order_acquire))
    h->pool.forget_owner(reinterpret_cast<HostPool::Owner>(ctx));
}

}  // namespace cudapool::shim

using namespace cudapool::shim;

CUDAPOOL_EXPORT CUresult cuMemHostAlloc(void** pp, std::size_t bytes, unsigned flags) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuMemHostAlloc == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = pooled_alloc(pp, bytes, flags);
  return r == kPassThrough ? d->cuMemHostAlloc(pp, bytes, flags) : r;
}

CUDAPOOL_EXPORT CUresult cuMemAllocHost_v2(void** pp, std::size_t bytes) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuMemAllocHost_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = pooled_alloc(pp, bytes, 0);
  return r == kPassThrough ? d->cuMemAllocHost_v2(pp, bytes) : r;
}

// CUDA 3.1's form (32-bit size), which cuGetProcAddress hands out below version 3020.
CUDAPOOL_EXPORT CUresult cuMemAllocHost(void** pp, unsigned bytes) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuMemAllocHost == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = pooled_alloc(pp, bytes, 0);
  return r == kPassThrough ? d->cuMemAllocHost(pp, bytes) : r;
}

CUDAPOOL_EXPORT CUresult cuMemFreeHost(void* p) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuMemFreeHost == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  HostState* h = g_host.load(std::memory_order_acquire);
  if (h == nullptr || p == nullptr) return d->cuMemFreeHost(p);
  if (Runtime::exiting()) {
    // No fence at exit (the driver may be tearing down): pool memory is left to the process's end.
    return h->pool.owns(p) ? CUDA_SUCCESS : d->cuMemFreeHost(p);
  }
  // The row first: once the pool has the block, another thread may be handed the same address
  // and write its allocation row. Only a live traced block has an entry, so a free the pool then
  // refuses (not its own, freed before) writes no row.
  trace_pinned_free(*h, p);
  switch (h->pool.free(p)) {
    case cudapool::FreeStatus::not_owned: return d->cuMemFreeHost(p);
    case cudapool::FreeStatus::ok: break;
    case cudapool::FreeStatus::double_free:
    case cudapool::FreeStatus::interior_pointer:
      log_warn(
          "cuMemFreeHost({}): inside the pinned pool but not a live block (freed before, or not its start); "
          "returning CUDA_ERROR_INVALID_VALUE, pool unchanged",
          p);
      return CUDA_ERROR_INVALID_VALUE;
  }
  // free_host_sync: CUDA's cudaFreeHost returns only once the device has finished; the pool's
  // fence keeps the block safe without that, but a program may rely on the wait itself.
  Runtime* rt = Runtime::peek();
  if (rt != nullptr && rt->policy().free_host_sync && d->cuCtxSynchronize != nullptr) {
    CUcontext ctx = nullptr;
    if (d->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr) return d->cuCtxSynchronize();
  }
  return CUDA_SUCCESS;
}

// C API (shim/cudapool.h).
CUDAPOOL_EXPORT int cudapool_get_host_stats(cudapool_host_stats* out) {
  if (out == nullptr) return -1;
  HostState* h = g_host.load(std::memory_order_acquire);
  if (h == nullptr) return -1;
  const cudapool::HostStats s = h->pool.stats();
  *out = cudapool_host_stats{};
  out->requested_bytes = s.requested_bytes.current;
  out->requested_bytes_peak = s.requested_bytes.peak;
  out->allocated_bytes = s.allocated_bytes.current;
  out->allocated_bytes_peak = s.allocated_bytes.peak;
  out->reserved_bytes = s.reserved_bytes.current;
  out->reserved_bytes_peak = s.reserved_bytes.peak;
  out->cached_bytes = s.cached_bytes.current;
  out->blocks = s.blocks.current;
  out->cache_hits = s.cache_hits;
  out->cache_misses = s.cache_misses;
  out->fence_skips = s.fence_skips;
  out->num_host_alloc = s.upstream_allocs;
  out->num_host_free = s.upstream_frees;
  out->bad_frees = s.bad_frees;
  return 0;
}

CUDAPOOL_EXPORT size_t cudapool_host_empty_cache(void) {
  HostState* h = g_host.load(std::memory_order_acquire);
  return h != nullptr && !Runtime::exiting() ? h->pool.empty_cache() : 0;
}
