// A fake FenceProvider for tests, tools and benchmarks. Fences complete only when the test says
// so (complete(), complete_all(), complete_some()), or at once in auto mode; wait() completes the
// fence it waits for (the GPU "catches up") and counts the wait. Handles are issued in increasing
// order, so a test can ask "has a fence recorded after point N completed?" (covered()), which
// is how the stress test proves that no pending block is handed out early. order_after (a GPU-side
// wait) succeeds unless the test turns it off; an ordered fence covers what it would cover once
// complete (work issued after the order waits for it on the "GPU"), and is listed until it
// completes, so a test can check that nothing is released while one still runs. Misuse (query,
// wait or release of an unknown or released handle) is counted, never fatal. Thread-safe.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

#include "allocator/fence.h"

namespace cudapool::testing {

class FakeFence : public FenceProvider {
 public:
  explicit FakeFence(bool auto_complete = false) : auto_complete_(auto_complete) {}

  // ---- FenceProvider -----------------------------------------------------------------------
  FenceHandle record_device() override { return record(true, 0); }
  FenceHandle record_stream(StreamId stream) override { return record(false, stream); }

  bool query(FenceHandle fence) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++queries_;
    auto it = fences_.find(fence);
    if (it == fences_.end()) {
      ++bad_calls_;
      return true;
    }
    return it->second.completed;
  }

