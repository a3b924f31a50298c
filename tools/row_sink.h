// An EventSink that keeps the pool's events as trace rows stamped with a clock the caller moves
// (the trace's own time in a replay, simulated time in the generator): the real TraceWriter
// stamps wall-clock time, which a simulation must not.
#pragma once
#include <vector>

#include "allocator/events.h"
#include "telemetry/trace.h"

namespace cudapool::tools {

class RowSink : public EventSink {
 public:
  RowSink(std::vector<TraceRow>* rows, const std::int64_t* now_ns) : rows_(rows), now_(now_ns) {}
  void on_event(const Event& e) override {
    TraceRow r;
    r.thread = 1;
    r.time_ns = *now_;
    r.action = trace_action_of(e.kind);
    r.ptr = e.ptr;
    r.size = e.size;
    r.requested = e.requested;
    r.stream = e.stream;
    r.device = e.device;
    r.duration_ns = e.duration_ns;
    if (e.kind == EventKind::free) r.detail = e.on_stream ? TraceDetail::free_async : TraceDetail::free_sync;
    rows_->push_back(r);
  }

 private:
  std::vector<TraceRow>* rows_;
  const std::int64_t* now_;
};

}  // namespace cudapool::tools
