// The event trace: one CSV row per pool event. See docs/trace-format.md for the format.
//
// The first six columns are RMM's logging_resource_adaptor columns, so RMM's replay benchmark
// (after filtering to allocate/free rows) and pandas scripts written for RMM logs read it:
//   Thread,Time,Action,Pointer,Size,Stream,device,requested,time_ns,duration_ns,detail
// `detail` says what replay needs to be faithful: the kind of free call on `free` rows, the kind
// of a stream on `stream` rows, the process's policy on the `policy` row (docs/trace-format.md).
// Traces written before that column existed (10 columns) are read too.
//
// Cost model: on_event() stores a fixed-size binary record in a preallocated buffer under one
// mutex; formatting and write(2) happen only when the buffer fills, on flush(), at exit, or from
// the shim's signal path. Nothing is formatted or allocated per event.
#pragma once
#include <cstddef>
#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/events.h"

namespace cudapool {

// Actions as written in the Action column. The first three are RMM's.
enum class TraceAction : std::uint8_t {
  allocate,          // "allocate"
  free,              // "free"
  allocate_failure,  // "allocate failure"
  segment_alloc,     // "segment_alloc"
  segment_free,      // "segment_free"
  segment_map,       // "segment_map"
  segment_unmap,     // "segment_unmap"
  oom,               // "oom"
  gc,                // "gc"
  empty_cache,       // "empty_cache"
  fence_wait,        // "fence_wait": the host blocked on a fence (duration_ns)
  gpu_wait,          // "gpu_wait": pending memory (Size bytes) reused, the GPU waits for its fences
  device,            // "device": Size = the device's total memory (written once per pool)
  policy,            // "policy": detail = the effective policy as a CUDAPOOL_CONF string (once)
  stream,            // "stream": a stream the program created; detail = its kind
  // Pinned host memory (pinned_cache): not the device pool's, so replays and reports of device
  // memory pass over them. Pointer = the host address, Size = the block, requested = the
  // program's size, device = the device of the context the memory belongs to.
  pinned_allocate,  // "pinned_allocate": cudaHostAlloc / cudaMallocHost served by the pinned pool
  pinned_free,      // "pinned_free": cudaFreeHost of such a block
};
// The last action (readers iterate up to it).
inline constexpr TraceAction kLastTraceAction = TraceAction::pinned_free;

// The `detail` column, as a code (the policy row's text is kept by the reader, not per row).
enum class TraceDetail : std::uint8_t {
  none,                 // ""
  free_sync,            // free row: "sync" = cudaFree / cuMemFree (DevicePool::free)
  free_async,           // free row: "async" = cudaFreeAsync / cuMemFreeAsync (free_on_stream)
  stream_blocking,      // stream row: "blocking" (synchronizes with the legacy default stream)
  stream_non_blocking,  // stream row: "non_blocking" (CU_STREAM_NON_BLOCKING)
  policy,               // policy row: the text is TraceReader::policy()
  device_facts,         // device row: the text is TraceReader::device_facts() (device_facts_text)
};
const char* trace_detail_name(TraceDetail d) noexcept;

const char* trace_action_name(TraceAction a) noexcept;
TraceAction trace_action_of(EventKind k) noexcept;

// The largest device ordinal a trace may hold. CUDA's are small; a larger one is a crafted or
// broken trace, and the tools would size things by it (a snapshot has one list per device).
inline constexpr std::int32_t kMaxTraceDevice = 1023;

// One row of a trace, as written and as read back.
struct TraceRow {
  std::uint64_t thread = 0;  // OS thread id (gettid), like RMM's spdlog %t
  std::int64_t time_ns = 0;  // ns since the Unix epoch (CLOCK_REALTIME at trace start +
                             // CLOCK_MONOTONIC since). Plain RMM logs: ns since midnight.
  TraceAction action = TraceAction::allocate;
  std::uintptr_t ptr = 0;
  std::size_t size = 0;  // rounded block size (allocate/free), segment size, bytes freed…
  std::uintptr_t stream = 0;
  int device = 0;                          // plain RMM logs: 0
  std::size_t requested = 0;               // the caller's size; plain RMM logs: = size
  std::int64_t duration_ns = 0;            // upstream events: time the upstream took; else 0
  TraceDetail detail = TraceDetail::none;  // older traces and RMM logs: none
  // allocate rows of a trace recorded with trace_call_sites: where the program allocated, as a
  // 1-based index into TraceReader::sites() (TraceMeta::sites); 0 = not recorded.
  std::uint32_t site = 0;
};

class TraceWriter : public EventSink {
 public:
  struct Options {
    std::size_t buffer_records = 8192;  // records buffered before a flush (≈ 64 B each)
  };

