#include "tools/sim_device.h"

#include "allocator/pool.h"

#include <cstdio>
#include <cstdlib>

namespace cudapool::tools {

SimUpstream::SimUpstream(std::size_t total_bytes, std::size_t granularity)
    : total_(total_bytes), granularity_(granularity) {}

std::uintptr_t SimUpstream::take_addresses(std::size_t bytes) {
  constexpr std::uintptr_t kAlign = 2 * 1024 * 1024;  // what cuMemAlloc gives large segments
  std::uintptr_t base = next_address_;
  next_address_ += (bytes + kAlign - 1) / kAlign * kAlign;
  return base;
}

bool SimUpstream::charge(std::size_t bytes) {
  ++calls_;
  if (bytes > total_ - used_) {
    ++refusals_;
    return false;
  }
  used_ += bytes;
  return true;
}

UpstreamStatus SimUpstream::allocate(std::size_t bytes, void** out) {
  if (!charge(bytes)) return UpstreamStatus::out_of_memory;
  *out = reinterpret_cast<void*>(take_addresses(bytes));
  return UpstreamStatus::ok;
}

void SimUpstream::release(void*, std::size_t bytes) {
  ++calls_;
  used_ -= bytes <= used_ ? bytes : used_;
}

void SimUpstream::mem_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (free_bytes) *free_bytes = total_ - used_;
  if (total_bytes) *total_bytes = total_;
}

UpstreamStatus SimUpstream::reserve(std::size_t bytes, std::size_t page, void** out) {
  if (granularity_ == 0 || page == 0 || page % granularity_ != 0 || bytes % page != 0) return UpstreamStatus::error;
  *out = reinterpret_cast<void*>(take_addresses(bytes));  // address space only: not charged
  return UpstreamStatus::ok;
}

void SimUpstream::unreserve(void*, std::size_t) {}

UpstreamStatus SimUpstream::map(void* addr, std::size_t bytes) {
  if (!charge(bytes)) return UpstreamStatus::out_of_memory;
  units_[reinterpret_cast<std::uintptr_t>(addr)] = bytes;
  ++unit_ops_;
  return UpstreamStatus::ok;
}

void SimUpstream::unmap(void* addr, std::size_t bytes) {
  ++calls_;
  used_ -= bytes <= used_ ? bytes : used_;
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  unit_ops_ += take_units(lo, lo + bytes).size();
}

// The same physical memory at a new address: nothing charged, each unit keeps its size.
UpstreamStatus SimUpstream::move(void* from, void* to, std::size_t bytes) {
  calls_ += 2;  // an unmap and a map, as the pool's statistics count upstream work
  move_units(from, to, bytes);
  return UpstreamStatus::ok;
}

// A second mapping of the same physical memory (the old one goes with unalias): nothing charged.
UpstreamStatus SimUpstream::alias(void* from, void* to, std::size_t bytes) {
  ++calls_;
  move_units(from, to, bytes);
  return UpstreamStatus::ok;
}

void SimUpstream::unalias(void*, std::size_t) { ++calls_; }

void SimUpstream::move_units(void* from, void* to, std::size_t bytes) {
  const auto src = reinterpret_cast<std::uintptr_t>(from), dst = reinterpret_cast<std::uintptr_t>(to);
  const auto moved = take_units(src, src + bytes);
  for (const auto& [at, size] : moved) units_[dst + (at - src)] = size;
  unit_ops_ += moved.size();
}

std::vector<std::pair<std::uintptr_t, std::size_t>> SimUpstream::take_units(std::uintptr_t lo, std::uintptr_t hi) {
  const auto first = units_.lower_bound(lo), last = units_.lower_bound(hi);
  std::vector<std::pair<std::uintptr_t, std::size_t>> out(first, last);
  units_.erase(first, last);
  return out;
}

FenceHandle SimFences::record() {
  fences_.push_back({index_, now_ns_ + latency_ns_, false});
  ++live_;
  return fences_.size();
}

namespace {
const std::int64_t* g_trace_now = nullptr;
std::int64_t trace_now() { return *g_trace_now; }
}  // namespace

TraceClock::TraceClock(const std::int64_t* now) {
  g_trace_now = now;
  set_pool_clock_for_testing(&trace_now);
}
TraceClock::~TraceClock() {
  set_pool_clock_for_testing(nullptr);
  g_trace_now = nullptr;
}

bool SimFences::query(FenceHandle h) {
  Fence& f = fences_[h - 1];
  if (!f.done && index_ > f.index && now_ns_ >= f.ready_ns) f.done = true;
  return f.done;
}

void SimFences::wait(FenceHandle h) {
  Fence& f = fences_[h - 1];
  if (!f.done) ++waits_;
  f.done = true;
}

void SimFences::release(FenceHandle h) {
  if (h == 0 || h > fences_.size()) {
    std::fprintf(stderr, "cudapool: internal error: release of unknown fence %llu\n",
                 static_cast<unsigned long long>(h));
    std::abort();
  }
  --live_;
}

}  // namespace cudapool::tools
