// The dump signal (policy key dump_signal, off by default): on the signal the process logs the
// pool stats table and a compact snapshot of every device, flushes the trace and keeps running.
//
// The handler only writes one byte to a pipe (async-signal-safe) and then calls any handler the
// program had installed before; a background thread, started with the handler, reads the pipe
// and does the work with CPU-only pool calls (stats(), snapshot()), never CUDA.
// What goes into the dump is the runtime's to gather (its pools), given here as a function, so
// this file knows nothing of the runtime.
#pragma once
#include <string>
#include <vector>

#include "allocator/stats.h"

namespace cudapool {
class TraceWriter;
struct Summary;
}  // namespace cudapool

namespace cudapool::shim {

// Makes the dump text for signal `signo`, on the reader thread; empty: nothing to dump yet.
using DumpTextFn = std::string (*)(int signo);

// Installs the handler for `signo` (sigaction, SA_RESTART, chaining the previous handler) and
// starts the reader thread, which logs what `text` makes. Once per process; false (with a
// warning logged) if it could not.
bool start_signal_dump(int signo, TraceWriter* trace, DumpTextFn text) noexcept;

// One pool's snapshot, for the dump.
struct DeviceSnapshot {
  int device = 0;
  Snapshot snapshot;
};
// The dump text: the summary table of `s` and, per pool, one line per segment with its blocks.
std::string format_dump(int signo, const Summary& s, const std::vector<DeviceSnapshot>& snapshots);

}  // namespace cudapool::shim
