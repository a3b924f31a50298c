// Parking on the real GPU (docs/design.md, "Parking"), under the shim (run.sh, check "park"):
//
//   park move GIB     GIB GiB of live blocks filled with a pattern, parked (cudapool_park) and
//                     restored twice: once by cudapool_unpark, once by the next kernel launch
//                     itself (the door). Every byte is checked after each restore; NVML must show
//                     the device's used memory fall by most of the parked bytes while parked. The
//                     times of the park and the restore per GiB are set against a pinned
//                     cudaMemcpy of 1 GiB each way in the same process (the bus's floor for a
//                     model switch).
//   park race ROUNDS  a thread launches kernels without pause, each checking that every word of a
//                     256 MiB block holds the count of the launches before it and adding one;
//                     the main thread parks the process ROUNDS times at random moments (restored
//                     by cudapool_unpark or by the launcher's next launch, alternately). A launch
//                     that slipped between the drain and the unmap, or a restore that lost or
//                     moved bytes, shows as a word that is off.
//
// Prints one line per check, "ROW|<check>|PASS or FAIL or INFO|<note>", for run.sh to turn into
// report rows, and "VALUE|<name>|<number>" lines; exit 1 when a check failed, 2 on a CUDA error or
// when the shim's C API is missing (not run under the shim).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Api {
  int (*park)(int) = nullptr;
  int (*unpark)() = nullptr;
  int (*parked)(size_t*) = nullptr;
  size_t (*why)(char*, size_t) = nullptr;
};

Api load_api() {
  Api a;
  a.park = reinterpret_cast<int (*)(int)>(dlsym(RTLD_DEFAULT, "cudapool_park"));
  a.unpark = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "cudapool_unpark"));
  a.parked = reinterpret_cast<int (*)(size_t*)>(dlsym(RTLD_DEFAULT, "cudapool_parked"));
  a.why = reinterpret_cast<size_t (*)(char*, size_t)>(dlsym(RTLD_DEFAULT, "cudapool_park_why"));
  return a;
}

std::string why(const Api& a) {
  char buf[512] = {0};
  a.why(buf, sizeof buf);
  return buf;
}

// The device's used memory from NVML (loaded at run time: no link dependency), or -1.
long long nvml_used(int index) {
  static void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (lib == nullptr) return -1;
  using Init = int (*)();
  using Handle = int (*)(unsigned, void**);
  struct Memory {
    unsigned long long total, free, used;
  };
  using Info = int (*)(void*, Memory*);
  static auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
  static auto handle = reinterpret_cast<Handle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  static auto info = reinterpret_cast<Info>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  static bool ok = init != nullptr && handle != nullptr && info != nullptr && init() == 0;
  void* h = nullptr;
  Memory m{};
  if (!ok || handle(static_cast<unsigned>(index), &h) != 0 || info(h, &m) != 0) return -1;
  return static_cast<long long>(m.used);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int failures = 0;
void row(const char* check, bool pass, const std::string& note) {
  std::printf("ROW|%s|%s|%s\n", check, pass ? "PASS" : "FAIL", note.c_str());
  failures += !pass;
}
void info_row(const char* check, const std::string& note) { std::printf("ROW|%s|INFO|%s\n", check, note.c_str()); }

constexpr std::uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;
constexpr std::uint64_t kBlock = 256 * kMiB;

// Bad bytes over every block, each against its own pattern.
unsigned long long count_bad(const std::vector<std::uint8_t*>& blocks, unsigned long long* d_counters) {
  CK(cudaMemset(d_counters, 0, 2 * sizeof(unsigned long long)));
  for (std::size_t b = 0; b < blocks.size(); ++b)
    check_pattern<<<1024, 256>>>(blocks[b], kBlock, static_cast<std::uint32_t>(b + 1), d_counters, d_counters + 1);
  CK(cudaGetLastError());
  unsigned long long h[2];
  CK(cudaMemcpy(h, d_counters, sizeof h, cudaMemcpyDeviceToHost));
  return h[0];
}

// Best of three 1 GiB pinned copies each way, in seconds.
void pinned_floor(double* d2h, double* h2d) {
  void* host = nullptr;
  void* dev = nullptr;
  CK(cudaHostAlloc(&host, kGiB, cudaHostAllocDefault));
  CK(cudaMalloc(&dev, kGiB));
  CK(cudaMemset(dev, 1, kGiB));
  CK(cudaDeviceSynchronize());
  *d2h = *h2d = 1e9;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    CK(cudaMemcpy(host, dev, kGiB, cudaMemcpyDeviceToHost));
    *d2h = std::min(*d2h, seconds_since(t0));
    t0 = Clock::now();
    CK(cudaMemcpy(dev, host, kGiB, cudaMemcpyHostToDevice));
    *h2d = std::min(*h2d, seconds_since(t0));
  }
  CK(cudaFree(dev));
  CK(cudaFreeHost(host));
}

