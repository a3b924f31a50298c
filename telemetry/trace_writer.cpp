// The trace writer. Hot path (on_event): read two clocks' worth of state, take one mutex, copy a
// 64-byte record into a preallocated array. Slow path (flush_locked): format the records into a
// preallocated char buffer and write(2) it. Both paths avoid malloc and stdio so the same flush
// can run from atexit and from a signal handler.
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "telemetry/logging.h"
#include "telemetry/trace.h"
#include "telemetry/trace_format.h"

namespace cudapool {
namespace {

std::int64_t mono_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

std::int64_t real_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

// gettid is a syscall; cache it per thread (RMM's spdlog %t is the same number).
std::uint64_t thread_id() noexcept {
  static thread_local std::uint64_t tid = 0;
  if (tid == 0) tid = static_cast<std::uint64_t>(::syscall(SYS_gettid));
  return tid;
}

bool write_all(int fd, const char* p, std::size_t n) noexcept {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Binary record: what on_event copies. Time is monotonic here; converted to epoch at format time.
struct Record {
  std::int64_t mono_ns;
  std::uint64_t thread;
  std::uintptr_t ptr;
  std::size_t size;
  std::size_t requested;
  std::uintptr_t stream;
  std::int64_t duration_ns;
  std::int32_t device;
  TraceAction action;
};

constexpr std::size_t kOutBytes = 64 * 1024;

}  // namespace

struct TraceWriter::Impl {
  std::mutex mu;
  int fd = -1;
  std::string path;
  Record* records = nullptr;  // preallocated, `capacity` entries
  std::size_t capacity = 0;
  std::size_t count = 0;
  char* out = nullptr;        // preallocated, kOutBytes
  std::int64_t base_real_ns = 0;
  std::int64_t base_mono_ns = 0;
  std::int64_t utc_offset_s = 0;
  std::atomic<std::uint64_t> rows{0};
  std::atomic<bool> write_failed{false};
  // Set in a forked child: the trace belongs to the parent; the child's copy must never write
  // (and must not take `mu`, which another parent thread may have held at fork time).
  std::atomic<bool> disowned{false};

  ~Impl() {
    std::free(records);
    std::free(out);
  }

  void push_locked(const Record& r) {
    if (count == capacity) flush_locked();
    records[count++] = r;
    rows.fetch_add(1, std::memory_order_relaxed);
  }

