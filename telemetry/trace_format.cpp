// CSV row formatting by hand: snprintf would cost more than the pool's whole hit path.
#include "telemetry/trace_format.h"

#include <ctime>
#include <string>

namespace cudapool {

const char* trace_header() noexcept {
  return "Thread,Time,Action,Pointer,Size,Stream,device,requested,time_ns,duration_ns";
}

const char* trace_action_name(TraceAction a) noexcept {
  switch (a) {
    case TraceAction::allocate: return "allocate";
    case TraceAction::free: return "free";
    case TraceAction::allocate_failure: return "allocate failure";
    case TraceAction::segment_alloc: return "segment_alloc";
    case TraceAction::segment_free: return "segment_free";
    case TraceAction::segment_map: return "segment_map";
    case TraceAction::segment_unmap: return "segment_unmap";
    case TraceAction::oom: return "oom";
    case TraceAction::gc: return "gc";
    case TraceAction::empty_cache: return "empty_cache";
    case TraceAction::device: return "device";
  }
  return "unknown";
}

TraceAction trace_action_of(EventKind k) noexcept {
  switch (k) {
    case EventKind::allocate: return TraceAction::allocate;
    case EventKind::free: return TraceAction::free;
    case EventKind::allocate_failure: return TraceAction::allocate_failure;
    case EventKind::segment_alloc: return TraceAction::segment_alloc;
    case EventKind::segment_free: return TraceAction::segment_free;
    case EventKind::segment_map: return TraceAction::segment_map;
    case EventKind::segment_unmap: return TraceAction::segment_unmap;
    case EventKind::oom: return TraceAction::oom;
    case EventKind::gc: return TraceAction::gc;
    case EventKind::empty_cache: return TraceAction::empty_cache;
  }
  return TraceAction::allocate;
}

namespace trace_detail {
namespace {

char* put_u64(char* p, std::uint64_t v) noexcept {
  char tmp[20];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *p++ = tmp[--n];
  return p;
}

char* put_i64(char* p, std::int64_t v) noexcept {
  if (v < 0) {
    *p++ = '-';
    return put_u64(p, ~static_cast<std::uint64_t>(v) + 1);
  }
  return put_u64(p, static_cast<std::uint64_t>(v));
}

char* put_hex(char* p, std::uint64_t v) noexcept {
  static const char digits[] = "0123456789abcdef";
  *p++ = '0';
  *p++ = 'x';
  char tmp[16];
  int n = 0;
  do {
    tmp[n++] = digits[v & 0xf];
    v >>= 4;
  } while (v != 0);
  while (n > 0) *p++ = tmp[--n];
  return p;
}

char* put_2(char* p, unsigned v) noexcept {
  *p++ = static_cast<char>('0' + v / 10);
  *p++ = static_cast<char>('0' + v % 10);
  return p;
}

char* put_str(char* p, const char* s) noexcept {
  while (*s != '\0') *p++ = *s++;
  return p;
}

}  // namespace

std::int64_t local_utc_offset_s() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (localtime_r(&now, &tm) == nullptr) return 0;
  return tm.tm_gmtoff;
}

std::size_t format_row(const TraceRow& r, std::int64_t utc_offset_s, char* out) noexcept {
  char* p = out;
  p = put_u64(p, r.thread);
  *p++ = ',';
  // Time: HH:MM:SS.uuuuuu local time, RMM's (spdlog "%H:%M:%S.%f") shape.
  std::int64_t local_ns = r.time_ns + utc_offset_s * 1'000'000'000LL;
  std::int64_t day_ns = local_ns % (86400LL * 1'000'000'000LL);
  if (day_ns < 0) day_ns += 86400LL * 1'000'000'000LL;
  auto sec = static_cast<unsigned>(day_ns / 1'000'000'000LL);
  auto usec = static_cast<unsigned>((day_ns % 1'000'000'000LL) / 1000);
  p = put_2(p, sec / 3600);
  *p++ = ':';
  p = put_2(p, (sec / 60) % 60);
  *p++ = ':';
  p = put_2(p, sec % 60);
  *p++ = '.';
  for (unsigned div = 100000; div > 0; div /= 10) *p++ = static_cast<char>('0' + (usec / div) % 10);
  *p++ = ',';
  p = put_str(p, trace_action_name(r.action));
  *p++ = ',';
  p = put_hex(p, r.ptr);
  *p++ = ',';
  p = put_u64(p, r.size);
  *p++ = ',';
  p = put_hex(p, r.stream);
  *p++ = ',';
  p = put_i64(p, r.device);
  *p++ = ',';
  p = put_u64(p, r.requested);
  *p++ = ',';
  p = put_i64(p, r.time_ns);
  *p++ = ',';
  p = put_i64(p, r.duration_ns);
  *p++ = '\n';
  return static_cast<std::size_t>(p - out);
}

}  // namespace trace_detail

std::string format_trace_row(const TraceRow& row) {
  char buf[trace_detail::kMaxRowChars];
  std::size_t n = trace_detail::format_row(row, trace_detail::local_utc_offset_s(), buf);
  return std::string(buf, n - 1);  // without the newline
}

}  // namespace cudapool
