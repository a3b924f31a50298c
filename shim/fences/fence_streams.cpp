#include "shim/fences/fence_streams.h"

#include <algorithm>

namespace cudapool::shim {

namespace {
// The last stream this thread found known, in which registry, as of which version.
struct KnownStream {
  const FenceStreams* streams = nullptr;
  CUstream stream = nullptr;
  unsigned version = 0;
};
thread_local KnownStream tl_known_stream;
}  // namespace

void FenceStreams::add(CUstream s, bool non_blocking) {
  all_.push_back(s);
  if (non_blocking) non_blocking_.push_back(s);
}

bool FenceStreams::forget(CUstream s) {
  auto it = std::find(all_.begin(), all_.end(), s);
  if (it == all_.end()) return false;
  all_.erase(it);
  version_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

bool FenceStreams::non_blocking(CUstream s) const {
  return std::find(non_blocking_.begin(), non_blocking_.end(), s) != non_blocking_.end();
}

void FenceStreams::drop_non_blocking(CUstream s) {
  auto it = std::find(non_blocking_.begin(), non_blocking_.end(), s);
  if (it != non_blocking_.end()) non_blocking_.erase(it);
}

bool FenceStreams::known_here(CUstream s) const noexcept {
  const unsigned v = version_.load(std::memory_order_acquire);
  const KnownStream& k = tl_known_stream;
  return k.streams == this && k.stream == s && k.version == v;
}

bool FenceStreams::knows_locked(CUstream s) {
  const bool known = std::find(all_.begin(), all_.end(), s) != all_.end();
  if (known) tl_known_stream = {this, s, version_.load(std::memory_order_relaxed)};
  return known;
}

void FenceStreams::clear() {
  version_.fetch_add(1, std::memory_order_acq_rel);
  all_.clear();
  non_blocking_.clear();
}

}  // namespace cudapool::shim
