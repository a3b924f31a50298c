// The allocation and free entry points: cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemFree_v2,
// cuMemAllocAsync(+_ptsz), cuMemFreeAsync(+_ptsz); cudart's cudaMalloc / cudaFree, where the shim
// answers them itself (shim/hooks/hooks_runtime_api.cpp), use pool_allocate_in and pool_free too. Fast
// path: one atomic load for the runtime, one cuCtxGetCurrent per allocation (none per free), one
// pool call; no shared state written by the shim itself (hints and counters are per thread /
// sharded). Everything unusual goes to the real driver untouched.
#include "shim/hooks/hooks.h"

#include "shim/fences/streams.h"
#include "shim/group/group.h"
#include "shim/hooks/hooked.h"
#include "shim/ipc/ipc.h"
#include "shim/log.h"
#include "shim/oom_note.h"
#include "shim/parking/parking.h"
#include "shim/warm_start/warm_start.h"
#include "telemetry/oom.h"
#include "telemetry/share.h"
#include "telemetry/trace.h"

namespace cudapool::shim {

namespace {

void* as_ptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

CUresult report_oom(ContextPool& cp, std::size_t bytes, const AllocResult& r) {
  std::size_t f = 0, t = 0;
  cp.upstream.mem_info(&f, &t);
  OomInfo info = make_oom_info(cp.device, bytes, r.asked_bytes, r.refusal, cp.pool.stats(), cp.pool.options(), f, t,
                               cp.pool.external_bytes());
  if (r.refusal == Refusal::budget && cp.member != nullptr) {
    // Who holds the budget, so the message can say why there is no room under it.
    const group::BudgetShares g = group::budget_shares(*cp.member);
    info.group_budget = g.budget;
    info.group_own = g.own;
    info.group_others = g.others;
    info.group_exited = g.exited;
    info.group_other_members = g.other_members;
    info.group_exited_members = g.exited_members;
  }
  const std::string msg = format_oom(info);
  log_warn("{}", msg);
  note_oom(msg);  // cudapool_last_oom_message: the pluggable allocator's exception text
  return CUDA_ERROR_OUT_OF_MEMORY;
}

// The CUresult for what the owning pool said about a free (never not_owned here).
CUresult finish_free(FreeStatus s, const ContextPool& cp, void* p, bool on_stream) {
  if (s == FreeStatus::ok) return CUDA_SUCCESS;
  log_warn("{} of {} (device {}): {}; returning CUDA_ERROR_INVALID_VALUE, pool unchanged",
           on_stream ? "cuMemFreeAsync" : "cuMemFree", p, cp.device, to_string(s));
  return CUDA_ERROR_INVALID_VALUE;
}

// The group's budget refused `r` (not the device): the other members may hold idle cached memory.
// Asks them, and tries again after each release until group_release_wait_ms has passed; then,
// with group_park:on, idle members move their live memory to host memory for it, until
// group_park_wait_ms has passed (a park copies gigabytes). No lock is held while waiting.
// *park_self: every member waits for memory and this process is to park before it tries again.
AllocResult wait_for_budget(ContextPool& cp, std::size_t bytes, StreamId stream, AllocResult r, bool* park_self) {
  auto refused = [](const AllocResult& a) {
    return a.status == AllocStatus::out_of_memory && a.refusal == Refusal::budget;
  };
  group::Waiting waiting(*cp.member);  // not asked to park meanwhile
  const std::int64_t start = share::monotonic_ns();
  for (int round = 0; group::ask_release(*cp.member, start, round, bytes); ++round) {
    r = cp.pool.allocate(bytes, stream);
    if (!refused(r)) return r;
  }
  const std::int64_t park_start = share::monotonic_ns();
  for (int round = 0; refused(r); ++round) {
    const group::ParkWait w = group::ask_park(*cp.member, park_start, round, bytes);
    if (w == group::ParkWait::give_up) break;
    if (w == group::ParkWait::park_self) {
      *park_self = true;
      break;
    }
    r = cp.pool.allocate(bytes, stream);
  }
  return r;
}

}  // namespace

CUresult pool_allocate(Runtime& rt, CUdeviceptr* dptr, std::size_t bytes, StreamId stream, int device) {
  // Once the process is exiting no pool work starts (it may record or wait on fences, or grow a
  // segment, in a driver that may be tearing down): the driver serves the allocation, and a later
  // free of that pointer is not the pool's, so it goes to the driver too.
  if (Runtime::exiting()) {
    rt.count_pass(PassKind::exiting);
    return kPassThrough;
  }
  ContextPool* cp = rt.current_pool();
  if (cp == nullptr) {
    rt.count_pass(PassKind::no_context);
    return kPassThrough;
  }
  if (device >= 0 && cp->device != device) return CUDA_ERROR_INVALID_DEVICE;
  return pool_allocate_in(rt, *cp, dptr, bytes, stream);
}

namespace {

// One attempt through the door; *park_self: see wait_for_budget (the answer is then not the
// program's: pool_allocate_in parks and tries again, or reports *refused).
CUresult allocate_once(Runtime& rt, ContextPool& cp, CUdeviceptr* dptr, std::size_t bytes, StreamId stream,
                       bool* park_self, AllocResult* refused) {
  // A parked process is restored before it allocates (its pool's pages are away).
  park::Door door;
  if (door.result() != 0) return door.result();
  ipc::drain_frees(rt);  // blocks the program freed while another process held them open
  // The context is current (the caller just read it): fence recording skips its own check.
  CudaFences::ContextGuard known(cp.ctx);
  if (cp.warm_pending.load(std::memory_order_relaxed)) [[unlikely]]
    warm_start(rt, cp, stream);
  // Where the program allocated, for the trace: taken here, before the pool's lock.
  if (rt.call_sites()) TraceWriter::capture_call_site();
  AllocResult r = cp.pool.allocate(bytes, stream);
  if (r.status == AllocStatus::out_of_memory && cp.member != nullptr && r.refusal == Refusal::budget) {
    r = wait_for_budget(cp, bytes, stream, r, park_self);
    if (*park_self) {
      *refused = r;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  switch (r.status) {
    case AllocStatus::ok: *dptr = reinterpret_cast<CUdeviceptr>(r.ptr); return CUDA_SUCCESS;
    case AllocStatus::out_of_memory:
    case AllocStatus::invalid_size:  // absurd sizes: the driver answers "out of memory" too
      group::note_oom(cp.device);
      return report_oom(cp, bytes, r);
    case AllocStatus::upstream_error:  // the driver's own answer (the pool's upstream calls all carry one)
      return r.upstream_error != CUDA_SUCCESS ? static_cast<CUresult>(r.upstream_error) : CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

}  // namespace

CUresult pool_allocate_in(Runtime& rt, ContextPool& cp, CUdeviceptr* dptr, std::size_t bytes, StreamId stream) {
  // Members that all wait for memory would wait for each other: the one chosen parks itself
  // (outside the door: a park waits for the threads inside), then tries again, which restores it
  // first. Bounded by group_park_wait_ms from the first time it gave way (the clock is read only
  // then: the fast path reads none).
  std::int64_t first_yield = 0;
  for (;;) {
    bool park_self = false;
    AllocResult refused;
    const CUresult r = allocate_once(rt, cp, dptr, bytes, stream, &park_self, &refused);
    if (!park_self) return r;
    if (first_yield == 0) first_yield = share::monotonic_ns();
    if (!group::park_self(*cp.member, bytes, first_yield)) {
      group::note_oom(cp.device);
      return report_oom(cp, bytes, refused);
    }
  }
}

namespace {

// A block exported with CUDA IPC and still open in another process is freed into the pool only
// once the last importer closed it: that process may still be using the bytes. kPassThrough: go
// on freeing; else the free's answer.
CUresult ipc_free_answer(void* p) {
  switch (ipc::on_free(p)) {
    case ipc::FreeVerdict::free: break;
    case ipc::FreeVerdict::held: return CUDA_SUCCESS;
    case ipc::FreeVerdict::already_freed:
      log_warn(
          "free of {}: freed before (it waits for another process to close its CUDA IPC handle); "
          "returning CUDA_ERROR_INVALID_VALUE",
          p);
      return CUDA_ERROR_INVALID_VALUE;
  }
  return kPassThrough;
}

// A stream every context may use without question: none (cuMemFree), the legacy or the
// per-thread default stream.
bool any_context_may_use(CUstream raw_stream) {
  return raw_stream == nullptr || raw_stream == CU_STREAM_LEGACY || raw_stream == CU_STREAM_PER_THREAD;
}

// Fast path: hand the pointer straight to the pool this thread last used; its answer is
// authoritative unless it says "not mine" (pools never overlap). No owns() (the pool's shared
// lock), no scan: a stream-ordered free can stay in the pool's per-thread cache. For a
// stream-ordered free the stream must be one this pool's context may use without question;
// anything else takes the checked path. kPassThrough: that pool did not answer.
CUresult free_in_last_pool(Runtime& rt, void* p, const StreamId* stream, CUstream raw_stream) {
  ContextPool* last = rt.last_owner();
  if (last == nullptr || last->retired.load(std::memory_order_acquire)) return kPassThrough;
  if (stream == nullptr) {
    const FreeStatus s = last->pool.free(p);
    if (s != FreeStatus::not_owned) return finish_free(s, *last, p, false);
  } else if (any_context_may_use(raw_stream) || last->fences.knows_stream(raw_stream)) {
    const FreeStatus s = last->pool.free_on_stream(p, *stream);
    if (s != FreeStatus::not_owned) return finish_free(s, *last, p, true);
  }
  return kPassThrough;
}

// A stream another context created cannot order work on cp's device: true (with a warning)
// when `raw_stream` is one.
bool stream_of_another_context(Runtime& rt, ContextPool& cp, void* p, CUstream raw_stream) {
  if (any_context_may_use(raw_stream) || cp.fences.knows_stream(raw_stream)) return false;
  bool elsewhere = false;
  rt.for_each_pool([&](ContextPool& other) {
    if (&other != &cp && other.fences.knows_stream(raw_stream)) elsewhere = true;
  });
  if (elsewhere) {
    log_warn(
        "cuMemFreeAsync({}) on a stream of another context (the block belongs to device {}): "
        "CUDA_ERROR_INVALID_VALUE",
        p, cp.device);
  }
  return elsewhere;
}

}  // namespace

CUresult pool_free(Runtime& rt, CUdeviceptr dptr, const StreamId* stream, CUstream raw_stream) {
  void* p = as_ptr(dptr);
  park::Door door;  // restored first: the pool may give the freed pages back
  if (door.result() != 0) return door.result();
  if (const CUresult r = ipc_free_answer(p); r != kPassThrough) return r;
  ipc::drain_frees(rt);
  if (!Runtime::exiting()) {
    if (const CUresult r = free_in_last_pool(rt, p, stream, raw_stream); r != kPassThrough) return r;
  }
  ContextPool* cp = rt.owner_of(p);
  if (cp == nullptr) {
    rt.count_pass(PassKind::foreign_pointer);
    return kPassThrough;
  }
  if (Runtime::exiting()) {
    // Leak: the process is going away, and recording a fence would call into a driver that may
    // already be tearing down.
    rt.count_pass(PassKind::exiting);
    return CUDA_SUCCESS;
  }
  if (stream != nullptr && stream_of_another_context(rt, *cp, p, raw_stream)) return CUDA_ERROR_INVALID_VALUE;
  FreeStatus s = stream != nullptr ? cp->pool.free_on_stream(p, *stream) : cp->pool.free(p);
  if (s == FreeStatus::not_owned) {  // raced with a reset: let the driver answer
    rt.count_pass(PassKind::foreign_pointer);
    return kPassThrough;
  }
  return finish_free(s, *cp, p, stream != nullptr);
}

namespace {

// Shared body of the synchronous allocation hooks.
CUresult alloc_sync(CUdeviceptr* dptr, std::size_t bytes) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const RealDriver& d = rt->driver();
  if (CudartCall* call = tl_cudart_call) [[unlikely]] {
    if (CUresult r = 0; call->take_alloc(bytes, &r)) return r == kPassThrough ? d.cuMemAlloc_v2(dptr, bytes) : r;
  }
  if (dptr == nullptr || bytes == 0 || !rt->native()) {
    if (!rt->native()) rt->count_pass(PassKind::backend);
    return d.cuMemAlloc_v2(dptr, bytes);  // the driver's own answer for odd arguments
  }
  if (sync_alloc_forbidden_by_capture()) {
    rt->count_pass(PassKind::capture);
    return d.cuMemAlloc_v2(dptr, bytes);
  }
  CUresult r = pool_allocate(*rt, dptr, bytes, kLegacyStream);
  return r == kPassThrough ? d.cuMemAlloc_v2(dptr, bytes) : r;
}

CUresult alloc_async(CUdeviceptr* dptr, std::size_t bytes, CUstream s, bool ptsz) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const RealDriver& d = rt->driver();
  auto real = ptsz ? d.cuMemAllocAsync_ptsz : d.cuMemAllocAsync;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == nullptr || bytes == 0 || !rt->native()) {
    if (!rt->native()) rt->count_pass(PassKind::backend);
    return real(dptr, bytes, s);
  }
  // On a capturing stream the allocation must become a graph node: the driver's job.
  // No capture ever began through the hooks: no stream can be capturing, skip the query.
  if (capture_ever_began()) {
    auto is_capturing = ptsz ? d.cuStreamIsCapturing_ptsz : d.cuStreamIsCapturing;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (is_capturing != nullptr && is_capturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE) {
      rt->count_pass(PassKind::capture);
      return real(dptr, bytes, s);
    }
  }
  CUresult r = pool_allocate(*rt, dptr, bytes, stream_id(s, ptsz));
  return r == kPassThrough ? real(dptr, bytes, s) : r;
}

CUresult free_async(CUdeviceptr dptr, CUstream s, bool ptsz) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const RealDriver& d = rt->driver();
  auto real = ptsz ? d.cuMemFreeAsync_ptsz : d.cuMemFreeAsync;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == 0) return real(dptr, s);
  if (!rt->native()) {
    rt->count_pass(PassKind::backend);
    return real(dptr, s);
  }
  const StreamId id = stream_id(s, ptsz);
  CUresult r = pool_free(*rt, dptr, &id, s);
  return r == kPassThrough ? real(dptr, s) : r;
}

}  // namespace

}  // namespace cudapool::shim

