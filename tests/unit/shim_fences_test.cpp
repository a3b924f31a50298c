// The fence layer's parts (shim/fences/cuda_fences.h and the files it names) in the test process, on the
// fake libcuda.so.1 loaded by its path (the driver table takes that copy, as in
// shim_driver_test.cpp). A stream the fake holds keeps the events recorded behind it running
// until it is released; the fake counts every driver call by function.
#include <dlfcn.h>

#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "allocator/pool.h"
#include "shim/fences/cuda_fences.h"
#include "shim/fences/streams.h"

// The parts, like the shim, never destroy driver objects from destructors (no CUDA at exit), so
// the events and streams they made stay with the fake driver when a test ends. Under
// AddressSanitizer that is a leak inside the fake's module, not of the code under test: LeakSanitizer
// is told to pass over what the fake libcuda.so.1 allocated.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcuda.so.1\n"; }

namespace cudapool::shim {
namespace {

// The fake driver and its test controls.
struct Fake {
  void* lib = nullptr;
  const RealDriver* d = nullptr;
  CUcontext ctx = nullptr;

  template <class Fn>
  Fn fn(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(lib, name));
  }
  long calls(const char* name) const { return fn<long (*)(const char*)>("fakecuda_calls")(name); }
  void hold(CUstream s) const { fn<void (*)(CUstream)>("fakecuda_hold_stream")(s); }
  void release(CUstream s) const { fn<void (*)(CUstream)>("fakecuda_release_stream")(s); }
  // 1: work issued on s from now on waits for the held stream's pending work.
  int would_wait(CUstream s, CUstream held) const {
    return fn<int (*)(CUstream, CUstream)>("fakecuda_would_wait")(s, held);
  }
  CUresult set_current(CUcontext c) const { return fn<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(c); }
  CUstream stream(unsigned flags) const {
    CUstream s = nullptr;
    EXPECT_EQ(d->cuStreamCreate(&s, flags), CUDA_SUCCESS);
    return s;
  }
};

const Fake& fake() {
  static const Fake f = [] {
    Fake x;
    x.lib = dlopen(CUDAPOOL_FAKECUDA_DIR "/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (x.lib == nullptr) return x;
    x.fn<CUresult (*)(unsigned)>("cuInit")(0);
    x.d = real_driver();
    if (x.d != nullptr) x.d->cuDevicePrimaryCtxRetain(&x.ctx, 0);
    return x;
  }();
  return f;
}

// The pool's clock, held still (the sweep gap and the newest fence's recheck read it).
std::int64_t g_now = 1'000'000'000;
std::int64_t still_clock() { return g_now; }

class FenceParts : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(fake().d, nullptr) << "the fake libcuda.so.1 could not be loaded";
    d_ = fake().d;
    ASSERT_EQ(fake().set_current(fake().ctx), CUDA_SUCCESS);
    set_pool_clock_for_testing(&still_clock);
  }
  void TearDown() override { set_pool_clock_for_testing(nullptr); }
  const RealDriver* d_ = nullptr;
  FenceCalls calls_;
};

// ---- recycled events ---------------------------------------------------------------------------

TEST_F(FenceParts, EventPoolRecyclesItsEvents) {
  EventPool events(*d_, calls_);
  const long created = fake().calls("cuEventCreate");
  CUevent a = events.take();
  ASSERT_NE(a, nullptr);
  events.put(a);
  EXPECT_EQ(events.take(), a);  // the same event again, not a new one
  EXPECT_EQ(fake().calls("cuEventCreate"), created + 1);
  events.put(a);
  events.forget();  // its context is gone: never reused
  CUevent b = events.take();
  EXPECT_EQ(fake().calls("cuEventCreate"), created + 2);
  events.put(b);
}

TEST_F(FenceParts, EventPoolAnswersWhetherTheWorkBehindAnEventIsDone) {
  EventPool events(*d_, calls_);
  CUstream s = fake().stream(CU_STREAM_NON_BLOCKING);
  fake().hold(s);
  CUevent e = events.record_new(s);
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(events.completed(e));
  fake().release(s);
  EXPECT_TRUE(events.completed(e));
  EXPECT_EQ(calls_.get(FenceCall::event_record), 1);
  EXPECT_EQ(calls_.get(FenceCall::event_query), 2);
  events.put(e);
  d_->cuStreamDestroy(s);
}

// ---- the context made current ------------------------------------------------------------------

