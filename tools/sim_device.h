// The simulated GPU that replay and tune run the pool against: an Upstream that hands out fake
// addresses from a device of settable size, and a FenceProvider whose fences complete on the
// trace's clock. The pool never touches the memory it manages, so fake addresses are enough.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "allocator/fence.h"
#include "allocator/upstream.h"

namespace cudapool::tools {

// The simulated device's page size for expandable segments (what datacenter GPUs report).
inline constexpr std::size_t kSimGranularity = std::size_t{2} << 20;

class SimUpstream : public Upstream {
 public:
  // `total_bytes`: the device's memory; allocations beyond it fail with out_of_memory.
  // `granularity`: page size for expandable segments (0 = expandable unsupported).
  explicit SimUpstream(std::size_t total_bytes, std::size_t granularity = kSimGranularity);

  UpstreamStatus allocate(std::size_t bytes, void** out) override;
  void release(void* base, std::size_t bytes) override;
  void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) override;
  std::size_t granularity() override { return granularity_; }
  UpstreamStatus reserve(std::size_t bytes, std::size_t page, void** out) override;
  void unreserve(void* base, std::size_t bytes) override;
  UpstreamStatus map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  UpstreamStatus move(void* from, void* to, std::size_t bytes) override;
  bool can_alias() override { return granularity_ != 0; }
  UpstreamStatus alias(void* from, void* to, std::size_t bytes) override;
  void unalias(void* addr, std::size_t bytes) override;

  std::size_t used() const { return used_; }
  std::uint64_t calls() const { return calls_; }  // allocate + release + map + unmap
  std::uint64_t refusals() const { return refusals_; }
  // Expandable segments: physical allocations created, moved and released. Each costs the
  // driver about the same whatever its size (~40-50 us on an H200: docs/benchmarks.md), so this
  // is the replay's measure of growth cost.
  std::uint64_t unit_ops() const { return unit_ops_; }

 private:
  std::uintptr_t take_addresses(std::size_t bytes);
  bool charge(std::size_t bytes);
  std::size_t total_, granularity_;
  std::size_t used_ = 0;
  std::uint64_t calls_ = 0, refusals_ = 0, unit_ops_ = 0;
  std::map<std::uintptr_t, std::size_t> units_;  // mapped physical allocations: base -> bytes
  // Takes the units inside [lo, hi) out of units_; returns them (address order).
  std::vector<std::pair<std::uintptr_t, std::size_t>> take_units(std::uintptr_t lo, std::uintptr_t hi);
  // The units of [from, from + bytes) to the same offsets from `to`, each counted as a handle op.
  void move_units(void* from, void* to, std::size_t bytes);
  // Addresses are never reused: a stale pointer in the pool can never alias a new segment.
  std::uintptr_t next_address_ = std::uintptr_t{1} << 40;
};

// While a TraceClock lives, the pool's clock (its fence batch window and query back-off) reads
// the simulated time *now instead of the host's steady clock: a replay then closes batches where
// the traced program did, however fast the replay runs, and gives the same answer every time.
// One at a time per process (the pool's clock is process-wide).
class TraceClock {
 public:
  explicit TraceClock(const std::int64_t* now);
  ~TraceClock();
  TraceClock(const TraceClock&) = delete;
  TraceClock& operator=(const TraceClock&) = delete;
};

// Fence model (docs/tools.md, "replay"): a fence recorded while the replay is at event i with
// trace time t completes once the replay has moved past event i and the trace time has reached
// t + latency. With latency 0 that is "the GPU caught up by the next call", which is what a
// free on one stream followed by an allocation on another looks like on an idle-enough device.
// Waiting on a fence (the pool blocking) completes it at once and is counted.
class SimFences : public FenceProvider {
 public:
  // orders_for_free: answer FenceProvider::orders_for_free as the shim does (tools/replay.cpp).
  explicit SimFences(std::int64_t latency_ns = 0, bool orders_for_free = false)
      : latency_ns_(latency_ns), orders_for_free_(orders_for_free) {}

  // The replay calls this before each event.
  void advance(std::uint64_t event_index, std::int64_t time_ns) {
    index_ = event_index;
    now_ns_ = time_ns;
  }

  FenceHandle record_device() override { return record(); }
  FenceHandle record_stream(StreamId) override { return record(); }
  bool query(FenceHandle f) override;
  void wait(FenceHandle f) override;
  void release(FenceHandle f) override;
  // The simulated GPU honours every GPU-side wait; the replay's host never blocks for one.
  bool order_after(const FenceHandle*, std::size_t) override {
    ++gpu_waits_;
    return true;
  }
  bool orders_for_free() override { return orders_for_free_; }

  std::uint64_t gpu_waits() const { return gpu_waits_; }
  std::uint64_t recorded() const { return fences_.size(); }
  std::uint64_t waits() const { return waits_; }
  std::uint64_t live() const { return live_; }

 private:
  struct Fence {
    std::uint64_t index;
    std::int64_t ready_ns;
    bool done;
  };
  FenceHandle record();
  std::int64_t latency_ns_;
  bool orders_for_free_;
  std::uint64_t index_ = 0;
  std::int64_t now_ns_ = 0;
  std::vector<Fence> fences_;  // handle h is fences_[h - 1]
  std::uint64_t waits_ = 0, live_ = 0, gpu_waits_ = 0;
};

}  // namespace cudapool::tools