int move(const Api& api, int gib) {
  int dev = 0;
  CK(cudaGetDevice(&dev));
  double floor_d2h = 0, floor_h2d = 0;
  pinned_floor(&floor_d2h, &floor_h2d);
  std::vector<std::uint8_t*> blocks(static_cast<std::size_t>(gib) * (kGiB / kBlock));
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    CK(cudaMalloc(reinterpret_cast<void**>(&blocks[b]), kBlock));
    fill_pattern<<<1024, 256>>>(blocks[b], kBlock, static_cast<std::uint32_t>(b + 1));
  }
  unsigned long long* counters = nullptr;
  CK(cudaMalloc(reinterpret_cast<void**>(&counters), 2 * sizeof(unsigned long long)));
  CK(cudaDeviceSynchronize());
  const unsigned long long bad0 = count_bad(blocks, counters);
  row("parking: the pattern before parking", bad0 == 0,
      std::to_string(bad0) + " bad bytes of " + std::to_string(gib) + " GiB");

  double best_park = 1e9, best_unpark = 1e9, best_door = 1e9;
  long long freed_min = -1;
  double moved_gib = 0;  // what the park moved: the blocks, and the pages they share with the counters
  for (int round = 0; round < 2; ++round) {
    const long long used_before = nvml_used(dev);
    auto t0 = Clock::now();
    if (api.park(0) != 0) {
      row("parking: cudapool_park", false, "refused: " + why(api));
      return 1;
    }
    best_park = std::min(best_park, seconds_since(t0));
    size_t parked_bytes = 0;
    const int is_parked = api.parked(&parked_bytes);
    const long long used_parked = nvml_used(dev);
    if (used_before >= 0 && used_parked >= 0) {
      const long long freed = used_before - used_parked;
      freed_min = freed_min < 0 ? freed : std::min(freed_min, freed);
    }
    if (is_parked != 1 || parked_bytes < blocks.size() * kBlock) {
      row("parking: cudapool_parked", false,
          "parked " + std::to_string(is_parked) + ", " + std::to_string(parked_bytes) + " bytes");
      return 1;
    }
    moved_gib = static_cast<double>(parked_bytes) / static_cast<double>(kGiB);
    t0 = Clock::now();
    if (round == 0) {
      if (api.unpark() != 0) {
        row("parking: cudapool_unpark", false, why(api));
        return 1;
      }
      best_unpark = std::min(best_unpark, seconds_since(t0));
    } else {
      // The door: the launch restores first, then runs (its own time is microseconds).
      check_pattern<<<1, 32>>>(blocks[0], 32, 1, counters, counters + 1);
      CK(cudaGetLastError());
      best_door = std::min(best_door, seconds_since(t0));
    }
    size_t left = 0;
    const bool resident = api.parked(&left) == 0;
    const unsigned long long bad = count_bad(blocks, counters);
    row(round == 0 ? "parking: every byte back after cudapool_unpark"
                   : "parking: every byte back after a launch restored it",
        resident && bad == 0,
        std::to_string(bad) + " bad bytes of " + std::to_string(gib) + " GiB" + (resident ? "" : "; still parked"));
  }
  row("parking: the device's memory is given back while parked (NVML)",
      freed_min >= static_cast<long long>(0.9 * static_cast<double>(blocks.size() * kBlock)),
      "used memory fell by " + std::to_string(freed_min / static_cast<long long>(kMiB)) + " MiB for " +
          std::to_string(blocks.size() * kBlock / kMiB) + " MiB parked");
  const double park_per_gib = best_park / moved_gib, unpark_per_gib = best_unpark / moved_gib,
               door_per_gib = best_door / moved_gib;
  char note[512];
  std::snprintf(note, sizeof note,
                "%.1f ms per GiB (%.2f GiB); a pinned 1 GiB cudaMemcpy to the host: %.1f ms; ratio %.2f",
                park_per_gib * 1e3, moved_gib, floor_d2h * 1e3, park_per_gib / floor_d2h);
  info_row("parking: park time per GiB", note);
  const double restore = std::min(unpark_per_gib, door_per_gib);
  std::snprintf(note, sizeof note,
                "%.1f ms per GiB by cudapool_unpark, %.1f by a launch; a pinned 1 GiB cudaMemcpy to the device: %.1f "
                "ms; "
                "ratio %.2f (at most 1.25)",
                unpark_per_gib * 1e3, door_per_gib * 1e3, floor_h2d * 1e3, restore / floor_h2d);
  row("parking: restore time per GiB against the bus", restore <= 1.25 * floor_h2d, note);
  std::printf("VALUE|park_ms_per_gib|%.2f\nVALUE|restore_ms_per_gib|%.2f\nVALUE|door_restore_ms_per_gib|%.2f\n",
              park_per_gib * 1e3, unpark_per_gib * 1e3, door_per_gib * 1e3);
  std::printf("VALUE|pinned_d2h_ms_per_gib|%.2f\nVALUE|pinned_h2d_ms_per_gib|%.2f\n", floor_d2h * 1e3, floor_h2d * 1e3);
  for (auto* p : blocks) CK(cudaFree(p));
  CK(cudaFree(counters));
  return 0;
}

