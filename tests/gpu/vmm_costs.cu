// What the driver's virtual-memory calls cost on this GPU, without the shim: the numbers behind
// the expandable-segment design (page size of the large pool, whether recycling should move
// pages or map fresh ones, whether an unmap may run while kernels do).
//
// For a page size P (the granularity, and 10x it) and N pages of 400 MiB in all, per call:
// cuMemCreate, cuMemMap, one cuMemSetAccess over the run, a move (cuMemUnmap + cuMemMap of the
// same handle elsewhere), a second mapping of a still-mapped handle (an alias), cuMemUnmap,
// cuMemRelease. Each phase runs twice: with the GPU idle, and while a 300 ms kernel runs on a
// non-blocking stream; "waited" says whether that kernel had finished when the phase returned,
// i.e. whether the call waits for unrelated GPU work (then every such call drains the queue).
// Shareable pages (what sharing expandable segments with another process would cost), GPU
// idle, same N pages of P: cuMemCreate + cuMemRelease with prop.requestedHandleTypes NONE
// (create_none, release_none) and POSIX_FILE_DESCRIPTOR (create_fd, release_fd), and per handle
// cuMemExportToShareableHandle to a file descriptor (export_fd) and cuMemImportFromShareableHandle
// of it in this same process (import_fd); when the driver refuses a kind of handle, one line
// `vmm page_mib=P op=X error=CODE` says so and that part is skipped.
// Output: one line per (page, phase, gpu state): `vmm page_mib=P op=X gpu=idle|busy
// us_per_call=T waited=yes|no|-`. Timings vary from run to run; nothing here is compared.
#include <cuda.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common.h"
#include "driver_check.h"

__global__ void spin(std::uint64_t ns) { gpu_delay_ns(ns); }

