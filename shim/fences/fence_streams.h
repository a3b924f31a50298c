// The streams created through the hooks in one context, as the fence layer needs them: every
// one (cuMemFreeAsync asks whether a stream is this context's), and the non-blocking ones, which
// the legacy stream does not cover (sweeps and GPU-side waits must reach them). Changed under the
// fences' lock; known_here() answers a repeated question on a thread without it (16 threads
// freeing on their own streams must not meet on one context's mutex).
#pragma once
#include <atomic>
#include <vector>

#include "shim/driver.h"

namespace cudapool::shim {

class FenceStreams {
 public:
  void add(CUstream s, bool non_blocking);
  // Forgets `s` as a stream of the context (false: it was never one); a non-blocking one stays
  // listed as such until drop_non_blocking (it may still have to be swept).
  bool forget(CUstream s);
  bool non_blocking(CUstream s) const;
  void drop_non_blocking(CUstream s);
  const std::vector<CUstream>& non_blocking_streams() const noexcept { return non_blocking_; }
  bool any_non_blocking() const noexcept { return !non_blocking_.empty(); }
  // This thread found `s` known lately and nothing was forgotten since (no lock needed).
  bool known_here(CUstream s) const noexcept;
  // Under the lock: whether `s` is known, remembered for this thread when it is.
  bool knows_locked(CUstream s);
  // The context is gone: every stream with it.
  void clear();

 private:
  std::vector<CUstream> all_;
  std::vector<CUstream> non_blocking_;
  // Bumped whenever a stream is forgotten: per-thread answers made before it are stale.
  std::atomic<unsigned> version_{0};
};

}  // namespace cudapool::shim
