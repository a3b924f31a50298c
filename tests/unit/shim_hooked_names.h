// The exported names of shim/entry_points.def (the hooked entry points), in its order, for the tests
// that check what the library exports and what its start report lists.
#pragma once
#include <string>
#include <vector>

namespace cudapool::test {

inline std::vector<std::string> hooked_names() {
  return {
#define CUDAPOOL_INTERPOSED(abi) #abi,
#define CUDAPOOL_HOOK(base, min_version, max_version, flavour, abi, params) #abi,
#include "shim/entry_points.def"
  };
}

}  // namespace cudapool::test
