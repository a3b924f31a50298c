// The pool's only way to reach memory. The shim implements it with the CUDA driver, tests with
// host memory, the replay tool with a simulated device. One Upstream serves one device pool.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cudapool {

// What an upstream call answered. Compared with a code (`us == UpstreamStatus::ok`); a failure
// may also say why, which the pool hands on in its AllocResult:
//  * budget: out_of_memory because a budget outside the device refused (the shim's group
//    budget), not the device itself;
//  * error_code: the upstream's own code for the failure (the shim: the driver's CUresult), 0
//    when it has none.
struct UpstreamStatus {
  enum Code : std::uint8_t { ok, out_of_memory, error };
  Code code = ok;
  bool budget = false;
  int error_code = 0;

  constexpr UpstreamStatus(Code c = ok) noexcept : code(c) {}  // NOLINT: implicit on purpose
  constexpr UpstreamStatus(Code c, int code_of_upstream, bool by_budget = false) noexcept
      : code(c), budget(by_budget), error_code(code_of_upstream) {}
  friend constexpr bool operator==(UpstreamStatus a, Code c) noexcept { return a.code == c; }
};

class Upstream {
 public:
  virtual ~Upstream() = default;

  // Map a new segment of exactly `bytes` bytes (a multiple of 512). On success *out is its base.
  virtual UpstreamStatus allocate(std::size_t bytes, void** out) = 0;
  // Give a segment obtained from allocate() back. The pool has already made sure no GPU work
  // still uses it (fences), so implementations need not synchronize.
  virtual void release(void* base, std::size_t bytes) = 0;
  // The device's free and total bytes as the driver reports them.
  virtual void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) = 0;

  // --- Expandable segments (optional). granularity() == 0 means unsupported. -----------------
  virtual std::size_t granularity() { return 0; }
  // Reserve virtual address space without backing memory. `page` (a multiple of granularity()
  // that divides `bytes`) is the unit the pool promises to use on this range: every map, unmap and
  // move covers whole pages at offsets from the base that are multiples of `page`.
  // Physical units: each map() call is ONE physical allocation (the driver's map and access
  // calls cost per allocation, not per byte: tests/gpu/vmm_costs.cu), and the pool unmaps and
  // moves only whole units, i.e. exactly the runs of earlier map() calls (possibly several
  // adjacent ones in one call; a moved unit keeps its size at its new address).
  virtual UpstreamStatus reserve(std::size_t /*bytes*/, std::size_t /*page*/, void** /*out*/) {
    return UpstreamStatus::error;
  }
  virtual void unreserve(void* /*base*/, std::size_t /*bytes*/) {}
  // Back [addr, addr+bytes) (whole pages of its range) with one physical allocation and make it
  // accessible.
  virtual UpstreamStatus map(void* /*addr*/, std::size_t /*bytes*/) { return UpstreamStatus::error; }
  // Remove the backing of [addr, addr+bytes) (whole units); the pool fences GPU work on it first.
  virtual void unmap(void* /*addr*/, std::size_t /*bytes*/) {}
  // Move the units behind [from, from+bytes) to [to, to+bytes) (whole units, `to` unmapped),
  // so that recycling pages need not free and re-create physical memory. Whatever the result,
  // [from, from+bytes) is unmapped on return; on ok [to, to+bytes) is mapped and accessible, on
  // failure none of it is. The default is unmap + map; an upstream that can remap the same
  // physical memory at a new address (shim: cuMemUnmap + cuMemMap of the same handle) does so.
  virtual UpstreamStatus move(void* from, void* to, std::size_t bytes) {
    unmap(from, bytes);
    return map(to, bytes);
  }

  // Aliasing (optional; can_alias() false means unsupported): map the units behind
  // [from, from+bytes) a second time at [to, to+bytes) (whole units, `to` unmapped) and leave
  // them mapped at `from` too, so that work still running on the old address keeps its pages while
  // new work, ordered after it on the GPU, uses them at the new one. From then on the units belong
  // to `to` (unmap, move and export name them there); the old address only waits for unalias().
  // On failure nothing changed: `from` still owns its units and `to` is unmapped.
  virtual bool can_alias() { return false; }
  virtual UpstreamStatus alias(void* /*from*/, void* /*to*/, std::size_t /*bytes*/) { return UpstreamStatus::error; }
  // Remove the old mappings alias() left at [addr, addr+bytes): the address becomes unmapped, the
  // physical memory stays where it was aliased to.
  virtual void unalias(void* /*addr*/, std::size_t /*bytes*/) {}
};

}  // namespace cudapool