  // Creates/truncates `path` (patterns of expand_path_pattern are expanded; opened as
  // sys/output_file.h says: a symbolic link there is refused, a new file has mode 0600) and
  // writes the header. nullptr and *error set on failure. The writer registers itself so that exit()
  // and flush_all_writers() flush it.
  static std::unique_ptr<TraceWriter> open(const std::string& path, std::string* error);
  static std::unique_ptr<TraceWriter> open(const std::string& path, const Options& options, std::string* error);
  // Writes the "policy" row (call once, right after open): `conf` is the process's effective
  // policy as a CUDAPOOL_CONF string, so that a replay can default to it.
  void note_policy(const std::string& conf);
  // From now on, allocate rows also record where the program made the allocation: its return
  // addresses outside this library, as "module+0xoffset" (policy key trace_call_sites). Costs a
  // stack walk per allocation.
  void record_call_sites(bool on);
  // Takes the calling thread's return addresses for its next allocate event (call it before the
  // pool runs: no pool lock may be held, the unwinder takes the loader's lock).
  static void capture_call_site() noexcept;
  // Writes a "stream" row: the program created `stream`, non-blocking or not.
  void note_stream(std::uintptr_t stream, bool non_blocking);
  // Writes a "pinned_allocate" (allocate true) or "pinned_free" row: a block of pinned host
  // memory of `size` bytes (the program asked for `requested`) at `ptr`, belonging to a context
  // of `device`.
  void note_pinned(bool allocate, int device, std::uintptr_t ptr, std::size_t size, std::size_t requested);
  // Flushes and closes.
  ~TraceWriter() override;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // EventSink: records the event with the current thread and time. Thread-safe.
  void on_event(const Event& e) override;
  // Writes a "device" row: the pool of `device` starts, the device has `total_bytes` memory and
  // maps expandable pages in multiples of `granularity` bytes (0: it cannot map pages); the row's
  // detail says so, with the pool's allocation units (device_facts_text).
  void note_device(int device, std::size_t total_bytes, std::size_t granularity);
  // Writes every buffered row to the file. Thread-safe.
  void flush();
  // Rows recorded so far (written or buffered).
  std::uint64_t rows() const;
  const std::string& path() const;

  // Flushes every open writer. Runs automatically from an atexit handler.
  static void flush_all_writers() noexcept;
  // For the shim's signal handler (e.g. SIGTERM it intercepts before re-raising): flushes every
  // writer whose lock can be taken without blocking, using only write(2) and preallocated memory
  // (no malloc, no stdio). A writer busy in another thread at that instant is skipped.
  static void flush_all_writers_from_signal() noexcept;

  struct Impl;

 private:
  explicit TraceWriter(std::unique_ptr<Impl> impl);
  void write_text_row(TraceRow row, const std::string& text);
  std::unique_ptr<Impl> impl_;
};

// Formats one row (no newline) exactly as the writer does. Used by tests and tools. The text of a
// policy row (the policy), of a device row with TraceDetail::device_facts, or of an allocate row
// with a site (the call site) is `text` (quoted as CSV wants).
std::string format_trace_row(const TraceRow& row, const std::string& text = "");

// What a replay needs to know about the recording device and pool besides the policy, as the
// device row's detail: "granularity:N" (the driver's page size for expandable segments, 0 when
// it has none) and this build's allocation units in bytes (min_block, small_size, small_buffer,
// min_large_alloc, large_buffer, round_large; allocator/types.h), comma-separated key:value.
std::string device_facts_text(std::size_t granularity);
// The header line (no newline).
const char* trace_header() noexcept;

// A line of a trace longer than this is refused as soon as that many bytes have passed without a
// newline: rows are < 256 bytes, a call site < 1 KiB, a policy a few hundred bytes.
inline constexpr std::size_t kMaxTraceLineBytes = 64 * 1024;
// The distinct call sites a trace may hold, and their bytes together (each site is held once).
inline constexpr std::size_t kMaxTraceSites = std::size_t{1} << 16;
inline constexpr std::size_t kMaxTraceSiteBytes = std::size_t{32} << 20;

// Strict reader for cudapool traces (10 columns) and plain RMM logs (6 columns). The header
// decides which. Every malformed line is an error naming its line number and what is wrong;
// reading stops at the first error. Never throws on bad input. A line is at most
// kMaxTraceLineBytes long; what the reader keeps besides the row it returns (the first policy,
// one device row per device, the call sites) is bounded too, so its memory does not grow with
// the input. Rows are the caller's to bound (read_trace_stream does, with TraceLimits).
class TraceReader {
 public:
  explicit TraceReader(std::istream& in);
  // Reads the next row into *row. false at end of input or on error (then error() is non-empty).
  bool next(TraceRow* row);
  const std::string& error() const { return error_; }
  // 1-based number of the last line read.
  std::size_t line() const { return line_; }
  // Bytes of the input taken so far: the lines read, with their newlines, and the header.
  std::uint64_t bytes() const { return bytes_; }
  // true when the input is a plain RMM log (6 columns).
  bool rmm_only() const { return rmm_only_; }
  // Columns of the format: 6 (RMM log), 10 (cudapool trace without detail), 11 (current).
  int columns() const { return columns_; }
  // The text of the policy row, once it was read (the first one, if several).
  const std::optional<std::string>& policy() const { return policy_; }
  // The device rows' detail text by device (the first per device; traces written before the
  // device row had one lack it).
  const std::map<int, std::string>& device_facts() const { return device_facts_; }
  // The call sites of allocate rows, each once; TraceRow::site is 1 + the index here. A site is
  // frames innermost first, separated by ';', each "module+0xoffset" or "module+0xoffset symbol".
  const std::vector<std::string>& sites() const { return sites_; }
  // Set when reading stopped early without an error: the last line was cut short (a program
  // killed while its trace was being written). "line N: …" says where and why.
  const std::string& warning() const { return warning_; }

