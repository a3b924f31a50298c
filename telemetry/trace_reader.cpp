// Strict trace reader. Every field is checked for shape and range; the first problem stops the
// read with "line N: column C (Name): what". Input is untrusted (files from other machines, hand
// edits), so nothing here throws or indexes past what it checked.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <istream>
#include <limits>
#include <string_view>

#include "sys/input_file.h"
#include "sys/printable.h"
#include "telemetry/trace.h"

namespace cudapool {
namespace {

constexpr std::string_view kRmmHeader = "Thread,Time,Action,Pointer,Size,Stream";
constexpr std::string_view kExtraHeader = ",device,requested,time_ns,duration_ns";
constexpr std::string_view kDetailHeader = ",detail";
constexpr const char* kColumnNames[] = {"Thread", "Time",      "Action",  "Pointer",     "Size",  "Stream",
                                        "device", "requested", "time_ns", "duration_ns", "detail"};

bool parse_action(std::string_view s, TraceAction* out) {
  // The two actions of nearly every row first.
  if (s == "allocate") {
    *out = TraceAction::allocate;
    return true;
  }
  if (s == "free") {
    *out = TraceAction::free;
    return true;
  }
  for (int i = 0; i <= static_cast<int>(kLastTraceAction); ++i) {
    auto a = static_cast<TraceAction>(i);
    if (s == trace_action_name(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

template <typename T>
bool parse_dec(std::string_view s, T* out) {
  if (s.empty()) return false;
  if (s.front() == '+') return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 10);
  return ec == std::errc() && p == s.data() + s.size();
}

// Hex with an optional 0x/0X prefix (RMM writes fmt::ptr, which has it).
bool parse_hex(std::string_view s, std::uint64_t* out) {
  if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return ec == std::errc() && p == s.data() + s.size();
}

// Stream: hex with 0x prefix as written by RMM and by us; a bare number is decimal (RMM's own
// parser reads the column as a decimal integer).
bool parse_stream(std::string_view s, std::uint64_t* out) {
  if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return parse_hex(s, out);
  return parse_dec(s, out);
}

// "HH:MM:SS.f…" (1–9 fractional digits) → ns since midnight.
bool parse_time_of_day(std::string_view s, std::int64_t* out) {
  if (s.size() < 10 || s[2] != ':' || s[5] != ':' || s[8] != '.') return false;
  unsigned h = 0, m = 0, sec = 0;
  if (!parse_dec(s.substr(0, 2), &h) || !parse_dec(s.substr(3, 2), &m) || !parse_dec(s.substr(6, 2), &sec))
    return false;
  if (h > 23 || m > 59 || sec > 60) return false;
  std::string_view frac = s.substr(9);
  if (frac.empty() || frac.size() > 9) return false;
  std::int64_t f = 0;
  for (char c : frac) {
    if (c < '0' || c > '9') return false;
    f = f * 10 + (c - '0');
  }
  for (std::size_t i = frac.size(); i < 9; ++i) f *= 10;
  *out = ((static_cast<std::int64_t>(h) * 60 + m) * 60 + sec) * 1'000'000'000LL + f;
  return true;
}

// A field quoted in an error message: at most 40 bytes of it, escaped (sys/printable.h), so
// that a crafted trace cannot put escape sequences on the terminal that shows the error.
std::string show(std::string_view field) {
  constexpr std::size_t kMax = 40;
  std::string s = "'";
  s.append(printable(field.substr(0, kMax)));
  if (field.size() > kMax) s += "…";
  return s + "'";
}

}  // namespace

// Input is read in blocks (a window growing to 1 MiB) and split with memchr: several times faster
// than getline, which matters for `cudapool replay` on traces of millions of rows. A line is
// refused once kMaxTraceLineBytes of it have passed without a newline, so a "line" of gigabytes
// costs one block's read, never the whole of it.
constexpr std::size_t kWindow = 1 << 20;
static_assert(kMaxTraceLineBytes < kWindow);

TraceReader::TraceReader(std::istream& in) : in_(in) {}

bool TraceReader::next_line(std::string_view* line) {
  if (buf_.empty()) buf_.resize(64 * 1024);  // grows to kWindow for big inputs
  auto too_long = [&] {
    ++line_;
    return fail("line longer than " + std::to_string(kMaxTraceLineBytes) + " bytes (not a trace?)");
  };
  while (true) {
    const char* start = buf_.data() + pos_;
    const std::size_t avail = end_ - pos_;
    if (const void* nl = std::memchr(start, '\n', std::min(avail, kMaxTraceLineBytes + 1))) {
      const auto len = static_cast<std::size_t>(static_cast<const char*>(nl) - start);
      *line = std::string_view(start, len);
      pos_ += len + 1;
      bytes_ += len + 1;
      ++line_;
      return true;
    }
    if (avail > kMaxTraceLineBytes) return too_long();
    if (eof_) {
      if (pos_ == end_) return false;
      *line = std::string_view(start, end_ - pos_);  // last line without a newline
      bytes_ += end_ - pos_;
      pos_ = end_;
      ++line_;
      unterminated_ = true;
      return true;
    }
    if (pos_ > 0) {
      std::memmove(buf_.data(), start, end_ - pos_);
      end_ -= pos_;
      pos_ = 0;
    }
    if (end_ == buf_.size()) buf_.resize(std::min(buf_.size() * 2, kWindow));  // end_ <= the line bound < kWindow
    in_.read(buf_.data() + end_, static_cast<std::streamsize>(buf_.size() - end_));
    const auto n = static_cast<std::size_t>(in_.gcount());
    end_ += n;
    if (n == 0) {
      if (in_.bad()) {
        ++line_;
        return fail("read error");
      }
      eof_ = true;
    }
  }
}

bool TraceReader::fail(std::string what) {
  error_ = "line " + std::to_string(line_) + ": " + std::move(what);
  return false;
}

bool TraceReader::read_header() {
  header_done_ = true;
  std::string_view h;
  if (!next_line(&h)) {
    if (!error_.empty()) return false;
    line_ = 1;
    return fail("empty file: expected the header '" + std::string(kRmmHeader) + "…'");
  }
  if (!h.empty() && h.back() == '\r') h.remove_suffix(1);
  // A UTF-8 byte order mark from editors that add one.
  if (h.substr(0, 3) == "\xEF\xBB\xBF") h.remove_prefix(3);
  if (h == kRmmHeader) {
    rmm_only_ = true;
    columns_ = 6;
    return true;
  }
  const std::string ten = std::string(kRmmHeader) + std::string(kExtraHeader);
  if (h == ten) {
    columns_ = 10;  // written before the detail column existed
    return true;
  }
  if (h == ten + std::string(kDetailHeader)) {
    columns_ = 11;
    return true;
  }
  return fail("header is " + show(h) + "; expected '" + std::string(kRmmHeader) + "' (RMM log) or that followed by '" +
              std::string(kExtraHeader) + std::string(kDetailHeader) + "' (cudapool trace; older ones lack '" +
              std::string(kDetailHeader) + "')");
}

bool TraceReader::next(TraceRow* row) {
  if (!error_.empty() || !warning_.empty()) return false;
  if (!header_done_ && !read_header()) return false;
  if (next_row(row)) return true;
  // A malformed last line without a newline is a row cut short: the program was killed while
  // the trace was written. The rows before it stand; say where it ends instead of failing.
  if (!error_.empty() && unterminated_ && line_ > 1) {
    warning_ = "line " + std::to_string(line_) + ": the last line is cut short (" +
               error_.substr(error_.find(": ") + 2) + "); read up to line " + std::to_string(line_ - 1);
    error_.clear();
  }
  return false;
}

// A quoted CSV field ("…" with "" for a quote inside) into *text; nullptr, or what is wrong.
const char* TraceReader::quoted(std::string_view d, std::string* text) {
  if (d.size() < 2 || d.front() != '"' || d.back() != '"') return "is not quoted";
  text->clear();
  for (std::size_t i = 1; i + 1 < d.size(); ++i) {
    if (d[i] == '"') {
      if (i + 2 >= d.size() || d[i + 1] != '"') return "has a lone '\"' inside the quotes";
      ++i;
    }
    *text += d[i];
  }
  return nullptr;
}

namespace {

// Splits a row at its commas into f: how many columns it has, or want + 1 when it has more than
// `want`. The detail column (the 11th, the last) may be a quoted CSV field with commas in it (the
// policy).
std::size_t split_columns(std::string_view rest, std::size_t want, std::string_view (&f)[11]) {
  std::size_t n = 0;
  while (true) {
    if (n == want) return want + 1;
    if (n == 10 && !rest.empty() && rest.front() == '"') {
      f[n++] = rest;
      return n;
    }
    std::size_t comma = rest.find(',');
    f[n++] = rest.substr(0, comma);
    if (comma == std::string_view::npos) return n;
    rest.remove_prefix(comma + 1);
  }
}

}  // namespace

bool TraceReader::next_row(TraceRow* row) {
  std::string_view line;
  if (!next_line(&line)) return false;  // clean end of input, or error_ set
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) return fail("empty line (a trace has no blank lines)");

  const auto want = static_cast<std::size_t>(columns_);
  std::string_view f[11];
  const std::size_t n = split_columns(line, want, f);
  if (n > want) return fail("more than " + std::to_string(want) + " columns");
  if (n != want) return fail("has " + std::to_string(n) + " columns, expected " + std::to_string(want));
  TraceRow r;
  if (!read_columns(f, &r)) return false;
  if (columns_ == 11) {
    if (!read_detail(f[10], &r)) return false;
  } else if (r.action == TraceAction::policy) {
    // A policy row in a trace without the detail column: its text is unknown, it is still one.
    r.detail = TraceDetail::policy;
  }
  *row = r;
  return true;
}

bool TraceReader::bad_column(std::size_t col, std::string_view value, const std::string& what) {
  return fail("column " + std::to_string(col + 1) + " (" + kColumnNames[col] + "): " + show(value) + " " + what);
}

bool TraceReader::read_columns(const std::string_view (&f)[11], TraceRow* r) {
  if (!parse_dec(f[0], &r->thread)) return bad_column(0, f[0], "is not a thread id (decimal integer)");
  std::int64_t tod = 0;
  if (!parse_time_of_day(f[1], &tod)) return bad_column(1, f[1], "is not a time of day HH:MM:SS.ffffff");
  if (!parse_action(f[2], &r->action)) {
    return bad_column(2, f[2],
                      rmm_only_ ? "is not an action (allocate, free, allocate failure)"
                                : "is not a cudapool action (see docs/trace-format.md)");
  }
  if (rmm_only_ && r->action != TraceAction::allocate && r->action != TraceAction::free &&
      r->action != TraceAction::allocate_failure) {
    return bad_column(2, f[2], "is a cudapool action, but the header is RMM's 6 columns");
  }
  std::uint64_t v = 0;
  if (!parse_hex(f[3], &v)) return bad_column(3, f[3], "is not a hex pointer (0x…)");
  r->ptr = static_cast<std::uintptr_t>(v);
  if (!parse_dec(f[4], &r->size)) return bad_column(4, f[4], "is not a size in bytes (decimal integer)");
  if (!parse_stream(f[5], &v)) return bad_column(5, f[5], "is not a stream (0x… hex or decimal)");
  r->stream = static_cast<std::uintptr_t>(v);
  if (rmm_only_) {
    r->time_ns = tod;
    r->device = 0;
    r->requested = r->size;
    r->duration_ns = 0;
    return true;
  }
  if (!parse_dec(f[6], &r->device) || r->device < 0 || r->device > kMaxTraceDevice)
    return bad_column(6, f[6], "is not a device ordinal (0 to " + std::to_string(kMaxTraceDevice) + ")");
  if (!parse_dec(f[7], &r->requested)) return bad_column(7, f[7], "is not a size in bytes");
  if (!parse_dec(f[8], &r->time_ns) || r->time_ns < 0) return bad_column(8, f[8], "is not a time in ns");
  if (!parse_dec(f[9], &r->duration_ns) || r->duration_ns < 0) return bad_column(9, f[9], "is not a duration in ns");
  return true;
}

bool TraceReader::read_detail(std::string_view d, TraceRow* r) {
  if (r->action == TraceAction::policy) {
    std::string text;
    if (const char* why = quoted(d, &text))
      return bad_column(10, d, d.empty() || d.front() != '"' ? "is not a quoted policy string" : why);
    r->detail = TraceDetail::policy;
    if (!policy_) policy_ = std::move(text);
  } else if (r->action == TraceAction::device && !d.empty()) {
    std::string text;
    if (const char* why = quoted(d, &text)) return bad_column(10, d, why);
    r->detail = TraceDetail::device_facts;
    device_facts_.emplace(r->device, std::move(text));
  } else if (r->action == TraceAction::allocate && !d.empty() && d.front() == '"') {
    std::string text;
    if (const char* why = quoted(d, &text)) return bad_column(10, d, why);
    return add_site(d, std::move(text), r);
  } else if (d.empty()) {
    r->detail = TraceDetail::none;
  } else if (r->action == TraceAction::free && (d == "sync" || d == "async")) {
    r->detail = d == "sync" ? TraceDetail::free_sync : TraceDetail::free_async;
  } else if (r->action == TraceAction::stream && (d == "blocking" || d == "non_blocking")) {
    r->detail = d == "blocking" ? TraceDetail::stream_blocking : TraceDetail::stream_non_blocking;
  } else {
    return bad_column(10, d,
                      r->action == TraceAction::free     ? "is not a free kind (sync, async or empty)"
                      : r->action == TraceAction::stream ? "is not a stream kind (blocking, non_blocking or empty)"
                                                         : "must be empty for this action");
  }
  return true;
}

bool TraceReader::add_site(std::string_view d, std::string text, TraceRow* r) {
  // Each site once: a long trace repeats a few dozen sites many times.
  auto it = site_ids_.find(text);
  if (it == site_ids_.end()) {
    if (sites_.size() >= kMaxTraceSites) return bad_column(10, d, "is one call site more than a trace may hold");
    if (site_bytes_ + text.size() > kMaxTraceSiteBytes)
      return bad_column(10, d,
                        "is a call site past the " + std::to_string(kMaxTraceSiteBytes >> 20) +
                            " MiB the call sites of a trace may take");
    site_bytes_ += text.size();
    sites_.push_back(text);
    it = site_ids_.emplace(std::move(text), static_cast<std::uint32_t>(sites_.size())).first;
  }
  r->site = it->second;
  return true;
}

TraceLimits TraceLimits::for_rows(std::uint64_t rows) {
  TraceLimits l;
  if (rows == 0) return l;
  l.max_rows = rows;
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  l.max_bytes = rows > kMax / kTraceBytesPerRow ? kMax : rows * kTraceBytesPerRow;
  return l;
}

bool read_trace_stream(std::istream& in, const std::string& name, std::vector<TraceRow>* rows, std::string* error,
                       TraceMeta* meta, const TraceLimits& limits) {
  TraceReader reader(in);
  TraceRow row;
  std::string over;
  while (reader.next(&row)) {
    if (reader.bytes() > limits.max_bytes) {
      over = "more than " + std::to_string(limits.max_bytes) + " bytes of text (the limit)";
      break;
    }
    if (rows->size() >= limits.max_rows) {
      over = "more than " + std::to_string(limits.max_rows) + " rows (the limit)";
      break;
    }
    // Grow by doubling, but never past the bound: memory at the bound is what its rows take.
    if (rows->size() == rows->capacity()) {
      const std::size_t cap = std::max<std::size_t>(rows->capacity() * 2, 1024);
      rows->reserve(static_cast<std::size_t>(std::min<std::uint64_t>(cap, limits.max_rows)));
    }
    rows->push_back(row);
  }
  if (meta != nullptr) {
    meta->columns = reader.columns();
    meta->policy = reader.policy();
    meta->device_facts = reader.device_facts();
    meta->sites = reader.sites();
    if (!reader.warning().empty()) meta->warning = name + ":" + reader.warning().substr(5);
    meta->over_limit = !over.empty();
  }
  if (!over.empty()) {
    if (error) *error = name + ": " + over;
    return false;
  }
  if (!reader.error().empty()) {
    if (error) *error = name + ":" + reader.error().substr(5);  // "line N: …" → "name:N: …"
    return false;
  }
  return true;
}

bool read_trace_file(const std::string& path, std::vector<TraceRow>* rows, std::string* error, TraceMeta* meta,
                     const TraceLimits& limits) {
  std::string why;
  const int fd = open_input_file(path, &why);  // a FIFO or a device is refused without blocking
  if (fd < 0) {
    if (error) *error = path + ": cannot open: " + why;
    return false;
  }
  InputFileBuf buf(fd);
  std::istream in(&buf);
  if (!read_trace_stream(in, path, rows, error, meta, limits)) return false;
  if (buf.failed()) {
    if (error) *error = path + ": cannot read: " + std::strerror(buf.error());
    return false;
  }
  return true;
}

}  // namespace cudapool
