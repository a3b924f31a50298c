// What a park keeps for one upstream (shim/upstream/park_store.h).
#include "shim/upstream/park_store.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "shim/log.h"
#include "shim/upstream/cuda_upstream.h"

namespace cudapool::shim {

void* ParkStore::host_for(std::size_t bytes, std::string* why) {
  if (spare_ != nullptr && spare_bytes_ >= bytes) {
    host_ = spare_;
    host_bytes_ = spare_bytes_;
    host_pinned_ = true;
    spare_ = nullptr;
    spare_bytes_ = 0;
    return host_;
  }
  free_spare();  // too small for this park
  void* host = nullptr;
  if (d_.cuMemHostAlloc != nullptr && d_.cuMemHostAlloc(&host, bytes, 0) == CUDA_SUCCESS && host != nullptr) {
    host_pinned_ = true;
  } else {
    host = std::malloc(bytes);
    if (host == nullptr) {
      *why = "no host memory for " + std::to_string(bytes) + " bytes";
      return nullptr;
    }
    host_pinned_ = false;
    log_info("parking: pinned host memory refused for {} bytes; copying through pageable memory", bytes);
  }
  host_ = host;
  host_bytes_ = bytes;
  return host_;
}

void ParkStore::hold(std::vector<Unit> units, std::size_t total, bool kept) noexcept {
  if (!kept) free_host();
  units_ = std::move(units);
  total_ = total;
}

void ParkStore::restored(std::int64_t now_ns) noexcept {
  units_.clear();
  total_ = 0;
  if (host_ != nullptr && host_pinned_) {  // kept for the next park (release_spare frees it)
    spare_ = host_;
    spare_bytes_ = host_bytes_;
    spare_since_ns_ = now_ns;
    host_ = nullptr;
    host_bytes_ = 0;
    host_pinned_ = false;
  } else {
    free_host();
  }
}

void ParkStore::drop(std::uintptr_t lo, std::uintptr_t hi) noexcept {
  const auto gone = [&](const Unit& u) { return u.addr >= lo && u.addr + u.bytes <= hi; };
  for (const Unit& u : units_)
    if (gone(u)) total_ -= u.bytes;
  units_.erase(std::remove_if(units_.begin(), units_.end(), gone), units_.end());
  if (units_.empty()) {
    total_ = 0;
    free_host();
  }
}

std::size_t ParkStore::release_spare(std::int64_t keep_ns, std::int64_t now_ns) noexcept {
  if (spare_ == nullptr || now_ns - spare_since_ns_ < keep_ns) return 0;
  const std::size_t n = spare_bytes_;
  free_spare();
  return n;
}

void ParkStore::free_host() noexcept {
  if (host_ != nullptr) {
    if (host_pinned_ && d_.cuMemFreeHost != nullptr) {
      ScopedContext scope(d_, ctx_);
      d_.cuMemFreeHost(host_);
    } else {
      std::free(host_);
    }
  }
  host_ = nullptr;
  host_bytes_ = 0;
  host_pinned_ = false;
}

void ParkStore::free_spare() noexcept {
  if (spare_ != nullptr && d_.cuMemFreeHost != nullptr) {
    ScopedContext scope(d_, ctx_);
    d_.cuMemFreeHost(spare_);
  }
  spare_ = nullptr;
  spare_bytes_ = 0;
}

}  // namespace cudapool::shim