TEST_F(FenceParts, ContextIsMadeCurrentUnlessTheHookVerifiedIt) {
  FenceContext context(*d_, fake().ctx, calls_);
  ASSERT_EQ(fake().set_current(nullptr), CUDA_SUCCESS);
  CUcontext inside = nullptr;
  context.run([&] { d_->cuCtxGetCurrent(&inside); });
  EXPECT_EQ(inside, fake().ctx);
  EXPECT_EQ(calls_.get(FenceCall::context_switch), 1);
  ASSERT_EQ(fake().set_current(fake().ctx), CUDA_SUCCESS);
  {
    const FenceContext::Guard known(fake().ctx);
    EXPECT_TRUE(context.known_current());
    {
      const FenceContext::Guard other(nullptr);  // nests
      EXPECT_FALSE(context.known_current());
    }
    context.run([] {});
  }
  EXPECT_FALSE(context.known_current());
  EXPECT_EQ(calls_.get(FenceCall::context_switch), 1);  // no switch under the guard
}

// ---- the context's streams and the per-thread cache --------------------------------------------

TEST_F(FenceParts, StreamCacheForgetsWhatWasForgotten) {
  FenceStreams streams;
  auto* a = reinterpret_cast<CUstream>(std::uintptr_t{0x1000});
  auto* b = reinterpret_cast<CUstream>(std::uintptr_t{0x2000});
  streams.add(a, false);
  streams.add(b, true);
  EXPECT_FALSE(streams.known_here(a));  // not asked yet on this thread
  EXPECT_TRUE(streams.knows_locked(a));
  EXPECT_TRUE(streams.known_here(a));
  bool other_thread = true;
  std::thread([&] { other_thread = streams.known_here(a); }).join();
  EXPECT_FALSE(other_thread);  // each thread its own answer
  EXPECT_TRUE(streams.non_blocking(b));
  EXPECT_FALSE(streams.non_blocking(a));
  EXPECT_TRUE(streams.forget(b));
  EXPECT_FALSE(streams.forget(b));
  EXPECT_FALSE(streams.known_here(a));   // stale after a forget
  EXPECT_TRUE(streams.non_blocking(b));  // until dropped: it may still be swept
  streams.drop_non_blocking(b);
  EXPECT_FALSE(streams.any_non_blocking());
  streams.clear();
  EXPECT_FALSE(streams.knows_locked(a));
}

// ---- the order of device fences ----------------------------------------------------------------

struct LegacyFence {
  Fence f;
  LegacyFence(EventPool& events, FenceSequence& seq) {
    f.device = true;
    f.events.push_back(events.record_new(CU_STREAM_LEGACY));
    f.on.push_back(CU_STREAM_LEGACY);
    seq.recorded(&f);
  }
};

TEST_F(FenceParts, SequenceAnswersOlderFencesFromTheNewest) {
  EventPool events(*d_, calls_);
  FenceSequence seq(events);
  fake().hold(CU_STREAM_LEGACY);
  LegacyFence a(events, seq), b(events, seq), c(events, seq);
  EXPECT_LT(a.f.seq, b.f.seq);
  EXPECT_FALSE(seq.events_complete(&a.f));  // the newest asked for it, then a itself: 2 queries
  EXPECT_EQ(calls_.get(FenceCall::event_query), 2);
  EXPECT_FALSE(seq.events_complete(&b.f));  // the newest found running just now: b alone
  EXPECT_EQ(calls_.get(FenceCall::event_query), 3);
  fake().release(CU_STREAM_LEGACY);
  g_now += 1'000'000;                      // past the recheck
  EXPECT_TRUE(seq.events_complete(&a.f));  // the newest completed: a and b with it
  EXPECT_EQ(calls_.get(FenceCall::event_query), 4);
  EXPECT_TRUE(seq.known_complete(&b.f));
  EXPECT_TRUE(seq.events_complete(&b.f));
  EXPECT_EQ(calls_.get(FenceCall::event_query), 4);
  EXPECT_FALSE(seq.context_wide_running());
  for (LegacyFence* x : {&a, &b, &c}) events.put(x->f.events.begin(), x->f.events.end());
}

// ---- context-wide fences -----------------------------------------------------------------------

TEST_F(FenceParts, ContextWideFenceIsOneContextEvent) {
  EventPool events(*d_, calls_);
  ContextWideFences wide(*d_, fake().ctx, events, calls_);
  ASSERT_TRUE(wide.usable()) << "the fake driver has cuCtxRecordEvent";
  Fence f;
  f.device = true;
  ASSERT_TRUE(wide.record(&f));
  EXPECT_TRUE(f.context_wide);
  ASSERT_EQ(f.on.size(), 1u);
  EXPECT_EQ(f.on.front(), nullptr);  // no stream: the whole context
  EXPECT_TRUE(wide.wait(&f));
  EXPECT_EQ(calls_.get(FenceCall::context_record), 1);
  EXPECT_EQ(calls_.get(FenceCall::context_wait), 1);
  EXPECT_EQ(calls_.get(FenceCall::event_record), 0);
  events.put(f.events.begin(), f.events.end());
}

