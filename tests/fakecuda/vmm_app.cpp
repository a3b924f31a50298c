// Expandable-segments test program: linked with the fake libcuda.so.1 (-lcuda style) and run
// under LD_PRELOAD=libcudapool.so with CUDAPOOL_CONF=expandable_segments:True by
// tests/unit/shim_vmm_test.cpp. It checks, through the fake driver's VMM counters, that the
// shim's CUDA upstream maps pages of the driver's granularity (the small pool) and of the
// expandable_page_mb size rounded up to it (the large pool), one handle each, gives wholly free
// pages back on
// empty-cache / trim, leaks nothing, keeps reservations bounded and refuses IPC.
// `vmm_app <scenario>` prints "FAIL file:line: expr" and exits 1 on the first failed check.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shim/cudapool.h"
#include "tests/fakecuda/fakecuda.h"
#define CUDAPOOL_TEST_APP_LCUDA
#include "tests/fakecuda/test_app.h"

using namespace cudaabi;

namespace {

constexpr std::size_t kMiB = 1u << 20;

template <typename Fn>
Fn c_api(const char* name) {
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  CHECK(fn != nullptr);
  return fn;
}

std::size_t empty_cache() { return c_api<std::size_t (*)()>("cudapool_empty_cache")(); }

cudapool_stats stats(int dev) {
  cudapool_stats s{};
  CHECK(c_api<int (*)(int, cudapool_stats*)>("cudapool_get_stats")(dev, &s) == 0);
  return s;
}

void start(int dev) { start_primary(dev); }

// The large pool's page: VMM_APP_LARGE_PAGE_MB (what the test set with expandable_page_mb)
// rounded up to the granularity; unset or 0, the granularity itself (the pool's default).
std::size_t large_page() {
  const std::size_t g = fakecuda_vmm_granularity();
  const char* e = std::getenv("VMM_APP_LARGE_PAGE_MB");
  const std::size_t want = e != nullptr ? std::strtoull(e, nullptr, 10) * kMiB : 0;
  return want <= g ? g : (want + g - 1) / g * g;
}

// The pool's largest physical unit for a growth of `grown` bytes into a pool that held none:
// VMM_APP_MAX_UNIT_MB (what the test set with expandable_unit_mb) or, unset, the default rule
// (units up to 1/64 of the pool after the growth, rounded down to a power of two, at most
// 16 MiB), in whole pages, at least one page.
std::size_t max_unit(std::size_t grown) {
  const std::size_t lp = large_page();
  const char* e = std::getenv("VMM_APP_MAX_UNIT_MB");
  const std::size_t want = e != nullptr ? std::strtoull(e, nullptr, 10) * kMiB
                                        : std::min<std::size_t>(16 * kMiB, std::bit_floor(grown / 64));
  return want <= lp ? lp : want / lp * lp;
}

// The accounting invariants that hold at every quiet point.
void check_accounting(int dev) {
  const std::size_t g = fakecuda_vmm_granularity();
  const std::size_t mapped = fakecuda_vmm_mapped_bytes();
  CHECK(mapped % g == 0);
  CHECK(fakecuda_vmm_reserved_bytes() % g == 0);
  // Every live handle mapped once, whole (the fake refuses a map past a handle's end), nothing
  // else alive: handle bytes equal mapped bytes; pages are at least the granularity.
  CHECK(fakecuda_vmm_handle_bytes() == mapped);
  CHECK(static_cast<std::size_t>(fakecuda_vmm_live_handles()) <= mapped / g);
  CHECK(static_cast<std::size_t>(stats(dev).reserved_bytes) == mapped);
  CHECK(fakecuda_vmm_bad_calls() == 0);
  CHECK(fakecuda_vmm_peer_descs() == 0);  // owner device only
}

// v: the byte pattern (its low 8 bits, as memset uses it).
void fill(CUdeviceptr p, std::size_t n, std::size_t v) {
  std::memset(reinterpret_cast<void*>(p), static_cast<unsigned char>(v), n);
}
bool holds(CUdeviceptr p, std::size_t n, std::size_t v) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 4096)
    if (b[i] != static_cast<unsigned char>(v)) return false;
  return b[n - 1] == static_cast<unsigned char>(v);
}

