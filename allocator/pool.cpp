// TEMPORARY first cut of DevicePool so other modules can link: every allocation is its own
// upstream segment, nothing is cached, fences are not used. Replaced by the real pool next.
#include <map>
#include <mutex>

#include "allocator/pool.h"

namespace cudapool {

struct DevicePool::Impl {
  struct Seg {
    std::size_t size, requested;
  };
  int device;
  PoolOptions options;
  Upstream& upstream;
  FenceProvider& fences;
  EventSink* sink;
  mutable std::mutex mu;
  std::map<std::uintptr_t, Seg> segs;
  Stats stats;
  Impl(int d, const PoolOptions& o, Upstream& u, FenceProvider& f, EventSink* s)
      : device(d), options(o), upstream(u), fences(f), sink(s) {}
};

DevicePool::DevicePool(int device, const PoolOptions& options, Upstream& upstream, FenceProvider& fences,
                       EventSink* sink)
    : impl_(std::make_unique<Impl>(device, options, upstream, fences, sink)) {}

DevicePool::~DevicePool() {
  for (auto& [b, s] : impl_->segs) impl_->upstream.release(reinterpret_cast<void*>(b), s.size);
}

AllocResult DevicePool::allocate(std::size_t size, StreamId) {
  if (size == 0) return {};
  std::size_t r = round_size(size, impl_->options);
  if (r == 0) return {nullptr, AllocStatus::invalid_size};
  void* p = nullptr;
  std::lock_guard<std::mutex> lock(impl_->mu);
  UpstreamStatus st = impl_->upstream.allocate(r, &p);
  if (st != UpstreamStatus::ok)
    return {nullptr, st == UpstreamStatus::out_of_memory ? AllocStatus::out_of_memory : AllocStatus::upstream_error};
  impl_->segs[reinterpret_cast<std::uintptr_t>(p)] = {r, size};
  return {p, AllocStatus::ok};
}

FreeStatus DevicePool::free(void* ptr) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->segs.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == impl_->segs.end()) return FreeStatus::not_owned;
  impl_->upstream.release(ptr, it->second.size);
  impl_->segs.erase(it);
  return FreeStatus::ok;
}
FreeStatus DevicePool::free_on_stream(void* ptr, StreamId) { return free(ptr); }

std::optional<AddressInfo> DevicePool::address_info(const void* ptr) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto a = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = impl_->segs.upper_bound(a);
  if (it == impl_->segs.begin()) return std::nullopt;
  --it;
  if (a >= it->first + it->second.size) return std::nullopt;
  return AddressInfo{it->first, it->second.requested, it->first, it->second.size, true, false};
}
bool DevicePool::owns(const void* ptr) const { return address_info(ptr).has_value(); }
std::size_t DevicePool::empty_cache() { return 0; }
void DevicePool::retire_stream(StreamId) {}
void DevicePool::abandon() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->segs.clear();
}
std::size_t DevicePool::cached_bytes() const { return 0; }
Stats DevicePool::stats() const { return impl_->stats; }
void DevicePool::reset_peak_stats() {}
void DevicePool::reset_accumulated_stats() {}
Snapshot DevicePool::snapshot() const { return {}; }
const PoolOptions& DevicePool::options() const { return impl_->options; }
int DevicePool::device() const { return impl_->device; }
void DevicePool::set_event_sink(EventSink* sink) { impl_->sink = sink; }
std::string DevicePool::check_consistency() const { return ""; }

}  // namespace cudapool
