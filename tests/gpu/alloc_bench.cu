// Allocation latency through the real CUDA runtime entry points. Whether the shim is in front is
// decided by run.sh (LD_PRELOAD), so the same binary measures raw CUDA, the driver's pool and
// cudapool in each free_sync mode.
//   alloc_bench LABEL malloc            cudaMalloc / cudaFree
//   alloc_bench LABEL async [--release-max]
//                                       cudaMallocAsync / cudaFreeAsync, one stream per thread;
//                                       --release-max keeps the driver pool from trimming
//                                       (release threshold = max), the driver-pool baseline.
//   --side-stream                       first creates one non-blocking stream and leaves it idle,
//                                       as most programs and every framework do: cudaFree then
//                                       names no stream the pool could order the reuse on.
#include <cstring>
#include <string>

#include "bench_harness.h"
#include "common.h"

namespace {

class MallocApi : public bench::Allocator {
 public:
  void* alloc(std::size_t n) override {
    void* p = nullptr;
    return cudaMalloc(&p, n) == cudaSuccess ? p : (cudaGetLastError(), nullptr);
  }
  void release(void* p) override { cudaFree(p); }
};

class AsyncApi : public bench::Allocator {
 public:
  AsyncApi() { CK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~AsyncApi() override {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  void* alloc(std::size_t n) override {
    void* p = nullptr;
    return cudaMallocAsync(&p, n, s_) == cudaSuccess ? p : (cudaGetLastError(), nullptr);
  }
  void release(void* p) override { cudaFreeAsync(p, s_); }

 private:
  cudaStream_t s_{};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s LABEL malloc|async [--release-max] [--side-stream] [--scale X]\n", argv[0]);
    return 64;
  }
  const std::string api = argv[2];
  bool release_max = false, side_stream = false;
  double scale = 1.0;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--release-max"))
      release_max = true;
    else if (!std::strcmp(argv[i], "--side-stream"))
      side_stream = true;
    else if (!std::strcmp(argv[i], "--scale") && i + 1 < argc)
      scale = std::atof(argv[++i]);
  }
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));  // create the context outside the measurements
  cudaStream_t side{};
  if (side_stream) CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));  // idle, kept to the end
  if (release_max) {
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    std::uint64_t threshold = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  bench::Factory make;
  if (api == "malloc")
    make = [] { return std::unique_ptr<bench::Allocator>(new MallocApi); };
  else if (api == "async")
    make = [] { return std::unique_ptr<bench::Allocator>(new AsyncApi); };
  else
    return 64;
  bench::run_all(argv[1], api.c_str(), make, scale);
  CK(cudaDeviceSynchronize());
  return 0;
}