 private:
  bool read_header();
  bool next_line(std::string_view* line);
  bool next_row(TraceRow* row);
  // Columns 1 to 10 of a row, then the 11th (the detail), into *r; false with error_ set.
  bool read_columns(const std::string_view (&f)[11], TraceRow* r);
  bool read_detail(std::string_view d, TraceRow* r);
  // The call site `text` (read from the detail `d`) as an index into sites_, kept once.
  bool add_site(std::string_view d, std::string text, TraceRow* r);
  static const char* quoted(std::string_view field, std::string* text);
  bool fail(std::string what);
  bool bad_column(std::size_t col, std::string_view value, const std::string& what);
  std::istream& in_;
  std::string buf_;  // a window of the input; lines are views into it
  std::size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
  std::string error_;
  std::size_t line_ = 0;
  std::uint64_t bytes_ = 0;
  bool header_done_ = false;
  bool rmm_only_ = false;
  int columns_ = 0;
  std::optional<std::string> policy_;
  std::map<int, std::string> device_facts_;
  std::vector<std::string> sites_;
  std::map<std::string, std::uint32_t> site_ids_;
  std::size_t site_bytes_ = 0;  // of the distinct sites held
  std::string warning_;
  bool unterminated_ = false;  // the line just read ended the input without a newline
};

// What a trace read whole into memory (read_trace_stream) may hold: rows (each kept as a TraceRow
// of 80 bytes, and the tools build more per row), and bytes of text, which bounds the time a
// trace of long rows or a gzip file that inflates a thousandfold takes before it is refused.
inline constexpr std::uint64_t kDefaultMaxTraceRows = 5'000'000;
inline constexpr std::uint64_t kTraceBytesPerRow = 512;  // the text bound: this much per row of the bound
struct TraceLimits {
  std::uint64_t max_rows = kDefaultMaxTraceRows;
  std::uint64_t max_bytes = kDefaultMaxTraceRows * kTraceBytesPerRow;
  // max_rows rows and kTraceBytesPerRow bytes of text for each (0: the default).
  static TraceLimits for_rows(std::uint64_t rows);
};

// What a trace says about itself besides its rows.
struct TraceMeta {
  int columns = 0;                          // 6, 10 or 11 (see TraceReader::columns)
  std::optional<std::string> policy;        // the recorded policy, when the trace has a policy row
  std::map<int, std::string> device_facts;  // TraceReader::device_facts
  std::vector<std::string> sites;           // TraceReader::sites
  std::string warning;                      // TraceReader::warning, as "path:N: …"
  bool over_limit = false;                  // reading stopped at a bound of TraceLimits
};

// Reads a whole trace from `in`. On error returns false with *error = "name:line: what", or
// "name: more than N rows (the limit)" / "name: more than N bytes of text (the limit)" with
// meta->over_limit set once a bound of `limits` is passed (reading stops there).
bool read_trace_stream(std::istream& in, const std::string& name, std::vector<TraceRow>* rows, std::string* error,
                       TraceMeta* meta = nullptr, const TraceLimits& limits = {});
// The same for the file at `path` (named so in errors).
bool read_trace_file(const std::string& path, std::vector<TraceRow>* rows, std::string* error,
                     TraceMeta* meta = nullptr, const TraceLimits& limits = {});

}  // namespace cudapool
