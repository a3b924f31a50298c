#include "telemetry/warm_plan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <unordered_map>

#include "allocator/types.h"
#include "sys/printable.h"
#include "telemetry/trace.h"

namespace cudapool {

std::size_t WarmPlan::bytes(int device, bool small) const {
  std::size_t n = 0;
  for (const WarmSegment& s : segments)
    if (s.device == device && s.small == small) n += s.bytes;
  return n;
}

std::size_t WarmPlan::bytes(int device) const { return bytes(device, true) + bytes(device, false); }

namespace {

// A value from the file, as a message shows it: at most 40 bytes, escaped.
std::string shown(std::string_view v) {
  std::string out = printable(v.substr(0, 40));
  if (v.size() > 40) out += "...";
  return "'" + out + "'";
}

// A plan's source as it is kept and written: escaped, at most 1024 bytes, never cut inside a
// UTF-8 sequence (so that a plan written and read back says the same).
constexpr std::size_t kMaxSource = 1024;
std::string capped_source(std::string_view text) {
  std::string s = printable(text);
  if (s.size() <= kMaxSource) return s;
  std::size_t n = kMaxSource;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;  // back to a sequence's start
  s.resize(n);
  return s;
}

bool parse_u64(std::string_view v, std::uint64_t* out) {
  if (v.empty() || v.size() > 20) return false;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  return ec == std::errc() && end == v.data() + v.size();
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
    if (out.size() > 8) break;  // no record has more: the rest is garbage anyway
  }
  return out;
}

class PlanParser {
 public:
  PlanParser(WarmPlan* plan, std::string* error) : plan_(plan), error_(error) {}

  bool run(std::string_view text) {
    if (text.size() > kMaxWarmPlanFile)
      return fail("the file is larger than " + std::to_string(kMaxWarmPlanFile >> 20) +
                  " MiB: not a plan written by `cudapool plan`");
    std::size_t pos = 0;
    while (pos < text.size()) {
      ++line_;
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      std::string_view line = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.size() > kMaxWarmPlanLine)
        return fail("longer than " + std::to_string(kMaxWarmPlanLine) + " characters");
      if (line_ == 1) {
        if (line != kWarmPlanMagic)
          return fail("the first line is " + shown(line) + ", not '" + std::string(kWarmPlanMagic) +
                      "' (make the plan with `cudapool plan TRACE -o PLAN`, or name the trace itself)");
        continue;
      }
      if (!record(line)) return false;
    }
    if (line_ == 0) return fail("the file is empty (make the plan with `cudapool plan TRACE -o PLAN`)");
    return true;
  }

 private:
  bool fail(const std::string& what) {
    if (error_) *error_ = "line " + std::to_string(line_) + ": " + what;
    return false;
  }

  bool device_of(std::string_view v, int* out) {
    std::uint64_t d = 0;
    if (!parse_u64(v, &d) || d > static_cast<std::uint64_t>(kMaxTraceDevice))
      return fail("device " + shown(v) + " is not a device ordinal from 0 to " + std::to_string(kMaxTraceDevice));
    *out = static_cast<int>(d);
    return true;
  }

  bool size_of(std::string_view v, const char* what, std::size_t* out) {
    std::uint64_t n = 0;
    if (!parse_u64(v, &n)) return fail(std::string(what) + " " + shown(v) + " is not a whole number of bytes");
    if (n < kWarmUnit || n > kMaxWarmSegmentBytes || n % kWarmUnit != 0)
      return fail(std::string(what) + " " + shown(v) + " is not a multiple of 512 bytes from 512 to 1 TiB");
    *out = static_cast<std::size_t>(n);
    return true;
  }

  bool record(std::string_view line) {
    if (line.empty() || line.front() == '#') return true;
    if (line.substr(0, 7) == "source ") {
      if (line.size() > 7 + kMaxSource) return fail("the source is longer than 1024 characters");
      plan_->source = capped_source(line.substr(7));
      return true;
    }
    const std::vector<std::string_view> w = words(line);
    if (w.empty()) return true;  // spaces only
    if (w[0] == "device") return device_record(w);
    if (w[0] == "segment") return segment_record(w);
    return fail(shown(line) + " is not a plan line (source, device, segment or a # comment)");
  }

