// Device memory the program takes outside the pool, counted against the pool's limit
// (Limits::external): the shim's cuMemCreate hook reserves it here before the driver call.
#include "allocator/pool_impl.h"

namespace cudapool {

bool DevicePool::reserve_external(std::size_t bytes) {
  Impl& pool = *impl_;
  std::size_t excess = 0;
  {
    Impl::Guard lock(pool.mu);
    pool.limits.ensure(pool.up, pool.opt);
    if (pool.limits.limit() != kNoLimit && bytes > pool.limits.limit()) return false;  // larger than the limit itself
    excess = pool.limits.excess(pool.ledger.reserved_bytes(), bytes);
    if (excess == 0) {
      pool.limits.add_external(bytes);
      return true;
    }
  }
  // Room from the pool's own idle cache, as an allocation of the pool would make it.
  release_idle(excess);
  Impl::Guard lock(pool.mu);
  if (pool.limits.excess(pool.ledger.reserved_bytes(), bytes) != 0) return false;
  pool.limits.add_external(bytes);
  return true;
}

void DevicePool::unreserve_external(std::size_t bytes) {
  Impl::Guard lock(impl_->mu);
  impl_->limits.remove_external(bytes);
}

std::size_t DevicePool::external_bytes() const {
  Impl::Guard lock(impl_->mu);
  return impl_->limits.external();
}

}  // namespace cudapool
