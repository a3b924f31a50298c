// An EventSink that keeps the pool's events as trace rows stamped with a clock the caller moves
// (the trace's own time in a replay, simulated time in the generator): the real TraceWriter
// stamps wall-clock time, which a simulation must not.
#pragma once
#include <vector>

#include "allocator/events.h"
#include "telemetry/event_row.h"
#include "telemetry/trace.h"

namespace cudapool::tools {

class RowSink : public EventSink {
 public:
  RowSink(std::vector<TraceRow>* rows, const std::int64_t* now_ns) : rows_(rows), now_(now_ns) {}
  void on_event(const Event& e) override {
    TraceRow r = trace_row_of(e);
    r.thread = 1;
    r.time_ns = *now_;
    rows_->push_back(r);
  }

 private:
  std::vector<TraceRow>* rows_;
  const std::int64_t* now_;
};

}  // namespace cudapool::tools