  bool device_record(const std::vector<std::string_view>& w) {
    if (w.size() != 4 || w[2] != "peak_reserved") return fail("expected 'device N peak_reserved BYTES'");
    WarmDevice d;
    if (!device_of(w[1], &d.device)) return false;
    std::uint64_t n = 0;
    if (!parse_u64(w[3], &n) || n > kMaxWarmDeviceBytes)
      return fail("peak_reserved " + shown(w[3]) + " is not a whole number of bytes up to 64 TiB");
    d.peak_reserved = static_cast<std::size_t>(n);
    for (const WarmDevice& o : plan_->devices)
      if (o.device == d.device) return fail("device " + std::to_string(d.device) + " is described twice");
    if (plan_->devices.size() > static_cast<std::size_t>(kMaxTraceDevice))
      return fail("more devices than there can be");  // unreachable: ordinals are distinct and bounded
    plan_->devices.push_back(d);
    return true;
  }

  bool segment_record(const std::vector<std::string_view>& w) {
    if (w.size() != 5 && w.size() != 7)
      return fail("expected 'segment DEVICE small|large classic|expandable BYTES [split B1,B2,...]'");
    if (plan_->segments.size() >= kMaxWarmSegments)
      return fail("more than " + std::to_string(kMaxWarmSegments) + " segments");
    WarmSegment s;
    if (!device_of(w[1], &s.device)) return false;
    if (w[2] != "small" && w[2] != "large") return fail("pool kind " + shown(w[2]) + " is not small or large");
    s.small = w[2] == "small";
    if (w[3] != "classic" && w[3] != "expandable")
      return fail("segment kind " + shown(w[3]) + " is not classic or expandable");
    s.expandable = w[3] == "expandable";
    if (!size_of(w[4], "segment size", &s.bytes)) return false;
    if (s.small && !s.expandable && s.bytes != kSmallBuffer)
      return fail("a classic small-pool segment is " + std::to_string(kSmallBuffer) + " bytes, not " +
                  std::to_string(s.bytes));
    if (w.size() == 7) {
      if (w[5] != "split") return fail(shown(w[5]) + " where 'split' was expected");
      std::string_view list = w[6];
      std::size_t sum = 0;
      while (!list.empty()) {
        const std::size_t comma = list.find(',');
        const std::string_view item = list.substr(0, comma);
        if (s.split.size() >= kMaxWarmSplit)
          return fail("a segment split into more than " + std::to_string(kMaxWarmSplit) + " blocks");
        std::size_t b = 0;
        if (!size_of(item, "block size", &b)) return false;
        s.split.push_back(b);
        sum += b;  // at most 4096 blocks of 1 TiB: no overflow
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
        if (list.empty()) return fail("the split list ends with a comma");
      }
      if (sum != s.bytes)
        return fail("the split's blocks add up to " + std::to_string(sum) + " bytes, not the segment's " +
                    std::to_string(s.bytes));
    }
    std::size_t& total = device_bytes_[s.device];
    if (total + s.bytes > kMaxWarmDeviceBytes)
      return fail("device " + std::to_string(s.device) + "'s segments add up to more than 64 TiB");
    total += s.bytes;
    plan_->segments.push_back(std::move(s));
    return true;
  }

  WarmPlan* plan_;
  std::string* error_;
  std::size_t line_ = 0;
  std::map<int, std::size_t> device_bytes_;
};

// ---- from a trace ------------------------------------------------------------------------------

struct MappedRun {
  std::size_t bytes = 0;
  std::uint32_t id = 0;  // index into TraceScan::run_small, set once its allocation is seen
};

struct DeviceScan {
  std::size_t reserved = 0, best = 0;
  std::uint64_t best_row = 0;  // 1-based row index where `best` was first reached (0 = never)
  std::unordered_map<std::uintptr_t, std::size_t> classic;           // live classic segments
  std::map<std::uintptr_t, MappedRun> mapped;                        // live mapped runs by address
  std::vector<std::uint32_t> unresolved;                             // runs waiting for their allocation
  std::vector<std::pair<std::size_t, bool>> classic_at_peak;         // (bytes, small)
  std::vector<std::pair<std::uintptr_t, MappedRun>> mapped_at_peak;  // by address
};

class TraceScan {
 public:
  explicit TraceScan(std::string* error) : error_(error) {}

