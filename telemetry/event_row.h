// A pool event as a trace row: the one mapping of an event's fields to the row's columns, used by
// the trace writer (telemetry/trace_writer.cpp) and by the tools' simulated recordings
// (tools/row_sink.h). The caller stamps the thread and the time: the writer its clock, a replay
// the trace's own time.
#pragma once
#include "allocator/events.h"
#include "telemetry/trace.h"

namespace cudapool {

// The row of `e`, its thread and time left 0. A free says which call freed it: on a stream
// (cudaFreeAsync) or not (cudaFree); other rows have no detail.
inline TraceRow trace_row_of(const Event& e) noexcept {
  TraceRow row;
  row.action = trace_action_of(e.kind);
  row.ptr = e.ptr;
  row.size = e.size;
  row.requested = e.requested;
  row.stream = e.stream;
  row.device = e.device;
  row.duration_ns = e.duration_ns;
  row.detail = e.kind != EventKind::free ? TraceDetail::none
               : e.on_stream             ? TraceDetail::free_async
                                         : TraceDetail::free_sync;
  return row;
}

}  // namespace cudapool
