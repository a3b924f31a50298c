// The shim's process-wide state: the policy, one DevicePool per CUDA context (created lazily,
// never destroyed: no CUDA at exit), pass-through counters, fork and exit handling.
//
// Nothing here runs at load time. The first hook that needs it (an allocation, a stream
// creation) starts it; the dlsym and cuGetProcAddress wrappers never do.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "allocator/pool.h"
#include "config/policy.h"
#include "shim/context_pool.h"
#include "shim/fences/cuda_fences.h"
#include "shim/pass_kind.h"
#include "shim/upstream/cuda_upstream.h"

namespace cudapool {
struct Summary;
}

namespace cudapool::shim {

class Runtime {
 public:
  // The runtime, started on first call (loads the policy; an invalid policy ends the process
  // with kPolicyErrorExitStatus unless CUDAPOOL_ON_ERROR=passthrough). nullptr when libcuda
  // cannot be loaded.
  static Runtime* get() noexcept {
    Runtime* rt = instance_.load(std::memory_order_acquire);
    return rt != nullptr ? rt : start();
  }
  // The runtime only if something already started it (for hooks that must not start it).
  static Runtime* peek() noexcept { return instance_.load(std::memory_order_acquire); }

  const RealDriver& driver() const noexcept { return driver_; }
  const Policy& policy() const noexcept { return policy_; }
  // The trace records where each allocation was made (trace_call_sites with a trace_file).
  bool call_sites() const noexcept { return call_sites_; }
  bool native() const noexcept { return native_; }
  static bool exiting() noexcept { return exiting_.load(std::memory_order_relaxed); }

  // Pool of the calling thread's current context, created on first use (with `create`; without,
  // nullptr where the context has none yet). nullptr when the thread has no current context (or
  // too many contexts).
  ContextPool* current_pool(bool create = true) noexcept;
  // Pool of `ctx` if one exists (retired ones excluded).
  ContextPool* find_pool(CUcontext ctx) noexcept;
  // The pool owning `p` (any address inside one of its segments), or nullptr.
  ContextPool* owner_of(const void* p) noexcept;
  // The pool this thread last allocated from or found as an owner (a hint for the free fast
  // path, kept per thread so no shared line is written per call; nullptr after any retire/fork).
  ContextPool* last_owner() const noexcept;
  // The context was destroyed or reset: abandon its pool (no CUDA call) and stop finding it.
  void retire(ContextPool* cp) noexcept;
  // The program enabled peer access (cuCtxEnablePeerAccess, which cudaDeviceEnablePeerAccess
  // calls): device `accessor` may now read and write `peer`'s memory. Expandable pages of
  // `peer`'s pool, mapped already or later, are mapped for `accessor` too, as cudaMalloc memory
  // would be. Remembered for a pool `peer` does not have yet.
  void peer_access_enabled(CUcontext peer, int accessor) noexcept;

  // Iterates live pools: fn(ContextPool&). With include_retired, also the pools of contexts that
  // were destroyed or reset (their counters still tell what the program did; the exit summary
  // reports them).
  template <typename Fn>
  void for_each_pool(Fn&& fn, bool include_retired = false) noexcept {
    const int n = count_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      ContextPool* cp = slots_[i].load(std::memory_order_acquire);
      if (cp != nullptr && (include_retired || !cp->retired.load(std::memory_order_acquire))) fn(*cp);
    }
  }

  // Sharded by thread: threads passing calls through concurrently do not share a cache line.
  void count_pass(PassKind k) noexcept {
    if (shards_[shard_index()].n[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed) == 0) log_first_pass(k);
  }
  std::int64_t passes(PassKind k) const noexcept;
  // Calls of cudart's cudaMalloc / cudaFree the shim served itself (shim/hooks/hooks_runtime_api.cpp),
  // counted like the passes; the exit summary's "runtime_api".
  enum class RuntimeApiCall : std::uint8_t { cuda_malloc, cuda_free, count_ };
  void count_served(RuntimeApiCall c) noexcept {
    shards_[shard_index()].served[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
  }
  std::int64_t served(RuntimeApiCall c) const noexcept;

  // A part of the exit summary kept outside the runtime (the pinned host pool's counters,
  // shim/hooks/hooks_host.cpp), set by its owner when it starts; called at exit, no CUDA.
  using SummaryPart = void (*)(Summary& s) noexcept;
  void set_summary_part(SummaryPart part) noexcept { summary_part_.store(part, std::memory_order_release); }

 private:
  static constexpr int kMaxPools = 256;
  static constexpr int kShards = 16;
  struct alignas(64) PassShard {
    std::atomic<std::int64_t> n[static_cast<int>(PassKind::count_)] = {};
    std::atomic<std::int64_t> served[static_cast<int>(RuntimeApiCall::count_)] = {};
  };
  static int shard_index() noexcept;
  Runtime(const RealDriver& d, Policy p, bool native);
  static Runtime* start() noexcept;
  static void on_fork_child() noexcept;
  static void on_exit() noexcept;
  static void on_exit_status(int status, void*) noexcept;
  void write_exit_summary() noexcept;
  ContextPool* create_pool(CUcontext ctx) noexcept;
  void grant_peers(ContextPool& cp) noexcept;  // expandable_peer_access
  // Peer access the program enabled (peer_access_enabled), under start_mutex(): applied to a
  // pool created for the context later. Bounded: contexts x devices of one process.
  struct PeerGrant {
    CUcontext peer;
    int accessor;
  };
  std::vector<PeerGrant> peer_grants_;

  static std::atomic<Runtime*> instance_;
  static std::atomic<bool> exiting_;
  const RealDriver& driver_;
  Policy policy_;
  PoolOptions pool_options_;  // of every pool: policy_.pool and the shim's own choice (runtime.cpp)
  bool call_sites_ = false;   // see call_sites()
  bool native_;
  EventSink* sink_ = nullptr;
  std::int64_t start_unix_ns_ = 0;
  std::int64_t start_mono_ns_ = 0;
  bool forked_ = false;  // this process is a forked child of the one that started the runtime
  std::atomic<ContextPool*> slots_[kMaxPools] = {};
  std::atomic<int> count_{0};
  // Bumped when a pool is retired or after fork; per-thread lookup caches check it (read-only on
  // the hot path).
  std::atomic<unsigned> generation_{1};
  PassShard shards_[kShards];
  std::atomic<SummaryPart> summary_part_{nullptr};
};

}  // namespace cudapool::shim