  // Pass 1 (build = false): each device's peak. Pass 2: the segments held there.
  bool pass(std::istream& in, bool build) {
    TraceReader reader(in);
    TraceRow row;
    std::uint64_t n = 0;
    for (auto& [dev, d] : devs_) d.reserved = 0;
    while (reader.next(&row)) {
      if (++n > kMaxWarmTraceRows)
        return fail(reader.line(), "more than " + std::to_string(kMaxWarmTraceRows) +
                                       " rows; make a plan of it with `cudapool plan TRACE -o PLAN` and name that");
      if (!row_(row, n, build, reader.line())) return false;
    }
    if (!reader.error().empty()) {
      if (error_) *error_ = reader.error();
      return false;
    }
    return true;
  }

  void finish(WarmPlan* plan) {
    for (auto& [dev, d] : devs_) {
      if (d.best == 0) continue;
      plan->devices.push_back(WarmDevice{dev, d.best});
      for (const auto& [bytes, small] : d.classic_at_peak) plan->segments.push_back({dev, small, false, bytes, {}});
      // Adjacent runs of one kind are one stretch of the range, as a snapshot shows it.
      std::sort(d.mapped_at_peak.begin(), d.mapped_at_peak.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      std::uintptr_t end = 0;
      for (const auto& [addr, run] : d.mapped_at_peak) {
        const bool small = run.id < run_small_.size() && run_small_[run.id] == 1;
        WarmSegment* last = plan->segments.empty() ? nullptr : &plan->segments.back();
        if (last != nullptr && last->expandable && last->device == dev && last->small == small && addr == end &&
            last->bytes + run.bytes <= kMaxWarmSegmentBytes)
          last->bytes += run.bytes;
        else
          plan->segments.push_back({dev, small, true, run.bytes, {}});
        end = addr + run.bytes;
      }
    }
    std::stable_sort(plan->segments.begin(), plan->segments.end(),
                     [](const WarmSegment& a, const WarmSegment& b) { return a.device < b.device; });
  }

 private:
  bool fail(std::size_t line, const std::string& what) {
    if (error_) *error_ = "line " + std::to_string(line) + ": " + what;
    return false;
  }

  bool row_(const TraceRow& row, std::uint64_t n, bool build, std::size_t line) {
    if (row.device < 0 || row.device > kMaxTraceDevice) return true;  // the reader refuses these already
    DeviceScan& d = devs_[row.device];
    const bool grows = row.action == TraceAction::segment_alloc || row.action == TraceAction::segment_map;
    const bool shrinks = row.action == TraceAction::segment_free || row.action == TraceAction::segment_unmap;
    if (build && row.action == TraceAction::allocate && !d.unresolved.empty()) {
      const std::uint8_t small = row.size <= kSmallSize ? 1 : 0;
      for (std::uint32_t id : d.unresolved) run_small_[id] = small;
      d.unresolved.clear();
    }
    if (!grows && !shrinks) return true;
    if (row.size > kMaxWarmSegmentBytes)
      return fail(line, "a segment of " + std::to_string(row.size) + " bytes, more than 1 TiB");
    if (row.size == 0 || row.size % kWarmUnit != 0)
      return fail(line, "a segment of " + std::to_string(row.size) + " bytes, not a multiple of 512");
    if (build) {
      if (!track(d, row, line)) return false;
    }
    if (grows) {
      d.reserved += row.size;
      if (d.reserved > kMaxWarmDeviceBytes) return fail(line, "the device holds more than 64 TiB");
    } else {
      d.reserved -= std::min(d.reserved, row.size);
    }
    if (!build && d.reserved > d.best) {
      d.best = d.reserved;
      d.best_row = n;
    }
    if (build && n == d.best_row) take(d);
    return true;
  }

  bool track(DeviceScan& d, const TraceRow& row, std::size_t line) {
    switch (row.action) {
      case TraceAction::segment_alloc:
        if (d.classic.size() >= kMaxWarmTraceLive) return fail(line, "too many live segments");
        d.classic[row.ptr] = row.size;
        break;
      case TraceAction::segment_free: d.classic.erase(row.ptr); break;
      case TraceAction::segment_map: {
        if (d.mapped.size() >= kMaxWarmTraceLive || run_small_.size() >= kMaxWarmTraceRows)
          return fail(line, "too many mapped runs");
        const auto id = static_cast<std::uint32_t>(run_small_.size());
        run_small_.push_back(0);
        d.mapped[row.ptr] = MappedRun{row.size, id};
        if (d.unresolved.size() < kMaxWarmTraceLive) d.unresolved.push_back(id);
        break;
      }
      case TraceAction::segment_unmap: {
        // Whole runs of earlier maps; one unmap may cover several adjacent ones.
        const std::uintptr_t hi = row.ptr + row.size;
        for (auto it = d.mapped.lower_bound(row.ptr); it != d.mapped.end() && it->first < hi;) it = d.mapped.erase(it);
        break;
      }
      default: break;
    }
    return true;
  }

  static void take(DeviceScan& d) {
    d.classic_at_peak.clear();
    for (const auto& [ptr, bytes] : d.classic) d.classic_at_peak.emplace_back(bytes, bytes == kSmallBuffer);
    std::sort(d.classic_at_peak.begin(), d.classic_at_peak.end(), std::greater<>());
    d.mapped_at_peak.assign(d.mapped.begin(), d.mapped.end());
  }

  std::string* error_;
  std::map<int, DeviceScan> devs_;
  std::vector<std::uint8_t> run_small_;  // by run id: 1 = mapped for a small-pool allocation
};

}  // namespace

