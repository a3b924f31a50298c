// A CUDA graph that allocates with cudaMallocAsync inside the capture, replayed many times while
// the program keeps allocating outside it. Allocations on a capturing stream must become graph
// memory nodes (the shim passes them through); if the pool served them instead, the graph would
// bake in a pool block that later plain allocations also receive, and the garbage written to
// those would show up in the graph's results.
// Also records what cudaMalloc returns during a global-mode capture (the real driver refuses it),
// so a difference in that answer shows in the compared output.
#include <vector>

#include "common.h"

namespace {

__global__ void sum_bytes(const std::uint8_t* p, std::uint64_t n, unsigned long long* out) {
  unsigned long long mine = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    mine += p[i];
  if (mine) atomicAdd(out, mine);
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  cudaStream_t s, noise;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&noise, cudaStreamNonBlocking));
  unsigned long long* out = nullptr;
  CK(cudaMalloc(&out, sizeof(unsigned long long)));

  const std::uint64_t n = 6u << 20;
  unsigned long long expected = 0;
  for (std::uint64_t i = 0; i < n; ++i) expected += pattern_byte(7, i);

  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  std::uint8_t* p = nullptr;
  CK(cudaMallocAsync(reinterpret_cast<void**>(&p), n, s));
  CK(cudaMemsetAsync(out, 0, sizeof(unsigned long long), s));
  fill_pattern<<<grid_for(n), 256, 0, s>>>(p, n, 7);
  sum_bytes<<<grid_for(n), 256, 0, s>>>(p, n, out);
  CK(cudaFreeAsync(p, s));
  CK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));

  Rng rng(99);
  int wrong = 0;
  const int replays = 40;
  for (int r = 0; r < replays; ++r) {
    CK(cudaGraphLaunch(exec, s));
    // Meanwhile: plain allocations of similar sizes, scribbled on from another stream.
    std::vector<std::uint8_t*> junk;
    for (int k = 0; k < 4; ++k) {
      std::uint8_t* j = nullptr;
      const std::uint64_t m = n / 2 + rng.below(n);
      CK(cudaMalloc(&j, m));
      CK(cudaMemsetAsync(j, 0xEE, m, noise));
      junk.push_back(j);
    }
    CK(cudaStreamSynchronize(s));
    unsigned long long got = 0;
    CK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
    wrong += got != expected;
    CK(cudaStreamSynchronize(noise));
    for (auto* j : junk) CK(cudaFree(j));
  }
  std::printf("graph: replays=%d wrong_results=%d\n", replays, wrong);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));

  // cudaMalloc while this thread captures in global mode: what does the program get back?
  cudaStream_t c;
  CK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  CK(cudaStreamBeginCapture(c, cudaStreamCaptureModeGlobal));
  void* m = nullptr;
  const cudaError_t rc = cudaMalloc(&m, 1 << 20);
  cudaGraph_t g2 = nullptr;
  const cudaError_t end_rc = cudaStreamEndCapture(c, &g2);
  std::printf("malloc during global capture: rc=%d end_capture_rc=%d\n", static_cast<int>(rc),
              static_cast<int>(end_rc));
  if (rc == cudaSuccess && m) cudaFree(m);
  if (g2) cudaGraphDestroy(g2);
  cudaGetLastError();
  CK(cudaStreamDestroy(c));

  CK(cudaFree(out));
  CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(noise));
  CK(cudaDeviceSynchronize());
  return 0;
}
