// The pool's FenceProvider on CUDA events, for one context.
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
// with a capturing stream the driver refuses them and invalidates the capture; shim/streams.h,
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
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "allocator/fence.h"
#include "shim/driver.h"

namespace cudapool::shim {

class CudaFences final : public FenceProvider {
 public:
  // While alive, the calling thread's current context is known to be `ctx` (the hook just read it
  // with cuCtxGetCurrent): fence recording in that context needs no context check. Nests.
  class ContextGuard {
   public:
    explicit ContextGuard(CUcontext ctx) noexcept;
    ~ContextGuard();
    ContextGuard(const ContextGuard&) = delete;
    ContextGuard& operator=(const ContextGuard&) = delete;

   private:
    CUcontext prev_;
  };

  CudaFences(const RealDriver& d, CUcontext ctx) : d_(d), ctx_(ctx) {}

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

  // The driver calls this provider made so far, by function (the exit summary's driver_calls):
  // what the pool's stream safety costs a program, counted where it is paid.
  struct CallCounts {
    std::int64_t event_record = 0, event_query = 0, event_sync = 0, stream_wait = 0, context_switch = 0,
                 stream_query = 0, sweeps = 0, non_blocking_streams = 0, context_record = 0, context_wait = 0;
  };
  CallCounts call_counts() const noexcept;

  // The context is gone: forget every event and stream without calling CUDA. Fences handed out
  // before stay valid handles (they count as complete) but their events are never reused.
  void abandon();

 private:
  struct Fence {
    std::vector<CUevent> events;
    std::vector<CUstream> on;  // the stream each event was recorded on
    StreamId stream = 0;
    bool device = false;
    bool deferred = false;
    bool done = false;          // complete: its events, and the sweep it needs
    bool events_done = false;   // its own events have completed
    bool context_wide = false;  // its one event is cuCtxRecordEvent's: it needs no sweep
    unsigned generation = 0;
    std::uint64_t seq = 0;    // device fences: recording order (0: not recorded, or legacy record failed)
    std::uint64_t cover = 0;  // device fences: the sweep that covers the non-blocking streams (0: none needed)
  };
  struct SweepEvent {
    CUevent event;  // nullptr: none could be recorded (the sweep cannot finish)
    CUstream stream;
  };
  // Minimum time between sweeps begun by queries (see above). A sweep asking 16 idle streams cost
  // ResNet-50 inference under PyTorch ~34 µs of cuStreamQuery on a lent H100 (~2 µs a call), the
  // largest part of the pool's host time there (tests/gpu/host_sampler.cpp); at one sweep per
  // millisecond that was ~5 % of a CPU-bound step. Every 4 ms cut its stream queries by a quarter
  // with the same peak: memory wanted sooner begins its own sweep (query_urgent, order_after).
  static constexpr std::int64_t kSweepGapNs = 4'000'000;

  Fence* new_fence_locked();
  CUevent take_event_locked();
  bool record_on_locked(Fence* f, CUstream s);
  void record_locked(Fence* f);              // the fence's events, now (context made current by the caller)
  bool record_context_locked(Fence* f);      // a device fence as one context-wide event, where it should be
  bool wait_context_locked(const Fence* f);  // cuCtxWaitEvent on its event
  void record_now_locked(Fence* f);          // record_locked with the context made current if needed
  // Runs f with the pool's context current: as it is when the hook verified it (ContextGuard),
  // else made current around f (ScopedContext, counted as a context switch).
  template <class F>
  auto in_context_locked(F&& f);
  bool query_events_locked(Fence* f);     // asks the driver; notes completion
  bool events_complete_locked(Fence* f);  // its events completed (the newest-fence shortcuts first)
  void note_complete_locked(const Fence* f);
  // A newer fence that covers what f does was seen complete (no driver call).
  bool known_complete_locked(const Fence* f) const;
  void begin_sweep_locked();    // a new sweep, now (see above)
  bool gather_stream_locked();  // the gather stream exists (made at the first sweep)
  void sweep_by_gathering_locked();
  void sweep_by_queries_locked();  // without a gather stream: cuStreamQuery each, events on the busy ones
  bool sweep_finished_locked();    // the sweep in flight has finished
  // A finished sweep covers f; may begin one once gap_ns has passed since the last (0: at once).
  bool covered_locked(const Fence* f, std::int64_t gap_ns);
  bool query_locked(Fence* f, std::int64_t gap_ns);
  void finish_stream_locked(CUstream s);  // host-waits for the work issued on s so far

  const RealDriver& d_;
  CUcontext ctx_;
  std::mutex mu_;
  // Counted under mu_ (or by the one thread that holds it), read at any time: relaxed atomics.
  struct Counter {
    std::atomic<std::int64_t> n{0};
    void add() noexcept { n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
    std::int64_t get() const noexcept { return n.load(std::memory_order_relaxed); }
  };
  Counter n_record_, n_query_, n_sync_, n_wait_, n_ctx_, n_stream_query_, n_sweeps_, n_non_blocking_, n_context_record_,
      n_context_wait_;
  unsigned generation_ = 0;
  std::uint64_t next_seq_ = 1;
  Fence* newest_ = nullptr;  // the newest recorded device fence, until released
  // Every device fence with seq <= completed_seq_ has its legacy event complete (a context-wide
  // fence: its event covers the legacy stream's work too); every one with seq <= completed_all_seq_
  // is complete, whatever it needed (a context-wide fence completed after it).
  std::uint64_t completed_seq_ = 0;
  std::uint64_t completed_all_seq_ = 0;
  std::uint64_t last_context_seq_ = 0;  // the newest context-wide fence's seq
  // The newest fence, as last asked on behalf of an older one and found running, and when
  // (events_complete_locked): within kNewestRecheckNs it is not asked again for another.
  std::uint64_t newest_running_seq_ = 0;
  std::int64_t newest_running_ns_ = 0;
  static constexpr std::int64_t kNewestRecheckNs = 50'000;
  bool context_events_ = true;  // until the driver lacks or refuses them
  // Sweeps (above): ids count up from 1; every fence with cover <= sweep_done_ is covered.
  std::uint64_t sweep_started_ = 0;
  std::uint64_t sweep_done_ = 0;
  std::uint64_t cover_wanted_ = 0;  // the highest cover handed to a fence
  std::int64_t last_sweep_ns_ = 0;
  // The events of the sweep in flight: the gather stream's one (plus any stream whose wait could
  // not be made), or, asking each stream, one per busy stream.
  std::vector<SweepEvent> sweep_events_;
  CUstream gather_ = nullptr;   // the gather stream (above)
  bool gather_failed_ = false;  // it could not be created: sweeps ask each stream
  std::vector<CUevent> free_events_;
  std::vector<Fence*> free_fences_;
  std::vector<CUstream> non_blocking_;
  // The join events of order_after that may still be running: non-blocking streams created later
  // wait for them. Owned here (not in free_events_): the newest join, which covers every older
  // one, and the legacy events of fences released while reused without a join (below).
  std::vector<CUevent> joins_;
  // The newest device fence whose memory order_after handed out without a join (a legacy-stream
  // event, no non-blocking stream then): a non-blocking stream created while it may still run
  // waits for its event. Cleared when the fence is released; its event then joins joins_ unless
  // it is known complete.
  Fence* unjoined_ = nullptr;
  void prune_joins_locked();  // recycles the join events that have completed
  std::vector<CUstream> streams_;
  // Bumped (under mu_) whenever a stream is forgotten: per-thread knows_stream answers made
  // before it are stale.
  std::atomic<unsigned> streams_version_{0};
};

}  // namespace cudapool::shim
