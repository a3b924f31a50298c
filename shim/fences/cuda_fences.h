// The pool's FenceProvider on CUDA events, for one context: a facade over the fence layer's
// parts, each in its own file: recycled events (shim/fences/event_pool.h), the context made current
// (shim/fences/fence_context.h), the fences themselves (shim/fences/fence_record.h), their order and what is
// known complete (shim/fences/fence_sequence.h), context-wide fences (shim/fences/context_wide_fences.h),
// sweeps of the non-blocking streams (shim/fences/fence_sweeps.h), recording and capture deferral
// (shim/fences/fence_recorder.h), GPU-side ordering (shim/fences/gpu_ordering.h) and the context's streams with
// their per-thread cache (shim/fences/fence_streams.h).
//
// record_device, where the driver has cuCtxRecordEvent (CUDA 12.5) and the context has a
// non-blocking stream: one CONTEXT-WIDE event, which covers the work issued so far on every
// stream of the context, the legacy one included. Otherwise one event on the legacy stream (it
// waits behind every blocking stream and every per-thread default stream: measured on the H200),
// and the context's non-blocking streams, which the legacy stream does not cover, are covered
// lazily by SWEEPS: a sweep records an event on each non-blocking stream, makes the provider's
// own GATHER stream (a non-blocking stream no program work runs on, made at the first sweep)
// wait for each, and records one event there, which completes once everything issued on every
// non-blocking stream before the sweep has. (Should the gather stream fail to be made, a sweep
// asks each stream instead, cuStreamQuery: an idle stream has finished everything issued on it
// so far, and records events on the busy ones.) A device fence recorded while such streams exist
// is complete once its legacy event has completed AND a sweep begun after it has finished.
// Sweeps are begun by a query at most once per kSweepGapNs (one sweep serves every fence
// recorded before it), at once by query_urgent(), wait() and order_after() (memory is wanted
// now), and before a non-blocking stream is destroyed while some fence still needs a sweep.
// Libraries create such streams by the dozen and rarely use them (cuDNN and cuBLAS handles under
// PyTorch: 16 per thread on an H200), so an event on each per fence cost a program more than all
// its kernels' launches; a sweep is shared by many fences, and a context-wide event needs none.
// Why gather (a lent H100, tests/gpu/fence_costs.cpp, 16 idle streams): a query of an idle stream
// costs ~0.3 µs with the GPU idle (4.8 µs a sweep) but ~1.5 µs while the legacy stream has work
// queued (23.6 µs), as it has in a program whose host runs ahead of its GPU, where a record and a
// wait stay ~0.3 and ~0.24 µs: a gathered sweep costs 9.4 µs either way, and its end is one event
// to ask. ResNet-50 inference under PyTorch sweeps ~13 times a step: ~0.3 ms of its host time
// asking, ~0.12 ms gathering.
// Context-wide events are used only while no capture ever began in the process (on a context
// with a capturing stream the driver refuses them and invalidates the capture; shim/fences/streams.h,
// context_wide_begin), and only while they are needed: with a non-blocking stream alive, or an
// earlier context-wide fence not yet seen complete (a legacy event recorded after it would not
// cover what it covers). A refusal turns them off for the context (legacy events and sweeps from
// then on).
// record_stream: one event on that stream.
// Events are created once with CU_EVENT_DISABLE_TIMING (cheapest kind) and recycled.
//
// While a graph capture is in progress, recording on the legacy stream or on a capturing stream
// would become part of the graph (or break it), so such a fence is "deferred": it is recorded at
// the first query after every capture has ended and counts as pending until then; no sweep is
// begun while a capture is open.
//
// order_after (free_sync:gpu_wait; docs/shim.md, "GPU-side waits"): context-wide fences still
// running are ordered by one cuCtxWaitEvent on the newest of them (all work issued from then on,
// on every stream of the context, made before or after, waits for it and so for everything it
// covers, fences recorded before it included). The remaining, legacy-stream fences: their
// still-running events are joined on the legacy stream (it waits for the sweep's events still
// running on non-blocking streams; a sweep is begun for fences no sweep covers yet), one join
// event is recorded there, and every live non-blocking stream waits
// for it; blocking and per-thread streams follow the legacy stream by themselves. So k streams
// cost about 2k waits, not k*k. A fence that is one event on the legacy stream, while the context
// has no non-blocking stream, needs nothing at all: every stream that exists follows the legacy
// stream, which runs the fence before anything issued later (no query, no wait, no join; a
// single-stream program pays no driver call for its reuse; the pool then reuses every batch as
// soon as its fence is recorded, orders_for_free). A non-blocking stream created while
// the newest join event, or the newest fence reused that way, may still run waits for it at
// creation.
// Never while a capture is open (a wait on a capturing stream would become part of its graph,
// and legacy-stream work breaks captures of blocking streams): the pool then keeps the memory
// pending.
//
// Hot-path economy (on an H200: cuEventRecord 0.25-0.5 µs, cuEventQuery 0.33 µs in a tight loop
// and ~1.4 µs in a program that synchronises every iteration, cuCtxGetCurrent per
// ScopedContext): the allocation hook marks the pool's context as current for the calling thread
// (ContextGuard), so recording skips the context check; device fences carry a sequence number,
// and once one is seen complete every older device fence is complete too as far as the newer one
// covers (a legacy event: the legacy stream's work, which completes in order; a context-wide
// event: everything), so older ones are answered without a driver call; likewise a finished
// sweep covers every fence recorded before it began.
#pragma once
#include <cstdint>
#include <mutex>

