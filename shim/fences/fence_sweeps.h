// Sweeps of a context's non-blocking streams, which the legacy stream does not cover. A device
// fence recorded as a legacy-stream event while such streams exist is complete once that event
// has completed AND a sweep begun after it has finished (its `cover`). A sweep records an event on
// each non-blocking stream, makes the GATHER stream (a non-blocking stream no program work runs
// on, made at the first sweep) wait for each, and records one event there, which completes once
// everything issued on every non-blocking stream before the sweep has. Should the gather stream
// fail to be made, a sweep asks each stream instead (cuStreamQuery: an idle stream has finished
// everything issued on it so far) and records events on the busy ones. One sweep serves every
// fence recorded before it; queries begin one at most once per kSweepGapNs, urgent asks at once.
// (Costs, measured: shim/fences/cuda_fences.h.) Not thread-safe: used under the fences' lock, with the
// context current where it records (begin()).
#pragma once
#include <cstdint>
#include <vector>

#include "shim/fences/event_pool.h"
#include "shim/fences/fence_context.h"
#include "shim/fences/fence_streams.h"

namespace cudapool::shim {

class FenceSweeps {
 public:
  // Minimum time between sweeps begun by queries. A sweep asking 16 idle streams cost ResNet-50
  // inference under PyTorch ~34 µs of cuStreamQuery on a lent H100 (~2 µs a call), the largest
  // part of the pool's host time there (tests/gpu/host_sampler.cpp); at one sweep per millisecond
  // that was ~5 % of a CPU-bound step. Every 4 ms cut its stream queries by a quarter with the
  // same peak: memory wanted sooner begins its own sweep (query_urgent, order_after). Timed by
  // the pool's clock (allocator/pool_clock.h), as the pool's own back-offs are: a test drives it.
  static constexpr std::int64_t kSweepGapNs = 4'000'000;

  FenceSweeps(const RealDriver& d, FenceContext& context, EventPool& events, const FenceStreams& streams,
              FenceCalls& calls)
      : d_(d), context_(context), events_(events), streams_(streams), calls_(calls) {}

  // The sweep a fence recorded now needs (0: none, no non-blocking stream); noted as wanted.
  std::uint64_t cover_for_new();
  // A finished sweep covers `cover`; may begin one once gap_ns has passed since the last (0: at
  // once), never while a capture is open.
  bool covered(std::uint64_t cover, std::int64_t gap_ns);
  // A sweep begun already covers `cover` (it can be waited for without a new one).
  bool begun_for(std::uint64_t cover) const noexcept { return cover <= started_; }
  // Some fence waits for a sweep not begun yet.
  bool wanted() const noexcept { return cover_wanted_ > started_; }
  // Host-waits until a sweep covering `cover` has finished (begun now if needed and no capture is
  // open; a warning where the streams' work cannot all be covered).
  void wait_for(std::uint64_t cover);
  // A new sweep, now (the context made current if needed).
  void begin();
  // The legacy stream waits for the sweep's events still running; `*only`: the single stream they
  // are all on (nullptr if several). False where a stream has no event or a wait failed.
  bool legacy_waits_for_running(CUstream* only);
  void reset() noexcept;  // the context is gone, with the gather stream

 private:
  struct SweepEvent {
    CUevent event;  // nullptr: none could be recorded (the sweep cannot finish)
    CUstream stream;
  };
  void begin_now();
  bool gather_stream();  // the gather stream exists (made at the first sweep)
  void sweep_by_gathering();
  bool gather_one(CUstream s);  // s's work joins the gather stream (false: marked otherwise, or not at all)
  void sweep_by_queries();      // without a gather stream: cuStreamQuery each, events on the busy ones
  bool finished();              // the sweep in flight has finished
  bool unmarked() const;        // a busy stream of the sweep in flight has no event

  const RealDriver& d_;
  FenceContext& context_;
  EventPool& events_;
  const FenceStreams& streams_;
  FenceCalls& calls_;
  // Ids count up from 1; every fence with cover <= done_ is covered.
  std::uint64_t started_ = 0;
  std::uint64_t done_ = 0;
  std::uint64_t cover_wanted_ = 0;  // the highest cover handed to a fence
  std::int64_t last_ns_ = 0;
  // The events of the sweep in flight: the gather stream's one (plus any stream whose wait could
  // not be made), or, asking each stream, one per busy stream.
  std::vector<SweepEvent> events_in_flight_;
  CUstream gather_ = nullptr;   // the gather stream
  bool gather_failed_ = false;  // it could not be created: sweeps ask each stream
};

}  // namespace cudapool::shim
