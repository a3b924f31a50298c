// CSV row formatting by hand: snprintf would cost more than the pool's whole hit path.
#include "telemetry/trace_format.h"

#include <cstring>
#include <ctime>
#include <string>

#include "allocator/types.h"

namespace cudapool {

const char* trace_header() noexcept {
  return "Thread,Time,Action,Pointer,Size,Stream,device,requested,time_ns,duration_ns,detail";
}

const char* trace_detail_name(TraceDetail d) noexcept {
  switch (d) {
    case TraceDetail::none: return "";
    case TraceDetail::free_sync: return "sync";
    case TraceDetail::free_async: return "async";
    case TraceDetail::stream_blocking: return "blocking";
    case TraceDetail::stream_non_blocking: return "non_blocking";
    case TraceDetail::policy: return "";
    case TraceDetail::device_facts: return "";
  }
  return "";
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
    case TraceAction::fence_wait: return "fence_wait";
    case TraceAction::gpu_wait: return "gpu_wait";
    case TraceAction::device: return "device";
    case TraceAction::policy: return "policy";
    case TraceAction::stream: return "stream";
    case TraceAction::pinned_allocate: return "pinned_allocate";
    case TraceAction::pinned_free: return "pinned_free";
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
    case EventKind::fence_wait: return TraceAction::fence_wait;
    case EventKind::gpu_wait: return TraceAction::gpu_wait;
  }
  return TraceAction::allocate;
}

namespace trace_detail {
namespace {

// Two digits per step from a table: halves the multiply-shift chains of a digit-at-a-time loop.
constexpr char kDigitPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

char* put_u64(char* p, std::uint64_t v) noexcept {
  char tmp[20];
  char* end = tmp + sizeof tmp;
  char* q = end;
  while (v >= 100) {
    const unsigned pair = static_cast<unsigned>(v % 100) * 2;
    v /= 100;
    *--q = kDigitPairs[pair + 1];
    *--q = kDigitPairs[pair];
  }
  if (v >= 10) {
    const unsigned pair = static_cast<unsigned>(v) * 2;
    *--q = kDigitPairs[pair + 1];
    *--q = kDigitPairs[pair];
  } else {
    *--q = static_cast<char>('0' + v);
  }
  const auto n = static_cast<std::size_t>(end - q);
  std::memcpy(p, q, n);
  return p + n;
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
  // Number of hex digits from the highest set bit; 0 prints as "0x0" like fmt::ptr.
  const int n = v == 0 ? 1 : (64 - __builtin_clzll(v) + 3) / 4;
  for (int i = n - 1; i >= 0; --i) p[n - 1 - i] = digits[(v >> (4 * i)) & 0xf];
  return p + n;
}

char* put_2(char* p, unsigned v) noexcept {
  p[0] = kDigitPairs[v * 2];
  p[1] = kDigitPairs[v * 2 + 1];
  return p + 2;
}

char* put_str(char* p, const char* s) noexcept {
  const std::size_t n = std::strlen(s);
  std::memcpy(p, s, n);
  return p + n;
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
  p = put_2(p, usec / 10000);
  p = put_2(p, (usec / 100) % 100);
  p = put_2(p, usec % 100);
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
  *p++ = ',';
  p = put_str(p, trace_detail_name(r.detail));
  *p++ = '\n';
  return static_cast<std::size_t>(p - out);
}

std::string quote_csv(const std::string& text) {
  std::string q = "\"";
  for (char c : text) {
    if (c == '"') q += '"';
    if (c == '\n' || c == '\r') c = ' ';  // one row per line, always
    q += c;
  }
  return q + "\"";
}

}  // namespace trace_detail

std::string device_facts_text(std::size_t granularity) {
  return "granularity:" + std::to_string(granularity) + ",min_block:" + std::to_string(kMinBlockSize) +
         ",small_size:" + std::to_string(kSmallSize) + ",small_buffer:" + std::to_string(kSmallBuffer) +
         ",min_large_alloc:" + std::to_string(kMinLargeAlloc) + ",large_buffer:" + std::to_string(kLargeBuffer) +
         ",round_large:" + std::to_string(kRoundLarge);
}

std::string format_trace_row(const TraceRow& row, const std::string& text) {
  // localtime_r takes a global lock and may read the zone file: once per process is enough
  // (tools format millions of rows through here).
  static const std::int64_t offset = trace_detail::local_utc_offset_s();
  char buf[trace_detail::kMaxRowChars];
  std::size_t n = trace_detail::format_row(row, offset, buf);
  std::string line(buf, n - 1);  // without the newline
  if (row.detail == TraceDetail::policy || row.detail == TraceDetail::device_facts ||
      (row.action == TraceAction::allocate && row.site != 0))
    line += trace_detail::quote_csv(text);
  return line;
}

}  // namespace cudapool
