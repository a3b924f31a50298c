// The start report, the logging sink (fan-out with the trace writer) and first-pass-through
// logging. See log_audit.h.
#include "shim/log_audit.h"

#include "config/version.h"

#include <time.h>

#include <atomic>
#include <cstdint>
#include <new>

#include "shim/cudapool.h"
#include "shim/log.h"
#include "shim/signal_dump.h"
#include "telemetry/logging.h"
#include "telemetry/trace.h"

namespace cudapool::shim {
namespace {

TraceWriter* g_trace = nullptr;  // set once by start_audit, before any pool exists
std::int64_t g_start_ns = 0;     // CLOCK_MONOTONIC at start_audit

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Logs the events users ask about (segment traffic with the upstream's time, GC and empty-cache
// passes) and forwards every event to the trace writer, if any. Per-allocation events cost one
// switch here; the sink is only installed when the logger is at info or below.
class LoggingSink final : public EventSink {
 public:
  explicit LoggingSink(EventSink* next) : next_(next) {}
  void on_event(const Event& e) override {
    if (next_ != nullptr) next_->on_event(e);
    const double us = static_cast<double>(e.duration_ns) / 1e3;
    switch (e.kind) {
      case EventKind::segment_alloc:
        log_info("segment alloc on device {}: {} bytes at {:#x} (upstream took {:.1f} us)", e.device, e.size, e.ptr,
                 us);
        break;
      case EventKind::segment_free:
        log_info("segment release on device {}: {} bytes at {:#x} (upstream took {:.1f} us)", e.device, e.size, e.ptr,
                 us);
        break;
      case EventKind::segment_map:
        log_debug("expandable segment on device {}: mapped {} bytes at {:#x} ({:.1f} us)", e.device, e.size, e.ptr, us);
        break;
      case EventKind::segment_unmap:
        log_debug("expandable segment on device {}: unmapped {} bytes at {:#x} ({:.1f} us)", e.device, e.size, e.ptr,
                  us);
        break;
      case EventKind::gc: log_info("GC pass on device {}: freed {} bytes", e.device, e.size); break;
      case EventKind::empty_cache: log_info("empty cache on device {}: released {} bytes", e.device, e.size); break;
      case EventKind::fence_wait: log_debug("device {}: the host waited {:.1f} us for a fence", e.device, us); break;
      case EventKind::gpu_wait:
        log_debug("device {}: {} pending bytes reused, streams wait on the GPU for their fences", e.device, e.size);
        break;
      case EventKind::oom:
        // The hook logs the full diagnosis at warn; this is the upstream refusal itself.
        log_debug("upstream refused a segment of {} bytes on device {}", e.size, e.device);
        break;
      case EventKind::allocate:
      case EventKind::free:
      case EventKind::allocate_failure: break;
    }
  }

 private:
  EventSink* next_;
};

std::atomic<bool> g_pass_logged[static_cast<int>(PassKind::count_)] = {};

const char* pass_reason(PassKind k) {
  switch (k) {
    case PassKind::backend: return "backend is passthrough: every call goes to the driver";
    case PassKind::foreign_pointer: return "a pointer the pool does not own (freed or queried by the driver)";
    case PassKind::capture: return "allocation during CUDA graph capture (served by the driver)";
    case PassKind::no_context: return "calling thread has no current context (the driver answers)";
    case PassKind::exiting:
      return "the process is exiting: frees of pool memory are leaked, allocations go to the driver";
    case PassKind::count_: break;
  }
  return "?";
}

}  // namespace

const char* hooked_entry_points() noexcept {
  // Every exported name of shim/entry_points.def, in its order, each after one space (the first space
  // is skipped).
  static constexpr char kList[] =
#define CUDAPOOL_INTERPOSED(abi) " " #abi
#define CUDAPOOL_HOOK(base, min_version, max_version, flavour, abi, params) " " #abi
#include "shim/entry_points.def"
      ;
  return kList + 1;
}

std::string start_report(const Policy& policy, bool native) {
  std::string s = "cudapool " + std::string(kVersion) + " (C API " + std::to_string(CUDAPOOL_API_VERSION) +
                  ") started, backend " + (native ? "native" : "passthrough") + "\n";
  s += "hooked entry points: " + std::string(hooked_entry_points()) + "\n";
  s += "effective policy (key = value   (origin)):\n";
  s += describe(policy);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

EventSink* start_audit(const Policy& policy, bool native, EventSink* trace, DumpTextFn dump_text) noexcept {
  try {
    g_start_ns = monotonic_ns();
    g_trace = static_cast<TraceWriter*>(trace);  // Runtime::start only ever passes a TraceWriter
    auto& lg = log();
    if (lg.should_log(spdlog::level::info)) lg.info("{}", start_report(policy, native));
    if (policy.dump_signal != 0) start_signal_dump(policy.dump_signal, g_trace, dump_text);
    if (!lg.should_log(spdlog::level::info)) return trace;
    return new LoggingSink(trace);  // leaked with the runtime, like the trace writer
  } catch (...) {
    return trace;
  }
}

TraceWriter* trace_writer_of(EventSink*) noexcept { return g_trace; }

double seconds_since_start() noexcept {
  return g_start_ns == 0 ? 0.0 : static_cast<double>(monotonic_ns() - g_start_ns) / 1e9;
}

void log_first_pass(PassKind k) noexcept {
  const int i = static_cast<int>(k);
  if (i < 0 || i >= static_cast<int>(PassKind::count_)) return;
  if (g_pass_logged[i].exchange(true, std::memory_order_relaxed)) return;
  try {
    log_info("pass-through ({}): {}; further ones are counted, not logged (exit summary)", to_string(k),
             pass_reason(k));
  } catch (...) {
  }
}

}  // namespace cudapool::shim
