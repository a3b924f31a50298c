// A "legacy" CUDA program of the kind the shim is for: built with nvcc's defaults (static
// cudart), it allocates variable-size work buffers every iteration and frees them at the end of
// it. It times its own cudaMalloc/cudaFree calls so run.sh can report the time spent in
// allocation with and without the shim; stdout (the results) must be identical either way.
//   legacy_app [ITERS] [--once]
// --once: the same program with its buffers allocated once, before the loop, at the largest size
// any iteration uses (the floor a pool can at best reach); same results.
#include <chrono>
#include <cstring>

#include "common.h"

namespace {

__global__ void init_field(float* x, std::uint64_t n, float phase) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    x[i] = __sinf(0.001f * static_cast<float>(i % 100003) + phase);
}

__global__ void stencil(const float* x, float* y, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const float l = x[i == 0 ? 0 : i - 1], r = x[i + 1 == n ? i : i + 1];
    y[i] = 0.25f * l + 0.5f * x[i] + 0.25f * r;
  }
}

// Integer-valued reduction so the result does not depend on the order of additions.
__global__ void quantized_sum(const float* y, std::uint64_t n, unsigned long long* out) {
  unsigned long long mine = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    mine += static_cast<unsigned long long>((y[i] + 2.0f) * 1024.0f);
  atomicAdd(out, mine);
}

using Clock = std::chrono::steady_clock;
double alloc_seconds = 0;  // time inside cudaMalloc/cudaFree

template <class T>
T* timed_malloc(std::uint64_t count) {
  const auto t0 = Clock::now();
  T* p = nullptr;
  CK(cudaMalloc(&p, count * sizeof(T)));
  alloc_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  return p;
}

void timed_free(void* p) {
  const auto t0 = Clock::now();
  CK(cudaFree(p));
  alloc_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 3000;
  bool once = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--once") == 0)
      once = true;
    else
      iters = std::atoi(argv[i]);
  }
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));  // context creation stays outside the timed loop
  const auto start = Clock::now();
  unsigned long long total = 0;
  Rng rng(2024);
  constexpr std::uint64_t kMaxN = 1024 + (6u << 20);  // above every n below
  float* x_once = nullptr;
  float* y_once = nullptr;
  unsigned long long* out_once = nullptr;
  if (once) {
    x_once = timed_malloc<float>(kMaxN);
    y_once = timed_malloc<float>(kMaxN);
    out_once = timed_malloc<unsigned long long>(1);
  }
  for (int it = 0; it < iters; ++it) {
    // Work-buffer sizes follow the "problem" of this iteration: 4 KiB to ~24 MiB.
    const std::uint64_t n = 1024 + rng.below(it % 10 == 0 ? (6u << 20) : (256u << 10));
    float* x = once ? x_once : timed_malloc<float>(n);
    float* y = once ? y_once : timed_malloc<float>(n);
    unsigned long long* out = once ? out_once : timed_malloc<unsigned long long>(1);
    CK(cudaMemset(out, 0, sizeof(unsigned long long)));
    init_field<<<grid_for(n), 256>>>(x, n, 0.01f * it);
    stencil<<<grid_for(n), 256>>>(x, y, n);
    quantized_sum<<<grid_for(n), 256>>>(y, n, out);
    unsigned long long h = 0;
    CK(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost));
    total = total * 31 + h;
    if (once) continue;
    timed_free(out);
    timed_free(y);
    timed_free(x);
  }
  CK(cudaDeviceSynchronize());
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  if (once) {  // outside the timed loop, as the floor has it
    CK(cudaFree(out_once));
    CK(cudaFree(y_once));
    CK(cudaFree(x_once));
  }
  std::printf("legacy: iterations=%d result=%llu\n", iters, total);
  std::fprintf(stderr, "wall_s=%.6f alloc_s=%.6f\n", wall, alloc_seconds);
  return 0;
}
