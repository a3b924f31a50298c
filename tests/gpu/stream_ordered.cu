// cudaMallocAsync / cudaFreeAsync across streams, ordered by events, as CUDA's stream-ordered
// allocator defines them: a block freed on stream S2 may be reused by S1 only once S1's work is
// ordered after the free (or the free has completed). A pool that hands it out earlier lets S1's
// new writes land while S2's delayed reader still reads the old contents.
// Also mixes the two worlds: a block freed with cudaFreeAsync must not be returned by a plain
// cudaMalloc before the free has happened on the GPU.
// stdout: mismatch counts and a checksum, compared with the run without the shim.
#include <vector>

#include "common.h"

namespace {

// Reads p after a delay and adds its checksum into *sum, its pattern errors into *bad.
__global__ void delayed_check(const std::uint8_t* p, std::uint64_t n, std::uint32_t tag, unsigned long long* bad,
                              unsigned long long* sum, std::uint64_t delay) {
  gpu_delay_ns(delay);
  unsigned long long my_bad = 0, my_sum = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    my_bad += p[i] != pattern_byte(tag, i);
    my_sum += p[i];
  }
  if (my_bad) atomicAdd(bad, my_bad);
  if (my_sum) atomicAdd(sum, my_sum);
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  cudaStream_t s1, s2, s3;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
  cudaEvent_t filled;
  CK(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
  unsigned long long* acc = nullptr;  // [0] bad, [1] sum
  CK(cudaMalloc(&acc, 2 * sizeof(unsigned long long)));
  CK(cudaMemset(acc, 0, 2 * sizeof(unsigned long long)));
  CK(cudaDeviceSynchronize());

  Rng rng(4242);
  unsigned long long new_bad = 0;
  const int iters = 150;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t n = 512 + rng.below(it % 3 == 0 ? (8u << 20) : (256u << 10));
    // S1 allocates and fills; S2 waits for the fill, reads late, frees on S2.
    std::uint8_t* p = nullptr;
    CK(cudaMallocAsync(reinterpret_cast<void**>(&p), n, s1));
    fill_pattern<<<grid_for(n), 256, 0, s1>>>(p, n, it);
    CK(cudaEventRecord(filled, s1));
    CK(cudaStreamWaitEvent(s2, filled, 0));
    delayed_check<<<8, 256, 0, s2>>>(p, n, it, acc, acc + 1, 300'000);
    CK(cudaFreeAsync(p, s2));

    // S1 (not ordered after S2's free) allocates the same size and overwrites it at once.
    std::uint8_t* q = nullptr;
    CK(cudaMallocAsync(reinterpret_cast<void**>(&q), n, s1));
    CK(cudaMemsetAsync(q, 0x5A, n, s1));
    CK(cudaFreeAsync(q, s1));

    // Every fourth round: a plain cudaMalloc right after, written from a third stream.
    if (it % 4 == 0) {
      std::uint8_t* r = nullptr;
      CK(cudaMalloc(&r, n));
      CK(cudaMemsetAsync(r, 0x77, n, s3));
      CK(cudaStreamSynchronize(s3));
      std::vector<std::uint8_t> host(n);
      CK(cudaMemcpy(host.data(), r, n, cudaMemcpyDeviceToHost));
      for (std::uint8_t v : host) new_bad += v != 0x77;
      CK(cudaFree(r));
    }
  }
  CK(cudaDeviceSynchronize());
  unsigned long long h[2];
  CK(cudaMemcpy(h, acc, sizeof h, cudaMemcpyDeviceToHost));
  std::printf("stream_ordered: corrupted_bytes=%llu new_block_errors=%llu checksum=%llu\n", h[0], new_bad, h[1]);
  CK(cudaFree(acc));
  CK(cudaEventDestroy(filled));
  for (cudaStream_t s : {s1, s2, s3}) CK(cudaStreamDestroy(s));
  return 0;
}
