// Pages still in use, moved. Four 32 MiB buffers; kernels on a non-blocking stream keep using A0
// and A2 for 20 ms (one reads them late and counts bytes that are not A's pattern, one writes
// them late); the host frees A0 and A2 at once and asks for B of 64 MiB, which fits in neither
// hole. Real CUDA waits in cudaFree. The pool's default hands the holes' pages out at once with
// the GPU made to wait, and, because B needs them in one run, maps the same physical pages a
// second time at B's address (an alias) and keeps the old mapping until the kernels are done.
// B is then written on the legacy stream and read back.
//   A pool that unmapped the old address under the kernels makes them fault (an error, exit 2);
//   one that skipped the GPU-side wait lets B's writes meet the kernels (corrupted bytes).
// `alias_race async`: the same with stream-ordered frees. A0 and A2 are freed with cudaFreeAsync
// on the kernels' stream; in rounds 0 and 1 B is allocated, written and read on that stream too:
// the pool aliases the stream's own pages into B at once (stream order puts B's work after the
// kernels) and keeps the old mapping until a fence on the stream completed. In rounds 2 and 3 B
// is allocated and written on the legacy stream, which does not follow the non-blocking one: the
// stream's pages must not reach it before that stream's work is done.
// stdout: `alias_corrupted=N` (bytes the late reader saw changed + bytes of B not B's pattern),
// stable across runs. stderr: `aliases=K` (the pool's num_device_alias, -1 without the shim) and
// B's address relative to A0 (run-dependent). report.py: 0 corrupted everywhere with no error;
// under the default also aliases > 0 (the mechanism ran); free_sync:immediate must corrupt or fault.
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace {

constexpr std::uint64_t kDelayNs = 20'000'000;
constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kSize = 32 * kMiB;
constexpr std::uint8_t kA = 0xAB, kB = 0x11, kLate = 0xCD;

// The pool's num_device_alias from its JSON stats; -1 without the shim.
long long aliases() {
  using Fn = std::size_t (*)(int, char*, std::size_t);
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "cudapool_memory_stats_json"));
  if (fn == nullptr) return -1;
  std::vector<char> buf(1 << 16);
  if (fn(0, buf.data(), buf.size()) == 0) return -1;
  const char* k = std::strstr(buf.data(), "\"num_device_alias\"");
  if (k == nullptr) return -1;
  k = std::strchr(k, ':');
  return k == nullptr ? -1 : std::atoll(k + 1);
}

}  // namespace

int main(int argc, char** argv) {
  const bool async = argc > 1 && std::strcmp(argv[1], "async") == 0;
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned long long* counters = nullptr;  // [0] late reader, [1] B check
  CK(cudaMalloc(&counters, 2 * sizeof(unsigned long long)));
  unsigned long long total = 0;
  for (int round = 0; round < 4; ++round) {
    const bool write_variant = round % 2 == 1;
    // async: B on the kernels' own stream in rounds 0 and 1, on the legacy stream after.
    cudaStream_t b_stream = async && round < 2 ? s : nullptr;
    std::uint8_t* a[4];
    for (auto& p : a) {
      if (async)
        CK(cudaMallocAsync(reinterpret_cast<void**>(&p), kSize, s));
      else
        CK(cudaMalloc(&p, kSize));
      CK(cudaMemsetAsync(p, kA, kSize, async ? s : nullptr));
    }
    CK(cudaMemset(counters, 0, 2 * sizeof(unsigned long long)));
    CK(cudaDeviceSynchronize());
    for (int i : {0, 2}) {
      if (write_variant)
        late_writer<<<8, 256, 0, s>>>(a[i], kSize, kLate, kDelayNs);
      else
        late_reader<<<8, 256, 0, s>>>(a[i], kSize, kA, kDelayNs, counters);
    }
    CK(cudaGetLastError());
    std::uint8_t* b = nullptr;
    if (async) {
      CK(cudaFreeAsync(a[0], s));
      CK(cudaFreeAsync(a[2], s));
      CK(cudaMallocAsync(reinterpret_cast<void**>(&b), 2 * kSize, b_stream));
    } else {
      CK(cudaFree(a[0]));
      CK(cudaFree(a[2]));
      CK(cudaMalloc(&b, 2 * kSize));
    }
    CK(cudaMemsetAsync(b, kB, 2 * kSize, b_stream));
    late_reader<<<128, 256, 0, b_stream>>>(b, 2 * kSize, kB, 0, counters + 1);  // B's fill, checked
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    unsigned long long got[2];
    CK(cudaMemcpy(got, counters, sizeof got, cudaMemcpyDeviceToHost));
    std::printf("round=%d variant=%s%s reader_mismatches=%llu b_mismatches=%llu\n", round,
                write_variant ? "write" : "read", async ? (b_stream == s ? " own_stream" : " other_stream") : "",
                got[0], got[1]);
    std::fprintf(stderr, "round %d: B at A0%+lld bytes\n", round,
                 static_cast<long long>(reinterpret_cast<std::intptr_t>(b) - reinterpret_cast<std::intptr_t>(a[0])));
    total += got[0] + got[1];
    for (std::uint8_t* p : {a[1], a[3], b}) CK(cudaFree(p));
  }
  CK(cudaFree(counters));
  CK(cudaStreamDestroy(s));
  std::printf("alias_corrupted=%llu\n", total);
  std::fprintf(stderr, "aliases=%lld\n", aliases());
  return 0;
}
