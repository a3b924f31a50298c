// The pool's Upstream on the CUDA driver: segments come from the REAL cuMemAlloc_v2 of one
// context and go back through the REAL cuMemFree_v2, never through the shim's own hooks.
#pragma once
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "allocator/upstream.h"
#include "shim/driver.h"
#include "shim/scoped_context.h"
#include "shim/upstream/park_store.h"

namespace cudapool::shim {

// Asked before the upstream takes physical memory from the device, told when it gives memory
// back: the group budget (shim/group/group.cpp) sits here because physical allocations are exactly
// what the budget counts (a move of expandable pages costs nothing; a cuMemCreate does).
// Thread-safe; never calls CUDA.
class ReserveGate {
 public:
  virtual ~ReserveGate() = default;
  // true: `bytes` more are now counted for this process; false: over the budget, allocate nothing.
  virtual bool acquire(std::size_t bytes) noexcept = 0;
  virtual void release(std::size_t bytes) noexcept = 0;
};

class CudaUpstream final : public Upstream {
 public:
  CudaUpstream(const RealDriver& d, CUcontext ctx) : d_(d), ctx_(ctx) {}
  const RealDriver& driver() const noexcept { return d_; }
  // Set before the pool's first allocation (nullptr = no gate).
  void set_gate(ReserveGate* gate) noexcept { gate_ = gate; }
  // The context is gone: its memory went with it, so its share of the budget goes back too.
  void drop_gated() noexcept;
  UpstreamStatus allocate(std::size_t bytes, void** out) override;
  void release(void* base, std::size_t bytes) override;
  void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) override;

  // --- Expandable segments through the driver's virtual memory management
  // (shim/upstream/cuda_upstream_vmm.cpp). Each page of a range (the `page` given at reserve: the
  // granularity for the small pool, expandable_page_mb for the large one, by default also the
  // granularity) is its own physical handle, so the pool can give back any whole page
  // (cuMemUnmap cannot unmap part of a mapping).
  std::size_t granularity() override;
  UpstreamStatus reserve(std::size_t bytes, std::size_t page, void** out) override;
  void unreserve(void* base, std::size_t bytes) override;
  UpstreamStatus map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  // Recycling: each page's physical handle is unmapped at `from` and mapped again at `to`
  // (cuMemUnmap + cuMemMap + one cuMemSetAccess), without cuMemRelease / cuMemCreate.
  UpstreamStatus move(void* from, void* to, std::size_t bytes) override;
  // Aliasing: each unit's handle is mapped a second time at `to` (cuMemMap + one cuMemSetAccess)
  // and stays mapped at `from` until unalias() (cuMemUnmap only: the handle lives on at `to`).
  bool can_alias() override;
  UpstreamStatus alias(void* from, void* to, std::size_t bytes) override;
  void unalias(void* addr, std::size_t bytes) override;
  // Device `device` (an ordinal) also gets read/write access to every page: those mapped from
  // now on and those mapped already. Empty by default: only the pool's own device can touch its
  // pages. The first failing cuMemSetAccess's error, else CUDA_SUCCESS.
  CUresult grant_peer_access(int device);
  // The context is being destroyed or reset (or is already gone): pages from cuMemCreate are not
  // freed with the context, so after the context's work has finished (cuCtxSynchronize, when the
  // context still exists) every page is unmapped and released and every range freed. Later
  // reserve/map calls fail. No CUDA call when this upstream never reserved anything.
  void release_all_vmm();

  // CUDA IPC of a block in an expandable segment: the physical units covering [lo, lo+bytes),
  // in address order, each exported as a file descriptor the caller owns. CUDA_ERROR_NOT_SUPPORTED
  // when the units were created without an exportable handle type (the driver refused one).
  struct ExportedUnit {
    std::uintptr_t addr = 0;
    std::size_t bytes = 0;
    int fd = -1;
  };
  CUresult export_units(std::uintptr_t lo, std::size_t bytes, std::vector<ExportedUnit>* out);

