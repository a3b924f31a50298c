// Parking of an upstream's expandable segments (shim/cuda_upstream.h): the physical units go back
// to the driver and come again at the same addresses, their bytes kept in host memory between.
// Only the driver's virtual memory management makes this possible: a classic segment
// (cuMemAlloc) cannot be given back and taken again at its address, so it stays, still counted.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "shim/cuda_upstream.h"
#include "shim/log.h"
#include "telemetry/share.h"

namespace cudapool::shim {

namespace {

CUmemAllocationProp unit_prop(int device, bool exportable) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

std::size_t CudaUpstream::mapped_bytes() {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  std::size_t n = 0;
  for (const auto& [lo, u] : units_) n += u.bytes;
  return n;
}

std::size_t CudaUpstream::parked_bytes() {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  return parked_total_;
}

std::string CudaUpstream::why_not_parkable() {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  if (!peers_.empty())
    return "peer access: pages of device " + std::to_string(device_) + " are mapped for other devices";
  if (!aliases_.empty()) return "pages of device " + std::to_string(device_) + " are mapped at two addresses";
  return {};
}

// Called with vmm_mu_ held.
void CudaUpstream::free_host() noexcept {
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

// Called with vmm_mu_ held.
void CudaUpstream::free_spare() noexcept {
  if (spare_ != nullptr && d_.cuMemFreeHost != nullptr) {
    ScopedContext scope(d_, ctx_);
    d_.cuMemFreeHost(spare_);
  }
  spare_ = nullptr;
  spare_bytes_ = 0;
}

std::size_t CudaUpstream::release_spare(std::int64_t keep_ns) noexcept {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  if (spare_ == nullptr || share::monotonic_ns() - spare_since_ns_ < keep_ns) return 0;
  const std::size_t n = spare_bytes_;
  free_spare();
  return n;
}

// Called with vmm_mu_ held.
void CudaUpstream::drop_parked(std::uintptr_t lo, std::uintptr_t hi) noexcept {
  const auto gone = [&](const ParkedUnit& u) { return u.addr >= lo && u.addr + u.bytes <= hi; };
  for (const ParkedUnit& u : parked_)
    if (gone(u)) parked_total_ -= u.bytes;
  parked_.erase(std::remove_if(parked_.begin(), parked_.end(), gone), parked_.end());
  if (parked_.empty()) {
    parked_total_ = 0;
    free_host();
  }
}

bool CudaUpstream::park_units(bool keep_bytes, std::size_t* bytes, std::string* why) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  *bytes = 0;
  if (!parked_.empty()) {
    *why = "already parked";
    return false;
  }
  if (units_.empty() || device_ < 0) return true;
  std::size_t total = 0;
  std::vector<ParkedUnit> list;
  try {
    list.reserve(units_.size());
    for (const auto& [lo, u] : units_) {
      list.push_back(ParkedUnit{lo, u.bytes, u.exportable, total});
      total += u.bytes;
    }
  } catch (const std::bad_alloc&) {
    *why = "no host memory for the list of pages";
    return false;
  }
  ScopedContext scope(d_, ctx_);
  if (keep_bytes) {
    // Pinned host memory copies near the bus's speed; pageable memory works, slower. The spare
    // a restore kept is reused when it fits (no pinning at all).
    void* host = nullptr;
    std::size_t capacity = total;
    bool pinned = false;
    if (spare_ != nullptr && spare_bytes_ >= total) {
      host = spare_;
      capacity = spare_bytes_;
      pinned = true;
      spare_ = nullptr;
      spare_bytes_ = 0;
    } else {
      free_spare();  // too small for this park
      if (d_.cuMemHostAlloc != nullptr && d_.cuMemHostAlloc(&host, total, 0) == CUDA_SUCCESS && host != nullptr) {
        pinned = true;
      } else {
        host = std::malloc(total);
        if (host == nullptr) {
          *why = "no host memory for " + std::to_string(total) + " bytes";
          return false;
        }
        log_info("parking: pinned host memory refused for {} bytes; copying through pageable memory", total);
      }
    }
    host_ = host;
    host_bytes_ = capacity;
    host_pinned_ = pinned;
    // One copy per run of back-to-back units.
    for (std::size_t i = 0; i < list.size();) {
      std::size_t j = i + 1, run = list[i].bytes;
      while (j < list.size() && list[j].addr == list[i].addr + run) run += list[j++].bytes;
      const CUresult r = d_.cuMemcpyDtoH_v2 != nullptr ? d_.cuMemcpyDtoH_v2(static_cast<char*>(host_) + list[i].offset,
                                                                            static_cast<CUdeviceptr>(list[i].addr), run)
                                                       : CUDA_ERROR_NOT_SUPPORTED;
      if (r != CUDA_SUCCESS) {
        free_host();
        *why = "copying " + std::to_string(run) + " bytes to host memory failed: CUDA error " + std::to_string(r);
        return false;
      }
      i = j;
    }
  }
  // From here on nothing fails the park: a unit that will not unmap is logged and forgotten.
  for (const ParkedUnit& p : list) {
    const Unit u = units_.at(p.addr);
    CUresult r = d_.cuMemUnmap(static_cast<CUdeviceptr>(p.addr), u.bytes);
    if (r != CUDA_SUCCESS) log_warn("parking: cuMemUnmap({:#x}, {} bytes) failed: CUDA error {}", p.addr, u.bytes, r);
    r = d_.cuMemRelease(u.handle);
    if (r != CUDA_SUCCESS) log_warn("parking: cuMemRelease of the unit at {:#x} failed: CUDA error {}", p.addr, r);
    credit(u.bytes);
  }
  units_.clear();
  parked_ = std::move(list);
  parked_total_ = total;
  *bytes = total;
  return true;
}

CUresult CudaUpstream::restore_units(park::RestoreWait wait, std::string* why) {
  std::unique_lock<std::mutex> lock(vmm_mu_);
  if (parked_.empty()) return CUDA_SUCCESS;
  const int dev = device_;
  // The budget first. Waiting happens without the lock: the group may ask this very process to
  // give back idle pages meanwhile (release_units), which takes it.
  std::size_t charged = parked_total_;
  lock.unlock();
  const std::int64_t start = share::monotonic_ns();
  for (int round = 0; !charge(charged); ++round) {
    if (wait == nullptr || !wait(dev, charged, start, round)) {
      *why = "the group budget has no room for the " + std::to_string(charged) + " parked bytes of device " +
             std::to_string(dev);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  lock.lock();
  if (parked_total_ < charged) {  // pages forgotten while waiting
    credit(charged - parked_total_);
    charged = parked_total_;
  }
  if (parked_.empty()) return CUDA_SUCCESS;
  ScopedContext scope(d_, ctx_);
  std::vector<Unit> made;
  made.reserve(parked_.size());
  CUresult r = CUDA_SUCCESS;
  for (const ParkedUnit& p : parked_) {
    const CUmemAllocationProp prop = unit_prop(dev, p.exportable);
    CUmemGenericAllocationHandle h = 0;
    r = d_.cuMemCreate(&h, p.bytes, &prop, 0);
    if (r != CUDA_SUCCESS) break;
    r = d_.cuMemMap(static_cast<CUdeviceptr>(p.addr), p.bytes, 0, h, 0);
    if (r != CUDA_SUCCESS) {
      d_.cuMemRelease(h);
      break;
    }
    made.push_back(Unit{h, p.bytes, p.exportable});
    r = set_access(dev, p.addr, p.bytes);
    if (r != CUDA_SUCCESS) break;
  }
  if (r == CUDA_SUCCESS && host_ != nullptr) {
    for (std::size_t i = 0; i < parked_.size() && r == CUDA_SUCCESS;) {
      std::size_t j = i + 1, run = parked_[i].bytes;
      while (j < parked_.size() && parked_[j].addr == parked_[i].addr + run) run += parked_[j++].bytes;
      r = d_.cuMemcpyHtoD_v2 != nullptr ? d_.cuMemcpyHtoD_v2(static_cast<CUdeviceptr>(parked_[i].addr),
                                                             static_cast<const char*>(host_) + parked_[i].offset, run)
                                        : CUDA_ERROR_NOT_SUPPORTED;
      i = j;
    }
  }
  if (r != CUDA_SUCCESS) {
    for (std::size_t i = 0; i < made.size(); ++i) {
      d_.cuMemUnmap(static_cast<CUdeviceptr>(parked_[i].addr), made[i].bytes);
      d_.cuMemRelease(made[i].handle);
    }
    credit(charged);
    *why = "mapping the parked pages of device " + std::to_string(dev) + " again failed: CUDA error " +
           std::to_string(r);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (std::size_t i = 0; i < made.size(); ++i) units_[parked_[i].addr] = made[i];
  parked_.clear();
  parked_total_ = 0;
  if (host_ != nullptr && host_pinned_) {  // kept for the next park (release_spare frees it)
    spare_ = host_;
    spare_bytes_ = host_bytes_;
    spare_since_ns_ = share::monotonic_ns();
    host_ = nullptr;
    host_bytes_ = 0;
    host_pinned_ = false;
  } else {
    free_host();
  }
  return CUDA_SUCCESS;
}

}  // namespace cudapool::shim
