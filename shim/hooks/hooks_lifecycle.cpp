// Context teardown, stream lifetime and graph capture: the events the pool must hear about
// before the driver acts on them.
#include "shim/fences/streams.h"
#include "shim/hooks/hooked.h"
#include "shim/hooks/hooks.h"
#include "shim/ipc/ipc.h"
#include "shim/log.h"
#include "shim/log_audit.h"
#include "shim/parking/parking.h"
#include "telemetry/trace.h"

using namespace cudapool::shim;

namespace {

void retire_context(Runtime* rt, CUcontext ctx) {
  if (rt == nullptr || ctx == nullptr) return;
  if (ContextPool* cp = rt->find_pool(ctx)) {
    rt->retire(cp);
    ipc::forget_pool(cp);            // its exports end: later opens find nothing
    cp->upstream.release_all_vmm();  // expandable segments: cuMemCreate pages outlive contexts
    host_forget_context(ctx);        // its pinned host memory went with it
  }
}

// The handle of `dev`'s primary context if it is active (retain + release: no net change).
CUcontext primary_context(const RealDriver& d, CUdevice dev) {
  unsigned flags = 0;
  int active = 0;
  if (d.cuDevicePrimaryCtxGetState == nullptr || d.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS ||
      !active) {
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if (d.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) return nullptr;
  d.cuDevicePrimaryCtxRelease_v2(dev);
  return ctx;
}

void track_new_stream(CUstream s, unsigned flags) {
  Runtime* rt = Runtime::get();
  if (rt == nullptr || !rt->native()) return;
  const bool non_blocking = (flags & CU_STREAM_NON_BLOCKING) != 0;
  if (ContextPool* cp = rt->current_pool()) cp->fences.add_stream(s, non_blocking);
  if (cudapool::TraceWriter* tw = trace_writer_of(nullptr))
    tw->note_stream(reinterpret_cast<std::uintptr_t>(s), non_blocking);
}

CUresult begin_capture(CUstream s, CUstreamCaptureMode mode, bool ptsz) {
  const RealDriver* d = real_driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto real = ptsz ? d->cuStreamBeginCapture_v2_ptsz : d->cuStreamBeginCapture_v2;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  park::Door door;  // a park sees this capture, or the capture begins after the restore
  if (door.result() != 0) return door.result();
  capture_may_begin();
  CUresult r = real(s, mode);
  if (r == CUDA_SUCCESS) capture_began(stream_id(s, ptsz), mode);
  return r;
}

CUresult end_capture(CUstream s, CUgraph* graph, bool ptsz) {
  const RealDriver* d = real_driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto real = ptsz ? d->cuStreamEndCapture_ptsz : d->cuStreamEndCapture;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(s, graph);
  // Ended, successfully or as an invalidated capture; either way the stream no longer captures.
  capture_ended(stream_id(s, ptsz));
  return r;
}

}  // namespace

namespace {

CUresult destroy_context(CUcontext ctx, PFN_cuCtxDestroy_v2 real) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  retire_context(Runtime::peek(), ctx);  // before the driver frees the context's memory
  return real(ctx);
}

CUresult reset_primary(CUdevice dev, PFN_cuDevicePrimaryCtxReset_v2 real) {
  const RealDriver* d = real_driver();
  if (d == nullptr || real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  Runtime* rt = Runtime::peek();
  if (rt != nullptr) retire_context(rt, primary_context(*d, dev));
  return real(dev);
}

CUresult release_primary(CUdevice dev, PFN_cuDevicePrimaryCtxRelease_v2 real) {
  const RealDriver* d = real_driver();
  if (d == nullptr || real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  Runtime* rt = Runtime::peek();
  if (rt == nullptr || Runtime::exiting()) return real(dev);
  CUcontext ctx = primary_context(*d, dev);
  CUresult r = real(dev);
  // The last release destroys the primary context (and its memory): drop the pool with it.
  unsigned flags = 0;
  int active = 1;
  if (r == CUDA_SUCCESS && ctx != nullptr && d->cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS &&
      !active) {
    retire_context(rt, ctx);
  }
  return r;
}

const RealDriver& driver_or_empty() {
  static const RealDriver empty{};
  const RealDriver* d = real_driver();
  return d != nullptr ? *d : empty;
}

}  // namespace

// A primary context retained while inactive is a NEW context, even when the driver hands back the
// old handle (it usually does). If a pool still sits under that handle, its context died in a way
// the shim never saw (a reset through an entry point it does not hook, e.g. cudart's private
// tables): retire it now, so the per-thread lookups miss and no block of the dead context is
// handed out. (Two threads retaining the same inactive context at once could both retire: only
// a pool created between the two calls would be dropped early, which costs memory, not safety.)
CUDAPOOL_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuDevicePrimaryCtxRetain == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  Runtime* rt = Runtime::peek();
  unsigned flags = 0;
  int active = 1;
  const bool fresh = rt != nullptr && pctx != nullptr && d->cuDevicePrimaryCtxGetState != nullptr &&
                     d->cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active;
  const CUresult r = d->cuDevicePrimaryCtxRetain(pctx, dev);
  if (r == CUDA_SUCCESS && fresh) retire_context(rt, *pctx);
  return r;
}

// Each comes in the versions cudart still resolves: cudart 13.0 asks for
// cuDevicePrimaryCtxReset/Release with version 7000, i.e. the v1 symbols.
CUDAPOOL_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  return destroy_context(ctx, driver_or_empty().cuCtxDestroy_v2);
}
CUDAPOOL_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return destroy_context(ctx, driver_or_empty().cuCtxDestroy); }
CUDAPOOL_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return reset_primary(dev, driver_or_empty().cuDevicePrimaryCtxReset_v2);
}
CUDAPOOL_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return reset_primary(dev, driver_or_empty().cuDevicePrimaryCtxReset);
}
CUDAPOOL_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return release_primary(dev, driver_or_empty().cuDevicePrimaryCtxRelease_v2);
}
CUDAPOOL_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return release_primary(dev, driver_or_empty().cuDevicePrimaryCtxRelease);
}

