// The trace writer.
//
// Hot path (on_event, called under the pool's lock): read the stamp counter, take `mu`, copy a
// 64-byte record into the active buffer. Nothing else.
//
// When the active buffer fills (or every kPeriod, so a live trace can be tailed), it moves to
// the `filled` FIFO and a spare becomes active; a background thread formats filled buffers and
// write(2)s them. If the formatter falls behind and no spare is left, the caller formats the
// oldest buffer itself (back-pressure instead of unbounded memory).
//
// Ordering: the pool calls on_event under its own lock, so the order of records in the buffers
// is the pool's order. `flush_mu` serialises everything that writes to the file and buffers are
// taken oldest first under it, so the file keeps that order.
//
// Exit and signals: at exit (atexit) flush_all_writers() writes out every open writer's rows;
// flush_all_writers_from_signal() drains filled buffers and the active one directly, with
// bounded lock waits, only preallocated memory and write(2) (its rows go without their call
// sites: no symbol lookup in a handler). The formatter thread blocks all signals, so a handler
// never runs on it while it holds `flush_mu`.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>
#include <execinfo.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/path_pattern.h"
#include "sys/output_file.h"
#include "telemetry/clock.h"
#include "telemetry/event_row.h"
#include "telemetry/logging.h"
#include "telemetry/trace.h"
#include "telemetry/trace_format.h"

namespace cudapool {
namespace {

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

struct Record {
  std::uint64_t stamp;  // StampClock counts; converted at format time
  std::uint64_t thread;
  std::uintptr_t ptr;
  std::size_t size;
  std::size_t requested;
  std::uintptr_t stream;
  std::int64_t duration_ns;
  std::int32_t device;
  TraceAction action;
  TraceDetail detail;
  std::uint16_t site;  // allocate: 1 + index into Impl::sites (record_call_sites); 0 = none

  // A row's columns but its time, which the stamp stands for until the record is formatted.
  static Record of(const TraceRow& row, std::uint64_t stamp) noexcept {
    return Record{stamp,      row.thread, row.ptr,    row.size, row.requested, row.stream, row.duration_ns,
                  row.device, row.action, row.detail, 0};
  }
  // Back to the row, its time set from the stamp by the caller.
  TraceRow row() const noexcept {
    TraceRow out;
    out.thread = thread;
    out.action = action;
    out.ptr = ptr;
    out.size = size;
    out.stream = stream;
    out.device = device;
    out.requested = requested;
    out.duration_ns = duration_ns;
    out.detail = detail;
    return out;
  }
};
static_assert(sizeof(Record) == 64, "a record stays one cache line");

// Call sites (record_call_sites): the raw return addresses of the allocating thread, taken by
// capture_call_site before the pool runs (no pool lock held: the unwinder takes the loader's
// lock), consumed by the allocate event that follows on the same thread.
constexpr int kSiteDepth = 16;  // raw frames kept: the library's own and then the program's
constexpr int kSiteFrames = 6;  // frames outside this library written per site
using RawSite = std::array<void*, kSiteDepth>;
thread_local RawSite tl_site{};
thread_local bool tl_site_set = false;

void site_anchor() {}  // an address inside this library, to tell its frames from the program's

struct Buffer {
  Record* records = nullptr;
  std::size_t count = 0;
};

constexpr std::size_t kBuffers = 4;           // 1 active + up to 3 filled/spare
constexpr std::size_t kOutBytes = 64 * 1024;  // formatted bytes per write(2)
constexpr std::size_t kSiteRoom = 1024;       // room kept for a row's call site
constexpr auto kPeriod = std::chrono::milliseconds(200);

// Bounded wait for a lock from a signal handler: the holder is another thread that will let go
// within microseconds; if the holder is the interrupted thread itself, give up rather than hang.
template <class Lockable>
bool try_lock_for_signal(Lockable& m) noexcept {
  for (int i = 0; i < 2000; ++i) {
    if (m.try_lock()) return true;
    timespec ts{0, 25'000};  // 25 µs; nanosleep is async-signal-safe
    nanosleep(&ts, nullptr);
  }
  return false;
}

// The hot-path lock. Critical sections are a 64-byte copy or a pointer swap, so a spinning
// test-and-test-and-set lock (one atomic exchange to take, a plain store to release) beats
// std::mutex (two atomic read-modify-writes). Spinners yield after a while in case the holder
// was preempted.
class SpinLock {
 public:
  void lock() noexcept {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; flag_.load(std::memory_order_relaxed); ++spins) {
        if (spins > 64) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
          __builtin_ia32_pause();
#endif
      }
    }
  }
  bool try_lock() noexcept {
    return !flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

}  // namespace

struct TraceWriter::Impl {
  // ---- guarded by mu ----
  SpinLock mu;
  Buffer active;
  std::array<Buffer, kBuffers> filled{};  // FIFO ring of full buffers
  std::size_t filled_head = 0, filled_count = 0;
  std::array<Record*, kBuffers> spare{};
  std::size_t spare_count = 0;
  std::uint64_t rows = 0;  // recorded so far (a plain counter: we hold mu anyway)
  // ---- guarded by flush_mu (the file side) ----
  std::mutex flush_mu;
  char* out = nullptr;
  trace_detail::StampClock clock;  // now() is const and lock-free; conversion under flush_mu
  // ---- fixed after open ----
  int fd = -1;
  std::string path;
  std::size_t capacity = 0;
  std::int64_t utc_offset_s = 0;
  std::array<Record*, kBuffers> all_records{};
  std::thread formatter;
  // Wakes the formatter when a buffer fills. The producer notifies without taking wake_mu, so a
  // wake-up can be missed; the formatter also wakes every kPeriod, and back-pressure in push()
  // keeps correctness independent of it.
  std::mutex wake_mu;
  std::condition_variable wake_cv;
  std::atomic<bool> wake{false};
  std::atomic<bool> stop{false};
  // ---- atomics ----
  std::atomic<bool> write_failed{false};
  // Set in a forked child: the trace belongs to the parent; the child's copy must never write
  // (and must not take the locks, which parent threads may have held at fork time).
  std::atomic<bool> disowned{false};
  // ---- call sites ----
  std::atomic<bool> call_sites{false};
  std::mutex sites_mu;  // a leaf lock: taken under the pool's, never the other way round
  std::map<RawSite, std::uint16_t> site_ids;
  std::vector<RawSite> sites;
  std::vector<std::string> site_text;  // formatted once each, under flush_mu
  bool in_signal = false;              // the signal flush writes rows without their sites

