// Parking test program: linked with the fake libcuda.so.1 (-lcuda style) and run under
// LD_PRELOAD=libcudapool.so with expandable segments by tests/unit/shim_park_test.cpp. The fake's
// test kernel reads and writes its arguments' memory on the fake's worker thread, so a launch
// that reached the driver while the pages were away would fault (SIGSEGV).
// `park_app <scenario>` prints "FAIL file:line: expr" and exits 1 on the first failed check.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shim/cudapool.h"
#include "tests/fakecuda/fakecuda.h"
#define CUDAPOOL_TEST_APP_LCUDA
#include "tests/fakecuda/test_app.h"

extern "C" {
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void**, void**);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void*, std::size_t);
CUresult cuMemcpyDtoH_v2(void*, CUdeviceptr, std::size_t);
CUresult cuCtxSynchronize();
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph*);
CUresult cuMemGetHandleForAddressRange(void*, CUdeviceptr, std::size_t, int, unsigned long long);
CUresult cuMemRetainAllocationHandle(unsigned long long*, void*);
}

using namespace cudaabi;

namespace {

constexpr std::size_t kMiB = 1u << 20;

template <typename Fn>
Fn c_api(const char* name) {
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  CHECK(fn != nullptr);
  return fn;
}

int park(int discard) { return c_api<int (*)(int)>("cudapool_park")(discard); }
int unpark() { return c_api<int (*)()>("cudapool_unpark")(); }
int parked(std::size_t* bytes) { return c_api<int (*)(std::size_t*)>("cudapool_parked")(bytes); }
std::string why() {
  char buf[512];
  c_api<std::size_t (*)(char*, std::size_t)>("cudapool_park_why")(buf, sizeof buf);
  return buf;
}

// The test kernel over `words` 32-bit words at `p`: each must hold base + i, and becomes base + i + 1.
CUresult launch(CUdeviceptr p, std::size_t words, std::uint32_t base) {
  void* args[] = {&p, &words, &base};
  return cuLaunchKernel(fakecuda_test_kernel(), 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr);
}

void fill(CUdeviceptr p, std::size_t words, std::uint32_t base) {
  std::vector<std::uint32_t> h(words);
  for (std::size_t i = 0; i < words; ++i) h[i] = base + static_cast<std::uint32_t>(i);
  CHECK_OK(cuMemcpyHtoD_v2(p, h.data(), words * 4));
}

// true when every word holds base + i.
bool holds(CUdeviceptr p, std::size_t words, std::uint32_t base) {
  std::vector<std::uint32_t> h(words);
  CHECK_OK(cuMemcpyDtoH_v2(h.data(), p, words * 4));
  for (std::size_t i = 0; i < words; ++i)
    if (h[i] != base + static_cast<std::uint32_t>(i)) return false;
  return true;
}

// Park, launch (restored transparently first), check the bytes, at the same address.
void scenario_basic() {
  start_primary(0);
  const std::size_t words = 6 * kMiB / 4;  // two blocks in more than one page
  CUdeviceptr a = 0, b = 0, idle = 0;
  CHECK_OK(cuMemAlloc_v2(&a, words * 4));
  CHECK_OK(cuMemAlloc_v2(&b, words * 4));
  CHECK_OK(cuMemAlloc_v2(&idle, 32 * kMiB));
  CHECK_OK(cuMemFree_v2(idle));  // cached, free: given back, not copied
  fill(a, words, 7);
  fill(b, words, 1000);
  CHECK_OK(launch(a, words, 7));  // queued work: the park drains it first
  const std::size_t before = fakecuda_vmm_device_bytes(0);
  CHECK(before >= 2 * words * 4);
  CHECK(parked(nullptr) == 0);
  CHECK(park(0) == 0);
  std::size_t bytes = 0;
  CHECK(parked(&bytes) == 1);
  CHECK(bytes >= 2 * words * 4);
  CHECK(bytes < before);                     // the idle 32 MiB were not copied
  CHECK(fakecuda_vmm_device_bytes(0) == 0);  // every page back to the device
  CHECK(fakecuda_vmm_is_mapped(a) == 0);     // the address is reserved, not mapped
  CHECK(fakecuda_kernel_mismatches() == 0);  // the queued kernel ran before the pages went
  CHECK(park(0) != 0);                       // once
  CHECK(why().find("already parked") != std::string::npos);
  // The launch restores first: same addresses, same bytes (the kernel checks every word).
  CHECK_OK(launch(a, words, 8));
  CHECK(parked(nullptr) == 0);
  CHECK(fakecuda_vmm_device_bytes(0) >= 2 * words * 4);
  CHECK_OK(launch(b, words, 1000));
  CHECK_OK(cuCtxSynchronize());
  CHECK(fakecuda_kernel_mismatches() == 0);
  CHECK(holds(a, words, 9));
  CHECK(holds(b, words, 1001));
  // A copy is a door too, and so is an allocation; unpark with nothing parked is fine.
  CHECK(park(0) == 0);
  CHECK(holds(a, words, 9));
  CHECK(park(0) == 0);
  CUdeviceptr c = 0;
  CHECK_OK(cuMemAlloc_v2(&c, kMiB));
  CHECK(parked(nullptr) == 0);
  CHECK(holds(b, words, 1001));
  CHECK(park(0) == 0);
  CHECK(unpark() == 0);
  CHECK(unpark() == 0);
  CHECK(holds(a, words, 9));
  // The counters.
  char json[8192];
  c_api<std::size_t (*)(int, char*, std::size_t)>("cudapool_memory_stats_json")(0, json, sizeof json);
  CHECK(std::strstr(json, "\"parks\": 4") != nullptr);
  CHECK(std::strstr(json, "\"unparks\": 4") != nullptr);
  CHECK(std::strstr(json, "\"parked_bytes\": 0") != nullptr);
  CHECK_OK(cuMemFree_v2(a));
  CHECK_OK(cuMemFree_v2(b));
  CHECK_OK(cuMemFree_v2(c));
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// Discard: the pages come back at the same address, contents not kept.
void scenario_discard() {
  start_primary(0);
  const std::size_t words = kMiB;
  CUdeviceptr a = 0;
  CHECK_OK(cuMemAlloc_v2(&a, words * 4));
  fill(a, words, 5);
  CHECK(park(1) == 0);
  CHECK(fakecuda_vmm_device_bytes(0) == 0);
  CHECK(unpark() == 0);
  CHECK(fakecuda_vmm_is_mapped(a) == 1);
  CHECK(!holds(a, words, 5));
  fill(a, words, 6);  // usable again
  CHECK(holds(a, words, 6));
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

// A thread launches over and over while another parks and unparks: every kernel sees its bytes.
void scenario_race() {
  start_primary(0);
  const char* e = std::getenv("PARK_APP_ROUNDS");
  const int rounds = e != nullptr ? std::atoi(e) : 2000;
  const std::size_t words = 16 * 1024;
  CUdeviceptr a = 0;
  CHECK_OK(cuMemAlloc_v2(&a, words * 4));
  fill(a, words, 0);
  CUcontext ctx = nullptr;
  CHECK_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  std::atomic<bool> stop{false};
  std::atomic<int> launched{0};
  std::thread launcher([&] {
    CHECK_OK(cuCtxSetCurrent(ctx));
    for (std::uint32_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
      CHECK_OK(launch(a, words, k));
      launched.fetch_add(1, std::memory_order_relaxed);
    }
  });
  int parks = 0;
  for (int i = 0; i < rounds; ++i) {
    if (park(0) == 0) ++parks;
    if (i % 2 == 0) CHECK(unpark() == 0);  // else the launcher restores
  }
  // Every launch is counted before the launcher looks at `stop` again: wait for enough of them.
  while (launched.load(std::memory_order_relaxed) < 2) std::this_thread::yield();
  stop.store(true);
  launcher.join();
  CHECK_OK(cuCtxSynchronize());
  CHECK(parks > 0);
  CHECK(fakecuda_kernel_mismatches() == 0);
  CHECK(holds(a, words, static_cast<std::uint32_t>(launched.load())));
  std::printf("parks %d of %d rounds, %d launches\n", parks, rounds, launched.load());
}

// The cases that must never be parked, each refused with its reason.
void scenario_refusals() {
  start_primary(0);
  // Nothing of the pool's yet.
  CHECK(park(0) != 0);
  // Classic segments only (expandable segments off in this run? no: nothing mapped yet).
  CUdeviceptr a = 0;
  CHECK_OK(cuMemAlloc_v2(&a, kMiB));
  // A graph capture in progress.
  CUstream s = nullptr;
  CHECK_OK(cuStreamCreate(&s, 0));
  CHECK_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK(park(0) != 0);
  CHECK(why().find("capture") != std::string::npos);
  CUgraph g = nullptr;
  CHECK_OK(cuStreamEndCapture(s, &g));
  CHECK(park(0) == 0);  // and parkable again once it ended
  CHECK(unpark() == 0);
  // A block exported over CUDA IPC.
  CUipcMemHandle h{};
  CHECK_OK(cuIpcGetMemHandle(&h, a));
  CHECK(park(0) != 0);
  CHECK(why().find("IPC") != std::string::npos);
  CHECK(fakecuda_vmm_device_bytes(0) > 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
}

void scenario_peer() {
  start_primary(0);
  CUdeviceptr a = 0;
  CHECK_OK(cuMemAlloc_v2(&a, kMiB));
  CUcontext peer = nullptr;
  CHECK_OK(cuDevicePrimaryCtxRetain(&peer, 1));
  CHECK_OK(cuCtxEnablePeerAccess(peer, 0));
  CHECK(park(0) != 0);
  CHECK(why().find("peer") != std::string::npos);
  CHECK(fakecuda_vmm_device_bytes(0) > 0);
}

// The pinned buffer of a restore is kept for the next park: a second park of the same memory pins
// nothing new; one that does not fit frees the spare and pins anew. The bytes survive each.
void scenario_spare() {
  start_primary(0);
  const std::size_t words = 4 * kMiB / 4;
  CUdeviceptr a = 0;
  CHECK_OK(cuMemAlloc_v2(&a, words * 4));
  fill(a, words, 11);
  const long pins0 = fakecuda_calls("cuMemHostAlloc"), unpins0 = fakecuda_calls("cuMemFreeHost");
  CHECK(park(0) == 0);
  CHECK(unpark() == 0);
  CHECK(fakecuda_calls("cuMemHostAlloc") == pins0 + 1);
  CHECK(fakecuda_calls("cuMemFreeHost") == unpins0);  // kept, not freed
  CHECK(holds(a, words, 11));
  CHECK(park(0) == 0);
  CHECK_OK(launch(a, words, 11));  // restores, then checks and bumps every word
  CHECK_OK(cuCtxSynchronize());
  CHECK(fakecuda_kernel_mismatches() == 0);
  CHECK(fakecuda_calls("cuMemHostAlloc") == pins0 + 1);  // the spare was reused
  CHECK(holds(a, words, 12));
  CUdeviceptr b = 0;  // more live memory than the spare holds
  CHECK_OK(cuMemAlloc_v2(&b, 64 * kMiB));
  fill(b, 64 * kMiB / 4, 5);
  CHECK(park(0) == 0);
  CHECK(fakecuda_calls("cuMemHostAlloc") == pins0 + 2);
  CHECK(fakecuda_calls("cuMemFreeHost") == unpins0 + 1);  // the small spare
  CHECK(unpark() == 0);
  CHECK(holds(a, words, 12));
  CHECK(holds(b, 64 * kMiB / 4, 5));
}

// Pool pages handed to a holder the shim cannot follow (a dma-buf of the range, or the allocation
// handle behind the address): parkable before, never after; each says why.
void scenario_handed_out(bool dmabuf) {
  start_primary(0);
  CUdeviceptr a = 0;
  CHECK_OK(cuMemAlloc_v2(&a, kMiB));
  CHECK(park(0) == 0);  // parkable so far; the export below restores first (it passes the door)
  if (dmabuf) {
    int fd = -1;
    CHECK_OK(cuMemGetHandleForAddressRange(&fd, a, kMiB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    CHECK(fd >= 0);
    close(fd);
  } else {
    unsigned long long h = 0;
    CHECK_OK(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(a)));
    CHECK(h != 0);
  }
  CHECK(parked(nullptr) == 0);
  CHECK(park(0) != 0);
  CHECK(why().find(dmabuf ? "dma-buf" : "allocation handle") != std::string::npos);
  CHECK(fakecuda_vmm_device_bytes(0) > 0);
  CHECK(fakecuda_vmm_bad_calls() == 0);
}
void scenario_dmabuf() { scenario_handed_out(true); }
void scenario_retain() { scenario_handed_out(false); }

// Classic segments only (expandable segments off): nothing can move.
void scenario_classic() {
  start_primary(0);
  CUdeviceptr a = 0;
  CHECK_OK(cuMemAlloc_v2(&a, kMiB));
  CHECK(park(0) != 0);
  CHECK(why().find("classic") != std::string::npos);
}

// The negative control: a launch that does not pass the shim (the driver's own cuLaunchKernel,
// looked up in libcuda.so.1 itself) against parked pages faults. Run by the test in a child that
// is expected to die of SIGSEGV: it shows that the test kernel really touches the memory, so a
// door the shim lacked would be seen.
void scenario_bypass() {
  start_primary(0);
  const std::size_t words = kMiB / 4;
  CUdeviceptr a = 0;
  CHECK_OK(cuMemAlloc_v2(&a, words * 4));
  fill(a, words, 3);
  CHECK(park(0) == 0);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(lib != nullptr);
  using Launch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void**, void**);
  // libc's own dlsym: the exported one is the shim's, which would hand out its wrapper.
  using Dlsym = void* (*)(void*, const char*);
  void* libc_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (libc_dlsym == nullptr) libc_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  CHECK(libc_dlsym != nullptr);
  auto real = reinterpret_cast<Launch>(reinterpret_cast<Dlsym>(libc_dlsym)(lib, "cuLaunchKernel"));
  CHECK(real != nullptr);
  CHECK(reinterpret_cast<void*>(real) != reinterpret_cast<void*>(&cuLaunchKernel));  // not the shim's
  std::uint32_t base = 3;
  std::size_t n = words;
  void* args[] = {&a, &n, &base};
  std::printf("launching past the shim\n");
  std::fflush(stdout);
  CHECK_OK(real(fakecuda_test_kernel(), 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  CHECK_OK(cuCtxSynchronize());  // waits for the kernel, which faults on the parked page
  std::printf("no fault\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scenario>\n", argv[0]);
    return 2;
  }
  const std::string s = argv[1];
  struct {
    const char* name;
    void (*fn)();
  } scenarios[] = {{"basic", scenario_basic},       {"discard", scenario_discard}, {"race", scenario_race},
                   {"refusals", scenario_refusals}, {"peer", scenario_peer},       {"classic", scenario_classic},
                   {"bypass", scenario_bypass},     {"dmabuf", scenario_dmabuf},   {"retain", scenario_retain},
                   {"spare", scenario_spare}};
  for (auto& sc : scenarios) {
    if (s == sc.name) {
      sc.fn();
      std::printf("PASS %s\n", sc.name);
      return 0;
    }
  }
  std::fprintf(stderr, "unknown scenario %s\n", argv[1]);
  return 2;
}