  void flush_locked() noexcept {
    if (count == 0 || fd < 0) {
      count = 0;
      return;
    }
    std::size_t used = 0;
    TraceRow row;
    for (std::size_t i = 0; i < count; ++i) {
      const Record& r = records[i];
      row.thread = r.thread;
      row.time_ns = base_real_ns + (r.mono_ns - base_mono_ns);
      row.action = r.action;
      row.ptr = r.ptr;
      row.size = r.size;
      row.stream = r.stream;
      row.device = r.device;
      row.requested = r.requested;
      row.duration_ns = r.duration_ns;
      used += trace_detail::format_row(row, utc_offset_s, out + used);
      if (kOutBytes - used < trace_detail::kMaxRowChars) {
        if (!write_all(fd, out, used)) write_failed.store(true, std::memory_order_relaxed);
        used = 0;
      }
    }
    if (used > 0 && !write_all(fd, out, used)) write_failed.store(true, std::memory_order_relaxed);
    count = 0;
  }
};

namespace {

// Open writers, for the exit and signal flushes. Fixed slots of atomics: walkable from a signal
// handler without locks or allocation.
constexpr std::size_t kMaxWriters = 64;
std::array<std::atomic<TraceWriter::Impl*>, kMaxWriters> g_writers{};
std::once_flag g_hooks_once;

void flush_impl(TraceWriter::Impl* w) noexcept {
  if (w->disowned.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(w->mu);
  w->flush_locked();
}

void at_exit_flush() { TraceWriter::flush_all_writers(); }

void in_forked_child() {
  for (auto& slot : g_writers) {
    if (TraceWriter::Impl* w = slot.load(std::memory_order_acquire)) {
      w->disowned.store(true, std::memory_order_relaxed);
    }
  }
}

bool register_writer(TraceWriter::Impl* w) {
  std::call_once(g_hooks_once, [] {
    std::atexit(at_exit_flush);
    pthread_atfork(nullptr, nullptr, in_forked_child);
  });
  for (auto& slot : g_writers) {
    TraceWriter::Impl* expected = nullptr;
    if (slot.compare_exchange_strong(expected, w, std::memory_order_acq_rel)) return true;
  }
  return false;
}

void unregister_writer(TraceWriter::Impl* w) {
  for (auto& slot : g_writers) {
    TraceWriter::Impl* expected = w;
    if (slot.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel)) return;
  }
}

}  // namespace

std::unique_ptr<TraceWriter> TraceWriter::open(const std::string& path, std::string* error) {
  return open(path, Options{}, error);
}

std::unique_ptr<TraceWriter> TraceWriter::open(const std::string& path, const Options& options,
                                               std::string* error) {
  auto impl = std::make_unique<Impl>();
  impl->path = expand_path_pattern(path);
  impl->capacity = options.buffer_records > 0 ? options.buffer_records : 1;
  impl->records = static_cast<Record*>(std::malloc(impl->capacity * sizeof(Record)));
  impl->out = static_cast<char*>(std::malloc(kOutBytes));
  if (impl->records == nullptr || impl->out == nullptr) {
    if (error) *error = "out of host memory for the trace buffer";
    return nullptr;
  }
  impl->fd = ::open(impl->path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (impl->fd < 0) {
    if (error) *error = "cannot open trace file '" + impl->path + "': " + std::strerror(errno);
    return nullptr;
  }
  std::string header = std::string(trace_header()) + "\n";
  if (!write_all(impl->fd, header.data(), header.size())) {
    if (error) *error = "cannot write trace file '" + impl->path + "': " + std::strerror(errno);
    ::close(impl->fd);
    return nullptr;
  }
  impl->base_mono_ns = mono_ns();
  impl->base_real_ns = real_ns();
  impl->utc_offset_s = trace_detail::local_utc_offset_s();
  if (!register_writer(impl.get())) {
    if (error) *error = "too many open trace writers";
    ::close(impl->fd);
    return nullptr;
  }
  return std::unique_ptr<TraceWriter>(new TraceWriter(std::move(impl)));
}

TraceWriter::TraceWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TraceWriter::~TraceWriter() {
  unregister_writer(impl_.get());
  if (!impl_->disowned.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->flush_locked();
  }
  if (impl_->fd >= 0) ::close(impl_->fd);
}

void TraceWriter::on_event(const Event& e) {
  Impl& w = *impl_;
  if (w.disowned.load(std::memory_order_relaxed)) return;
  Record r;
  r.mono_ns = mono_ns();
  r.thread = thread_id();
  r.ptr = e.ptr;
  r.size = e.size;
  r.requested = e.requested;
  r.stream = e.stream;
  r.duration_ns = e.duration_ns;
  r.device = e.device;
  r.action = trace_action_of(e.kind);
  std::lock_guard<std::mutex> lock(w.mu);
  w.push_locked(r);
  // A failed allocation is often followed by the program dying: put the trace on disk now.
  if (e.kind == EventKind::oom || e.kind == EventKind::allocate_failure) w.flush_locked();
}

void TraceWriter::note_device(int device, std::size_t total_bytes) {
  Impl& w = *impl_;
  if (w.disowned.load(std::memory_order_relaxed)) return;
  Record r{};
  r.mono_ns = mono_ns();
  r.thread = thread_id();
  r.size = total_bytes;
  r.requested = total_bytes;
  r.device = device;
  r.action = TraceAction::device;
  std::lock_guard<std::mutex> lock(w.mu);
  w.push_locked(r);
}

void TraceWriter::flush() { flush_impl(impl_.get()); }

std::uint64_t TraceWriter::rows() const { return impl_->rows.load(std::memory_order_relaxed); }

const std::string& TraceWriter::path() const { return impl_->path; }

void TraceWriter::flush_all_writers() noexcept {
  for (auto& slot : g_writers) {
    if (Impl* w = slot.load(std::memory_order_acquire)) flush_impl(w);
  }
}

void TraceWriter::flush_all_writers_from_signal() noexcept {
  for (auto& slot : g_writers) {
    Impl* w = slot.load(std::memory_order_acquire);
    if (w == nullptr || w->disowned.load(std::memory_order_relaxed)) continue;
    // try_lock: the interrupted thread may hold the lock; blocking here would deadlock.
    if (!w->mu.try_lock()) continue;
    w->flush_locked();
    w->mu.unlock();
  }
}

}  // namespace cudapool