  // --- Parking (shim/upstream/cuda_upstream_park.cpp; the protocol around it: shim/parking/parking.cpp). The
  // caller has closed the doors and drained the context.
  // Bytes of physical memory mapped now (units), and whether anything stops them from moving:
  // peers granted access, or units also mapped at a second address (alias()).
  std::size_t mapped_bytes();
  std::string why_not_parkable();
  // Copies each unit's bytes to host memory (pinned when the driver gives it; not with
  // `keep_bytes` false), then unmaps and releases every unit and credits the gate; the ranges
  // stay reserved. All or nothing: false with *why leaves everything mapped. *bytes: the bytes
  // given back.
  bool park_units(bool keep_bytes, std::size_t* bytes, std::string* why);
  // Charges the gate for the parked bytes (while it refuses: `wait`, until it says stop), creates
  // and maps the units again at their addresses, copies the bytes back and frees the host copy.
  // CUDA_SUCCESS (also when nothing is parked), else the error the door's call fails with; the
  // units stay parked then.
  CUresult restore_units(park::RestoreWait wait, std::string* why);
  std::size_t parked_bytes();  // bytes given back by park_units and not restored yet
  // Frees the pinned buffer a restore kept for the next park once it has been kept `keep_ns`
  // (the publisher asks every round); the bytes freed.
  std::size_t release_spare(std::int64_t keep_ns) noexcept;

  // Bounds on address space, per process (all upstreams together) and per range.
  static constexpr std::size_t kMaxReservedTotal = std::size_t{16} << 40;  // 16 TiB
  static std::size_t reserved_total() noexcept;

 private:
  struct Range {
    std::size_t bytes = 0;
    std::size_t page = 0;
  };
  bool vmm_device(int* device);  // ordinal of ctx_, once; false without VMM support
  // The page size of the range holding [lo, lo+bytes), if one does and lo is page aligned in it
  // and bytes a multiple of its page; else 0.
  std::size_t page_at(std::uintptr_t lo, std::size_t bytes) const;
  // Unmaps and releases every unit lying wholly inside [lo, hi).
  void release_units(std::uintptr_t lo, std::uintptr_t hi);
  // Unmaps every old mapping alias() left inside [lo, hi).
  void drop_aliases(std::uintptr_t lo, std::uintptr_t hi);
  CUresult set_access(int dev, std::uintptr_t lo, std::size_t bytes);

  bool charge(std::size_t bytes) noexcept;  // false: the gate refused
  // A failed call's answer, carrying the CUresult so the hook returns what the program would
  // have got without the pool; the gate's refusal says it was the budget (the hook then asks
  // the group for memory instead of returning out-of-memory at once).
  static UpstreamStatus driver_failure(CUresult r) noexcept {
    return {r == CUDA_ERROR_OUT_OF_MEMORY ? UpstreamStatus::out_of_memory : UpstreamStatus::error, r};
  }
  static UpstreamStatus budget_refusal() noexcept {
    return {UpstreamStatus::out_of_memory, CUDA_ERROR_OUT_OF_MEMORY, true};
  }
  void credit(std::size_t bytes) noexcept;

  const RealDriver& d_;
  CUcontext ctx_;
  ReserveGate* gate_ = nullptr;
  std::atomic<std::size_t> gated_{0};
  // VMM state, behind its own lock (the pool calls under its lock, the C API from any thread).
  std::mutex vmm_mu_;
  int device_ = -1;  // -1: not looked up yet, -2: VMM unusable (or released for good)
  std::size_t gran_ = 0;
  std::size_t device_total_ = 0;
  std::vector<int> peers_;
  // Units are created with a file-descriptor handle type, so any block can be shared with another
  // process, until the driver refuses that once (some containers): then without, for good.
  bool fd_handles_ = true;
  struct Unit {
    CUmemGenericAllocationHandle handle = 0;
    std::size_t bytes = 0;
    bool exportable = false;
  };
  std::map<std::uintptr_t, Unit> units_;  // physical allocations by mapped address (one per map())
  // Old mappings left by alias(), address -> bytes: the handles belong to units_ elsewhere.
  std::map<std::uintptr_t, std::size_t> aliases_;
  std::map<std::uintptr_t, Range> ranges_;  // reservations by base
  // Parking's steps (shim/upstream/cuda_upstream_park.cpp).
  CUresult copy_out(const std::vector<ParkStore::Unit>& list, void* host, std::string* why);
  void give_back(const std::vector<ParkStore::Unit>& list) noexcept;
  bool charge_waiting(std::size_t bytes, int dev, park::RestoreWait wait, std::string* why);
  CUresult map_again(int dev, std::vector<Unit>* made);
  // Parked units (their addresses stay reserved) and the host copy of their bytes.
  ParkStore parked_{d_, ctx_};
};

}  // namespace cudapool::shim