  std::uint16_t intern_site(const RawSite& raw) {
    std::lock_guard<std::mutex> l(sites_mu);
    auto it = site_ids.find(raw);
    if (it != site_ids.end()) return it->second;
    if (sites.size() >= 0xffff) return 0;
    sites.push_back(raw);
    const auto id = static_cast<std::uint16_t>(sites.size());
    site_ids.emplace(raw, id);
    return id;
  }

  // "module+0xoffset symbol;…" for the program's frames of site `id`. Caller holds flush_mu.
  const std::string& site_string(std::uint16_t id) {
    while (site_text.size() < id) site_text.emplace_back();
    std::string& text = site_text[id - 1];
    if (!text.empty()) return text;
    RawSite raw;
    {
      std::lock_guard<std::mutex> l(sites_mu);
      raw = sites[id - 1];
    }
    Dl_info self{};
    const void* own = dladdr(reinterpret_cast<void*>(&site_anchor), &self) != 0 ? self.dli_fbase : nullptr;
    int kept = 0;
    for (void* pc : raw) {
      if (pc == nullptr || kept == kSiteFrames) break;
      Dl_info info{};
      if (dladdr(pc, &info) == 0 || info.dli_fbase == own) continue;
      const char* module = info.dli_fname != nullptr ? info.dli_fname : "?";
      if (const char* slash = std::strrchr(module, '/')) module = slash + 1;
      char frame[160];
      // The return address minus one: inside the call instruction, so the line it maps to is
      // the call's own.
      const auto off = reinterpret_cast<std::uintptr_t>(pc) - 1 - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
      std::snprintf(frame, sizeof frame, "%.80s+0x%llx%s%.60s", module, static_cast<unsigned long long>(off),
                    info.dli_sname != nullptr ? " " : "", info.dli_sname != nullptr ? info.dli_sname : "");
      for (char* c = frame; *c != '\0'; ++c)
        if (*c == ';' || *c == '"' || *c == ',' || static_cast<unsigned char>(*c) < 0x20) *c = '_';
      if (!text.empty()) text += ';';
      text += frame;
      ++kept;
    }
    if (text.empty()) text = "?";
    return text;
  }

