// libFuzzer target: the CUDAPOOL_CONF grammar on arbitrary bytes, and the same bytes as an
// untrusted policy (a trace's policy row): what pool_shaping_conf keeps parses and sets no key
// whose reach is beyond the pool.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/keys.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const cudapool::PolicyResult r = cudapool::parse_conf(text, cudapool::Policy{});
  cudapool::fuzz::check(r);
  const cudapool::UntrustedConf u = cudapool::pool_shaping_conf(text, "a trace");
  if (u.error.empty() != r.policy.has_value()) cudapool::fuzz::fail("untrusted and plain parsing disagree", u.error);
  if (!u.error.empty()) return 0;
  const cudapool::PolicyResult kept = cudapool::parse_conf(u.conf, cudapool::Policy{});
  if (!kept.policy) cudapool::fuzz::fail("the kept untrusted policy does not parse", u.conf);
  for (const cudapool::config::KeySpec& k : cudapool::config::keys())
    if (k.reach != cudapool::config::Reach::pool && k.format != nullptr && !k.is_default(*kept.policy))
      cudapool::fuzz::fail("an untrusted policy kept a key beyond the pool", u.conf);
  return 0;
}
