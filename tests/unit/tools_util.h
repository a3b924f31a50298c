// Helpers for the tools tests: hand-built traces as rows or CSV text.
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "allocator/types.h"
#include "telemetry/trace.h"

namespace cudapool::tools::testing {

// A small trace builder: one row per call, time advancing 1 µs per row.
class TraceBuilder {
 public:
  TraceBuilder& device(std::size_t total) { return add(TraceAction::device, 0, total, 0); }
  TraceBuilder& alloc(std::uintptr_t ptr, std::size_t size, std::uintptr_t stream = 0, int dev = 0) {
    return add(TraceAction::allocate, ptr, size, stream, dev);
  }
  TraceBuilder& free(std::uintptr_t ptr, std::size_t size, std::uintptr_t stream = 0, int dev = 0) {
    return add(TraceAction::free, ptr, size, stream, dev);
  }
  // A free whose row says which call the program made (cudaFree = sync, cudaFreeAsync = async).
  TraceBuilder& free_as(std::uintptr_t ptr, std::size_t size, std::uintptr_t stream, bool sync) {
    add(TraceAction::free, ptr, size, stream);
    rows_.back().detail = sync ? TraceDetail::free_sync : TraceDetail::free_async;
    return *this;
  }
  TraceBuilder& segment(std::uintptr_t ptr, std::size_t size) { return add(TraceAction::segment_alloc, ptr, size, 0); }
  TraceBuilder& segment_free(std::uintptr_t ptr, std::size_t size) {
    return add(TraceAction::segment_free, ptr, size, 0);
  }
  TraceBuilder& failure(std::size_t size) { return add(TraceAction::allocate_failure, 0, size, 0); }
  TraceBuilder& add(TraceAction a, std::uintptr_t ptr, std::size_t size, std::uintptr_t stream, int dev = 0) {
    TraceRow r;
    r.thread = 1;
    r.time_ns = 1'000'000'000 + static_cast<std::int64_t>(rows_.size()) * 1000;
    r.action = a;
    r.ptr = ptr;
    r.size = size;
    r.requested = size;
    r.stream = stream;
    r.device = dev;
    rows_.push_back(r);
    return *this;
  }
  const std::vector<TraceRow>& rows() const { return rows_; }
  std::string csv() const {
    std::string s = std::string(trace_header()) + "\n";
    for (const auto& r : rows_) s += format_trace_row(r) + "\n";
    return s;
  }

 private:
  std::vector<TraceRow> rows_;
};

}  // namespace cudapool::tools::testing
