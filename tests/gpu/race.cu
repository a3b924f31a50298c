// Cross-stream reuse race. A kernel that is still using buffer A (reading it, or writing it late)
// when the host calls cudaFree(A); then the host allocates B of the same size and writes B from
// another stream. Real CUDA makes cudaFree wait for the device, so A's bytes stay A's until the
// kernel ends. A pool that hands A's bytes out as B too early, without making the writer wait for
// the kernel, lets the two collide:
//   read  variant: the kernel sees B's bytes where A's pattern should be;
//   write variant: B's contents get overwritten by the kernel's late write to A.
// B is written by one of these writers:
//   other       cudaMemsetAsync on a non-blocking stream created at program start;
//   new_stream  cudaMemsetAsync on a non-blocking stream created after cudaMalloc(B) returned;
//   graph       cudaGraphLaunch on `other` of a graph with one kernel node that fills a buffer,
//               instantiated (and run once on a scratch buffer) before the free, its pointer
//               parameter set to B with cudaGraphExecKernelNodeSetParams;
//   legacy      cudaMemsetAsync on stream 0 (the legacy default stream);
//   per_thread  cudaMemsetAsync on cudaStreamPerThread.
// Sizes: 4 KiB (small pool) and 8 MiB (a 20 MiB segment) with the `other` writer; 16 MiB (a
// segment of exactly that size, so B cannot come from the rest of A's segment: a pool that reuses
// memory whose fence still runs, instead of growing, hands A's address out as B) with every
// writer.
// stdout: one line per case, one per writer, the total (`total_corrupted=... corrupted_cases=...
// cases=...`) and `reused_cases=N` (cases where B got A's address). report.py reads the totals
// only (nothing here is compared between runs): 0 corrupted bytes with the real driver and the
// pool's safe policies (default gpu_wait also needs reused_cases > 0: the reuse path ran), > 0
// with free_sync:immediate (which proves this test can fail).
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace {

constexpr std::uint64_t kDelayNs = 20'000'000;  // the kernel holds A for 20 ms
constexpr std::uint8_t kA = 0xAB, kB = 0x11, kLate = 0xCD;
constexpr std::uint64_t kScratch = 4096;  // the graph's buffer until it is pointed at B

// The graph writer's kernel node.
__global__ void fill_bytes(std::uint8_t* p, std::uint64_t n, unsigned int v) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::uint8_t>(v);
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

enum class Writer { other, new_stream, graph, legacy, per_thread };
constexpr Writer kWriters[] = {Writer::other, Writer::new_stream, Writer::graph, Writer::legacy, Writer::per_thread};
constexpr int kNumWriters = 5;
const char* name(Writer w) {
  switch (w) {
    case Writer::other: return "other";
    case Writer::new_stream: return "new_stream";
    case Writer::graph: return "graph";
    case Writer::legacy: return "legacy";
    case Writer::per_thread: return "per_thread";
  }
  return "?";
}

// Few blocks, so the writer on the other stream finds free SMs and really runs concurrently.
constexpr unsigned kGrid = 8, kBlock = 256, kWriterGrid = 128;

struct Case {
  Flavour flavour;
  bool write_variant;
  std::uint64_t size;
  Writer writer;
};

struct Result {
  unsigned long long corrupted = 0;
  bool reused = false;
};

// A one-kernel-node graph (fill_bytes), built explicitly (no stream capture), instantiated and
// run once on the scratch buffer.
struct GraphWriter {
  cudaGraph_t graph = nullptr;
  cudaGraphNode_t node = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::uint8_t* ptr = nullptr;
  std::uint64_t n = 0;
  unsigned int value = kB;
  void* args[3] = {&ptr, &n, &value};

  cudaKernelNodeParams params() {
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(fill_bytes);
    kp.gridDim = dim3(kWriterGrid);
    kp.blockDim = dim3(kBlock);
    kp.sharedMemBytes = 0;
    kp.kernelParams = args;
    kp.extra = nullptr;
    return kp;
  }
  void build(std::uint8_t* scratch, cudaStream_t s) {
    ptr = scratch;
    n = kScratch;
    CK(cudaGraphCreate(&graph, 0));
    const cudaKernelNodeParams kp = params();
    CK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &kp));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, s));  // warm: the launch under test is not the first
    CK(cudaStreamSynchronize(s));
  }
  void launch_on(std::uint8_t* p, std::uint64_t size, cudaStream_t s) {
    ptr = p;
    n = size;
    const cudaKernelNodeParams kp = params();
    CK(cudaGraphExecKernelNodeSetParams(exec, node, &kp));
    CK(cudaGraphLaunch(exec, s));
  }
  ~GraphWriter() {
    if (exec) CK(cudaGraphExecDestroy(exec));
    if (graph) CK(cudaGraphDestroy(graph));
  }
};