  ~Impl() {
    for (Record* r : all_records) std::free(r);
    std::free(out);
  }

  // Formats and writes one buffer. Caller holds flush_mu.
  void write_buffer(const Record* recs, std::size_t n) noexcept {
    if (n == 0 || fd < 0) return;
    clock.begin_batch();
    std::size_t used = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Record& r = recs[i];
      TraceRow row = r.row();
      row.time_ns = clock.to_epoch_ns(r.stamp);
      used += trace_detail::format_row(row, utc_offset_s, out + used);
      if (r.site != 0 && !in_signal) {
        // The call site goes in the detail column, before the newline (a site is < 1 KiB).
        const std::string q = trace_detail::quote_csv(site_string(r.site)) + "\n";
        if (q.size() <= kSiteRoom) {
          std::memcpy(out + used - 1, q.data(), q.size());
          used += q.size() - 1;
        }
      }
      if (kOutBytes - used < trace_detail::kMaxRowChars + kSiteRoom) {
        if (!write_all(fd, out, used)) write_failed.store(true, std::memory_order_relaxed);
        used = 0;
      }
    }
    if (used > 0 && !write_all(fd, out, used)) write_failed.store(true, std::memory_order_relaxed);
  }

  // Moves the active buffer to the filled FIFO if a spare can replace it. Caller holds mu.
  bool rotate_locked() noexcept {
    if (active.count == 0 || spare_count == 0) return false;
    filled[(filled_head + filled_count) % kBuffers] = active;
    ++filled_count;
    active = Buffer{spare[--spare_count], 0};
    return true;
  }

  // Takes the oldest filled buffer. Caller holds mu.
  Buffer pop_filled_locked() noexcept {
    Buffer b = filled[filled_head];
    filled_head = (filled_head + 1) % kBuffers;
    --filled_count;
    return b;
  }

  // Everything buffered goes to the file: filled buffers oldest first, then the active one.
  // Caller holds flush_mu and mu (the signal path, which must not wait on anything).
  void drain_locked() noexcept {
    while (filled_count > 0) {
      Buffer b = pop_filled_locked();
      write_buffer(b.records, b.count);
      spare[spare_count++] = b.records;
    }
    write_buffer(active.records, active.count);
    active.count = 0;
  }

  // Formats the oldest filled buffer, if any. Caller holds flush_mu, not mu.
  bool write_oldest() noexcept {
    Buffer b;
    {
      std::lock_guard<SpinLock> lock(mu);
      if (filled_count == 0) return false;
      b = pop_filled_locked();
    }
    write_buffer(b.records, b.count);
    std::lock_guard<SpinLock> lock(mu);
    spare[spare_count++] = b.records;
    return true;
  }

  void formatter_loop() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    while (true) {
      {
        std::unique_lock<std::mutex> wl(wake_mu);
        wake_cv.wait_for(wl, kPeriod, [this] { return stop.load() || wake.load(); });
        wake.store(false);
      }
      if (stop.load()) return;
      std::lock_guard<std::mutex> f(flush_mu);
      {
        std::lock_guard<SpinLock> lock(mu);
        if (filled_count == 0) rotate_locked();  // periodic: make recent rows visible
      }
      while (write_oldest()) {
      }
    }
  }

  // A row recorded now on this thread (unless the writer was disowned).
  void push_now(TraceRow row) noexcept {
    if (disowned.load(std::memory_order_relaxed)) return;
    const std::uint64_t stamp = clock.now();
    row.thread = thread_id();
    push(Record::of(row, stamp));
  }

  void push(const Record& r) noexcept {
    std::unique_lock<SpinLock> lock(mu);
    while (active.count == capacity) {
      if (rotate_locked()) {
        wake.store(true, std::memory_order_relaxed);
        wake_cv.notify_one();
        break;
      }
      // No spare: the formatter is behind. Format the oldest buffer here (lock order is
      // flush_mu before mu, so let go of mu first).
      lock.unlock();
      {
        std::lock_guard<std::mutex> f(flush_mu);
        write_oldest();
      }
      lock.lock();
    }
    active.records[active.count++] = r;
    ++rows;
  }

