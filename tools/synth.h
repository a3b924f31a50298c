// Synthetic transformer workloads recorded by the real pool (the sample traces of tests/traces/).
//
// A workload runs through DevicePool on the replay tool's simulated device and the pool's own
// events are kept as trace rows, so a synthetic trace is exactly what the library would write
// for that allocation sequence: replaying it under the same policy gives back the recorded peak
// reserved. Sizes, orders and lifetimes follow what PyTorch does for a GPT-style model (weights,
// optimizer state, saved activations freed in reverse in backward, gradients freed by
// zero_grad(set_to_none=True), variable sequence lengths) and for LLM serving (KV caches grown
// by reallocation); the clock is simulated so the timeline looks like the workload, not like
// the generator's own speed.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "allocator/options.h"
#include "telemetry/trace.h"

namespace cudapool::tools {

struct SynthOptions {
  std::string pattern = "train";  // "train" or "serve"
  int steps = 6;
  int layers = 8;
  std::size_t hidden = 1024;
  unsigned seed = 1;
  std::size_t device_memory = std::size_t{16} << 30;
};

struct SynthResult {
  std::vector<TraceRow> rows;  // starts with the "device" row
  int failed_allocations = 0;
};

// false with *error for an unknown pattern.
bool synthesize_trace(const SynthOptions& options, const PoolOptions& pool, SynthResult* out, std::string* error);

}  // namespace cudapool::tools
