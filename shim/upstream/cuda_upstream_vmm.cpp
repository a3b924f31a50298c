// Expandable segments on the CUDA driver's virtual memory management: the pool reserves a
// virtual range (cuMemAddressReserve), backs pages of it with physical memory where it needs
// them (cuMemCreate + cuMemMap + cuMemSetAccess) and gives wholly free pages back
// (cuMemUnmap + cuMemRelease) after its fences. Everything goes through the REAL driver.
//
// Granularity = the driver's recommended allocation granularity for pinned device memory on the
// pool's device (2 MiB on current GPUs, but never assumed). Each range has its own page, a multiple
// of it chosen by the pool at reserve() (the granularity for the small pool; for the large one
// expandable_page_mb, by default the granularity too). Each map() call is one physical handle of
// the call's size (the pool's physical unit: expandable_unit_mb caps it): cuMemUnmap must cover
// whole mappings, and the pool only ever unmaps or moves whole units. Handles are what cost: on
// an H200 cuMemCreate, cuMemMap and cuMemSetAccess take ~50 us per handle together, for 2 MiB or
// 20 MiB alike (tests/gpu/vmm_costs.cu), so a growth of 1 GiB is 512 handles in 2 MiB pages and
// 16 in 64 MiB units. One cuMemSetAccess covers a whole map() or move() call.
//
// Address space: the pool asks for one range per pool kind (small/large) of about 9/8 of the
// device (allocator/expandable_ranges.cpp), i.e. two per context, however many streams there are.
// This upstream refuses (the pool then falls back to classic segments) a range larger than
// 9/8 of the device plus two pages, and any reservation that would take this process's total
// over kMaxReservedTotal (16 TiB: 8 devices x a few contexts of 141 GB GPUs fit many times, and
// it stays far below the 47-bit / 128 TiB space the driver shares with the host).
#include <unistd.h>

#include <algorithm>

#include "shim/log.h"
#include "shim/upstream/cuda_upstream.h"