namespace {

struct Ctx {
  int dev = 0;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  cudaStream_t side = nullptr;
};

// Runs `phase` (n calls) with the GPU idle or busy and prints the line.
template <class F>
void measure(const Ctx& c, double page_mib, const char* op, bool busy, int n, F&& phase) {
  CK(cudaDeviceSynchronize());
  if (busy) {
    spin<<<1, 1, 0, c.side>>>(300ull * 1000 * 1000);
    CK(cudaGetLastError());
    const double t = now_us();  // let the kernel start
    while (now_us() - t < 2000) {
    }
  }
  const double t0 = now_us();
  phase();
  const double dt = now_us() - t0;
  const bool waited = busy && cudaStreamQuery(c.side) == cudaSuccess;
  std::printf("vmm page_mib=%g op=%s gpu=%s us_per_call=%.2f waited=%s\n", page_mib, op, busy ? "busy" : "idle", dt / n,
              busy ? (waited ? "yes" : "no") : "-");
  std::fflush(stdout);
  CK(cudaDeviceSynchronize());
}

void run_page(const Ctx& c, std::size_t gran, std::size_t page, bool busy) {
  const std::size_t total = 400ull << 20;
  const int n = static_cast<int>(total / page);
  const double mib = static_cast<double>(page) / (1 << 20);
  CUdeviceptr a = 0, b = 0;
  CKD(cuMemAddressReserve(&a, total, gran, 0, 0));  // alignment: a power of two
  CKD(cuMemAddressReserve(&b, total, gran, 0, 0));
  std::vector<CUmemGenericAllocationHandle> h(n);
  measure(c, mib, "create", busy, n, [&] {
    for (auto& x : h) CKD(cuMemCreate(&x, page, &c.prop, 0));
  });
  measure(c, mib, "map", busy, n, [&] {
    for (int i = 0; i < n; ++i) CKD(cuMemMap(a + i * page, page, 0, h[i], 0));
  });
  measure(c, mib, "set_access_run", busy, 1, [&] { CKD(cuMemSetAccess(a, total, &c.access, 1)); });
  measure(c, mib, "move", busy, n, [&] {
    for (int i = 0; i < n; ++i) {
      CKD(cuMemUnmap(a + i * page, page));
      CKD(cuMemMap(b + i * page, page, 0, h[i], 0));
    }
    CKD(cuMemSetAccess(b, total, &c.access, 1));
  });
  // A handle mapped at two addresses at once: legal in CUDA; costs a map, no unmap.
  measure(c, mib, "alias_map", busy, n, [&] {
    for (int i = 0; i < n; ++i) CKD(cuMemMap(a + i * page, page, 0, h[i], 0));
    CKD(cuMemSetAccess(a, total, &c.access, 1));
  });
  measure(c, mib, "unmap", busy, n, [&] {
    for (int i = 0; i < n; ++i) CKD(cuMemUnmap(a + i * page, page));
  });
  measure(c, mib, "unmap_release", busy, n, [&] {
    for (int i = 0; i < n; ++i) {
      CKD(cuMemUnmap(b + i * page, page));
      CKD(cuMemRelease(h[i]));
    }
  });
  CKD(cuMemAddressFree(a, total));
  CKD(cuMemAddressFree(b, total));
}
// Creation with and without a file-descriptor handle type, export and import, GPU idle.
void run_shareable(const Ctx& c, std::size_t page) {
  const std::size_t total = 400ull << 20;
  const int n = static_cast<int>(total / page);
  const double mib = static_cast<double>(page) / (1 << 20);
  CUmemAllocationProp none = c.prop, fd = c.prop;
  none.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  fd.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const auto kFd = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::vector<CUmemGenericAllocationHandle> h(n);
  measure(c, mib, "create_none", false, n, [&] {
    for (auto& x : h) CKD(cuMemCreate(&x, page, &none, 0));
  });
  measure(c, mib, "release_none", false, n, [&] {
    for (auto x : h) CKD(cuMemRelease(x));
  });

  // One page first, outside the timing: a driver that refuses the handle type or the export
  // ends this part with a line saying so instead of ending the program.
  CUmemGenericAllocationHandle probe = 0;
  CUresult r = cuMemCreate(&probe, page, &fd, 0);
  if (r != CUDA_SUCCESS) {
    std::printf("vmm page_mib=%g op=create_fd error=%d\n", mib, static_cast<int>(r));
    return;
  }
  int probe_fd = -1;
  r = cuMemExportToShareableHandle(&probe_fd, probe, kFd, 0);
  bool can_import = false;
  if (r == CUDA_SUCCESS) {
    CUmemGenericAllocationHandle imported = 0;
    const CUresult ri = cuMemImportFromShareableHandle(&imported,
                                                       reinterpret_cast<void*>(static_cast<std::uintptr_t>(probe_fd)),
                                                       kFd);
    can_import = ri == CUDA_SUCCESS;
    if (can_import)
      CKD(cuMemRelease(imported));
    else
      std::printf("vmm page_mib=%g op=import_fd error=%d\n", mib, static_cast<int>(ri));
    close(probe_fd);
  }
  CKD(cuMemRelease(probe));
  if (r != CUDA_SUCCESS) std::printf("vmm page_mib=%g op=export_fd error=%d\n", mib, static_cast<int>(r));

  measure(c, mib, "create_fd", false, n, [&] {
    for (auto& x : h) CKD(cuMemCreate(&x, page, &fd, 0));
  });
  if (r == CUDA_SUCCESS) {
    std::vector<int> fds(n, -1);
    measure(c, mib, "export_fd", false, n, [&] {
      for (int i = 0; i < n; ++i) CKD(cuMemExportToShareableHandle(&fds[i], h[i], kFd, 0));
    });
    if (can_import) {
      std::vector<CUmemGenericAllocationHandle> imported(n);
      measure(c, mib, "import_fd", false, n, [&] {
        for (int i = 0; i < n; ++i)
          CKD(cuMemImportFromShareableHandle(&imported[i], reinterpret_cast<void*>(static_cast<std::uintptr_t>(fds[i])),
                                             kFd));
      });
      for (auto x : imported) CKD(cuMemRelease(x));
    }
    for (int x : fds) close(x);
  }
  measure(c, mib, "release_fd", false, n, [&] {
    for (auto x : h) CKD(cuMemRelease(x));
  });
}
}  // namespace

int main() {
  CK(cudaFree(nullptr));  // the primary context, current on this thread
  Ctx c;
  CK(cudaGetDevice(&c.dev));
  CK(cudaStreamCreateWithFlags(&c.side, cudaStreamNonBlocking));
  c.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  c.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  c.prop.location.id = c.dev;
  c.access.location = c.prop.location;
  c.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::size_t g = 0;
  CKD(cuMemGetAllocationGranularity(&g, &c.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  std::printf("vmm granularity_bytes=%zu\n", g);
  for (std::size_t page : {g, 10 * g})
    for (bool busy : {false, true}) run_page(c, g, page, busy);
  for (std::size_t page : {g, 10 * g}) run_shareable(c, page);
  // The reference: what cudaMalloc + cudaFree of the same 400 MiB cost, idle and busy.
  for (bool busy : {false, true}) {
    void* p = nullptr;
    measure(c, 400, "cudaMalloc", busy, 1, [&] { CK(cudaMalloc(&p, 400ull << 20)); });
    measure(c, 400, "cudaFree", busy, 1, [&] { CK(cudaFree(p)); });
  }
  CK(cudaStreamDestroy(c.side));
  return 0;
}
