// cudaDeviceReset in the middle of a run, twice, with blocks both live and freed at the time of
// the reset. The context dies with the reset; a pool that kept its cached blocks would hand out
// addresses of the dead context afterwards (kernels fault, or results differ).
// stdout: checksums per phase, compared with the run without the shim.
#include <vector>

#include "common.h"

namespace {

// Allocates `count` buffers, fills and checks them, frees every other one (so the pool holds
// cached and pending blocks), and returns the checksum. The rest stay live, leaked on purpose.
unsigned long long phase(int round, int count, bool use_async) {
  Rng rng(1000 + round);
  unsigned long long* acc = nullptr;
  CK(cudaMalloc(&acc, 2 * sizeof(unsigned long long)));
  CK(cudaMemset(acc, 0, 2 * sizeof(unsigned long long)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<std::pair<std::uint8_t*, std::uint64_t>> bufs;
  for (int i = 0; i < count; ++i) {
    const std::uint64_t n = 1 + rng.below(i % 5 == 0 ? (32u << 20) : (200u << 10));
    std::uint8_t* p = nullptr;
    if (use_async && i % 2)  // odd buffers stream-ordered
      CK(cudaMallocAsync(reinterpret_cast<void**>(&p), n, s));
    else
      CK(cudaMalloc(&p, n));
    fill_pattern<<<grid_for(n), 256, 0, s>>>(p, n, round * 1000 + i);
    check_pattern<<<grid_for(n), 256, 0, s>>>(p, n, round * 1000 + i, acc, acc + 1);
    bufs.push_back({p, n});
  }
  CK(cudaStreamSynchronize(s));
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    if (i % 4 >= 2) continue;  // half stay live (leaked), half of each kind are freed
    if (use_async && i % 2)
      CK(cudaFreeAsync(bufs[i].first, s));
    else
      CK(cudaFree(bufs[i].first));
  }
  unsigned long long h[2];
  CK(cudaMemcpy(h, acc, sizeof h, cudaMemcpyDeviceToHost));
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
  std::printf("round %d: corrupted_bytes=%llu checksum=%llu\n", round, h[0], h[1]);
  return h[0];
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  unsigned long long bad = 0;
  bad += phase(0, 60, false);
  CK(cudaDeviceReset());
  bad += phase(1, 60, true);
  CK(cudaDeviceReset());
  bad += phase(2, 60, false);
  std::size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  std::printf("after resets: corrupted_bytes=%llu free_le_total=%d\n", bad, free_b <= total_b);
  CK(cudaDeviceReset());
  return 0;
}
