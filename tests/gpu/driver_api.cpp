// A program that uses the driver API itself and is linked with -lcuda (no cudart at all): the
// shim must catch it through the cuMemAlloc_v2 / cuMemAllocPitch_v2 / cuMemFree_v2 symbols it
// exports, since no cuGetProcAddress lookup happens. Blocks are filled with cuMemsetD8 and read
// back with cuMemcpyDtoH while other blocks come and go, so overlapping or short blocks show.
// stdout must be identical with and without the shim; stderr carries alloc_calls for the stats
// comparison.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "driver_check.h"

namespace {

struct Block {
  CUdeviceptr p = 0;
  std::size_t n = 0;
  unsigned char value = 0;
};

// Every byte of b must still be its value; reads the whole block (blocks are at most 1 MiB).
unsigned long long count_wrong(const Block& b, std::vector<unsigned char>& host) {
  host.resize(b.n);
  CKD(cuMemcpyDtoH(host.data(), b.p, b.n));
  unsigned long long wrong = 0;
  for (unsigned char v : host) wrong += v != b.value;
  return wrong;
}

}  // namespace

int main() {
  CUdevice dev;
  use_primary_context(&dev);

  std::uint64_t rng = 88172645463325252ull;
  auto next = [&rng] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  unsigned long long calls = 0, wrong = 0, checksum = 0;
  std::vector<Block> slots(64);
  std::vector<unsigned char> host;
  for (int it = 0; it < 4000; ++it) {
    Block& b = slots[next() % slots.size()];
    if (b.p) {
      const unsigned long long w = count_wrong(b, host);
      wrong += w;
      checksum = checksum * 131 + b.n * b.value;
      CKD(cuMemFree(b.p));
      b = Block{};
    } else {
      b.n = 1 + next() % (1u << 20);
      b.value = static_cast<unsigned char>(it);
      if (it % 7 == 0) {  // a pitched one now and then; treated as pitch * height bytes
        std::size_t pitch = 0;
        const std::size_t width = 1 + b.n % 4096, height = 1 + b.n / 4096 % 64;
        CKD(cuMemAllocPitch(&b.p, &pitch, width, height, 4));
        if (pitch < width) ++wrong;
        b.n = pitch * height;
      } else {
        CKD(cuMemAlloc(&b.p, b.n));
      }
      ++calls;
      CKD(cuMemsetD8(b.p, b.value, b.n));
    }
  }
  for (Block& b : slots)
    if (b.p) {
      wrong += count_wrong(b, host);
      CKD(cuMemFree(b.p));
    }
  // cuMemGetInfo with a NULL out-pointer is legal.
  std::size_t total = 0;
  const CUresult info_rc = cuMemGetInfo(nullptr, &total);
  std::printf("driver api: errors=%llu checksum=%llu meminfo_null_free_rc=%d\n", wrong, checksum,
              static_cast<int>(info_rc));
  CKD(cuCtxSynchronize());
  CKD(cuDevicePrimaryCtxRelease(dev));
  std::fprintf(stderr, "alloc_calls=%llu\n", calls);
  return 0;
}