  // Counted; in urgent-completes mode (set_urgent_completes) an urgent query completes the fence
  // first, as the shim's sweep answers at once what a plain query answers only later.
  bool query_urgent(FenceHandle fence) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++urgent_queries_;
      auto it = fences_.find(fence);
      if (urgent_completes_ && it != fences_.end()) mark_completed(fence, it->second);
    }
    return query(fence);
  }

  bool can_wait(FenceHandle fence) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fences_.find(fence);
    return can_wait_ || it == fences_.end() || it->second.completed;
  }

  void wait(FenceHandle fence) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++waits_;
    auto it = fences_.find(fence);
    if (it == fences_.end()) {
      ++bad_calls_;
      return;
    }
    mark_completed(fence, it->second);
  }

  void release(FenceHandle fence) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++releases_;
    if (fences_.erase(fence) == 0) ++bad_calls_;
  }

  bool order_after(const FenceHandle* fences, std::size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++order_calls_;
    if (!can_order_) return false;
    for (std::size_t i = 0; i < n; ++i) {
      auto it = fences_.find(fences[i]);
      if (it == fences_.end()) {
        ++bad_calls_;
        continue;
      }
      if (!it->second.device) ++bad_calls_;  // the pool orders device fences only
      it->second.ordered = true;
      if (!it->second.completed) ++ordered_running_;
      max_ordered_device_ = std::max(max_ordered_device_, fences[i]);
    }
    return true;
  }

  // Off unless a test turns it on (set_orders_for_free): a context whose every stream follows
  // the legacy stream. Answers as order_after would (refused orders are never free).
  bool orders_for_free() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++free_asks_;
    return orders_for_free_ && can_order_;
  }

  // ---- GPU-side waits ----------------------------------------------------------------------
  void set_can_order(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    can_order_ = on;
  }
  void set_orders_for_free(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    orders_for_free_ = on;
  }
  // Off: can_wait() says no for every fence not yet completed (the shim during a graph capture).
  void set_can_wait(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    can_wait_ = on;
  }
  void set_urgent_completes(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    urgent_completes_ = on;
  }
  std::size_t urgent_queries() const { return locked(urgent_queries_); }
  std::size_t free_asks() const { return locked(free_asks_); }
  std::size_t order_calls() const { return locked(order_calls_); }
  // Fences ordered while still running (GPU-side waits that really had something to wait for).
  std::size_t ordered_running() const { return locked(ordered_running_); }
  // Ordered fences not yet complete: memory handed out under them may still be in use by old work.
  std::size_t ordered_incomplete() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (auto& [h, f] : fences_) n += f.ordered && !f.completed;
    return n;
  }

  // ---- Control -----------------------------------------------------------------------------
  void set_auto_complete(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    auto_complete_ = on;
  }
  // Complete one fence; false if it is unknown (released or never recorded).
  bool complete(FenceHandle fence) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fences_.find(fence);
    if (it == fences_.end()) return false;
    mark_completed(fence, it->second);
    return true;
  }
  // Complete every outstanding fence; returns how many were not complete before.
  std::size_t complete_all() {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (auto& [h, f] : fences_)
      if (!f.completed) {
        mark_completed(h, f);
        ++n;
      }
    return n;
  }
  // Complete each outstanding fence with probability p (random order of completion, as streams
  // run independently on a GPU). Returns how many completed.
  template <class Rng>
  std::size_t complete_some(Rng& rng, double p) {
    std::lock_guard<std::mutex> lock(mu_);
    std::bernoulli_distribution coin(p);
    std::size_t n = 0;
    for (auto& [h, f] : fences_)
      if (!f.completed && coin(rng)) {
        mark_completed(h, f);
        ++n;
      }
    return n;
  }

  // The handle the next record_*() will return. Read it *before* a free: any fence that can
  // legitimately cover that free has a handle >= this value.
  FenceHandle next_handle() const {
    std::lock_guard<std::mutex> lock(mu_);
    return next_;
  }
  // true if some fence with handle >= since has completed that covers `stream` (a device fence
  // covers every stream; a stream fence only its own). stream = nullopt: device fences only.
  bool covered(FenceHandle since, std::optional<StreamId> stream) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (max_completed_device_ >= since) return true;
    if (!stream) return false;
    auto it = max_completed_stream_.find(*stream);
    return it != max_completed_stream_.end() && it->second >= since;
  }
  // covered(), or a device fence with handle >= since was ordered (order_after): new work of any
  // stream waits for it on the GPU, so memory may be REUSED, though not released or unmapped.
  bool covered_or_ordered(FenceHandle since, std::optional<StreamId> stream) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (max_ordered_device_ >= since) return true;
    }
    return covered(since, stream);
  }
  bool is_completed(FenceHandle fence) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fences_.find(fence);
    return it != fences_.end() && it->second.completed;
  }

  // ---- Counters ----------------------------------------------------------------------------
  std::size_t device_records() const { return locked(device_records_); }
  std::size_t stream_records() const { return locked(stream_records_); }
  std::size_t records() const { return locked(device_records_) + locked(stream_records_); }
  std::size_t queries() const { return locked(queries_); }
  std::size_t waits() const { return locked(waits_); }
  std::size_t releases() const { return locked(releases_); }
  std::size_t bad_calls() const { return locked(bad_calls_); }
  // Recorded and not yet released (a pool that leaks fences shows here).
  std::size_t outstanding() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fences_.size();
  }
  std::vector<FenceHandle> outstanding_handles() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<FenceHandle> v;
    for (auto& [h, f] : fences_) v.push_back(h);
    std::sort(v.begin(), v.end());
    return v;
  }

 private:
  struct Fence {
    bool device = false;
    StreamId stream = 0;
    bool completed = false;
    bool ordered = false;
  };

  FenceHandle record(bool device, StreamId stream) {
    std::lock_guard<std::mutex> lock(mu_);
    FenceHandle h = next_++;
    Fence& f = fences_[h];
    f.device = device;
    f.stream = stream;
    ++(device ? device_records_ : stream_records_);
    if (auto_complete_) mark_completed(h, f);
    return h;
  }
  void mark_completed(FenceHandle h, Fence& f) {
    if (f.completed) return;
    f.completed = true;
    if (f.device)
      max_completed_device_ = std::max(max_completed_device_, h);
    else
      max_completed_stream_[f.stream] = std::max(max_completed_stream_[f.stream], h);
  }
  std::size_t locked(const std::size_t& v) const {
    std::lock_guard<std::mutex> lock(mu_);
    return v;
  }

  mutable std::mutex mu_;
  bool auto_complete_;
  bool can_wait_ = true;
  FenceHandle next_ = 1;  // 0 is never a valid fence
  std::unordered_map<FenceHandle, Fence> fences_;
  FenceHandle max_completed_device_ = 0;
  FenceHandle max_ordered_device_ = 0;  // newest device fence the GPU was made to wait for
  bool can_order_ = true;
  bool orders_for_free_ = false;
  std::size_t order_calls_ = 0, ordered_running_ = 0, free_asks_ = 0, urgent_queries_ = 0;
  bool urgent_completes_ = false;
  std::unordered_map<StreamId, FenceHandle> max_completed_stream_;
  std::size_t device_records_ = 0, stream_records_ = 0, queries_ = 0, waits_ = 0, releases_ = 0;
  std::size_t bad_calls_ = 0;
};

}  // namespace cudapool::testing
