// The allocation-latency harness (bench_harness.h) run over the host's malloc/free, so the
// selftest can check on a machine without a GPU that every measurement ends within its budget
// and prints a well-formed line.
#include <cstdlib>

#include "../bench_harness.h"

namespace {

class HostMalloc : public bench::Allocator {
 public:
  void* alloc(std::size_t n) override { return std::malloc(n); }
  void release(void* p) override { std::free(p); }
};

}  // namespace

int main() {
  bench::run_all(
      "host", "malloc", [] { return std::unique_ptr<bench::Allocator>(new HostMalloc); }, 0.05);
  return 0;
}
