// Correctness under the shim: a deterministic allocation workload whose stdout must be identical
// with and without LD_PRELOAD. Built twice by run.sh (static cudart, nvcc's default, and
// -cudart shared) because the two reach the driver differently.
//
// What would make the output differ: two live blocks sharing bytes (patterns clash, also between
// host threads allocating at once), a block shorter than asked (pattern check reads past it),
// misalignment, pitch allocations that are too narrow, error codes for zero-size or bad frees
// that the real driver would not return, and address-range / pointer-attribute answers that
// describe the segment instead of the block.
#include <cuda.h>  // types for the driver entry point looked up below; no -lcuda needed

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "common.h"

namespace {

struct Slot {
  std::uint8_t* p = nullptr;
  std::uint64_t n = 0;
  std::uint32_t tag = 0;
};

std::uint64_t pick_size(Rng& rng) {
  const std::uint64_t r = rng.below(100);
  if (r < 70) return 1 + rng.below(64 << 10);          // small pool, odd sizes
  if (r < 95) return (64 << 10) + rng.below(4 << 20);  // medium
  return (4ull << 20) + rng.below(60ull << 20);        // large
}

std::atomic<unsigned long long> g_calls{0};  // cudaMalloc + cudaMallocPitch calls issued

// Live ranges must never overlap; returns the number of overlaps `p` creates.
int overlaps(const std::map<std::uintptr_t, std::uint64_t>& live, std::uintptr_t p, std::uint64_t n) {
  int bad = 0;
  auto it = live.upper_bound(p);
  if (it != live.end() && it->first < p + n) ++bad;
  if (it != live.begin()) {
    --it;
    if (it->first + it->second > p) ++bad;
  }
  return bad;
}

void random_workload(unsigned long long* d_bad, unsigned long long* d_sum) {
  Rng rng(12345);
  std::vector<Slot> slots(256);
  std::map<std::uintptr_t, std::uint64_t> live;
  int overlap_errors = 0, misaligned = 0;
  unsigned long long checksum = 0, bad_total = 0;
  const int iters = 12000;
  for (int it = 0; it < iters; ++it) {
    Slot& s = slots[rng.below(slots.size())];
    if (s.p) {
      live.erase(reinterpret_cast<std::uintptr_t>(s.p));
      CK(cudaFree(s.p));
      s = Slot{};
    } else {
      s.n = pick_size(rng);
      s.tag = static_cast<std::uint32_t>(it);
      CK(cudaMalloc(&s.p, s.n));
      ++g_calls;
      const auto a = reinterpret_cast<std::uintptr_t>(s.p);
      misaligned += (a % 256) != 0;  // cudaMalloc promises 256-byte alignment
      overlap_errors += overlaps(live, a, s.n);
      live[a] = s.n;
      fill_pattern<<<grid_for(s.n), 256>>>(s.p, s.n, s.tag);
      CK(cudaGetLastError());
    }
    if (it % 500 == 499) {  // every live block must still hold exactly its own pattern
      CK(cudaMemset(d_bad, 0, sizeof(unsigned long long)));
      CK(cudaMemset(d_sum, 0, sizeof(unsigned long long)));
      for (const Slot& v : slots)
        if (v.p) check_pattern<<<grid_for(v.n), 256>>>(v.p, v.n, v.tag, d_bad, d_sum);
      unsigned long long bad = 0, sum = 0;
      CK(cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
      bad_total += bad;
      checksum = checksum * 1000003ull + sum;
    }
  }
  for (Slot& s : slots)
    if (s.p) CK(cudaFree(s.p));
  std::printf("random: corrupted_bytes=%llu overlaps=%d misaligned=%d checksum=%llu\n", bad_total, overlap_errors,
              misaligned, checksum);
}

// Several host threads allocate, fill, check and free at once, each on its own per-thread
// default stream; contents must stay each thread's own. The checksum is a sum over threads, so it
// does not depend on how they interleave.
void threaded_workload() {
  constexpr int kThreads = 8, kIters = 600;
  std::vector<unsigned long long> bad(kThreads, 0), sums(kThreads, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([t, &bad, &sums] {
      Rng rng(500 + t);
      unsigned long long* acc = nullptr;  // [0] bad, [1] sum
      CK(cudaMalloc(&acc, 2 * sizeof(unsigned long long)));
      ++g_calls;
      CK(cudaMemsetAsync(acc, 0, 2 * sizeof(unsigned long long), cudaStreamPerThread));
      std::vector<Slot> mine(16);
      for (int it = 0; it < kIters; ++it) {
        Slot& s = mine[rng.below(mine.size())];
        if (s.p) {
          check_pattern<<<grid_for(s.n), 256, 0, cudaStreamPerThread>>>(s.p, s.n, s.tag, acc, acc + 1);
          CK(cudaFree(s.p));  // the check above is still queued: cudaFree must wait for it
          s = Slot{};
        } else {
          s.n = 1 + rng.below(rng.below(4) == 0 ? (2u << 20) : (48u << 10));
          s.tag = static_cast<std::uint32_t>(t * 100000 + it);
          CK(cudaMalloc(&s.p, s.n));
          ++g_calls;
          fill_pattern<<<grid_for(s.n), 256, 0, cudaStreamPerThread>>>(s.p, s.n, s.tag);
        }
      }
      for (Slot& s : mine)
        if (s.p) {
          check_pattern<<<grid_for(s.n), 256, 0, cudaStreamPerThread>>>(s.p, s.n, s.tag, acc, acc + 1);
          CK(cudaFree(s.p));
        }
      unsigned long long h[2];
      CK(cudaMemcpyAsync(h, acc, sizeof h, cudaMemcpyDeviceToHost, cudaStreamPerThread));
      CK(cudaStreamSynchronize(cudaStreamPerThread));
      CK(cudaFree(acc));
      bad[t] = h[0];
      sums[t] = h[1];
    });
  for (auto& th : ts) th.join();
  unsigned long long b = 0, sum = 0;
  for (int t = 0; t < kThreads; ++t) b += bad[t], sum += sums[t];
  std::printf("threads: corrupted_bytes=%llu checksum=%llu\n", b, sum);
}

void pitch_workload() {
  Rng rng(777);
  int errors = 0;
  for (int i = 0; i < 200; ++i) {
    const std::size_t width = 1 + rng.below(5000), height = 1 + rng.below(300);
    void* p = nullptr;
    std::size_t pitch = 0;
    CK(cudaMallocPitch(&p, &pitch, width, height));
    ++g_calls;
    if (pitch < width) ++errors;
    const int value = static_cast<int>(i & 0xff);
    CK(cudaMemset2D(p, pitch, value, width, height));
    std::vector<std::uint8_t> host(width * height);
    CK(cudaMemcpy2D(host.data(), width, p, pitch, width, height, cudaMemcpyDeviceToHost));
    for (std::uint8_t b : host) errors += b != value;
    CK(cudaFree(p));
  }
  std::printf("pitch: errors=%d\n", errors);
}

void edge_cases() {
  void* p = reinterpret_cast<void*>(0x1);
  cudaError_t rc = cudaMalloc(&p, 0);
  std::printf("malloc(0): rc=%d null=%d\n", static_cast<int>(rc), p == nullptr);
  if (rc == cudaSuccess && p) CK(cudaFree(p));
  cudaGetLastError();
  std::printf("free(NULL): rc=%d\n", static_cast<int>(cudaFree(nullptr)));

  // Interior-pointer free and double free: refused with an error, and the block survives.
  std::uint8_t* q = nullptr;
  CK(cudaMalloc(&q, 1 << 20));
  ++g_calls;
  fill_pattern<<<grid_for(1 << 20), 256>>>(q, 1 << 20, 99);
  rc = cudaFree(q + 4096);
  std::printf("free(interior): rc=%d\n", static_cast<int>(rc));
  cudaGetLastError();
  unsigned long long *bad, *sum;
  CK(cudaMalloc(&bad, 16));
  ++g_calls;
  sum = bad + 1;
  CK(cudaMemset(bad, 0, 16));
  check_pattern<<<grid_for(1 << 20), 256>>>(q, 1 << 20, 99, bad, sum);
  unsigned long long h[2];
  CK(cudaMemcpy(h, bad, sizeof h, cudaMemcpyDeviceToHost));
  std::printf("block after bad free: corrupted_bytes=%llu\n", h[0]);
  CK(cudaFree(q));
  rc = cudaFree(q);
  std::printf("free(twice): rc=%d\n", static_cast<int>(rc));
  cudaGetLastError();
  CK(cudaFree(bad));

  std::size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  std::printf("meminfo: total=%zu free_le_total=%d\n", total_b, free_b <= total_b);
}

// Address ranges and pointer attributes describe the block the program allocated.
void range_queries() {
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      !fn) {
    cudaGetLastError();
    std::printf("ranges: cuMemGetAddressRange not resolvable (status %d)\n", static_cast<int>(q));
    return;
  }
  auto get_range = reinterpret_cast<GetRange>(fn);
  const std::size_t sizes[] = {1000, 3000, 5000, 70000, 3 << 20};
  std::vector<std::uint8_t*> ptrs;
  for (std::size_t n : sizes) {
    std::uint8_t* p = nullptr;
    CK(cudaMalloc(&p, n));
    ++g_calls;
    ptrs.push_back(p);
  }
  int errors = 0;
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    for (std::size_t off : {std::size_t{0}, sizes[i] / 2}) {
      CUdeviceptr base = 0;
      size_t size = 0;
      if (get_range(&base, &size, reinterpret_cast<CUdeviceptr>(ptrs[i] + off)) != CUDA_SUCCESS) {
        ++errors;
        continue;
      }
      if (base != reinterpret_cast<CUdeviceptr>(ptrs[i]) || size < sizes[i]) ++errors;
      for (std::size_t j = 0; j < ptrs.size(); ++j)  // the range may not cover another live block
        if (j != i && reinterpret_cast<CUdeviceptr>(ptrs[j]) >= base &&
            reinterpret_cast<CUdeviceptr>(ptrs[j]) < base + size)
          ++errors;
    }
    cudaPointerAttributes attr{};
    CK(cudaPointerGetAttributes(&attr, ptrs[i] + 1));
    if (attr.type != cudaMemoryTypeDevice || attr.device != 0) ++errors;
  }
  for (auto* p : ptrs) CK(cudaFree(p));
  std::printf("ranges: errors=%d\n", errors);
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  unsigned long long* scratch = nullptr;
  CK(cudaMalloc(&scratch, 2 * sizeof(unsigned long long)));
  ++g_calls;
  random_workload(scratch, scratch + 1);
  threaded_workload();
  pitch_workload();
  edge_cases();
  range_queries();
  CK(cudaFree(scratch));
  CK(cudaDeviceSynchronize());
  // On stderr, so stdout stays comparable: run.sh sets it against num_device_alloc in the stats.
  std::fprintf(stderr, "alloc_calls=%llu\n", g_calls.load());
  return 0;
}
