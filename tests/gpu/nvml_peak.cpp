// nvml_peak OUT.json -- COMMAND [ARGS...]
// Runs COMMAND and samples NVML's used device memory for every GPU about every 0.2 ms until it
// exits; writes the baseline (before the start), the peak and peak - baseline per device, and
// exits with COMMAND's status. NVML counts what the driver has really mapped for the process
// (context, caches, pool segments), which is what "peak device memory" means for a user.
// NVML is loaded with dlopen, so this builds with any C++ compiler and no CUDA headers.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string_view>
#include <thread>
#include <vector>

namespace {

struct NvmlMemory {
  unsigned long long total, free, used;
};
using Init = int (*)();
using Count = int (*)(unsigned*);
using Handle = int (*)(unsigned, void**);
using MemInfo = int (*)(void*, NvmlMemory*);

volatile pid_t g_child = 0;
// A timeout aimed at this wrapper must stop the measured command, and the peak is still written.
void forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || std::string_view(argv[2]) != "--") {
    std::fprintf(stderr, "usage: %s OUT.json -- COMMAND [ARGS...]\n", argv[0]);
    return 64;
  }
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  Init init = lib ? reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2")) : nullptr;
  Count count = lib ? reinterpret_cast<Count>(dlsym(lib, "nvmlDeviceGetCount_v2")) : nullptr;
  Handle handle = lib ? reinterpret_cast<Handle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2")) : nullptr;
  MemInfo info = lib ? reinterpret_cast<MemInfo>(dlsym(lib, "nvmlDeviceGetMemoryInfo")) : nullptr;
  std::vector<void*> devs;
  unsigned n = 0;
  if (init && count && handle && info && init() == 0 && count(&n) == 0)
    for (unsigned i = 0; i < n; ++i) {
      void* h = nullptr;
      if (handle(i, &h) == 0) devs.push_back(h);
    }
  if (devs.empty()) std::fprintf(stderr, "nvml_peak: NVML unavailable, no peak recorded\n");

  auto used = [&](std::size_t i) {
    NvmlMemory m{};
    return info(devs[i], &m) == 0 ? m.used : 0ull;
  };
  std::vector<unsigned long long> base(devs.size()), peak(devs.size());
  for (std::size_t i = 0; i < devs.size(); ++i) base[i] = peak[i] = used(i);

  signal(SIGTERM, forward);
  signal(SIGINT, forward);
  const pid_t child = fork();
  g_child = child;
  if (child == 0) {
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    execvp(argv[3], argv + 3);
    std::perror("nvml_peak: exec");
    _exit(127);
  }
  int status = 0;
  for (;;) {
    for (std::size_t i = 0; i < devs.size(); ++i) peak[i] = std::max(peak[i], used(i));
    const pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child || r < 0) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (FILE* f = std::fopen(argv[1], "w")) {
    std::fprintf(f, "{\"devices\": [");
    for (std::size_t i = 0; i < devs.size(); ++i)
      std::fprintf(f, "%s{\"baseline\": %llu, \"peak\": %llu, \"peak_delta\": %llu}", i ? ", " : "", base[i], peak[i],
                   peak[i] - base[i]);
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
