// The driver calls the fence layer makes, counted by function where they are paid (the exit
// summary's driver_calls): what the pool's stream safety costs a program.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace cudapool::shim {

enum class FenceCall : std::uint8_t {
  event_record,
  event_query,
  event_sync,
  stream_wait,
  context_switch,
  stream_query,
  sweeps,
  non_blocking_streams,
  context_record,
  context_wait,
};

// The counts at one moment, by function.
struct FenceCallCounts {
  std::int64_t event_record = 0, event_query = 0, event_sync = 0, stream_wait = 0, context_switch = 0, stream_query = 0,
               sweeps = 0, non_blocking_streams = 0, context_record = 0, context_wait = 0;
};

// Counted under the fences' lock (or by the one thread that holds it), read at any time: relaxed
// atomics, a load and a store each (no read-modify-write on the hot path).
class FenceCalls {
 public:
  void add(FenceCall c) noexcept {
    std::atomic<std::int64_t>& n = n_[static_cast<std::size_t>(c)];
    n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  std::int64_t get(FenceCall c) const noexcept {
    return n_[static_cast<std::size_t>(c)].load(std::memory_order_relaxed);
  }
  FenceCallCounts counts() const noexcept {
    FenceCallCounts c;
    c.event_record = get(FenceCall::event_record);
    c.event_query = get(FenceCall::event_query);
    c.event_sync = get(FenceCall::event_sync);
    c.stream_wait = get(FenceCall::stream_wait);
    c.context_switch = get(FenceCall::context_switch);
    c.stream_query = get(FenceCall::stream_query);
    c.sweeps = get(FenceCall::sweeps);
    c.non_blocking_streams = get(FenceCall::non_blocking_streams);
    c.context_record = get(FenceCall::context_record);
    c.context_wait = get(FenceCall::context_wait);
    return c;
  }

 private:
  static constexpr std::size_t kKinds = static_cast<std::size_t>(FenceCall::context_wait) + 1;
  std::array<std::atomic<std::int64_t>, kKinds> n_{};
};

}  // namespace cudapool::shim
