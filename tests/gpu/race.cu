// Cross-stream reuse race. A kernel that is still using buffer A (reading it, or writing it late)
// when the host calls cudaFree(A); then the host allocates B of the same size and writes B from
// another (non-blocking) stream. Real CUDA makes cudaFree wait for the device, so A's bytes stay
// A's until the kernel ends. A pool that hands A's bytes out as B too early lets the two collide:
//   read  variant: the kernel sees B's bytes where A's pattern should be;
//   write variant: B's contents get overwritten by the kernel's late write to A.
// stdout: one line per case plus a total; run.sh expects 0 with the real driver and the default
// policy, and > 0 with free_sync:immediate (which proves this test can fail).
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace {

constexpr std::uint64_t kDelayNs = 20'000'000;  // the kernel holds A for 20 ms
constexpr std::uint8_t kA = 0xAB, kB = 0x11, kLate = 0xCD;

__global__ void late_reader(const std::uint8_t* a, std::uint64_t n, unsigned long long* mismatches) {
  gpu_delay_ns(kDelayNs);
  unsigned long long mine = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    mine += a[i] != kA;
  if (mine) atomicAdd(mismatches, mine);
}

__global__ void late_writer(std::uint8_t* a, std::uint64_t n) {
  gpu_delay_ns(kDelayNs);
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a[i] = kLate;
}

enum class Flavour { legacy, blocking, nonblocking, per_thread, per_thread_other_thread };
const char* name(Flavour f) {
  switch (f) {
    case Flavour::legacy: return "legacy";
    case Flavour::blocking: return "blocking";
    case Flavour::nonblocking: return "nonblocking";
    case Flavour::per_thread: return "per_thread";
    case Flavour::per_thread_other_thread: return "per_thread_other_thread";
  }
  return "?";
}

// Few blocks, so the writer on the other stream finds free SMs and really runs concurrently.
constexpr unsigned kGrid = 8, kBlock = 256;

struct Case {
  Flavour flavour;
  bool write_variant;
  std::uint64_t size;
};

unsigned long long run_case(const Case& c, cudaStream_t other, unsigned long long* d_count) {
  std::uint8_t* a = nullptr;
  CK(cudaMalloc(&a, c.size));
  CK(cudaMemset(a, kA, c.size));
  CK(cudaMemset(d_count, 0, sizeof(unsigned long long)));
  CK(cudaDeviceSynchronize());

  cudaStream_t own = nullptr;
  if (c.flavour == Flavour::blocking) CK(cudaStreamCreateWithFlags(&own, cudaStreamDefault));
  if (c.flavour == Flavour::nonblocking) CK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  auto launch = [&](cudaStream_t s) {
    if (c.write_variant)
      late_writer<<<kGrid, kBlock, 0, s>>>(a, c.size);
    else
      late_reader<<<kGrid, kBlock, 0, s>>>(a, c.size, d_count);
    CK(cudaGetLastError());
  };
  switch (c.flavour) {
    case Flavour::legacy: launch(cudaStreamLegacy); break;
    case Flavour::blocking:
    case Flavour::nonblocking: launch(own); break;
    case Flavour::per_thread: launch(cudaStreamPerThread); break;
    case Flavour::per_thread_other_thread: {
      std::thread t([&] { launch(cudaStreamPerThread); });  // the launch returns at once
      t.join();
      break;
    }
  }

  CK(cudaFree(a));  // the kernel is still delaying: A's bytes are still the kernel's
  std::uint8_t* b = nullptr;
  CK(cudaMalloc(&b, c.size));
  const bool reused = b == a;
  CK(cudaMemsetAsync(b, kB, c.size, other));  // another stream, no ordering with the kernel
  CK(cudaDeviceSynchronize());

  unsigned long long corrupted = 0;
  if (c.write_variant) {
    std::vector<std::uint8_t> host(c.size);
    CK(cudaMemcpy(host.data(), b, c.size, cudaMemcpyDeviceToHost));
    for (std::uint8_t v : host) corrupted += v != kB;
  } else {
    CK(cudaMemcpy(&corrupted, d_count, sizeof corrupted, cudaMemcpyDeviceToHost));
  }
  CK(cudaFree(b));
  if (own) CK(cudaStreamDestroy(own));
  std::fprintf(stderr, "  %s %s %llu: same_address=%d corrupted=%llu\n", name(c.flavour),
               c.write_variant ? "write" : "read", static_cast<unsigned long long>(c.size), reused,
               corrupted);
  return corrupted;
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  cudaStream_t other;
  CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  unsigned long long* d_count = nullptr;
  CK(cudaMalloc(&d_count, sizeof(unsigned long long)));

  unsigned long long total = 0;
  int cases = 0, corrupted_cases = 0;
  for (std::uint64_t size : {std::uint64_t{4096}, std::uint64_t{8} << 20})
    for (Flavour f : {Flavour::legacy, Flavour::blocking, Flavour::nonblocking, Flavour::per_thread,
                      Flavour::per_thread_other_thread})
      for (bool write : {false, true}) {
        const unsigned long long c = run_case({f, write, size}, other, d_count);
        std::printf("case %s %s %llu corrupted=%llu\n", name(f), write ? "write" : "read",
                    static_cast<unsigned long long>(size), c);
        total += c;
        ++cases;
        corrupted_cases += c != 0;
      }
  std::printf("total_corrupted=%llu corrupted_cases=%d cases=%d\n", total, corrupted_cases, cases);
  CK(cudaFree(d_count));
  CK(cudaStreamDestroy(other));
  return 0;
}