// Large blocks grow one range page by page; freeing a run in the middle leaves whole free pages
// that empty-cache gives back while the neighbours stay mapped and keep their contents.
void scenario_release() {
  start(0);
  const std::size_t g = fakecuda_vmm_granularity();
  const std::size_t lp = large_page();
  CHECK(g >= kMiB);
  constexpr std::size_t kN = 48;
  // Not a multiple of any granularity the tests use; the remainder of a page (> 1 MiB) is split
  // off and serves the next request (PyTorch's rule: large blocks split when > 1 MiB remains).
  const std::size_t sz = 5 * kMiB / 2;
  std::vector<CUdeviceptr> p(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    CHECK_OK(cuMemAlloc_v2(&p[i], sz));
    fill(p[i], sz, i + 1);
  }
  CHECK(fakecuda_alloc_calls() == 0);  // no classic segment: everything from the VMM range
  CHECK(fakecuda_vmm_ranges() == 1);
  for (std::size_t i = 1; i < kN; ++i) CHECK(p[i] > p[0] && p[i] - p[0] < fakecuda_vmm_reserved_bytes());
  const std::size_t mapped_full = fakecuda_vmm_mapped_bytes();
  CHECK(mapped_full >= kN * sz);
  // Grown page by page: at most the split rule's 1 MiB of slack per block, plus one page.
  CHECK(mapped_full <= kN * (sz + kMiB) + lp);
  // Large blocks only: whole large pages, in handles of one page up to the largest unit.
  CHECK(mapped_full % lp == 0);
  CHECK(static_cast<std::size_t>(fakecuda_vmm_live_handles()) <= mapped_full / lp);
  CHECK(static_cast<std::size_t>(fakecuda_vmm_live_handles()) >= mapped_full / max_unit(mapped_full));
  check_accounting(0);
  // The address range query answers per block.
  CUdeviceptr base = 0;
  std::size_t size = 0;
  CHECK_OK(cuMemGetAddressRange_v2(&base, &size, p[5] + 100));
  CHECK(base == p[5] && size == sz);

  // Free the middle half: whole pages inside it become releasable.
  constexpr std::size_t kLo = kN / 4, kHi = 3 * kN / 4;
  for (std::size_t i = kLo; i < kHi; ++i) CHECK_OK(cuMemFree_v2(p[i]));
  CHECK(fakecuda_vmm_mapped_bytes() == mapped_full);  // cached, not released yet
  const std::size_t released = empty_cache();
  const std::size_t mapped_after = fakecuda_vmm_mapped_bytes();
  CHECK(mapped_after < mapped_full);
  CHECK(released == mapped_full - mapped_after);
  CHECK(released % lp == 0);
  CHECK(released >= (kHi - kLo) * sz - 2 * lp);  // all whole pages of the freed run
  CHECK(!fakecuda_vmm_is_mapped(p[kN / 2]));
  check_accounting(0);
  for (std::size_t i = 0; i < kN; ++i)
    if (i < kLo || i >= kHi) CHECK(holds(p[i], sz, i + 1));

  // The hole serves a different size later (pages mapped again where needed).
  CUdeviceptr big = 0;
  CHECK_OK(cuMemAlloc_v2(&big, 7 * sz));
  CHECK(big >= p[kLo] && big < p[kHi]);
  fill(big, 7 * sz, 0x5a);
  check_accounting(0);
  CHECK_OK(cuMemFree_v2(big));

  // Everything freed and emptied: no page, no handle left; the range itself stays reserved.
  for (std::size_t i = 0; i < kN; ++i)
    if (i < kLo || i >= kHi) CHECK_OK(cuMemFree_v2(p[i]));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0);
  CHECK(fakecuda_vmm_live_handles() == 0);
  CHECK(stats(0).reserved_bytes == 0);
  check_accounting(0);
  std::printf("OK mapped_full=%zu mapped_after=%zu g=%zu\n", mapped_full, mapped_after, g);
}

// Trimming the device's default memory pool gives pages back too.
void scenario_trim() {
  start(0);
  std::vector<CUdeviceptr> p(6);
  for (auto& x : p) CHECK_OK(cuMemAlloc_v2(&x, 9 * kMiB));
  const std::size_t before = fakecuda_vmm_mapped_bytes();
  for (auto& x : p) CHECK_OK(cuMemFree_v2(x));
  CUmemoryPool def = nullptr;
  CHECK_OK(cuDeviceGetDefaultMemPool(&def, 0));
  CHECK_OK(cuMemPoolTrimTo(def, 0));
  CHECK(before > 0 && fakecuda_vmm_mapped_bytes() == 0);
  CHECK(fakecuda_vmm_live_handles() == 0);
  check_accounting(0);
}

