// What a park keeps for one upstream (shim/upstream/cuda_upstream_park.cpp): the list of physical units it
// gave back, whose addresses stay reserved, and the host memory holding their bytes. Pinning
// gigabytes of host memory costs far more than copying them (on an H100, some 300 ms a GiB to pin
// and unpin against 20 ms to copy), so a restore keeps its pinned buffer as the spare, which the
// next park reuses when it fits, until release_spare frees it. Called with the upstream's VMM lock
// held; the driver calls here are cuMemHostAlloc / cuMemFreeHost in the upstream's context.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shim/driver.h"

namespace cudapool::shim {

namespace park {
// Called by a restore when the gate refuses the bytes it needs back (set by the group layer,
// park::set_restore_wait); returns when memory may have come free (true: try again) or the wait
// is over (false).
using RestoreWait = bool (*)(int device, std::size_t bytes, std::int64_t start_ns, int round);
}  // namespace park

class ParkStore {
 public:
  struct Unit {
    std::uintptr_t addr = 0;
    std::size_t bytes = 0;
    bool exportable = false;
    std::size_t offset = 0;  // where its bytes lie in the host copy
  };
  ParkStore(const RealDriver& d, CUcontext ctx) : d_(d), ctx_(ctx) {}
  ParkStore(const ParkStore&) = delete;
  ParkStore& operator=(const ParkStore&) = delete;

  bool empty() const noexcept { return units_.empty(); }
  std::size_t total() const noexcept { return total_; }
  const std::vector<Unit>& units() const noexcept { return units_; }
  // Host memory for `bytes` of parked data: the spare when it fits, else pinned memory, else
  // pageable memory (slower copies; logged). nullptr with *why when there is none. Called with
  // the upstream's context current.
  void* host_for(std::size_t bytes, std::string* why);
  // The units now parked (their bytes in the host memory host_for gave, or discarded: `kept`
  // false frees that memory).
  void hold(std::vector<Unit> units, std::size_t total, bool kept) noexcept;
  const void* host() const noexcept { return host_; }
  // A park that failed after host_for: the host memory goes.
  void abandon() noexcept { free_host(); }
  // The units are mapped again: the list is cleared, pinned host memory kept as the spare.
  void restored(std::int64_t now_ns) noexcept;
  // The pool unmapped pages that are parked (a release of idle memory): those lying wholly inside
  // [lo, hi) are forgotten.
  void drop(std::uintptr_t lo, std::uintptr_t hi) noexcept;
  // Frees the spare once it has been kept `keep_ns`; the bytes freed.
  std::size_t release_spare(std::int64_t keep_ns, std::int64_t now_ns) noexcept;

 private:
  void free_host() noexcept;
  void free_spare() noexcept;

  const RealDriver& d_;
  CUcontext ctx_;
  std::vector<Unit> units_;
  std::size_t total_ = 0;
  void* host_ = nullptr;        // the host copy of the parked bytes (nullptr: discarded)
  std::size_t host_bytes_ = 0;  // its size (a reused spare may be larger than the parked bytes)
  bool host_pinned_ = false;
  void* spare_ = nullptr;  // pinned, kept by the last restore
  std::size_t spare_bytes_ = 0;
  std::int64_t spare_since_ns_ = 0;
};

}  // namespace cudapool::shim
