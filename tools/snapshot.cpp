#include "tools/snapshot.h"

#include <algorithm>

#include "tools/pickle.h"
#include "tools/units.h"

namespace cudapool::tools {
namespace {

// PyTorch's frames: a list of {"filename", "line", "name"}, innermost first. A recorded call site
// ("module+0xoffset symbol;…", telemetry/trace.h) gives one per frame: filename the module and
// offset (what addr2line takes), name the symbol where the module exports one, line 0 (a trace
// has no debug information). No site: an empty list, as PyTorch writes without context.
void frames(PickleWriter& w, const std::string* site) {
  w.begin_list();
  if (site != nullptr) {
    std::size_t start = 0;
    while (start < site->size()) {
      std::size_t end = site->find(';', start);
      if (end == std::string::npos) end = site->size();
      const std::string frame = site->substr(start, end - start);
      const std::size_t space = frame.find(' ');
      w.begin_dict();
      w.key("filename");
      w.str(frame.substr(0, space));
      w.key("line");
      w.integer(0);
      w.key("name");
      w.str(space == std::string::npos ? "??" : frame.substr(space + 1));
      w.end();
      start = end + 1;
    }
  }
  w.end();
}

// One device_traces entry. PyTorch's fields: action, addr, size, stream, time_us, frames,
// compile_context and user_metadata (the last two empty here: a trace has neither).
void trace_entry(PickleWriter& w, const char* action, std::uintptr_t addr, std::size_t size, std::uintptr_t stream,
                 std::int64_t time_ns, const std::int64_t* device_free = nullptr, const std::string* site = nullptr) {
  w.begin_dict();
  w.key("action");
  w.str(action);
  w.key("addr");
  w.uinteger(addr);
  w.key("size");
  w.uinteger(size);
  w.key("stream");
  w.uinteger(stream);
  w.key("time_us");
  w.integer(time_ns / 1000);
  w.key("frames");
  frames(w, site);
  w.key("compile_context");
  w.str("N/A");
  w.key("user_metadata");
  w.str("");
  if (device_free != nullptr) {
    w.key("device_free");
    w.integer(*device_free);
  }
  w.end();
}

using BlockSites = std::unordered_map<std::uintptr_t, std::uint32_t>;

// The call site of a site id (telemetry/trace.h: 1-based, 0 = none), or null.
const std::string* site_of(const std::vector<std::string>* sites, std::uint32_t id) {
  return sites != nullptr && id != 0 && id <= sites->size() ? &(*sites)[id - 1] : nullptr;
}

void write_block(PickleWriter& w, const BlockInfo& b, const std::string* site) {
  w.begin_dict();
  w.key("address");
  w.uinteger(b.address);
  w.key("size");
  w.uinteger(b.size);
  w.key("requested_size");
  w.uinteger(b.requested_size);
  w.key("state");
  w.str(to_string(b.state));
  w.key("frames");  // where the live block was allocated, when the trace says
  frames(w, site);
  w.end();
}

// One segments entry with its blocks; the figures counted.
void write_segment(PickleWriter& w, const SegmentInfo& s, const std::vector<std::string>* sites,
                   const BlockSites* block_sites, SnapshotFigures* fig) {
  fig->reserved += s.total_size;
  fig->allocated += s.allocated_size;
  fig->requested += s.requested_size;
  w.begin_dict();
  w.key("device");
  w.integer(s.device);
  w.key("address");
  w.uinteger(s.address);
  w.key("total_size");
  w.uinteger(s.total_size);
  w.key("allocated_size");
  w.uinteger(s.allocated_size);
  w.key("active_size");
  w.uinteger(s.active_size);
  w.key("requested_size");
  w.uinteger(s.requested_size);
  w.key("stream");
  w.uinteger(s.stream);
  w.key("segment_type");
  w.str(s.is_small ? "small" : "large");
  w.key("segment_pool_id");  // (0, 0): the default pool, no CUDA graph pool
  w.begin_tuple();
  w.integer(0);
  w.integer(0);
  w.end();
  w.key("is_expandable");
  w.boolean(s.is_expandable);
  w.key("frames");
  w.begin_list();
  w.end();
  w.key("blocks");
  w.begin_list();
  for (const BlockInfo& b : s.blocks) {
    ++fig->blocks;
    if (b.state == BlockState::active_allocated) ++fig->active_blocks;
    const std::string* site = nullptr;
    if (block_sites != nullptr && b.state == BlockState::active_allocated)
      if (auto it = block_sites->find(b.address); it != block_sites->end()) site = site_of(sites, it->second);
    if (site != nullptr) ++fig->blocks_with_frames;
    write_block(w, b, site);
  }
  w.end();
  w.end();
}

// The device_traces entries of one row (none for the pool's own bookkeeping: driver refusals,
// gc, waits have no PyTorch action); *reserved follows the segment rows.
void write_trace_row(PickleWriter& w, const TraceRow& r, std::size_t device_memory,
                     const std::vector<std::string>* sites, std::int64_t* reserved, SnapshotFigures* fig) {
  switch (r.action) {
    case TraceAction::allocate:
      trace_entry(w, "alloc", r.ptr, r.requested, r.stream, r.time_ns, nullptr, site_of(sites, r.site));
      ++fig->events;
      break;
    case TraceAction::free:
      // The pool has no later moment at which a free "completes" for the program: both at once.
      trace_entry(w, "free_requested", r.ptr, r.requested, r.stream, r.time_ns);
      trace_entry(w, "free_completed", r.ptr, r.requested, r.stream, r.time_ns);
      fig->events += 2;
      break;
    case TraceAction::segment_alloc:
    case TraceAction::segment_map:
      *reserved = add_bytes(*reserved, r.size);
      trace_entry(w, r.action == TraceAction::segment_alloc ? "segment_alloc" : "segment_map", r.ptr, r.size, r.stream,
                  r.time_ns);
      ++fig->events;
      break;
    case TraceAction::segment_free:
    case TraceAction::segment_unmap:
      *reserved = sub_bytes(*reserved, r.size);
      trace_entry(w, r.action == TraceAction::segment_free ? "segment_free" : "segment_unmap", r.ptr, r.size, r.stream,
                  r.time_ns);
      ++fig->events;
      break;
    case TraceAction::allocate_failure: {
      // What the program saw: out of memory for this request (PyTorch's 'oom').
      const std::int64_t device_free = std::max<std::int64_t>(0, static_cast<std::int64_t>(device_memory) - *reserved);
      trace_entry(w, "oom", 0, r.requested ? r.requested : r.size, r.stream, r.time_ns, &device_free);
      ++fig->events;
      break;
    }
    default: break;
  }
}

// device_traces: one list per device up to the replayed one (the others stay empty).
void write_device_traces(PickleWriter& w, const std::vector<TraceRow>& rows, int device, std::size_t device_memory,
                         const std::vector<std::string>* sites, SnapshotFigures* fig) {
  w.key("device_traces");
  w.begin_list();
  // Bounded: the reader takes no device above kMaxTraceDevice, and a caller's own number is cut
  // there too rather than writing billions of empty lists.
  device = std::clamp(device, 0, static_cast<int>(kMaxTraceDevice));
  for (int d = 0; d < device; ++d) {
    w.begin_list();
    w.end();
  }
  w.begin_list();
  std::int64_t reserved = 0;
  for (const TraceRow& r : rows)
    if (r.device == device) write_trace_row(w, r, device_memory, sites, &reserved, fig);
  w.end();
  w.end();
}

void write_allocator_settings(PickleWriter& w, const std::string& conf, const PoolOptions& options) {
  w.key("allocator_settings");
  w.begin_dict();
  w.key("PYTORCH_CUDA_ALLOC_CONF");
  w.str(conf);
  w.key("max_split_size");
  w.integer(options.max_split_size == kNoLimit ? -1 : static_cast<std::int64_t>(options.max_split_size));
  w.key("garbage_collection_threshold");
  w.real(options.garbage_collection_threshold);
  w.key("expandable_segments");
  w.boolean(options.expandable_segments);
  w.key("release_lock_on_cudamalloc");
  w.boolean(options.release_lock_on_cudamalloc);
  w.key("roundup_power2_divisions");
  w.begin_list();
  for (auto d : options.roundup_power2_divisions) w.integer(d);
  w.end();
  w.end();
}

}  // namespace

std::string snapshot_pickle(const Snapshot& snap, const std::vector<TraceRow>& rows, int device,
                            std::size_t device_memory, const std::string& conf, const PoolOptions& options,
                            SnapshotFigures* figures, const std::vector<std::string>* sites,
                            const std::unordered_map<std::uintptr_t, std::uint32_t>* block_sites) {
  SnapshotFigures fig = figures ? *figures : SnapshotFigures{};
  fig.segments = snap.segments.size();
  fig.reserved = fig.allocated = fig.requested = 0;
  fig.blocks = fig.active_blocks = fig.events = fig.blocks_with_frames = 0;
  PickleWriter w;
  w.begin_dict();
  w.key("segments");
  w.begin_list();
  for (const SegmentInfo& s : snap.segments) write_segment(w, s, sites, block_sites, &fig);
  w.end();
  write_device_traces(w, rows, device, device_memory, sites, &fig);
  w.key("external_annotations");  // PyTorch's record_annotations(); none in a trace
  w.begin_list();
  w.end();
  write_allocator_settings(w, conf, options);
  w.end();
  if (figures) *figures = fig;
  return w.finish();
}

std::string snapshot_from_replay(const PreparedTrace& trace, const ReplayConfig& config,
                                 std::optional<std::int64_t> at_ns, const std::string& conf, SnapshotFigures* figures) {
  SnapshotFigures fig;
  if (at_ns) {
    fig.op = op_at_time(trace, *at_ns);
  } else {
    ReplayConfig find = config;
    find.collect_rows = false;
    find.track_peak = true;
    fig.op = replay_trace(trace, find).peak_op;
    fig.at_peak = true;
  }
  fig.t_ns = trace.ops.empty() ? 0 : trace.ops[fig.op].time_ns - trace.facts.start_ns;
  ReplayConfig take = config;
  take.collect_rows = true;
  take.snapshot_after_op = fig.op;
  ReplayResult r = replay_trace(trace, take);
  std::string out = snapshot_pickle(r.snapshot.value_or(Snapshot{}), r.rows, trace.facts.device, r.device_memory, conf,
                                    config.pool, &fig, &trace.sites, &r.block_sites);
  if (figures) *figures = fig;
  return out;
}

}  // namespace cudapool::tools