bool parse_warm_plan(std::string_view text, WarmPlan* plan, std::string* error) {
  *plan = WarmPlan{};
  return PlanParser(plan, error).run(text);
}

std::string format_warm_plan(const WarmPlan& plan) {
  std::string out(kWarmPlanMagic);
  out += "\n# segments each device's pool held at its peak; `cudapool plan` wrote this, the policy key\n";
  out += "# warm_start preallocates them (docs/trace-format.md, \"Warm-start plans\")\n";
  if (!plan.source.empty()) {
    out += "source " + capped_source(plan.source) + "\n";
  }
  for (const WarmDevice& d : plan.devices)
    out += "device " + std::to_string(d.device) + " peak_reserved " + std::to_string(d.peak_reserved) + "\n";
  for (const WarmSegment& s : plan.segments) {
    out += "segment " + std::to_string(s.device) + (s.small ? " small" : " large") +
           (s.expandable ? " expandable " : " classic ") + std::to_string(s.bytes);
    if (!s.split.empty()) {
      out += " split ";
      for (std::size_t i = 0; i < s.split.size(); ++i) out += (i ? "," : "") + std::to_string(s.split[i]);
    }
    out += "\n";
  }
  return out;
}

bool warm_plan_from_trace(std::istream& in, WarmPlan* plan, std::string* error) {
  *plan = WarmPlan{};
  TraceScan scan(error);
  if (!scan.pass(in, false)) return false;
  in.clear();
  in.seekg(0);
  if (!in) {
    if (error) *error = "line 1: the trace cannot be read a second time";
    return false;
  }
  if (!scan.pass(in, true)) return false;
  scan.finish(plan);
  if (plan->segments.size() > kMaxWarmSegments) {
    if (error) *error = "line 1: more than " + std::to_string(kMaxWarmSegments) + " segments at the peak";
    return false;
  }
  if (plan->segments.empty()) {
    if (error)
      *error =
          "line 1: the trace records no segment (segment_alloc or segment_map rows): nothing to preallocate "
          "(an RMM log, or a run that allocated nothing)";
    return false;
  }
  return true;
}

namespace {

// An istream over a file descriptor this code opened itself (seekable: a regular file).
class FdBuf : public std::streambuf {
 public:
  explicit FdBuf(int fd) : fd_(fd) {}

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    ssize_t n;
    do n = ::read(fd_, buf_, sizeof buf_);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return traits_type::eof();
    setg(buf_, buf_, buf_ + n);
    return traits_type::to_int_type(*gptr());
  }
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override {
    if (dir != std::ios_base::beg) return pos_type(off_type(-1));
    return seekpos(pos_type(off), std::ios_base::in);
  }
  pos_type seekpos(pos_type pos, std::ios_base::openmode) override {
    if (::lseek(fd_, static_cast<off_t>(pos), SEEK_SET) < 0) return pos_type(off_type(-1));
    setg(buf_, buf_, buf_);
    return pos;
  }

 private:
  int fd_;
  char buf_[64 * 1024];
};