// ---- sweeps of the non-blocking streams --------------------------------------------------------

TEST_F(FenceParts, SweepGathersTheNonBlockingStreams) {
  EventPool events(*d_, calls_);
  FenceContext context(*d_, fake().ctx, calls_);
  FenceStreams streams;
  FenceSweeps sweeps(*d_, context, events, streams, calls_);
  EXPECT_EQ(sweeps.cover_for_new(), 0u);  // no non-blocking stream: nothing to sweep
  CUstream s1 = fake().stream(CU_STREAM_NON_BLOCKING), s2 = fake().stream(CU_STREAM_NON_BLOCKING);
  streams.add(s1, true);
  streams.add(s2, true);
  const std::uint64_t cover = sweeps.cover_for_new();
  EXPECT_EQ(cover, 1u);
  EXPECT_TRUE(sweeps.wanted());
  fake().hold(s2);
  EXPECT_FALSE(sweeps.covered(cover, FenceSweeps::kSweepGapNs));  // begun (the first), s2 still runs
  EXPECT_EQ(calls_.get(FenceCall::sweeps), 1);
  EXPECT_EQ(calls_.get(FenceCall::stream_wait), 2);  // the gather stream waits for each stream
  EXPECT_FALSE(sweeps.covered(cover, FenceSweeps::kSweepGapNs));
  EXPECT_EQ(calls_.get(FenceCall::sweeps), 1);  // the one in flight covers it: not begun again
  fake().release(s2);
  EXPECT_TRUE(sweeps.covered(cover, FenceSweeps::kSweepGapNs));
  // A later fence: within the gap no sweep is begun for it, an urgent ask begins one.
  const std::uint64_t later = sweeps.cover_for_new();
  EXPECT_EQ(later, 2u);
  EXPECT_FALSE(sweeps.covered(later, FenceSweeps::kSweepGapNs));
  EXPECT_EQ(calls_.get(FenceCall::sweeps), 1);
  EXPECT_TRUE(sweeps.covered(later, 0));
  EXPECT_EQ(calls_.get(FenceCall::sweeps), 2);
  d_->cuStreamDestroy(s1);
  d_->cuStreamDestroy(s2);
}

TEST_F(FenceParts, SweepWaitIsAHostWaitOnTheGatheredWork) {
  EventPool events(*d_, calls_);
  FenceContext context(*d_, fake().ctx, calls_);
  FenceStreams streams;
  FenceSweeps sweeps(*d_, context, events, streams, calls_);
  CUstream s = fake().stream(CU_STREAM_NON_BLOCKING);
  streams.add(s, true);
  fake().hold(s);
  const std::uint64_t cover = sweeps.cover_for_new();
  sweeps.wait_for(cover);  // the fake finishes held work on a host wait
  EXPECT_EQ(calls_.get(FenceCall::event_sync), 1);
  EXPECT_TRUE(sweeps.covered(cover, FenceSweeps::kSweepGapNs));
  d_->cuStreamDestroy(s);
}

// ---- recording and capture deferral ------------------------------------------------------------

struct Layer {
  FenceCalls calls;
  EventPool events;
  FenceContext context;
  FenceStreams streams;
  FenceSequence seq;
  ContextWideFences wide;
  FenceSweeps sweeps;
  FenceRecorder recorder;
  explicit Layer(const RealDriver& d)
      : events(d, calls),
        context(d, fake().ctx, calls),
        seq(events),
        wide(d, fake().ctx, events, calls),
        sweeps(d, context, events, streams, calls),
        recorder(context, events, wide, seq, sweeps, streams) {}
};

TEST_F(FenceParts, RecorderPicksTheLegacyEventOrTheContextWideOne) {
  Layer l(*d_);
  Fence legacy;
  legacy.device = true;
  l.recorder.take(&legacy);  // no non-blocking stream: one legacy event, no sweep needed
  EXPECT_TRUE(legacy.legacy_only());
  EXPECT_EQ(legacy.cover, 0u);
  EXPECT_EQ(l.calls.get(FenceCall::context_record), 0);
  CUstream s = fake().stream(CU_STREAM_NON_BLOCKING);
  l.streams.add(s, true);
  Fence wide;
  wide.device = true;
  l.recorder.take(&wide);  // a non-blocking stream: one context-wide event replaces the sweep
  EXPECT_TRUE(wide.context_wide);
  EXPECT_GT(wide.seq, legacy.seq);
  EXPECT_EQ(l.calls.get(FenceCall::context_record), 1);
  Fence on_stream;
  on_stream.stream = reinterpret_cast<StreamId>(s);
  l.recorder.take(&on_stream);
  ASSERT_EQ(on_stream.on.size(), 1u);
  EXPECT_EQ(on_stream.on.front(), s);
  for (Fence* f : {&legacy, &wide, &on_stream}) l.events.put(f->events.begin(), f->events.end());
  d_->cuStreamDestroy(s);
}

