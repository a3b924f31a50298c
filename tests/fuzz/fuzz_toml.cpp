// libFuzzer target: the TOML policy file on arbitrary bytes. The first byte picks how a profile
// is chosen (none / by name / by match with two candidates), the rest is the file.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/toml_loader.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const std::string path = "fuzz.toml";
  const std::uint8_t mode = data[0] % 3;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string_view profile = mode == 1 ? "train" : "";
  const std::string_view cmd = mode == 2 ? "python train.py eval.py" : "python train.py";
  cudapool::Policy p;
  cudapool::PolicyResult r;
  r.error = cudapool::config::apply_toml(text, path, profile, cmd, p);
  if (r.error.empty()) r.policy = std::move(p);
  cudapool::fuzz::check(r);
  return 0;
}
