#include "shim/fences/gpu_ordering.h"

namespace cudapool::shim {

Fence* GpuOrdering::newest_running_wide(const FenceHandle* fences, std::size_t n) {
  Fence* wide = nullptr;
  for (std::size_t i = 0; i < n; ++i) {
    Fence* f = Fence::of(fences[i]);
    if (f->done || parts_.slab.stale(f) || !f->context_wide) continue;
    // Not asked: a wait on an event that has completed costs the GPU nothing, and a query finding
    // it complete costs the host ~10 times the wait (see free_now).
    if (parts_.seq.all_complete(f) || f->events_done) {
      f->done = true;
      continue;
    }
    if (wide == nullptr || f->seq > wide->seq) wide = f;
  }
  return wide;
}

bool GpuOrdering::classify(Fence* f, Pending* p) {
  if (f->done || parts_.slab.stale(f)) return true;
  if (f->deferred) {  // no capture is open now: it can be recorded (after the work it covers)
    parts_.recorder.record(f);
    f->deferred = false;
    if (f->context_wide) return parts_.wide.wait(f);  // recorded just now: ordered by a wait of its own
  }
  if (f->context_wide || (f->seq != 0 && f->seq <= p->ordered_seq)) return true;  // the wait covers it
  const bool covered = parts_.sweeps.covered(f->cover, 0);
  if (p->legacy_orders_all && covered && f->legacy_only() && !parts_.seq.legacy_complete(f)) {
    if (p->unjoined == nullptr || f->seq > p->unjoined->seq) p->unjoined = f;
    return true;
  }
  const bool events_done = parts_.seq.events_complete(f);
  if (!events_done) p->legacy_running = true;
  if (!covered) p->sweep_running = true;
  if (events_done && covered) f->done = true;
  return true;
}

bool GpuOrdering::order(const FenceHandle* fences, std::size_t n) {
  // Context-wide fences still running: one wait on the newest orders all later work after it,
  // and after every fence recorded before it.
  const Fence* wide = newest_running_wide(fences, n);
  if (wide != nullptr && !parts_.wide.wait(wide)) return false;
  Pending p;
  p.ordered_seq = wide != nullptr ? wide->seq : 0;
  // Only the legacy stream and the streams that follow it exist: a fence that is one event on
  // the legacy stream runs before anything issued from now on, on any of them.
  p.legacy_orders_all = !parts_.streams.any_non_blocking();
  for (std::size_t i = 0; i < n; ++i)
    if (!classify(Fence::of(fences[i]), &p)) return false;
  if (p.unjoined != nullptr && (unjoined_ == nullptr || p.unjoined->seq > unjoined_->seq)) unjoined_ = p.unjoined;
  if (!p.legacy_running && !p.sweep_running) return true;  // all complete or ordered: nothing to wait for
  return join(p);
}

bool GpuOrdering::join(const Pending& p) {
  // Join on the legacy stream: it waits for the sweep's events still running on the non-blocking
  // streams, and one event recorded after those waits covers everything.
  CUstream only = nullptr;  // the single non-blocking stream every running event is on, if any
  if (p.sweep_running && !parts_.sweeps.legacy_waits_for_running(&only)) return false;
  CUevent join = events_.take();
  if (join == nullptr) return false;
  if (!events_.record(join, CU_STREAM_LEGACY)) {
    events_.put(join);
    return false;
  }
  for (CUstream s : parts_.streams.non_blocking_streams()) {
    if (!p.legacy_running && s == only) continue;  // all it would wait for ran on it
    calls_.add(FenceCall::stream_wait);
    if (d_.cuStreamWaitEvent(s, join, 0) != CUDA_SUCCESS) {
      events_.put(join);  // waits already made only add order; the memory stays pending
      return false;
    }
  }
  // The new join covers every older one (it was recorded on the legacy stream after them).
  events_.put(joins_.begin(), joins_.end());
  joins_.assign(1, join);
  return true;
}

bool GpuOrdering::free_now() const noexcept {
  // Legacy-stream fences only: no driver call at all.
  if (!parts_.streams.any_non_blocking() && !parts_.seq.context_wide_running()) return true;
  // Context-wide fences: one cuCtxWaitEvent on the newest, without asking it first. Its record
  // costs ~0.16 us and the wait ~0.13 us, but a query that finds it complete ~1.3 us while the
  // GPU runs behind the host (measured on an H100, tests/gpu/fence_costs.cpp): asking each fence
  // once cost ResNet-50 inference under PyTorch more than all its other pool calls.
  return parts_.wide.usable();
}

void GpuOrdering::prune_joins() {
  std::size_t kept = 0;
  for (CUevent e : joins_) {
    if (!events_.completed(e))
      joins_[kept++] = e;
    else
      events_.put(e);
  }
  joins_.resize(kept);
}

void GpuOrdering::stream_added(CUstream s) {
  // Memory handed out under a GPU-side wait that may still be running: the new stream must not
  // run ahead of it either. (Called in the creating thread, whose current context is the pool's.)
  if (d_.cuStreamWaitEvent == nullptr) return;
  prune_joins();
  for (CUevent e : joins_) d_.cuStreamWaitEvent(s, e, 0);
  if (unjoined_ != nullptr && !unjoined_->done) d_.cuStreamWaitEvent(s, unjoined_->events.front(), 0);
}

void GpuOrdering::released(Fence* f, bool stale) {
  if (f != unjoined_) return;
  unjoined_ = nullptr;
  // Memory was reused after it without a join: streams created from now on must still wait for
  // its event unless it is known complete, so the event becomes a join instead of being reused.
  if (!stale && !f->done) {
    joins_.push_back(f->events.front());
    f->events.erase(f->events.begin());
  }
}

void GpuOrdering::reset() noexcept {
  unjoined_ = nullptr;
  joins_.clear();
}

}  // namespace cudapool::shim
