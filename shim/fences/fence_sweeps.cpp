#include "shim/fences/fence_sweeps.h"

#include <algorithm>

#include "allocator/pool_clock.h"
#include "shim/fences/streams.h"
#include "shim/log.h"

namespace cudapool::shim {

std::uint64_t FenceSweeps::cover_for_new() {
  // The non-blocking streams are not asked now: the next sweep begun from here on covers them.
  if (!streams_.any_non_blocking()) return 0;
  const std::uint64_t cover = started_ + 1;
  cover_wanted_ = std::max(cover_wanted_, cover);
  return cover;
}

bool FenceSweeps::unmarked() const {
  return std::any_of(events_in_flight_.begin(), events_in_flight_.end(),
                     [](const SweepEvent& se) { return se.event == nullptr; });
}

bool FenceSweeps::covered(std::uint64_t cover, std::int64_t gap_ns) {
  if (cover <= done_) return true;
  if (cover <= started_) {  // the sweep in flight covers it
    if (finished()) return true;
    if (!unmarked()) return false;  // still running; it finishes by itself
    // A busy stream got no event (none could be created or recorded): only a new sweep helps.
  }
  // No sweep begun since the fence: begin one, unless one began less than gap_ns ago (a sweep
  // asks every non-blocking stream; a burst of fences shares one) or a capture is open (a record
  // on a capturing stream would join its graph).
  if (gap_ns > 0 && cudapool::detail::pool_clock_ns() - last_ns_ < gap_ns) return false;
  if (any_capture_active()) return false;
  begin();
  return finished();
}

void FenceSweeps::wait_for(std::uint64_t cover) {
  if (cover <= done_) return;
  // A sweep begun after the fence, with an event on every busy stream (a new one if the one in
  // flight left a busy stream unmarked); none can be begun while a capture is open.
  if (cover > started_ || unmarked()) {
    if (any_capture_active()) {
      log_warn("waiting for a fence while a graph capture is open: non-blocking streams not asked");
      return;
    }
    begin();
  }
  for (const SweepEvent& se : events_in_flight_)
    if (se.event != nullptr) events_.sync(se.event);
  if (unmarked()) {
    log_warn("waiting for a fence: no event could be recorded on a busy non-blocking stream; its work is not covered");
  } else {
    finished();
  }
}

void FenceSweeps::begin() {
  context_.run([&] { begin_now(); });
}

void FenceSweeps::begin_now() {
  // A newer sweep covers everything an older one did: the older one's events are not needed.
  for (const SweepEvent& se : events_in_flight_)
    if (se.event != nullptr) events_.put(se.event);
  events_in_flight_.clear();
  ++started_;
  calls_.add(FenceCall::sweeps);
  last_ns_ = cudapool::detail::pool_clock_ns();
  if (streams_.any_non_blocking()) {
    if (gather_stream())
      sweep_by_gathering();
    else
      sweep_by_queries();
  }
  if (events_in_flight_.empty()) done_ = started_;
}

bool FenceSweeps::gather_stream() {
  if (gather_ != nullptr) return true;
  if (gather_failed_ || d_.cuStreamCreate == nullptr || d_.cuStreamWaitEvent == nullptr) return false;
  // The driver's own call, not the hook: the fences' stream is no program stream to track.
  if (d_.cuStreamCreate(&gather_, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    gather_ = nullptr;
    gather_failed_ = true;
    log_warn("could not create the fence stream; sweeps ask each non-blocking stream instead");
    return false;
  }
  return true;
}

bool FenceSweeps::gather_one(CUstream s) {
  CUevent e = events_.take();
  if (e == nullptr) {  // nothing marks this stream's work: the sweep cannot finish
    events_in_flight_.push_back({nullptr, s});
    return false;
  }
  if (!events_.record(e, s)) {
    events_.put(e);
    // Then asked, as a sweep that asks would: any answer but "not ready" (a stream the driver no
    // longer knows) leaves nothing running there; else nothing marks its work.
    bool running = true;
    if (d_.cuStreamQuery != nullptr) {
      calls_.add(FenceCall::stream_query);
      running = d_.cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
    }
    if (running) events_in_flight_.push_back({nullptr, s});
    return false;
  }
  calls_.add(FenceCall::stream_wait);
  if (d_.cuStreamWaitEvent(gather_, e, 0) != CUDA_SUCCESS) {
    events_in_flight_.push_back({e, s});  // asked on its own
    return false;
  }
  // The wait took the work the event marks now; recording the event again does not change it.
  events_.put(e);
  return true;
}

void FenceSweeps::sweep_by_gathering() {
  bool gathered = false;
  for (CUstream s : streams_.non_blocking_streams())
    if (gather_one(s)) gathered = true;
  if (!gathered) return;
  CUevent g = events_.take();
  if (g != nullptr) {
    if (events_.record(g, gather_)) {
      events_in_flight_.push_back({g, gather_});
      return;
    }
    events_.put(g);
  }
  events_in_flight_.push_back({nullptr, gather_});  // the gathered waits are marked by nothing
}

void FenceSweeps::sweep_by_queries() {
  for (CUstream s : streams_.non_blocking_streams()) {
    if (d_.cuStreamQuery != nullptr) {
      calls_.add(FenceCall::stream_query);
      // Idle: everything ever issued on it has finished. Any other answer than "not ready" is
      // an error that leaves nothing running there either.
      if (d_.cuStreamQuery(s) != CUDA_ERROR_NOT_READY) continue;
    }
    // No event to mark the stream's work with (none made, or its record failed): the sweep stays
    // unfinished until a later one gets its events.
    events_in_flight_.push_back({events_.record_new(s), s});
  }
}

bool FenceSweeps::finished() {
  while (!events_in_flight_.empty()) {
    const SweepEvent& se = events_in_flight_.back();
    if (se.event == nullptr || !events_.completed(se.event)) return false;
    events_.put(se.event);
    events_in_flight_.pop_back();
  }
  done_ = started_;
  return true;
}

bool FenceSweeps::legacy_waits_for_running(CUstream* only) {
  CUstream one = nullptr;
  bool several = false;
  for (const SweepEvent& se : events_in_flight_) {
    if (se.event == nullptr) return false;  // that stream's work has no event to wait for
    calls_.add(FenceCall::stream_wait);
    if (d_.cuStreamWaitEvent(CU_STREAM_LEGACY, se.event, 0) != CUDA_SUCCESS) return false;
    if (one == nullptr)
      one = se.stream;
    else if (one != se.stream)
      several = true;
  }
  *only = several ? nullptr : one;
  return true;
}

void FenceSweeps::reset() noexcept {
  events_in_flight_.clear();
  done_ = started_ = cover_wanted_ = 0;
  last_ns_ = 0;
  gather_ = nullptr;  // went with the context
  gather_failed_ = false;
}

}  // namespace cudapool::shim