// Each launch: every word must equal `expect` (the launches before it); then one is added.
__global__ void bump(std::uint32_t* p, std::uint64_t n, std::uint32_t expect, unsigned long long* bad) {
  unsigned long long my_bad = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    my_bad += p[i] != expect;
    p[i] = expect + 1;
  }
  if (my_bad != 0) atomicAdd(bad, my_bad);
}

int race(const Api& api, int rounds) {
  const std::uint64_t words = kBlock / sizeof(std::uint32_t);
  std::uint32_t* buf = nullptr;
  unsigned long long* bad = nullptr;
  CK(cudaMalloc(reinterpret_cast<void**>(&buf), kBlock));
  CK(cudaMalloc(reinterpret_cast<void**>(&bad), sizeof(unsigned long long)));
  CK(cudaMemset(buf, 0, kBlock));
  CK(cudaMemset(bad, 0, sizeof(unsigned long long)));
  CK(cudaDeviceSynchronize());
  std::atomic<bool> stop{false};
  std::atomic<std::uint32_t> launches{0};
  std::thread launcher([&] {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::uint32_t k = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      bump<<<264, 256, 0, s>>>(buf, words, k, bad);
      CK(cudaGetLastError());
      ++k;
      launches.store(k, std::memory_order_relaxed);
      if (k % 16 == 0) CK(cudaStreamSynchronize(s));
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
  });
  std::mt19937 rng(12345);
  int parked = 0, refused = 0, by_unpark = 0;
  std::string last_refusal;
  for (int r = 0; r < rounds; ++r) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    // The launcher may still be restoring the last park ("a park or restore is in progress"):
    // asked again for up to a second before the round counts as refused.
    int rc = api.park(0);
    for (int tries = 0; rc != 0 && why(api).find("in progress") != std::string::npos && tries < 1000; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      rc = api.park(0);
    }
    if (rc == 0) {
      ++parked;
      if (r % 2 == 0) {
        if (api.unpark() != 0) {
          row("parking race: cudapool_unpark", false, why(api));
          break;
        }
        ++by_unpark;
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));  // the launcher's next launch restores
      }
    } else {
      ++refused;
      last_refusal = why(api);
    }
  }
  stop.store(true);
  launcher.join();
  CK(cudaDeviceSynchronize());
  const std::uint32_t n = launches.load();
  // A last launch checks every word against the launch count.
  bump<<<264, 256>>>(buf, words, n, bad);
  unsigned long long h_bad = 0;
  CK(cudaMemcpy(&h_bad, bad, sizeof h_bad, cudaMemcpyDeviceToHost));
  std::string note = std::to_string(rounds) + " rounds: " + std::to_string(parked) + " parked (" +
                     std::to_string(by_unpark) + " restored by cudapool_unpark, the rest by a launch), " +
                     std::to_string(refused) + " refused" + (refused != 0 ? " (last: " + last_refusal + ")" : "") +
                     "; " + std::to_string(n) + " launches; " + std::to_string(h_bad) + " words off";
  row("parking race: launches from another thread while the process is parked and restored",
      h_bad == 0 && parked >= rounds / 2, note);
  CK(cudaFree(buf));
  CK(cudaFree(bad));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int n = argc > 2 ? std::atoi(argv[2]) : 0;
  if ((mode != "move" && mode != "race") || n <= 0) {
    std::fprintf(stderr, "usage: park move GIB | park race ROUNDS\n");
    return 2;
  }
  const Api api = load_api();
  if (api.park == nullptr || api.unpark == nullptr || api.parked == nullptr || api.why == nullptr) {
    std::printf("ROW|parking|FAIL|the shim's C API (cudapool_park) is not in this process: run under LD_PRELOAD\n");
    return 2;
  }
  CK(cudaFree(nullptr));
  const int rc = mode == "move" ? move(api, n) : race(api, n);
  return rc != 0 ? rc : failures != 0 ? 1 : 0;
}
