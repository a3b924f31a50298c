#include "shim/fences/fence_record.h"

namespace cudapool::shim {

FenceSlab::~FenceSlab() {
  for (Fence* f : free_) delete f;
}

Fence* FenceSlab::make() {
  Fence* f;
  if (!free_.empty()) {
    f = free_.back();
    free_.pop_back();
  } else {
    f = new Fence;
  }
  f->events.clear();
  f->on.clear();
  f->deferred = f->done = f->events_done = f->context_wide = false;
  f->generation = generation_;
  f->seq = 0;
  f->cover = 0;
  return f;
}

}  // namespace cudapool::shim