// true when `head` (a file's first bytes, not a plan's magic line) may start a trace. Otherwise
// *why says what is wrong: a plan with lines written ahead of its magic line (what a shell
// redirection catches when a summary shares the plan's stream), or a file of neither kind.
bool neither_plan_nor_trace(std::string_view head, std::string* why) {
  const std::string magic_line = "\n" + std::string(kWarmPlanMagic);
  const std::size_t at = head.find(magic_line);
  if (at != std::string_view::npos) {
    const auto line = static_cast<std::size_t>(
                          std::count(head.begin(), head.begin() + static_cast<std::ptrdiff_t>(at), '\n')) +
                      2;
    *why = "line " + std::to_string(line) + ": a warm-start plan begins here, not on line 1: the " +
           std::to_string(line - 1) + " line(s) before it are not part of a plan; delete them, or write the plan " +
           "again with `cudapool plan TRACE -o PLAN`";
    return false;
  }
  if (head.empty()) return true;  // the trace reader says "empty file"
  std::string_view first = head.substr(0, head.find('\n'));
  if (!first.empty() && first.back() == '\r') first.remove_suffix(1);
  if (first.substr(0, 3) == "\xEF\xBB\xBF") first.remove_prefix(3);
  // The trace reader's own message names what the header lacks; only a file that is no CSV trace
  // of any kind is named here.
  const std::string_view header = trace_header();
  const std::string_view rmm = header.substr(0, header.find(",device"));
  if (first.substr(0, rmm.size()) == rmm) return true;
  *why = "line 1: neither a warm-start plan (whose first line is '" + std::string(kWarmPlanMagic) +
         "') nor a trace (whose first line is the CSV header '" + std::string(rmm) + ",...'): it begins " +
         shown(first);
  return false;
}

}  // namespace

bool load_warm_plan(const std::string& path, WarmPlan* plan, std::string* error) {
  // O_NONBLOCK: a FIFO or device named here must not block the open; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (error) *error = printable(path) + ": cannot open: " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    if (error) *error = printable(path) + ": not a regular file";
    return false;
  }
  ::fcntl(fd, F_SETFL, 0);  // plain blocking reads from here on
  // The file's start: which kind of file it is, and what to say when it is neither.
  std::string head(4096, '\0');
  ssize_t got;
  do got = ::pread(fd, head.data(), head.size(), 0);
  while (got < 0 && errno == EINTR);
  head.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
  const bool is_plan = std::string_view(head).substr(0, kWarmPlanMagic.size()) == kWarmPlanMagic;
  bool ok = false;
  std::string why;
  if (is_plan) {
    if (static_cast<std::uint64_t>(st.st_size) > kMaxWarmPlanFile) {
      why = "line 1: the file is larger than " + std::to_string(kMaxWarmPlanFile >> 20) + " MiB";
    } else {
      std::string text;
      char buf[64 * 1024];
      ssize_t n;
      while (text.size() <= kMaxWarmPlanFile && ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0) text.append(buf, static_cast<std::size_t>(n));
      ok = parse_warm_plan(text, plan, &why);
    }
  } else if (head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
             static_cast<unsigned char>(head[1]) == 0x8b) {
    why =
        "line 1: the file is compressed with gzip, which a warm start does not read; make a plan from it once "
        "(cudapool plan TRACE -o PLAN reads it as it is) and name the plan";
  } else if (!neither_plan_nor_trace(head, &why)) {
    // why says what the file is instead
  } else if (static_cast<std::uint64_t>(st.st_size) > kMaxWarmTraceFile) {
    why = "line 1: a trace of " + std::to_string(static_cast<std::uint64_t>(st.st_size) >> 20) +
          " MiB is more than a warm start reads at a pool's start (" + std::to_string(kMaxWarmTraceFile >> 20) +
          " MiB); make a plan from it once (cudapool plan TRACE -o PLAN) and name the plan";
  } else {
    FdBuf fb(fd);
    std::istream in(&fb);
    ok = warm_plan_from_trace(in, plan, &why);
    if (ok && plan->source.empty()) plan->source = capped_source("trace " + path);
  }
  ::close(fd);
  if (!ok && error) {
    // "line N: what" becomes "PATH:N: what", as the trace reader's messages do.
    *error = why.rfind("line ", 0) == 0 ? printable(path) + ":" + why.substr(5) : printable(path) + ": " + why;
  }
  return ok;
}

}  // namespace cudapool
