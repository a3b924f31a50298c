// Shared by the real-GPU test programs: error checking, a device-side delay, byte patterns.
// Every program prints only values that must be identical with and without the shim, so run.sh
// can compare whole outputs; anything run-dependent (addresses, timings) goes to stderr.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(expr)                                                                                                  \
  do {                                                                                                            \
    cudaError_t ck_err_ = (expr);                                                                                 \
    if (ck_err_ != cudaSuccess) {                                                                                 \
      std::fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #expr, cudaGetErrorString(ck_err_), \
                   static_cast<int>(ck_err_));                                                                    \
      std::exit(2);                                                                                               \
    }                                                                                                             \
  } while (0)

// Nanosecond clock shared by all SMs, so a delay means wall time, not cycles.
__device__ inline std::uint64_t gpu_now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every thread waits until `ns` have passed since it started; __nanosleep keeps the SM cool.
__device__ inline void gpu_delay_ns(std::uint64_t ns) {
  const std::uint64_t t0 = gpu_now_ns();
  while (gpu_now_ns() - t0 < ns) __nanosleep(2000);
}

// The byte a buffer tagged `tag` holds at offset i: cheap, position-dependent, tag-dependent,
// so a block handed to two owners, or shifted, is caught.
__host__ __device__ inline std::uint8_t pattern_byte(std::uint32_t tag, std::uint64_t i) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(tag) << 17);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x);
}

__global__ void fill_pattern(std::uint8_t* p, std::uint64_t n, std::uint32_t tag) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    p[i] = pattern_byte(tag, i);
}

// Counts bytes that differ from the pattern and folds the contents into an order-independent
// checksum (integer sums commute, so the result does not depend on scheduling).
__global__ void check_pattern(const std::uint8_t* p, std::uint64_t n, std::uint32_t tag, unsigned long long* bad,
                              unsigned long long* sum) {
  unsigned long long my_bad = 0, my_sum = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint8_t v = p[i];
    my_bad += v != pattern_byte(tag, i);
    my_sum += static_cast<unsigned long long>(v) * ((i % 251) + 1);
  }
  if (my_bad) atomicAdd(bad, my_bad);
  if (my_sum) atomicAdd(sum, my_sum);
}

// A kernel that keeps using a buffer late, as a program's work does after the host freed it:
// waits `delay_ns`, then counts the bytes that are not `expect` into *mismatches (the reader), or
// writes `value` over every byte (the writer). With no delay the reader checks a fill.
__global__ void late_reader(const std::uint8_t* a, std::uint64_t n, std::uint8_t expect, std::uint64_t delay_ns,
                            unsigned long long* mismatches) {
  gpu_delay_ns(delay_ns);
  unsigned long long mine = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    mine += a[i] != expect;
  if (mine) atomicAdd(mismatches, mine);
}

__global__ void late_writer(std::uint8_t* a, std::uint64_t n, std::uint8_t value, std::uint64_t delay_ns) {
  gpu_delay_ns(delay_ns);
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a[i] = value;
}

// Grid size for a grid-stride loop over n bytes: enough to saturate, never zero.
inline unsigned grid_for(std::uint64_t n, unsigned block = 256, unsigned max_grid = 1024) {
  std::uint64_t g = (n + block - 1) / block;
  if (g == 0) g = 1;
  return static_cast<unsigned>(g < max_grid ? g : max_grid);
}

// Small deterministic generator (xorshift64*), identical on every run and every machine.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed ? seed : 1) {}
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};