TEST_F(FenceParts, FenceTakenDuringACaptureIsRecordedAfterIt) {
  Layer l(*d_);
  const StreamId capturing = 0x7000;
  capture_began(capturing, CU_STREAM_CAPTURE_MODE_RELAXED);
  Fence f;
  f.device = true;
  l.recorder.take(&f);
  EXPECT_TRUE(f.deferred);
  EXPECT_TRUE(f.events.empty());
  EXPECT_FALSE(l.recorder.settle(&f));  // still open: stays deferred
  capture_ended(capturing);
  EXPECT_TRUE(l.recorder.settle(&f));
  EXPECT_FALSE(f.deferred);
  EXPECT_TRUE(f.legacy_only());
  l.events.put(f.events.begin(), f.events.end());
}

// ---- GPU-side ordering -------------------------------------------------------------------------

TEST_F(FenceParts, OrderingByTheLegacyStreamAloneReachesStreamsMadeLater) {
  Layer l(*d_);
  FenceSlab slab;
  GpuOrdering ordering(*d_, l.events, l.calls, {slab, l.recorder, l.seq, l.sweeps, l.wide, l.streams});
  fake().hold(CU_STREAM_LEGACY);
  Fence* f = slab.make();
  f->device = true;
  l.recorder.take(f);
  const long records = l.calls.get(FenceCall::event_record);
  const FenceHandle h = f->handle();
  EXPECT_TRUE(ordering.free_now());
  EXPECT_TRUE(ordering.order(&h, 1));  // every stream follows the legacy stream: no driver call
  EXPECT_EQ(l.calls.get(FenceCall::event_record), records);
  EXPECT_EQ(l.calls.get(FenceCall::stream_wait), 0);
  CUstream s = fake().stream(CU_STREAM_NON_BLOCKING);
  l.streams.add(s, true);
  ordering.stream_added(s);  // a stream made now must not run ahead of the fence
  EXPECT_EQ(fake().would_wait(s, CU_STREAM_LEGACY), 1);
  fake().release(CU_STREAM_LEGACY);
  ordering.released(f, false);
  l.events.put(f->events.begin(), f->events.end());
  slab.recycle(f);
  d_->cuStreamDestroy(s);
}

TEST_F(FenceParts, OrderingJoinsRunningFencesForTheNonBlockingStreams) {
  Layer l(*d_);
  FenceSlab slab;
  GpuOrdering ordering(*d_, l.events, l.calls, {slab, l.recorder, l.seq, l.sweeps, l.wide, l.streams});
  Fence* f = slab.make();
  f->device = true;
  f->stream = 0;
  fake().hold(CU_STREAM_LEGACY);
  l.recorder.take(f);  // a legacy event: no non-blocking stream yet
  CUstream s = fake().stream(CU_STREAM_NON_BLOCKING);
  l.streams.add(s, true);
  EXPECT_EQ(fake().would_wait(s, CU_STREAM_LEGACY), 0);
  const FenceHandle h = f->handle();
  EXPECT_TRUE(ordering.order(&h, 1));  // joined on the legacy stream, which s now waits for
  EXPECT_EQ(fake().would_wait(s, CU_STREAM_LEGACY), 1);
  EXPECT_GE(l.calls.get(FenceCall::stream_wait), 1);
  fake().release(CU_STREAM_LEGACY);
  ordering.released(f, false);
  l.events.put(f->events.begin(), f->events.end());
  slab.recycle(f);
  d_->cuStreamDestroy(s);
}

// ---- the facade --------------------------------------------------------------------------------

TEST_F(FenceParts, FencesCompleteOnlyAfterTheirWork) {
  CudaFences fences(*d_, fake().ctx);
  fake().hold(CU_STREAM_LEGACY);
  const FenceHandle h = fences.record_device();
  EXPECT_FALSE(fences.query(h));
  EXPECT_TRUE(fences.can_wait(h));
  fake().release(CU_STREAM_LEGACY);
  g_now += 1'000'000;
  EXPECT_TRUE(fences.query(h));
  fences.release(h);
  fake().hold(CU_STREAM_LEGACY);
  const FenceHandle g = fences.record_device();
  fences.abandon();  // the context is gone: its fences count as complete
  EXPECT_TRUE(fences.query(g));
  fences.release(g);
  fake().release(CU_STREAM_LEGACY);
  EXPECT_GE(fences.call_counts().event_record, 2);
}

}  // namespace
}  // namespace cudapool::shim