namespace cudapool::shim {

namespace {
std::atomic<std::size_t> g_reserved_total{0};

// The units of `units` that tile [src, src + bytes), in address order: step(offset, entry) for
// each until one fails (its answer is returned). CUDA_ERROR_INVALID_VALUE where the range is not
// whole units of ours. `*off`: the bytes of the units whose step succeeded. The step may erase
// its entry.
template <class Units, class Step>
CUresult walk_units(Units& units, std::uintptr_t src, std::size_t bytes, std::size_t* off, Step&& step) {
  *off = 0;
  while (*off < bytes) {
    auto it = units.find(src + *off);
    if (it == units.end() || it->second.bytes > bytes - *off) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t n = it->second.bytes;
    if (const CUresult r = step(*off, it); r != CUDA_SUCCESS) return r;
    *off += n;
  }
  return CUDA_SUCCESS;
}

CUmemAllocationProp pinned_on(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

std::size_t CudaUpstream::reserved_total() noexcept { return g_reserved_total.load(std::memory_order_relaxed); }

// Called with vmm_mu_ held.
bool CudaUpstream::vmm_device(int* device) {
  if (device_ == -1) {
    device_ = -2;
    if (!d_.has_vmm()) {
      log_info("expandable segments: the driver has no virtual memory management API; classic segments");
      return false;
    }
    ScopedContext scope(d_, ctx_);
    CUdevice dev = -1;
    if (d_.cuCtxGetDevice(&dev) != CUDA_SUCCESS) return false;
    const CUmemAllocationProp prop = pinned_on(dev);
    std::size_t g = 0;
    CUresult r = d_.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS || g == 0) r = d_.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    // The pool's sizes are multiples of 512: a page must be too.
    if (r != CUDA_SUCCESS || g == 0 || g % 512 != 0) {
      log_warn(
          "expandable segments: no usable allocation granularity on device {} (CUDA error {}, {} bytes); "
          "classic segments",
          dev, r, g);
      return false;
    }
    std::size_t free_bytes = 0, total = 0;
    if (d_.cuMemGetInfo_v2(&free_bytes, &total) != CUDA_SUCCESS || total == 0) return false;
    gran_ = g;
    device_total_ = total;
    device_ = dev;
    log_debug("expandable segments: device {} page size {} bytes", dev, g);
  }
  *device = device_;
  return device_ >= 0;
}

std::size_t CudaUpstream::granularity() {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  int dev = 0;
  return vmm_device(&dev) ? gran_ : 0;
}

CUresult CudaUpstream::grant_peer_access(int device) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  for (int p : peers_)
    if (p == device) return CUDA_SUCCESS;
  peers_.push_back(device);
  if (units_.empty() || device_ < 0) return CUDA_SUCCESS;
  // Pages already mapped get the new access list too, one call per unit (a unit is one mapping).
  ScopedContext scope(d_, ctx_);
  CUresult first = CUDA_SUCCESS;
  for (const auto& [lo, u] : units_) {
    const CUresult r = set_access(device_, lo, u.bytes);
    if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = r;
  }
  return first;
}

UpstreamStatus CudaUpstream::reserve(std::size_t bytes, std::size_t page, void** out) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  int dev = 0;
  if (!vmm_device(&dev) || bytes == 0 || page == 0 || page % gran_ != 0 || bytes % page != 0)
    return UpstreamStatus::error;
  const std::size_t per_range = device_total_ + device_total_ / 8 + 2 * page;
  if (bytes > per_range) {
    log_warn("expandable segments: refusing to reserve {} bytes (more than 9/8 of the device's {} bytes)", bytes,
             device_total_);
    return UpstreamStatus::error;
  }
  std::size_t cur = g_reserved_total.load(std::memory_order_relaxed);
  do {
    if (cur + bytes > kMaxReservedTotal) {
      log_warn("expandable segments: refusing to reserve {} more bytes of address space ({} reserved, cap {})", bytes,
               cur, kMaxReservedTotal);
      return UpstreamStatus::error;
    }
  } while (!g_reserved_total.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  ScopedContext scope(d_, ctx_);
  CUdeviceptr p = 0;
  const CUresult r = d_.cuMemAddressReserve(&p, bytes, gran_, 0, 0);
  if (r != CUDA_SUCCESS) {
    g_reserved_total.fetch_sub(bytes, std::memory_order_relaxed);
    log_warn("expandable segments: cuMemAddressReserve({} bytes) failed: CUDA error {}", bytes, r);
    return driver_failure(r);
  }
  ranges_[static_cast<std::uintptr_t>(p)] = Range{bytes, page};
  *out = reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  return UpstreamStatus::ok;
}

void CudaUpstream::unreserve(void* base, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  const auto b = reinterpret_cast<std::uintptr_t>(base);
  auto it = ranges_.find(b);
  if (it == ranges_.end()) {
    log_warn("expandable segments: unreserve of unknown range {} ({} bytes)", base, bytes);
    return;
  }
  // The pool unmaps everything first; anything still mapped here would leak its handle.
  const std::size_t size = it->second.bytes;
  drop_aliases(b, b + size);
  release_units(b, b + size);
  ScopedContext scope(d_, ctx_);
  const CUresult r = d_.cuMemAddressFree(static_cast<CUdeviceptr>(b), size);
  if (r != CUDA_SUCCESS) log_warn("cuMemAddressFree({}, {} bytes) failed: CUDA error {}", base, size, r);
  g_reserved_total.fetch_sub(size, std::memory_order_relaxed);
  ranges_.erase(it);
}

// Called with vmm_mu_ held.
std::size_t CudaUpstream::page_at(std::uintptr_t lo, std::size_t bytes) const {
  auto it = ranges_.upper_bound(lo);
  if (it == ranges_.begin()) return 0;
  --it;
  const Range& r = it->second;
  if (bytes == 0 || lo + bytes > it->first + r.bytes || (lo - it->first) % r.page != 0 || bytes % r.page != 0) return 0;
  return r.page;
}

UpstreamStatus CudaUpstream::map(void* addr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  int dev = 0;
  if (!vmm_device(&dev)) return driver_failure(CUDA_ERROR_NOT_SUPPORTED);
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  if (page_at(lo, bytes) == 0) return driver_failure(CUDA_ERROR_INVALID_VALUE);  // not whole pages of one of our ranges
  ScopedContext scope(d_, ctx_);
  CUmemAllocationProp prop = pinned_on(dev);
  if (!charge(bytes)) return budget_refusal();
  CUmemGenericAllocationHandle h = 0;
  const bool want_fd = fd_handles_ && d_.cuMemExportToShareableHandle != nullptr;
  if (want_fd) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUresult r = d_.cuMemCreate(&h, bytes, &prop, 0);
  if (want_fd && r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY) {
    // Some containers refuse exportable memory: expandable segments still work, unshared.
    log_info(
        "expandable segments: the driver refused exportable pages (CUDA error {}); pages are created "
        "without a shareable handle from now on, so CUDA IPC of blocks in them is refused",
        r);
    fd_handles_ = false;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    r = d_.cuMemCreate(&h, bytes, &prop, 0);
  }
  if (r == CUDA_SUCCESS) {
    r = d_.cuMemMap(static_cast<CUdeviceptr>(lo), bytes, 0, h, 0);
    if (r != CUDA_SUCCESS) {
      d_.cuMemRelease(h);
      credit(bytes);
    } else {
      units_[lo] = Unit{h, bytes, want_fd && fd_handles_};
      r = set_access(dev, lo, bytes);
      if (r == CUDA_SUCCESS) return UpstreamStatus::ok;
      release_units(lo, lo + bytes);  // all or nothing (credits the unit)
    }
  } else {
    credit(bytes);
  }
  log_debug("expandable segments: mapping {} bytes at {:#x} failed: CUDA error {}", bytes, lo, r);
  return driver_failure(r);
}

// Called with vmm_mu_ held and the context current: read/write for the owning device, and for
// peers only when they were granted.
CUresult CudaUpstream::set_access(int dev, std::uintptr_t lo, std::size_t bytes) {
  std::vector<CUmemAccessDesc> access(1 + peers_.size());
  access[0].location = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    access[i + 1].location = {CU_MEM_LOCATION_TYPE_DEVICE, peers_[i]};
    access[i + 1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return d_.cuMemSetAccess(static_cast<CUdeviceptr>(lo), bytes, access.data(), access.size());
}

// Recycling without giving physical memory back: per unit, cuMemUnmap at the old address and
// cuMemMap of the same handle at the new one; one cuMemSetAccess for the whole new run. Saves a
// cuMemRelease + cuMemCreate per unit. On any failure the units not yet moved, and those moved
// by this call, are unmapped and released: `from` is unmapped whatever happens, `to` is mapped
// only on success (Upstream::move's contract).
UpstreamStatus CudaUpstream::move(void* from, void* to, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  int dev = 0;
  const auto src = reinterpret_cast<std::uintptr_t>(from);
  const auto dst = reinterpret_cast<std::uintptr_t>(to);
  // A handle keeps its size: both ends must be whole pages of ranges with the same page.
  const std::size_t page = page_at(src, bytes);
  if (!vmm_device(&dev) || page == 0 || page_at(dst, bytes) != page) {
    release_units(src, src + bytes);
    return UpstreamStatus::error;
  }
  ScopedContext scope(d_, ctx_);
  std::size_t off = 0;
  CUresult r = walk_units(units_, src, bytes, &off, [&](std::size_t o, auto it) {
    const Unit u = it->second;
    CUresult m = d_.cuMemUnmap(static_cast<CUdeviceptr>(src + o), u.bytes);
    if (m != CUDA_SUCCESS) return m;  // still mapped at src: release_units below handles it
    units_.erase(it);
    m = d_.cuMemMap(static_cast<CUdeviceptr>(dst + o), u.bytes, 0, u.handle, 0);
    if (m != CUDA_SUCCESS) {
      d_.cuMemRelease(u.handle);
      credit(u.bytes);
      return m;
    }
    units_[dst + o] = u;
    return CUDA_SUCCESS;
  });
  if (r == CUDA_SUCCESS) {
    r = set_access(dev, dst, bytes);
    if (r == CUDA_SUCCESS) return UpstreamStatus::ok;
    off = bytes;
  }
  release_units(src, src + bytes);  // not moved yet (units only partly inside stay: not ours to cut)
  release_units(dst, dst + off);    // moved by this call
  log_debug("expandable segments: moving {} bytes from {:#x} to {:#x} failed: CUDA error {}", bytes, src, dst, r);
  return driver_failure(r);
}

bool CudaUpstream::can_alias() { return granularity() != 0; }

// The new mappings are made first; only when all of them and their access are in place does
// the unit change hands, so a failure leaves everything as it was.
UpstreamStatus CudaUpstream::alias(void* from, void* to, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  int dev = 0;
  const auto src = reinterpret_cast<std::uintptr_t>(from);
  const auto dst = reinterpret_cast<std::uintptr_t>(to);
  const std::size_t page = page_at(src, bytes);
  if (!vmm_device(&dev) || page == 0 || page_at(dst, bytes) != page) return UpstreamStatus::error;
  ScopedContext scope(d_, ctx_);
  std::size_t off = 0;
  CUresult r = walk_units(units_, src, bytes, &off, [&](std::size_t o, auto it) {
    return d_.cuMemMap(static_cast<CUdeviceptr>(dst + o), it->second.bytes, 0, it->second.handle, 0);
  });
  if (r == CUDA_SUCCESS) r = set_access(dev, dst, bytes);
  if (r != CUDA_SUCCESS) {
    for (std::size_t o = 0; o < off;) {  // the second mappings made so far go again
      const std::size_t n = units_.at(src + o).bytes;
      d_.cuMemUnmap(static_cast<CUdeviceptr>(dst + o), n);
      o += n;
    }
    log_debug("expandable segments: aliasing {} bytes from {:#x} at {:#x} failed: CUDA error {}", bytes, src, dst, r);
    return driver_failure(r);
  }
  for (std::size_t o = 0; o < bytes;) {
    auto node = units_.extract(src + o);
    const std::size_t n = node.mapped().bytes;
    node.key() = dst + o;
    units_.insert(std::move(node));
    aliases_[src + o] = n;
    o += n;
  }
  return UpstreamStatus::ok;
}

void CudaUpstream::unalias(void* addr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  drop_aliases(lo, lo + bytes);
}

// Called with vmm_mu_ held.
void CudaUpstream::drop_aliases(std::uintptr_t lo, std::uintptr_t hi) {
  if (aliases_.empty()) return;
  ScopedContext scope(d_, ctx_);
  for (auto it = aliases_.lower_bound(lo); it != aliases_.end() && it->first < hi;) {
    const CUresult r = d_.cuMemUnmap(static_cast<CUdeviceptr>(it->first), it->second);
    if (r != CUDA_SUCCESS)
      log_warn("cuMemUnmap({:#x}, {} bytes) of an old mapping failed: CUDA error {}", it->first, it->second, r);
    it = aliases_.erase(it);
  }
}

void CudaUpstream::unmap(void* addr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  if (gran_ == 0) return;
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  if (page_at(lo, bytes) == 0)
    log_warn("expandable segments: unmap({}, {} bytes) is not whole pages of a range", addr, bytes);
  release_units(lo, lo + bytes);
}

// Called with vmm_mu_ held.
void CudaUpstream::release_units(std::uintptr_t lo, std::uintptr_t hi) {
  if (!parked_.empty()) parked_.drop(lo, hi);  // parked pages the pool gives up: nothing to restore
  if (gran_ == 0 || units_.empty()) return;
  ScopedContext scope(d_, ctx_);
  auto it = units_.lower_bound(lo);
  while (it != units_.end() && it->first < hi) {
    const std::uintptr_t p = it->first;
    const Unit u = it->second;
    if (p + u.bytes > hi) {  // the pool never cuts a unit: a caller bug, not worth a fault
      log_warn("expandable segments: not unmapping the {} bytes at {:#x}: only part of it was asked for", u.bytes, p);
      ++it;
      continue;
    }
    CUresult r = d_.cuMemUnmap(static_cast<CUdeviceptr>(p), u.bytes);
    if (r != CUDA_SUCCESS) log_warn("cuMemUnmap({:#x}, {} bytes) failed: CUDA error {}", p, u.bytes, r);
    r = d_.cuMemRelease(u.handle);
    if (r != CUDA_SUCCESS) log_warn("cuMemRelease of the unit at {:#x} failed: CUDA error {}", p, r);
    credit(u.bytes);
    it = units_.erase(it);
  }
}

}  // namespace cudapool::shim

namespace cudapool::shim {

void CudaUpstream::release_all_vmm() {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  const bool had = !ranges_.empty();
  if (had) {
    ScopedContext scope(d_, ctx_);
    if (d_.cuCtxSynchronize != nullptr) d_.cuCtxSynchronize();  // work on the pages ends first
    std::size_t units = units_.size();
    for (auto& [base, range] : ranges_) {
      drop_aliases(base, base + range.bytes);
      release_units(base, base + range.bytes);
      const CUresult r = d_.cuMemAddressFree(static_cast<CUdeviceptr>(base), range.bytes);
      if (r != CUDA_SUCCESS) log_warn("cuMemAddressFree({:#x}, {} bytes) failed: CUDA error {}", base, range.bytes, r);
      g_reserved_total.fetch_sub(range.bytes, std::memory_order_relaxed);
    }
    log_info("expandable segments: context gone, released {} physical units and {} ranges", units, ranges_.size());
    ranges_.clear();
  }
  if (device_ >= 0 || device_ == -1) device_ = -2;  // no more reservations or maps
}

CUresult CudaUpstream::export_units(std::uintptr_t lo, std::size_t bytes, std::vector<ExportedUnit>* out) {
  std::lock_guard<std::mutex> lock(vmm_mu_);
  out->clear();
  if (d_.cuMemExportToShareableHandle == nullptr || bytes == 0) return CUDA_ERROR_NOT_SUPPORTED;
  auto it = units_.upper_bound(lo);
  if (it == units_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  CUresult r = CUDA_SUCCESS;
  std::uintptr_t next = it->first;
  for (; it != units_.end() && it->first < lo + bytes; ++it) {
    // Units are mapped back to back inside a block: a gap means the block is not what we think.
    if (it->first != next) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && !it->second.exportable) r = CUDA_ERROR_NOT_SUPPORTED;
    int fd = -1;
    if (r == CUDA_SUCCESS)
      r = d_.cuMemExportToShareableHandle(&fd, it->second.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) break;
    out->push_back(ExportedUnit{it->first, it->second.bytes, fd});
    next = it->first + it->second.bytes;
  }
  if (r == CUDA_SUCCESS && next < lo + bytes) r = CUDA_ERROR_INVALID_VALUE;  // the block runs past the units
  if (r != CUDA_SUCCESS) {
    for (const ExportedUnit& u : *out) ::close(u.fd);
    out->clear();
  }
  return r;
}

}  // namespace cudapool::shim