CUDAPOOL_EXPORT CUresult cuStreamCreate(CUstream* ph, unsigned flags) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuStreamCreate == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuStreamCreate(ph, flags);
  if (r == CUDA_SUCCESS) track_new_stream(*ph, flags);
  return r;
}

CUDAPOOL_EXPORT CUresult cuStreamCreateWithPriority(CUstream* ph, unsigned flags, int priority) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuStreamCreateWithPriority == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuStreamCreateWithPriority(ph, flags, priority);
  if (r == CUDA_SUCCESS) track_new_stream(*ph, flags);
  return r;
}

namespace {
CUresult destroy_stream(CUstream s, PFN_cuStreamDestroy_v2 real) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  Runtime* rt = Runtime::peek();
  if (rt != nullptr && rt->native() && !Runtime::exiting() && s != nullptr) {
    ContextPool* owner = nullptr;
    rt->for_each_pool([&](ContextPool& cp) {
      if (owner == nullptr && cp.fences.knows_stream(s)) owner = &cp;
    });
    const bool tracked = owner != nullptr;
    // A stream created before the shim started (not tracked) belongs to the current context.
    if (owner == nullptr) owner = rt->current_pool();
    // Blocks only this stream could reuse become pending on a fence recorded on it now, while
    // the handle is still valid. Before the stream leaves the fences' list: the device fence
    // that retiring records for free()d blocks must still cover work pending on it.
    if (owner != nullptr) owner->pool.retire_stream(stream_id(s, false));
    if (tracked) owner->fences.remove_stream(s);
  }
  return real(s);
}
}  // namespace

CUDAPOOL_EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  return destroy_stream(s, driver_or_empty().cuStreamDestroy_v2);
}
CUDAPOOL_EXPORT CUresult cuStreamDestroy(CUstream s) { return destroy_stream(s, driver_or_empty().cuStreamDestroy); }

CUDAPOOL_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return begin_capture(s, mode, false);
}
CUDAPOOL_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return begin_capture(s, mode, true);
}
// CUDA 10.0's form: no mode argument, the capture is global-mode.
CUDAPOOL_EXPORT CUresult cuStreamBeginCapture(CUstream s) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuStreamBeginCapture == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  park::Door door;  // a park sees this capture, or the capture begins after the restore
  if (door.result() != 0) return door.result();
  capture_may_begin();
  CUresult r = d->cuStreamBeginCapture(s);
  if (r == CUDA_SUCCESS) capture_began(stream_id(s, false), CU_STREAM_CAPTURE_MODE_GLOBAL);
  return r;
}
CUDAPOOL_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuStreamBeginCapture_ptsz == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  park::Door door;  // a park sees this capture, or the capture begins after the restore
  if (door.result() != 0) return door.result();
  capture_may_begin();
  CUresult r = d->cuStreamBeginCapture_ptsz(s);
  if (r == CUDA_SUCCESS) capture_began(stream_id(s, true), CU_STREAM_CAPTURE_MODE_GLOBAL);
  return r;
}
// CUDA 12.3: a capture into an existing graph is a capture like any other for the pool
// (allocations on the stream must become graph nodes; sync allocations follow the mode).
static CUresult begin_capture_to_graph(CUstream s, CUgraph graph, const void* deps, const void* edges, std::size_t n,
                                       CUstreamCaptureMode mode, bool ptsz) {
  const RealDriver* d = real_driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto real = ptsz ? d->cuStreamBeginCaptureToGraph_ptsz : d->cuStreamBeginCaptureToGraph;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  park::Door door;  // a park sees this capture, or the capture begins after the restore
  if (door.result() != 0) return door.result();
  capture_may_begin();
  CUresult r = real(s, graph, deps, edges, n, mode);
  if (r == CUDA_SUCCESS) capture_began(stream_id(s, ptsz), mode);
  return r;
}
CUDAPOOL_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph graph, const void* deps, const void* edges,
                                                     std::size_t n, CUstreamCaptureMode mode) {
  return begin_capture_to_graph(s, graph, deps, edges, n, mode, false);
}
CUDAPOOL_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph graph, const void* deps,
                                                          const void* edges, std::size_t n, CUstreamCaptureMode mode) {
  return begin_capture_to_graph(s, graph, deps, edges, n, mode, true);
}
CUDAPOOL_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* graph) { return end_capture(s, graph, false); }
CUDAPOOL_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* graph) { return end_capture(s, graph, true); }

// Peer access enabled from the current context to `peer`: the driver grants it for cudaMalloc
// memory; expandable pages need their access list extended (Runtime::peer_access_enabled).
// "Already enabled" still means the program may use the peer's memory: the grant is recorded too.
CUDAPOOL_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->cuCtxEnablePeerAccess == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  park::Door door;  // a park sees the peer access, or it is enabled after the restore
  if (door.result() != 0) return door.result();
  const CUresult r = d->cuCtxEnablePeerAccess(peer, flags);
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) park::note_peer_access();
  Runtime* rt = Runtime::peek();
  CUdevice accessor = -1;
  if ((r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) && rt != nullptr &&
      d->cuCtxGetDevice(&accessor) == CUDA_SUCCESS) {
    rt->peer_access_enabled(peer, accessor);
  }
  return r;
}