using namespace cudapool::shim;

CUDAPOOL_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytesize) { return alloc_sync(dptr, bytesize); }

CUDAPOOL_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width,
                                            std::size_t height, unsigned element_size) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const auto real = rt->driver().cuMemAllocPitch_v2;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const bool valid_args = dptr != nullptr && pitch != nullptr && width > 0 && height > 0 &&
                          (element_size == 4 || element_size == 8 || element_size == 16);
  if (!valid_args || !rt->native() || sync_alloc_forbidden_by_capture()) {
    return real(dptr, pitch, width, height, element_size);  // the driver's answer / behaviour
  }
  // Rows aligned to 512 B: a multiple of every GPU's texture pitch alignment, and the pool's
  // own block alignment, so each row starts aligned.
  // A request whose rounded row or whole size does not fit in size_t is impossible: the driver's
  // answer to one, as for any absurd size (pool_allocate's invalid_size), is out of memory.
  constexpr std::size_t kPitchAlign = 512;
  if (width > SIZE_MAX - (kPitchAlign - 1)) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t p = (width + kPitchAlign - 1) / kPitchAlign * kPitchAlign;
  if (height > SIZE_MAX / p) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = pool_allocate(*rt, dptr, p * height, kLegacyStream);
  if (r == kPassThrough) return real(dptr, pitch, width, height, element_size);
  if (r == CUDA_SUCCESS) *pitch = p;
  return r;
}