Result run_case(const Case& c, cudaStream_t other, unsigned long long* d_count, std::uint8_t* scratch,
                std::vector<std::uint8_t>& host) {
  std::uint8_t* a = nullptr;
  CK(cudaMalloc(&a, c.size));
  CK(cudaMemset(a, kA, c.size));
  CK(cudaMemset(d_count, 0, sizeof(unsigned long long)));
  CK(cudaDeviceSynchronize());

  GraphWriter gw;
  if (c.writer == Writer::graph) gw.build(scratch, other);  // before the free

  cudaStream_t own = nullptr;
  if (c.flavour == Flavour::blocking) CK(cudaStreamCreateWithFlags(&own, cudaStreamDefault));
  if (c.flavour == Flavour::nonblocking) CK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  auto launch = [&](cudaStream_t s) {
    if (c.write_variant)
      late_writer<<<kGrid, kBlock, 0, s>>>(a, c.size, kLate, kDelayNs);
    else
      late_reader<<<kGrid, kBlock, 0, s>>>(a, c.size, kA, kDelayNs, d_count);
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
  Result r;
  r.reused = b == a;
  cudaStream_t fresh = nullptr;
  switch (c.writer) {  // no ordering with the kernel but what cudaFree (or the pool) provides
    case Writer::other: CK(cudaMemsetAsync(b, kB, c.size, other)); break;
    case Writer::new_stream:
      CK(cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking));
      CK(cudaMemsetAsync(b, kB, c.size, fresh));
      break;
    case Writer::graph: gw.launch_on(b, c.size, other); break;
    case Writer::legacy: CK(cudaMemsetAsync(b, kB, c.size, 0)); break;
    case Writer::per_thread: CK(cudaMemsetAsync(b, kB, c.size, cudaStreamPerThread)); break;
  }
  CK(cudaDeviceSynchronize());

  if (c.write_variant) {
    host.resize(c.size);
    CK(cudaMemcpy(host.data(), b, c.size, cudaMemcpyDeviceToHost));
    for (std::uint8_t v : host) r.corrupted += v != kB;
  } else {
    CK(cudaMemcpy(&r.corrupted, d_count, sizeof r.corrupted, cudaMemcpyDeviceToHost));
  }
  CK(cudaFree(b));
  if (fresh) CK(cudaStreamDestroy(fresh));
  if (own) CK(cudaStreamDestroy(own));
  std::fprintf(stderr, "  %s %s %llu %s: same_address=%d corrupted=%llu\n", name(c.flavour),
               c.write_variant ? "write" : "read", static_cast<unsigned long long>(c.size), name(c.writer), r.reused,
               r.corrupted);
  return r;
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  cudaStream_t other;
  CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  unsigned long long* d_count = nullptr;
  CK(cudaMalloc(&d_count, sizeof(unsigned long long)));
  std::uint8_t* scratch = nullptr;
  CK(cudaMalloc(&scratch, kScratch));
  std::vector<std::uint8_t> host;

  struct Tally {
    unsigned long long corrupted = 0;
    int cases = 0, corrupted_cases = 0, reused = 0;
  };
  Tally all, per_writer[kNumWriters];
  for (std::uint64_t size : {std::uint64_t{4096}, std::uint64_t{8} << 20, std::uint64_t{16} << 20})
    for (Writer w : kWriters) {
      if (w != Writer::other && size != (std::uint64_t{16} << 20)) continue;  // every writer: 16 MiB only
      for (Flavour f : {Flavour::legacy, Flavour::blocking, Flavour::nonblocking, Flavour::per_thread,
                        Flavour::per_thread_other_thread})
        for (bool write : {false, true}) {
          const Result r = run_case({f, write, size, w}, other, d_count, scratch, host);
          std::printf("case %s %s %llu %s corrupted=%llu same_address=%d\n", name(f), write ? "write" : "read",
                      static_cast<unsigned long long>(size), name(w), r.corrupted, r.reused);
          for (Tally* t : {&all, &per_writer[static_cast<int>(w)]}) {
            t->corrupted += r.corrupted;
            ++t->cases;
            t->corrupted_cases += r.corrupted != 0;
            t->reused += r.reused;
          }
        }
    }
  for (Writer w : kWriters) {
    const Tally& t = per_writer[static_cast<int>(w)];
    std::printf("writer %s: cases=%d reused=%d corrupted_cases=%d corrupted=%llu\n", name(w), t.cases, t.reused,
                t.corrupted_cases, t.corrupted);
  }
  std::printf("total_corrupted=%llu corrupted_cases=%d cases=%d\n", all.corrupted, all.corrupted_cases, all.cases);
  std::printf("reused_cases=%d\n", all.reused);
  CK(cudaFree(scratch));
  CK(cudaFree(d_count));
  CK(cudaStreamDestroy(other));
  return 0;
}
