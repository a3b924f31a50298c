// libFuzzer target: the CUDAPOOL_CONF grammar on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  cudapool::fuzz::check(cudapool::parse_conf(text, cudapool::Policy{}));
  return 0;
}