CUDAPOOL_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == 0) return rt->driver().cuMemFree_v2(dptr);
  if (CudartCall* call = tl_cudart_call) [[unlikely]] {
    if (CUresult r = 0; call->take_free(dptr, &r)) return r == kPassThrough ? rt->driver().cuMemFree_v2(dptr) : r;
  }
  if (!rt->native()) {
    rt->count_pass(PassKind::backend);
    return rt->driver().cuMemFree_v2(dptr);
  }
  CUresult r = pool_free(*rt, dptr, nullptr, nullptr);
  if (r == kPassThrough) return rt->driver().cuMemFree_v2(dptr);
  // free_host_sync: CUDA's cudaFree returns only once the device has finished; the pool's free
  // never needs that wait itself (its fences keep the memory safe), but a program may read
  // results through mapped host memory right after it.
  if (r == CUDA_SUCCESS && rt->policy().free_host_sync && !Runtime::exiting() &&
      rt->driver().cuCtxSynchronize != nullptr) {
    const CUresult s = rt->driver().cuCtxSynchronize();
    if (s != CUDA_SUCCESS) return s;
  }
  return r;
}

CUDAPOOL_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, std::size_t bytesize, CUstream s) {
  return alloc_async(dptr, bytesize, s, false);
}
CUDAPOOL_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, std::size_t bytesize, CUstream s) {
  return alloc_async(dptr, bytesize, s, true);
}
CUDAPOOL_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s, false); }
CUDAPOOL_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s, true); }
