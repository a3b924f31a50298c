// PyTorch's caching allocator called from C++ (raw_alloc / raw_delete on the current stream),
// measured by the same harness as alloc_bench. Built on the GPU machine against the installed
// torch's headers and libraries (see run.sh); run without the shim.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdlib>

#include "bench_harness.h"

namespace {

class TorchCaching : public bench::Allocator {
 public:
  void* alloc(std::size_t n) override {
    try {
      return c10::cuda::CUDACachingAllocator::raw_alloc(n);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  void release(void* p) override { c10::cuda::CUDACachingAllocator::raw_delete(p); }
};

}  // namespace

int main(int argc, char** argv) {
  const double scale = argc > 1 ? std::atof(argv[1]) : 1.0;
  c10::cuda::set_device(0);
  // Normally torch's lazy CUDA init does this; a bare C++ program has to.
  c10::cuda::CUDACachingAllocator::init(c10::cuda::device_count());
  bench::run_all(
      "torch", "raw_alloc", [] { return std::unique_ptr<bench::Allocator>(new TorchCaching); }, scale);
  c10::cuda::device_synchronize();
  return 0;
}
