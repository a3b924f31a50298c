// What the shim logs beyond the hooks' own warnings: the start report (version,
// the effective policy with each key's origin, the hooked entry points), segment and GC events
// through a logging EventSink composed with the trace writer, and the first pass-through of each
// kind. Runtime::start calls start_audit() once; nothing here calls CUDA.
#pragma once
#include <string>

#include "allocator/events.h"
#include "config/policy.h"
#include "shim/pass_kind.h"
#include "shim/signal_dump.h"

namespace cudapool {
class TraceWriter;
}

namespace cudapool::shim {

// Logs the start report, starts the dump-signal handler when the policy names one (its text
// made by `dump_text`), and returns
// the sink the pools should use: `trace` itself (possibly nullptr) unless the logger is at info or
// below when the process starts, then a fan-out that also logs segment/GC/empty-cache events.
// The fan-out is only installed when it will print something, so the default (warn) costs nothing
// on the hot path.
EventSink* start_audit(const Policy& policy, bool native, EventSink* trace, DumpTextFn dump_text) noexcept;

// The trace writer start_audit() was given (nullptr when tracing is off), whatever sink wraps it.
TraceWriter* trace_writer_of(EventSink* sink) noexcept;

// The hooked entry points, as the start line lists them: every name of shim/entry_points.def, which
// are also the names libcudapool.so exports besides the C API.
const char* hooked_entry_points() noexcept;

// Seconds since start_audit() ran (the runtime's start), for reports made while running.
double seconds_since_start() noexcept;

// The start report text (also used by tests through the log).
std::string start_report(const Policy& policy, bool native);

}  // namespace cudapool::shim
