// Parking of an upstream's expandable segments (shim/upstream/cuda_upstream.h): the physical units go back
// to the driver and come again at the same addresses, their bytes kept in host memory between.
// Only the driver's virtual memory management makes this possible: a classic segment
// (cuMemAlloc) cannot be given back and taken again at its address, so it stays, still counted.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "shim/log.h"
#include "shim/upstream/cuda_upstream.h"
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
  return parked_.total();
}

std::string CudaUpstream::why_not_parkable() {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  if (!peers_.empty())
    return "peer access: pages of device " + std::to_string(device_) + " are mapped for other devices";
  if (!aliases_.empty()) return "pages of device " + std::to_string(device_) + " are mapped at two addresses";
  return {};
}

std::size_t CudaUpstream::release_spare(std::int64_t keep_ns) noexcept {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  return parked_.release_spare(keep_ns, share::monotonic_ns());
}

namespace {

// Calls fn(first, count, bytes) for each run of back-to-back units in `units` (address order):
// one copy per run.
template <typename Fn>
CUresult for_each_run(const std::vector<ParkStore::Unit>& units, Fn&& fn) {
  CUresult r = CUDA_SUCCESS;
  for (std::size_t i = 0; i < units.size() && r == CUDA_SUCCESS;) {
    std::size_t j = i + 1, run = units[i].bytes;
    while (j < units.size() && units[j].addr == units[i].addr + run) run += units[j++].bytes;
    r = fn(units[i], run);
    i = j;
  }
  return r;
}

}  // namespace

// Called with vmm_mu_ held, the context current: the bytes of every unit into `host`.
CUresult CudaUpstream::copy_out(const std::vector<ParkStore::Unit>& list, void* host, std::string* why) {
  return for_each_run(list, [&](const ParkStore::Unit& first, std::size_t run) {
    const CUresult r = d_.cuMemcpyDtoH_v2 != nullptr ? d_.cuMemcpyDtoH_v2(static_cast<char*>(host) + first.offset,
                                                                          static_cast<CUdeviceptr>(first.addr), run)
                                                     : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS)
      *why = "copying " + std::to_string(run) + " bytes to host memory failed: CUDA error " + std::to_string(r);
    return r;
  });
}

// Called with vmm_mu_ held: unmaps and releases every unit of `list` and credits the gate.
// Nothing fails here: a unit that will not unmap is logged and forgotten.
void CudaUpstream::give_back(const std::vector<ParkStore::Unit>& list) noexcept {
  for (const ParkStore::Unit& p : list) {
    const Unit u = units_.at(p.addr);
    CUresult r = d_.cuMemUnmap(static_cast<CUdeviceptr>(p.addr), u.bytes);
    if (r != CUDA_SUCCESS) log_warn("parking: cuMemUnmap({:#x}, {} bytes) failed: CUDA error {}", p.addr, u.bytes, r);
    r = d_.cuMemRelease(u.handle);
    if (r != CUDA_SUCCESS) log_warn("parking: cuMemRelease of the unit at {:#x} failed: CUDA error {}", p.addr, r);
    credit(u.bytes);
  }
  units_.clear();
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
  std::vector<ParkStore::Unit> list;
  try {
    list.reserve(units_.size());
    for (const auto& [lo, u] : units_) {
      list.push_back(ParkStore::Unit{lo, u.bytes, u.exportable, total});
      total += u.bytes;
    }
  } catch (const std::bad_alloc&) {
    *why = "no host memory for the list of pages";
    return false;
  }
  ScopedContext scope(d_, ctx_);
  if (keep_bytes) {
    void* host = parked_.host_for(total, why);
    if (host == nullptr) return false;
    if (copy_out(list, host, why) != CUDA_SUCCESS) {
      parked_.abandon();
      return false;
    }
  }
  give_back(list);
  parked_.hold(std::move(list), total, keep_bytes);
  *bytes = total;
  return true;
}

// Without vmm_mu_: charges the gate for `bytes`, calling `wait` while it refuses. false with *why
// when the wait gave up.
bool CudaUpstream::charge_waiting(std::size_t bytes, int dev, park::RestoreWait wait, std::string* why) {
  const std::int64_t start = share::monotonic_ns();
  for (int round = 0; !charge(bytes); ++round) {
    if (wait == nullptr || !wait(dev, bytes, start, round)) {
      *why = "the group budget has no room for the " + std::to_string(bytes) + " parked bytes of device " +
             std::to_string(dev);
      return false;
    }
  }
  return true;
}

// Called with vmm_mu_ held, the context current: creates and maps a unit at each parked address
// (into *made, in the order of the parked list) and copies the bytes back.
CUresult CudaUpstream::map_again(int dev, std::vector<Unit>* made) {
  const std::vector<ParkStore::Unit>& list = parked_.units();
  made->reserve(list.size());
  for (const ParkStore::Unit& p : list) {
    const CUmemAllocationProp prop = unit_prop(dev, p.exportable);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = d_.cuMemCreate(&h, p.bytes, &prop, 0);
    if (r != CUDA_SUCCESS) return r;
    r = d_.cuMemMap(static_cast<CUdeviceptr>(p.addr), p.bytes, 0, h, 0);
    if (r != CUDA_SUCCESS) {
      d_.cuMemRelease(h);
      return r;
    }
    made->push_back(Unit{h, p.bytes, p.exportable});
    r = set_access(dev, p.addr, p.bytes);
    if (r != CUDA_SUCCESS) return r;
  }
  if (parked_.host() == nullptr) return CUDA_SUCCESS;  // discarded: nothing to copy
  return for_each_run(list, [&](const ParkStore::Unit& first, std::size_t run) {
    return d_.cuMemcpyHtoD_v2 != nullptr
               ? d_.cuMemcpyHtoD_v2(static_cast<CUdeviceptr>(first.addr),
                                    static_cast<const char*>(parked_.host()) + first.offset, run)
               : CUDA_ERROR_NOT_SUPPORTED;
  });
}

CUresult CudaUpstream::restore_units(park::RestoreWait wait, std::string* why) {
  std::unique_lock<std::mutex> lock(vmm_mu_);
  if (parked_.empty()) return CUDA_SUCCESS;
  const int dev = device_;
  // The budget first. Waiting happens without the lock: the group may ask this very process to
  // give back idle pages meanwhile (release_units), which takes it.
  std::size_t charged = parked_.total();
  lock.unlock();
  if (!charge_waiting(charged, dev, wait, why)) return CUDA_ERROR_OUT_OF_MEMORY;
  lock.lock();
  if (parked_.total() < charged) {  // pages forgotten while waiting
    credit(charged - parked_.total());
    charged = parked_.total();
  }
  if (parked_.empty()) return CUDA_SUCCESS;
  ScopedContext scope(d_, ctx_);
  std::vector<Unit> made;
  const CUresult r = map_again(dev, &made);
  const std::vector<ParkStore::Unit>& list = parked_.units();
  if (r != CUDA_SUCCESS) {
    for (std::size_t i = 0; i < made.size(); ++i) {
      d_.cuMemUnmap(static_cast<CUdeviceptr>(list[i].addr), made[i].bytes);
      d_.cuMemRelease(made[i].handle);
    }
    credit(charged);
    *why = "mapping the parked pages of device " + std::to_string(dev) + " again failed: CUDA error " +
           std::to_string(r);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (std::size_t i = 0; i < made.size(); ++i) units_[list[i].addr] = made[i];
  parked_.restored(share::monotonic_ns());
  return CUDA_SUCCESS;
}

}  // namespace cudapool::shim
