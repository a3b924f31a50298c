// The dump signal (policy key dump_signal, off by default): on the signal the process logs the
// pool stats table and a compact snapshot of every device, flushes the trace and keeps running.
//
// The handler only writes one byte to a pipe (async-signal-safe) and then calls any handler the
// program had installed before; a background thread, started with the handler, reads the pipe
// and does the work with CPU-only pool calls (stats(), snapshot()), never CUDA.
#pragma once
#include <string>

namespace cudapool {
class TraceWriter;
}

namespace cudapool::shim {

class Runtime;

// Installs the handler for `signo` (sigaction, SA_RESTART, chaining the previous handler) and
// starts the reader thread. Once per process; false (with a warning logged) if it could not.
bool start_signal_dump(int signo, TraceWriter* trace) noexcept;

// The dump text: the summary table and, per device, one line per segment with its blocks.
std::string format_dump(Runtime& rt, int signo);

}  // namespace cudapool::shim