  // Writes every row recorded before the call. mu is held only to move buffers, so producers
  // are not stalled while rows are formatted.
  void flush() noexcept {
    std::lock_guard<std::mutex> f(flush_mu);
    {
      std::unique_lock<SpinLock> lock(mu);
      // No spare means every other buffer is filled: write the oldest first (order), then move
      // the active buffer behind the rest.
      while (active.count > 0 && !rotate_locked()) {
        Buffer b = pop_filled_locked();
        lock.unlock();
        write_buffer(b.records, b.count);
        lock.lock();
        spare[spare_count++] = b.records;
      }
    }
    while (write_oldest()) {
    }
  }
};

namespace {

// Open writers, for the exit and signal flushes. Fixed slots of atomics: walkable from a signal
// handler without locks or allocation.
constexpr std::size_t kMaxWriters = 64;
std::array<std::atomic<TraceWriter::Impl*>, kMaxWriters> g_writers{};
std::once_flag g_hooks_once;

// Set once the exit flush ran. Events after it come from code that runs later in the exit
// sequence (static destructors of libraries loaded earlier, e.g. a CUDA runtime freeing its
// memory at teardown); those rows are written at once, since no later flush will come.
std::atomic<bool> g_exit_flushed{false};

void at_exit_flush() {
  g_exit_flushed.store(true, std::memory_order_relaxed);
  TraceWriter::flush_all_writers();
}

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

std::unique_ptr<TraceWriter> TraceWriter::open(const std::string& path, const Options& options, std::string* error) {
  auto impl = std::make_unique<Impl>();
  impl->path = expand_path_pattern(path);
  impl->capacity = options.buffer_records > 0 ? options.buffer_records : 1;
  for (Record*& r : impl->all_records) {
    r = static_cast<Record*>(std::malloc(impl->capacity * sizeof(Record)));
  }
  impl->out = static_cast<char*>(std::malloc(kOutBytes));
  for (Record* r : impl->all_records) {
    if (r == nullptr || impl->out == nullptr) {
      if (error) *error = "out of host memory for the trace buffers";
      return nullptr;
    }
  }
  impl->active = Buffer{impl->all_records[0], 0};
  for (std::size_t i = 1; i < kBuffers; ++i) impl->spare[impl->spare_count++] = impl->all_records[i];

  std::string why;
  impl->fd = open_output_file(impl->path, O_TRUNC, "trace file", &why);
  if (impl->fd < 0) {
    if (error) *error = why;
    return nullptr;
  }
  std::string header = std::string(trace_header()) + "\n";
  if (!write_all(impl->fd, header.data(), header.size())) {
    if (error) *error = "cannot write trace file '" + impl->path + "': " + std::strerror(errno);
    ::close(impl->fd);
    return nullptr;
  }
  impl->clock.init();
  impl->utc_offset_s = trace_detail::local_utc_offset_s();
  if (!register_writer(impl.get())) {
    if (error) *error = "too many open trace writers";
    ::close(impl->fd);
    return nullptr;
  }
  Impl* raw = impl.get();
  try {
    impl->formatter = std::thread([raw] { raw->formatter_loop(); });
  } catch (const std::system_error& e) {
    unregister_writer(raw);
    if (error) *error = std::string("cannot start the trace formatter thread: ") + e.what();
    ::close(impl->fd);
    return nullptr;
  }
  return std::unique_ptr<TraceWriter>(new TraceWriter(std::move(impl)));
}

TraceWriter::TraceWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TraceWriter::~TraceWriter() {
  Impl& w = *impl_;
  unregister_writer(&w);
  if (w.disowned.load(std::memory_order_relaxed)) {
    // Forked child: the thread does not exist here; the parent owns the file.
    if (w.formatter.joinable()) w.formatter.detach();
  } else {
    {
      std::lock_guard<std::mutex> wl(w.wake_mu);
      w.stop.store(true);
    }
    w.wake_cv.notify_one();
    if (w.formatter.joinable()) w.formatter.join();
    w.flush();
  }
  if (w.fd >= 0) ::close(w.fd);
}

void TraceWriter::on_event(const Event& e) {
  Impl& w = *impl_;
  if (w.disowned.load(std::memory_order_relaxed)) return;
  const std::uint64_t stamp = w.clock.now();
  TraceRow row = trace_row_of(e);
  row.thread = thread_id();
  Record r = Record::of(row, stamp);
  if (e.kind == EventKind::allocate && tl_site_set && w.call_sites.load(std::memory_order_relaxed)) {
    r.site = w.intern_site(tl_site);
    tl_site_set = false;
  }
  w.push(r);
  // A failed allocation is often followed by the program dying: put the trace on disk now.
  // Same after the exit flush: nothing else will write these rows.
  if (e.kind == EventKind::oom || e.kind == EventKind::allocate_failure ||
      g_exit_flushed.load(std::memory_order_relaxed))
    w.flush();
}

void TraceWriter::note_device(int device, std::size_t total_bytes, std::size_t granularity) {
  TraceRow row;
  row.size = total_bytes;
  row.requested = total_bytes;
  row.device = device;
  row.action = TraceAction::device;
  row.detail = TraceDetail::device_facts;
  write_text_row(row, device_facts_text(granularity));
}

void TraceWriter::record_call_sites(bool on) {
  if (on) {
    void* warm[2];
    (void)::backtrace(warm, 2);  // the unwinder loads on first use: not inside a program's call
  }
  impl_->call_sites.store(on, std::memory_order_relaxed);
}

void TraceWriter::capture_call_site() noexcept {
  const int n = ::backtrace(tl_site.data(), kSiteDepth);
  for (int i = n < 0 ? 0 : n; i < kSiteDepth; ++i) tl_site[static_cast<std::size_t>(i)] = nullptr;
  tl_site_set = n > 0;
}

void TraceWriter::note_stream(std::uintptr_t stream, bool non_blocking) {
  TraceRow row;
  row.stream = stream;
  row.action = TraceAction::stream;
  row.detail = non_blocking ? TraceDetail::stream_non_blocking : TraceDetail::stream_blocking;
  impl_->push_now(row);
}

void TraceWriter::note_pinned(bool allocate, int device, std::uintptr_t ptr, std::size_t size, std::size_t requested) {
  TraceRow row;
  row.ptr = ptr;
  row.size = size;
  row.requested = requested;
  row.device = device;
  row.action = allocate ? TraceAction::pinned_allocate : TraceAction::pinned_free;
  impl_->push_now(row);
}

void TraceWriter::note_policy(const std::string& conf) {
  TraceRow row;
  row.action = TraceAction::policy;
  row.detail = TraceDetail::policy;
  write_text_row(row, conf);
}

// A row whose detail is text (the policy, the device's facts): formatted and written at once
// rather than buffered (the buffer holds fixed-size records).
void TraceWriter::write_text_row(TraceRow row, const std::string& text) {
  Impl& w = *impl_;
  if (w.disowned.load(std::memory_order_relaxed)) return;
  // Rows recorded before it go first, so the file keeps the recording order.
  w.flush();
  std::lock_guard<std::mutex> f(w.flush_mu);
  row.thread = thread_id();
  w.clock.begin_batch();
  row.time_ns = w.clock.to_epoch_ns(w.clock.now());
  char buf[trace_detail::kMaxRowChars];
  std::size_t n = trace_detail::format_row(row, w.utc_offset_s, buf);
  std::string line(buf, n - 1);
  line += trace_detail::quote_csv(text);
  line += '\n';
  if (!write_all(w.fd, line.data(), line.size())) w.write_failed.store(true, std::memory_order_relaxed);
  {
    std::lock_guard<SpinLock> lock(w.mu);
    ++w.rows;
  }
}

void TraceWriter::flush() {
  if (!impl_->disowned.load(std::memory_order_relaxed)) impl_->flush();
}

std::uint64_t TraceWriter::rows() const {
  std::lock_guard<SpinLock> lock(impl_->mu);
  return impl_->rows;
}

const std::string& TraceWriter::path() const { return impl_->path; }

void TraceWriter::flush_all_writers() noexcept {
  for (auto& slot : g_writers) {
    Impl* w = slot.load(std::memory_order_acquire);
    if (w != nullptr && !w->disowned.load(std::memory_order_relaxed)) w->flush();
  }
}

void TraceWriter::flush_all_writers_from_signal() noexcept {
  for (auto& slot : g_writers) {
    Impl* w = slot.load(std::memory_order_acquire);
    if (w == nullptr || w->disowned.load(std::memory_order_relaxed)) continue;
    if (!try_lock_for_signal(w->flush_mu)) continue;
    if (try_lock_for_signal(w->mu)) {
      w->in_signal = true;  // no symbol lookup, no allocation: rows go without their sites
      w->drain_locked();
      w->in_signal = false;
      w->mu.unlock();
    }
    w->flush_mu.unlock();
  }
}

}  // namespace cudapool
