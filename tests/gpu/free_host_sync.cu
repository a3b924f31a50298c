// The host-side half of cudaFree's promise: real CUDA's cudaFree returns only after the device
// finished all work queued before it, on every stream. A kernel waits 20 ms on the GPU and then
// writes a value into mapped pinned host memory; the host calls cudaFree on an unrelated device
// buffer and, with no other synchronization, reads that host memory at once. With the real
// driver the write is there (seen); a pool whose cudaFree returns at once reads the old value.
// Two parts: the kernel on the legacy stream, and on a non-blocking stream (the real cudaFree
// waits for that one too).
// stdout per part: one line per trial (`seen_after_free=0|1`), `PART: seen=K of N` and
// `PART: seen_after_sync=K of N` (after cudaDeviceSynchronize: must be N in every run, else the
// kernel's write never reached the host and the test says nothing). report.py expects seen=N
// without the shim and with free_host_sync:True; the default policy does not wait (INFO).
#include "common.h"

namespace {

constexpr std::uint64_t kDelayNs = 20'000'000;  // the kernel runs for 20 ms before it writes
constexpr unsigned kValue = 0x5A5A5A5Au;
constexpr int kTrials = 5;
constexpr std::size_t kJunk = 4u << 20;  // the unrelated buffer cudaFree is called on

__global__ void late_host_write(volatile unsigned* host, unsigned v) {
  gpu_delay_ns(kDelayNs);
  *host = v;
  __threadfence_system();
}

void part(const char* label, cudaStream_t s, volatile unsigned* h, unsigned* d) {
  int seen = 0, after_sync = 0;
  for (int t = 0; t < kTrials; ++t) {
    void* junk = nullptr;
    CK(cudaMalloc(&junk, kJunk));  // allocated earlier, never touched by the kernel
    CK(cudaDeviceSynchronize());
    *h = 0;
    late_host_write<<<1, 1, 0, s>>>(d, kValue);
    CK(cudaGetLastError());
    CK(cudaFree(junk));
    const int now = *h == kValue;  // no synchronization but cudaFree's own
    CK(cudaDeviceSynchronize());
    after_sync += *h == kValue;
    seen += now;
    std::printf("%s trial %d: seen_after_free=%d\n", label, t, now);
  }
  std::printf("%s: seen=%d of %d\n", label, seen, kTrials);
  std::printf("%s: seen_after_sync=%d of %d\n", label, after_sync, kTrials);
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  unsigned* h = nullptr;
  CK(cudaHostAlloc(reinterpret_cast<void**>(&h), sizeof(unsigned), cudaHostAllocMapped));
  unsigned* d = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d), h, 0));
  cudaStream_t nb;
  CK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));

  part("legacy", cudaStreamLegacy, h, d);
  part("nonblocking", nb, h, d);

  CK(cudaStreamDestroy(nb));
  CK(cudaFreeHost(h));
  return 0;
}