// Small and large blocks on many streams and both devices: two ranges per device, each within
// about 9/8 of the device, however many streams allocate.
void scenario_bounded() {
  start(0);
  const std::size_t g = fakecuda_vmm_granularity();
  std::size_t free_b = 0, total = 0;
  CHECK_OK(cuMemGetInfo_v2(&free_b, &total));
  std::vector<CUstream> streams(8);
  for (auto& s : streams) CHECK_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<std::pair<CUdeviceptr, CUstream>> live;
  for (int round = 0; round < 4; ++round)
    for (auto s : streams) {
      CUdeviceptr a = 0, b = 0;
      CHECK_OK(cuMemAllocAsync(&a, 4096, s));      // small pool
      CHECK_OK(cuMemAllocAsync(&b, 2 * kMiB, s));  // large pool
      live.push_back({a, s});
      live.push_back({b, s});
    }
  CHECK(fakecuda_alloc_calls() == 0);
  CHECK(fakecuda_vmm_ranges() == 2);
  CHECK(fakecuda_vmm_reserved_bytes() <= 2 * (total + total / 8) + 2 * g + 2 * large_page());
  check_accounting(0);
  const std::size_t dev0 = fakecuda_vmm_device_bytes(0);
  CHECK(dev0 == fakecuda_vmm_mapped_bytes() && fakecuda_vmm_device_bytes(1) == 0);

  // Device 1: its own two ranges, its pages created on device 1.
  CUcontext ctx1 = nullptr;
  CHECK_OK(cuDevicePrimaryCtxRetain(&ctx1, 1));
  CHECK_OK(cuCtxSetCurrent(ctx1));
  CUdeviceptr d1 = 0;
  CHECK_OK(cuMemAlloc_v2(&d1, 5 * kMiB));
  CHECK(fakecuda_vmm_ranges() == 3);
  CHECK(fakecuda_vmm_device_bytes(1) >= 5 * kMiB && fakecuda_vmm_device_bytes(0) == dev0);
  CHECK_OK(cuMemFree_v2(d1));

  for (auto& [p, s] : live) CHECK_OK(cuMemFreeAsync(p, s));
  for (auto s : streams) CHECK_OK(cuStreamDestroy_v2(s));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// A block of an expandable segment exports the shim's handle (its pages' descriptors are taken
// then); the export maps nothing more, and once the block is freed with no importer its pages go
// back like any others. (Opening such handles: tests/fakecuda/ipc_app.cpp.)
void scenario_ipc() {
  start(0);
  CUdeviceptr p = 0;
  CHECK_OK(cuMemAlloc_v2(&p, 12 * kMiB));
  const long handles = fakecuda_vmm_live_handles();
  const std::size_t mapped = fakecuda_vmm_mapped_bytes();
  CUipcMemHandle h{}, again{};
  CHECK_OK(cuIpcGetMemHandle(&h, p));
  CHECK(std::memcmp(h.reserved, "CPOOLIPC", 8) == 0);
  CHECK_OK(cuIpcGetMemHandle(&again, p + 5 * kMiB));
  CHECK(std::memcmp(h.reserved, again.reserved, sizeof h.reserved) == 0);
  CHECK(fakecuda_vmm_live_handles() == handles && fakecuda_vmm_mapped_bytes() == mapped);
  check_accounting(0);
  CHECK_OK(cuMemFree_v2(p));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  check_accounting(0);
}

// Out of device memory: the pool gets CUDA_ERROR_OUT_OF_MEMORY from cuMemCreate, releases what
// it cached, and the program sees the driver's error; nothing leaks.
void scenario_oom() {
  start(0);
  std::size_t free_b = 0, total = 0;
  CHECK_OK(cuMemGetInfo_v2(&free_b, &total));
  std::vector<CUdeviceptr> p;
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < 1000 && r == CUDA_SUCCESS; ++i) {
    CUdeviceptr x = 0;
    r = cuMemAlloc_v2(&x, 10 * kMiB);
    if (r == CUDA_SUCCESS) p.push_back(x);
  }
  CHECK(r == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(!p.empty() && p.size() * 10 * kMiB <= total);
  check_accounting(0);
  for (auto x : p) CHECK_OK(cuMemFree_v2(x));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
  std::printf("OK allocations_before_oom=%zu\n", p.size());
}

// The driver reports a granularity the pool cannot use (run with FAKECUDA_VMM_GRANULARITY_KB=0):
// expandable segments turn off and classic cuMemAlloc segments serve the program.
void scenario_classic() {
  start(0);
  CUdeviceptr p = 0;
  CHECK_OK(cuMemAlloc_v2(&p, 3 * kMiB));
  CHECK(fakecuda_alloc_calls() == 1);
  CHECK(fakecuda_vmm_ranges() == 0 && fakecuda_vmm_mapped_bytes() == 0);
  CHECK_OK(cuMemFree_v2(p));
}

// A device so large (run with FAKECUDA_TOTAL_MB=8388608, 8 TiB) that the second 9/8-of-the-
// device range would take the process past the shim's 16 TiB address-space cap: the large pool
// gets its range, the small pool is refused one and uses classic segments.
void scenario_cap() {
  start(0);
  CUdeviceptr big = 0, small = 0;
  CHECK_OK(cuMemAlloc_v2(&big, 5 * kMiB));
  CHECK(fakecuda_vmm_ranges() == 1 && fakecuda_alloc_calls() == 0);
  CHECK_OK(cuMemAlloc_v2(&small, 4096));
  CHECK(fakecuda_vmm_ranges() == 1);
  CHECK(fakecuda_alloc_calls() == 1);  // the small pool's classic segment
  CHECK_OK(cuMemFree_v2(small));
  CHECK_OK(cuMemFree_v2(big));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// Physical memory the program creates itself (cuMemCreate, as XLA does) counts against the cap
// (max_reserved_mb or a group budget: VMM_APP_CAP_MB, 0 = none): a creation that would pass it
// fails with nothing created, the pool's own allocations see it, cuMemGetInfo counts it, and the
// pool gives back idle cache to make room for it. Without a cap everything goes to the driver.
void scenario_foreign() {
  start(0);
  const char* e = std::getenv("VMM_APP_CAP_MB");
  const std::size_t cap = (e != nullptr ? std::strtoull(e, nullptr, 10) : 0) * kMiB;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  const long handles = fakecuda_vmm_live_handles();
  CUmemGenericAllocationHandle a = 0, b = 0;
  CHECK_OK(cuMemCreate(&a, 32 * kMiB, &prop, 0));
  CUdeviceptr p = 0;
  if (cap == 0) {
    CHECK_OK(cuMemCreate(&b, 48 * kMiB, &prop, 0));
    CHECK(fakecuda_vmm_live_handles() == handles + 2);
    CHECK_OK(cuMemRelease(b));
    CHECK_OK(cuMemRelease(a));
    CHECK(fakecuda_vmm_live_handles() == handles);
    return;
  }
  CHECK(cap == 64 * kMiB);
  CHECK(cuMemCreate(&b, 48 * kMiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);  // 32 + 48 > 64
  CHECK(fakecuda_vmm_live_handles() == handles + 1);                        // nothing created
  CHECK(cuMemAlloc_v2(&p, 40 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);          // the pool counts it
  std::size_t f = 0, t = 0;
  CHECK_OK(cuMemGetInfo_v2(&f, &t));
  CHECK(t == cap);
  CHECK(f <= cap - 32 * kMiB);
  CHECK_OK(cuMemRelease(a));
  CHECK_OK(cuMemGetInfo_v2(&f, &t));
  CHECK(f > cap - 32 * kMiB);  // given back
  // The pool's idle cache makes room: 40 MiB cached, then 48 MiB created by the program.
  CHECK_OK(cuMemAlloc_v2(&p, 40 * kMiB));
  CHECK_OK(cuMemFree_v2(p));
  CHECK(static_cast<std::size_t>(stats(0).reserved_bytes) >= 40 * kMiB);
  CHECK_OK(cuMemCreate(&b, 48 * kMiB, &prop, 0));
  CHECK(static_cast<std::size_t>(stats(0).reserved_bytes) <= 16 * kMiB);
  CHECK_OK(cuMemRelease(b));
  CHECK(fakecuda_vmm_live_handles() <= handles + 4);  // the pool's own small pages at most
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// Pages from cuMemCreate outlive contexts: a reset of the primary context must make the shim
// give back every page and range of the dropped pool (after a context-wide sync), and a new pool
// on the fresh context starts from zero.
void scenario_reset() {
  start(0);
  CUdeviceptr a = 0, b = 0;
  CHECK_OK(cuMemAlloc_v2(&a, 5 * kMiB));
  CHECK_OK(cuMemAlloc_v2(&b, 4096));
  CHECK(fakecuda_vmm_ranges() == 2 && fakecuda_vmm_live_handles() > 0);
  const long syncs = fakecuda_ctx_syncs();
  CHECK_OK(cuDevicePrimaryCtxReset_v2(0));
  CHECK(fakecuda_ctx_syncs() == syncs + 1);
  CHECK(fakecuda_vmm_ranges() == 0 && fakecuda_vmm_reserved_bytes() == 0);
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  start(0);
  CUdeviceptr c = 0;
  CHECK_OK(cuMemAlloc_v2(&c, 5 * kMiB));
  CHECK(fakecuda_vmm_ranges() == 1 && fakecuda_vmm_mapped_bytes() > 0);
  CHECK_OK(cuMemFree_v2(c));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// Growth past the peak recycles free pages: the same physical handles are mapped at the new
// place (no cuMemCreate, no cuMemRelease), the mapped total stays at its peak, the moved memory
// is usable and its neighbours keep their contents.
void scenario_recycle() {
  start(0);
  const std::size_t g = large_page();  // the large pool's page
  // Blocks of k whole pages, more than 8 MiB: the growth below (2k pages) then exceeds the pool's
  // 16 MiB growth slack above the live peak, which would map fresh pages instead of moving.
  const std::size_t k = std::max<std::size_t>(2, 8 * kMiB / g + 1);
  std::vector<CUdeviceptr> p(4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK_OK(cuMemAlloc_v2(&p[i], k * g));  // whole pages: no split remainders
    fill(p[i], k * g, i + 1);
  }
  const std::size_t mapped = fakecuda_vmm_mapped_bytes();
  CHECK(mapped == 4 * k * g);
  check_accounting(0);
  CHECK_OK(cuMemFree_v2(p[0]));
  CHECK_OK(cuMemFree_v2(p[2]));
  const long creates = fakecuda_vmm_create_calls();
  const long handles = fakecuda_vmm_live_handles();
  CUdeviceptr e = 0;
  CHECK_OK(cuMemAlloc_v2(&e, 2 * k * g));  // fits neither hole: p[0]'s and p[2]'s pages move
  CHECK(fakecuda_vmm_create_calls() == creates);
  CHECK(fakecuda_vmm_live_handles() == handles);
  CHECK(fakecuda_vmm_mapped_bytes() == mapped);
  CHECK(fakecuda_vmm_is_mapped(e) && fakecuda_vmm_is_mapped(e + 2 * k * g - 1));
  CHECK(!fakecuda_vmm_is_mapped(p[0]) && !fakecuda_vmm_is_mapped(p[2]));
  fill(e, 2 * k * g, 9);
  CHECK(holds(p[1], k * g, 2) && holds(p[3], k * g, 4) && holds(e, 2 * k * g, 9));
  check_accounting(0);
  CHECK_OK(cuMemFree_v2(e));
  CHECK_OK(cuMemFree_v2(p[1]));
  CHECK_OK(cuMemFree_v2(p[3]));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// Pages freed while the GPU still works on them, handed out again under a GPU-side wait, then
// needed elsewhere by a growth: the same handles are mapped a second time at the growth (no new
// handle, no host wait), and the old mapping stays until the work that could use it has finished.
void scenario_alias() {
  drive_pool_clock();
  start(0);
  const std::size_t g = large_page();
  const std::size_t k = std::max<std::size_t>(2, 8 * kMiB / g + 1);  // past the 16 MiB growth slack
  std::vector<CUdeviceptr> p(4);
  for (std::size_t i = 0; i < 4; ++i) CHECK_OK(cuMemAlloc_v2(&p[i], k * g));
  const std::size_t mapped = fakecuda_vmm_mapped_bytes();
  CHECK(mapped == 4 * k * g);
  check_accounting(0);
  fakecuda_hold_stream(nullptr);  // the legacy stream is busy: the frees' fences stay pending
  CHECK_OK(cuMemFree_v2(p[0]));
  CHECK_OK(cuMemFree_v2(p[2]));
  const long creates = fakecuda_vmm_create_calls();
  const long handles = fakecuda_vmm_live_handles();
  const long syncs = fakecuda_event_syncs();
  CUdeviceptr e = 0;
  // Fits neither hole: the GPU is made to wait for the frees, and their pages are aliased into place.
  CHECK_OK(cuMemAlloc_v2(&e, 2 * k * g));
  CHECK(fakecuda_vmm_create_calls() == creates);  // no new physical memory
  CHECK(fakecuda_vmm_live_handles() == handles);
  CHECK(fakecuda_event_syncs() == syncs);  // and no host wait
  CHECK(fakecuda_vmm_handle_bytes() == mapped);
  CHECK(fakecuda_vmm_mapped_bytes() > mapped);  // the old addresses are still mapped…
  CHECK(fakecuda_vmm_mapped_bytes() == mapped + 2 * k * g);
  for (CUdeviceptr x : {p[0], p[2]})  // …for the held work
    CHECK(fakecuda_vmm_is_mapped(x) && fakecuda_vmm_is_mapped(x + k * g - 1));
  CHECK(fakecuda_vmm_is_mapped(e) && fakecuda_vmm_is_mapped(e + 2 * k * g - 1));
  CHECK(static_cast<std::size_t>(stats(0).reserved_bytes) == mapped);  // physical memory counted once
  CHECK(fakecuda_vmm_bad_calls() == 0);
  fakecuda_release_stream(nullptr);  // the work finishes; the next fence service drops the old mappings
  auto old_mapped = [&] { return fakecuda_vmm_is_mapped(p[0]) || fakecuda_vmm_is_mapped(p[2]); };
  for (int i = 0; i < 50 && old_mapped(); ++i) {
    advance_pool_clock(kPastWindowsNs);  // the poll gap of the GPU-side waits passes
    CUdeviceptr t = 0;
    CHECK_OK(cuMemAlloc_v2(&t, 4096));  // small pool: maps its own page once, serves the rest
    CHECK_OK(cuMemFree_v2(t));
  }
  CHECK(!old_mapped());
  CHECK(fakecuda_vmm_create_calls() == creates + 1);  // the small pool's page, nothing else
  check_accounting(0);                                // every mapping is a live handle's again
  for (CUdeviceptr x : {p[1], p[3], e}) CHECK_OK(cuMemFree_v2(x));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// expandable_peer_access:True (set by the test): every mapping also names the other device, which
// cuDeviceCanAccessPeer says can reach this one; pages stay on the owning device.
void scenario_peers() {
  start(1);
  CUdeviceptr p = 0, q = 0;
  CHECK_OK(cuMemAlloc_v2(&p, 7 * kMiB));
  CHECK_OK(cuMemAlloc_v2(&q, 3 * kMiB));
  fill(p, 7 * kMiB, 3);
  const long calls = fakecuda_vmm_access_calls();
  CHECK(calls > 0);
  CHECK(fakecuda_vmm_peer_descs() == calls);  // exactly one peer (device 0) per mapping
  CHECK(fakecuda_vmm_device_bytes(1) == fakecuda_vmm_mapped_bytes());
  CHECK(fakecuda_vmm_device_bytes(0) == 0);
  CHECK_OK(cuMemFree_v2(p));
  CHECK_OK(cuMemFree_v2(q));
  empty_cache();
  CHECK(fakecuda_vmm_mapped_bytes() == 0 && fakecuda_vmm_live_handles() == 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// The program enables peer access (what cudaDeviceEnablePeerAccess does): device 0 may then use
// device 1's memory, so expandable pages of device 1 mapped before the call are mapped for device
// 0 too, and so are pages mapped after it; a repeat ("already enabled") changes nothing. Before
// the call, device 0 reaches none of them.
void scenario_enable_peer() {
  CHECK_OK(cuInit(0));
  CUcontext c0 = nullptr, c1 = nullptr;
  CHECK_OK(cuDevicePrimaryCtxRetain(&c0, 0));
  CHECK_OK(cuDevicePrimaryCtxRetain(&c1, 1));
  CHECK_OK(cuCtxSetCurrent(c1));
  CUdeviceptr before = 0, after = 0;
  CHECK_OK(cuMemAlloc_v2(&before, 7 * kMiB));
  CHECK(fakecuda_vmm_is_mapped(before) == 1);  // expandable pages, not a cuMemAlloc segment
  CHECK(fakecuda_vmm_access_ok(before, 7 * kMiB, 1) == 1);
  CHECK(fakecuda_vmm_access_ok(before, 7 * kMiB, 0) == 0);
  CHECK_OK(cuCtxSetCurrent(c0));
  CHECK_OK(cuCtxEnablePeerAccess(c1, 0));
  CHECK(fakecuda_peer_enables() == 1);
  CHECK(fakecuda_vmm_access_ok(before, 7 * kMiB, 0) == 1);
  CHECK(cuCtxEnablePeerAccess(c1, 0) == 704);  // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, passed on
  CHECK_OK(cuCtxSetCurrent(c1));
  CHECK_OK(cuMemAlloc_v2(&after, 300 * kMiB));  // far past the pages mapped so far
  CHECK(fakecuda_vmm_access_ok(after, 300 * kMiB, 0) == 1);
  CHECK(fakecuda_vmm_access_ok(after, 300 * kMiB, 1) == 1);
  fill(after, 300 * kMiB, 5);
  CHECK(holds(after, 300 * kMiB, 5));
  // Device 0's own pool was never asked for device 1: its pages stay its own.
  CHECK_OK(cuCtxSetCurrent(c0));
  CUdeviceptr own = 0;
  CHECK_OK(cuMemAlloc_v2(&own, 5 * kMiB));
  CHECK(fakecuda_vmm_access_ok(own, 5 * kMiB, 0) == 1);
  CHECK(fakecuda_vmm_access_ok(own, 5 * kMiB, 1) == 0);
  CHECK_OK(cuMemFree_v2(own));
  CHECK_OK(cuCtxSetCurrent(c1));
  CHECK_OK(cuMemFree_v2(before));
  CHECK_OK(cuMemFree_v2(after));
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

}  // namespace
// Physical units: a large growth is a few handles of up to expandable_unit_mb, not one per page
// (the driver charges per handle); a unit partly in use stays mapped through empty-cache, and
// goes back once all of it is free.
void scenario_units() {
  start(0);
  const std::size_t g = fakecuda_vmm_granularity();
  CUdeviceptr a = 0;
  const std::size_t big = 100 * kMiB;  // a multiple of 2 and 4 MiB granularities
  const std::size_t unit = max_unit(big);
  CHECK(big % g == 0);
  CHECK_OK(cuMemAlloc_v2(&a, big));
  fill(a, big, 3);
  CHECK(fakecuda_vmm_mapped_bytes() == big);
  const long units = static_cast<long>((big + unit - 1) / unit);
  CHECK(fakecuda_vmm_live_handles() == units);
  CHECK(fakecuda_vmm_create_calls() == units);
  check_accounting(0);
  CHECK_OK(cuMemFree_v2(a));
  // A small large-pool block at the start of the freed run keeps its unit (and only it) mapped.
  CUdeviceptr b = 0;
  CHECK_OK(cuMemAlloc_v2(&b, 3 * kMiB / 2));
  CHECK(b == a);
  fill(b, 3 * kMiB / 2, 9);
  const std::size_t released = empty_cache();
  CHECK(released == big - unit);
  CHECK(fakecuda_vmm_mapped_bytes() == unit);
  CHECK(fakecuda_vmm_live_handles() == 1);
  CHECK(holds(b, 3 * kMiB / 2, 9));
  check_accounting(0);
  CHECK_OK(cuMemFree_v2(b));
  CHECK(empty_cache() == unit);
  CHECK(fakecuda_vmm_mapped_bytes() == 0);
  CHECK(fakecuda_vmm_live_handles() == 0);
  check_accounting(0);
  std::printf("OK units=%ld unit=%zu g=%zu\n", units, unit, g);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scenario>\n", argv[0]);
    return 2;
  }
  const std::string s = argv[1];
  struct {
    const char* name;
    void (*fn)();
  } scenarios[] = {{"release", scenario_release},
                   {"trim", scenario_trim},
                   {"bounded", scenario_bounded},
                   {"ipc", scenario_ipc},
                   {"oom", scenario_oom},
                   {"classic", scenario_classic},
                   {"cap", scenario_cap},
                   {"reset", scenario_reset},
                   {"recycle", scenario_recycle},
                   {"peers", scenario_peers},
                   {"enable_peer", scenario_enable_peer},
                   {"units", scenario_units},
                   {"alias", scenario_alias},
                   {"foreign", scenario_foreign}};
  for (auto& sc : scenarios) {
    if (s == sc.name) {
      sc.fn();
      std::printf("PASS %s\n", sc.name);
      return 0;
    }
  }
  std::fprintf(stderr, "unknown scenario %s\n", argv[1]);
  return 2;
}