#include "allocator/fence.h"
#include "shim/driver.h"
#include "shim/fences/context_wide_fences.h"
#include "shim/fences/event_pool.h"
#include "shim/fences/fence_calls.h"
#include "shim/fences/fence_context.h"
#include "shim/fences/fence_record.h"
#include "shim/fences/fence_recorder.h"
#include "shim/fences/fence_sequence.h"
#include "shim/fences/fence_streams.h"
#include "shim/fences/fence_sweeps.h"
#include "shim/fences/gpu_ordering.h"

namespace cudapool::shim {

class CudaFences final : public FenceProvider {
 public:
  // While alive, the calling thread's current context is known to be `ctx` (the hook just read it
  // with cuCtxGetCurrent): fence recording in that context needs no context check. Nests.
  using ContextGuard = FenceContext::Guard;

  CudaFences(const RealDriver& d, CUcontext ctx);

  FenceHandle record_device() override;
  FenceHandle record_stream(StreamId stream) override;
  bool query(FenceHandle fence) override;
  // A sweep may begin at once (the pool missed: asking the streams is cheaper than mapping
  // memory or ordering the GPU), not only kSweepGapNs after the last one.
  bool query_urgent(FenceHandle fence) override;
  void wait(FenceHandle fence) override;
  // False for a fence taken while a capture is open, as long as one still is: it could not be
  // recorded on the legacy stream (that would break the capture), so no wait can cover it.
  bool can_wait(FenceHandle fence) override;
  void release(FenceHandle fence) override;
  bool order_after(const FenceHandle* fences, std::size_t n) override;
  // No capture open, and either no non-blocking stream in the context and no context-wide fence
  // that may still run (order_after of device fences, one legacy-stream event each, makes no
  // driver call: see above), or context-wide fences in use (one cuCtxWaitEvent, with no query,
  // orders every fence recorded so far: cheaper than asking whether they completed).
  bool orders_for_free() override;

  // Stream lifetime, from the stream-creation hooks.
  void add_stream(CUstream s, bool non_blocking);
  // true if the stream was created through the hooks in this context.
  bool remove_stream(CUstream s);
  // On every cuMemFreeAsync: a per-thread cache answers the repeated question without the lock
  // (16 threads freeing on their own streams must not meet on this context's mutex).
  bool knows_stream(CUstream s);

  // The driver calls this provider made so far, by function (the exit summary's driver_calls).
  using CallCounts = FenceCallCounts;
  CallCounts call_counts() const noexcept { return calls_.counts(); }

  // The context is gone: forget every event and stream without calling CUDA. Fences handed out
  // before stay valid handles (they count as complete) but their events are never reused.
  void abandon();

 private:
  bool query_locked(Fence* f, std::int64_t gap_ns);
  void finish_stream_locked(CUstream s);  // host-waits for the work issued on s so far

  const RealDriver& d_;
  std::mutex mu_;
  FenceCalls calls_;
  EventPool events_;
  FenceContext context_;
  FenceStreams streams_;
  FenceSlab slab_;
  FenceSequence seq_;
  ContextWideFences wide_;
  FenceSweeps sweeps_;
  FenceRecorder recorder_;
  GpuOrdering ordering_;
};

}  // namespace cudapool::shim
