// What the driver calls behind the shim's fences cost the host on this machine, without the shim:
// the numbers that decide how a fence covers the program's non-blocking streams (shim/fences/cuda_fences.cpp).
// PyTorch creates its pool of non-blocking streams early and most of them never run anything, so
// what matters is the cost per call against an IDLE stream, next to the legacy stream's.
//
// With K idle non-blocking streams (16 by default: `fence_costs [K]`), per call, in µs (the
// median of 9 runs of 2000 calls, the GPU idle):
//   ctx_get           cuCtxGetCurrent (the floor: a thread-local read)
//   stream_query      cuStreamQuery on an idle non-blocking stream
//   legacy_query      cuStreamQuery on the legacy stream
//   record_nb         cuEventRecord on an idle non-blocking stream
//   record_legacy     cuEventRecord on the legacy stream
//   event_query_done  cuEventQuery of an event that has completed
//   wait_nb           cuStreamWaitEvent of an idle non-blocking stream on a completed event
//   sweep_query       one sweep as the shim makes it: cuStreamQuery of each of the K streams
//   sweep_record      the same streams covered by events: a record on each, then (after a
//                     context synchronize, not timed) a query of each
//   sweep_gather      one sweep as the shim makes it: an event on each of the K streams, a
//                     stream of its own waiting for each, one event there
//   ctx_record        cuCtxRecordEvent: one event for all the context's work, every stream
//   ctx_wait          cuCtxWaitEvent of a completed event: all later work waits for it
//   busy_*            some of the same while the legacy stream has a queue of work (below)
//   busy_*_enqueue    a call followed by a small memset on the legacy stream (the work that
//                     follows a fence: does the call make the next enqueue dearer?)
// Then what the context-wide calls promise, checked with one non-blocking stream kept busy
// (`fence_costs streams=K probe=X ok=0|1`): ctx_event_covers_nb (an event recorded for the
// context is not complete while that stream runs), ctx_wait_orders_nb and
// ctx_wait_orders_new_stream (after cuCtxWaitEvent on it, an event recorded on another idle
// stream, or on one created afterwards, is not complete either).
// Output: `fence_costs streams=K op=X us_per_call=T`, one line each. Nothing here is compared:
// run.sh prints the figures.
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "driver_check.h"

namespace {

// Median over 9 runs of `f` called `n` times: µs per call.
template <class F>
double per_call(int n, F f) {
  std::vector<double> runs;
  for (int r = 0; r < 9; ++r) {
    const double t0 = now_us();
    for (int i = 0; i < n; ++i) f(i);
    runs.push_back((now_us() - t0) / n);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int k = argc > 1 ? std::atoi(argv[1]) : 16;
  if (k < 1 || k > 256) {
    std::fprintf(stderr, "usage: fence_costs [STREAMS 1..256]\n");
    return 2;
  }
  CUdevice dev;
  use_primary_context(&dev);
  std::vector<CUstream> nb(static_cast<std::size_t>(k));
  for (CUstream& s : nb) CKD(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<CUevent> ev(static_cast<std::size_t>(k));
  for (CUevent& e : ev) CKD(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUevent done;
  CKD(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  CKD(cuEventRecord(done, CU_STREAM_LEGACY));
  CKD(cuCtxSynchronize());
  const int n = 2000;
  auto report = [&](const char* op, double us) {
    std::printf("fence_costs streams=%d op=%s us_per_call=%.3f\n", k, op, us);
  };
  auto at = [&](int i) { return static_cast<std::size_t>(i % k); };

  report("ctx_get", per_call(n, [&](int) {
           CUcontext c;
           CKD(cuCtxGetCurrent(&c));
         }));
  report("stream_query", per_call(n, [&](int i) { CKD(cuStreamQuery(nb[at(i)])); }));
  report("legacy_query", per_call(n, [&](int) { CKD(cuStreamQuery(CU_STREAM_LEGACY)); }));
  report("record_nb", per_call(n, [&](int i) { CKD(cuEventRecord(ev[at(i)], nb[at(i)])); }));
  CKD(cuCtxSynchronize());
  report("record_legacy", per_call(n, [&](int i) { CKD(cuEventRecord(ev[at(i)], CU_STREAM_LEGACY)); }));
  CKD(cuCtxSynchronize());
  report("event_query_done", per_call(n, [&](int) { CKD(cuEventQuery(done)); }));
  report("wait_nb", per_call(n, [&](int i) { CKD(cuStreamWaitEvent(nb[at(i)], done, 0)); }));
  CKD(cuCtxSynchronize());
  report("sweep_query", per_call(n / 10, [&](int) {
           for (CUstream s : nb) CKD(cuStreamQuery(s));
         }));
  // Records on every stream, then (after they completed: the GPU is idle) one query of each.
  double rec = 0, qry = 0;
  const int sweeps = n / 10;
  std::vector<double> per_sweep;
  for (int r = 0; r < 9; ++r) {
    rec = qry = 0;
    for (int i = 0; i < sweeps; ++i) {
      const double t0 = now_us();
      for (std::size_t j = 0; j < nb.size(); ++j) CKD(cuEventRecord(ev[j], nb[j]));
      const double t1 = now_us();
      CKD(cuCtxSynchronize());  // not timed: a sweep's events are asked later, once they ran
      const double t1b = now_us();
      for (CUevent e : ev) CKD(cuEventQuery(e));
      const double t2 = now_us() - (t1b - t1);
      rec += t1 - t0;
      qry += t2 - t1;
    }
    per_sweep.push_back((rec + qry) / sweeps);
  }
  std::sort(per_sweep.begin(), per_sweep.end());
  report("sweep_record", per_sweep[per_sweep.size() / 2]);
  CKD(cuCtxSynchronize());

  // The same while the legacy stream has work queued, as in a program whose host runs ahead of
  // its GPU: five 256 MiB memsets, then 300 small ones (a queue of short kernels), enqueued (not
  // timed) before each window of calls; "busy_left" says in how many windows the legacy stream
  // was still busy when the calls had been made.
  CUdeviceptr buf;
  const std::size_t big = 256u << 20;
  CKD(cuMemAlloc(&buf, big));
  auto load = [&] {
    for (int i = 0; i < 5; ++i) CKD(cuMemsetD32Async(buf, static_cast<unsigned>(i), big / 4, CU_STREAM_LEGACY));
    for (int i = 0; i < 300; ++i) CKD(cuMemsetD32Async(buf, static_cast<unsigned>(i), 1024, CU_STREAM_LEGACY));
  };
  auto busy = [&](const char* op, int calls, auto f) {
    std::vector<double> runs;
    int left = 0;
    for (int r = 0; r < 9; ++r) {
      load();
      const double t0 = now_us();
      for (int i = 0; i < calls; ++i) f(i);
      runs.push_back((now_us() - t0) / calls);
      left += cuStreamQuery(CU_STREAM_LEGACY) == CUDA_ERROR_NOT_READY;
      CKD(cuCtxSynchronize());
    }
    std::sort(runs.begin(), runs.end());
    std::printf("fence_costs streams=%d op=%s us_per_call=%.3f busy_left=%d/9\n", k, op, runs[runs.size() / 2], left);
  };
  CUevent pending;
  CKD(cuEventCreate(&pending, CU_EVENT_DISABLE_TIMING));
  busy("busy_stream_query", 64, [&](int i) { CKD(cuStreamQuery(nb[at(i)])); });
  busy("busy_sweep_query", 8, [&](int) {
    for (CUstream s : nb) CKD(cuStreamQuery(s));
  });
  // A sweep as the shim makes it: an event on each stream, the gather stream waiting for each,
  // one event there (the query of that event, once complete, is busy_event_query_done).
  CUstream gather;
  CKD(cuStreamCreate(&gather, CU_STREAM_NON_BLOCKING));
  auto gather_sweep = [&] {
    for (CUstream s : nb) {
      CKD(cuEventRecord(ev[0], s));
      CKD(cuStreamWaitEvent(gather, ev[0], 0));
    }
    CKD(cuEventRecord(ev[1], gather));
  };
  report("sweep_gather", per_call(n / 10, [&](int) { gather_sweep(); }));
  CKD(cuCtxSynchronize());
  busy("busy_sweep_gather", 8, [&](int) { gather_sweep(); });
  busy("busy_wait_nb", 64, [&](int i) { CKD(cuStreamWaitEvent(gather, ev[at(i)], 0)); });
  busy("busy_record_nb", 64, [&](int i) { CKD(cuEventRecord(ev[at(i)], nb[at(i)])); });
  busy("busy_record_legacy", 64, [&](int i) { CKD(cuEventRecord(ev[at(i)], CU_STREAM_LEGACY)); });
  busy("busy_event_query_pending", 64, [&](int i) {
    if (i == 0) CKD(cuEventRecord(pending, CU_STREAM_LEGACY));
    const CUresult q = cuEventQuery(pending);
    if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) CKD(q);
  });
  busy("busy_event_query_done", 64, [&](int) { CKD(cuEventQuery(done)); });
  CUcontext ctx;
  CKD(cuCtxGetCurrent(&ctx));
  report("ctx_record", per_call(n, [&](int i) { CKD(cuCtxRecordEvent(ctx, ev[at(i)])); }));
  CKD(cuCtxSynchronize());
  report("ctx_wait", per_call(n, [&](int) { CKD(cuCtxWaitEvent(ctx, done)); }));
  CKD(cuCtxSynchronize());
  busy("busy_ctx_record", 64, [&](int i) { CKD(cuCtxRecordEvent(ctx, ev[at(i)])); });
  busy("busy_ctx_wait", 64, [&](int) { CKD(cuCtxWaitEvent(ctx, done)); });
  // What the work issued next costs to enqueue after each kind of fence call (a small memset on
  // the legacy stream, where a kernel launch would follow): the calls' effect on the launch path,
  // which their own costs above do not show. Per group of calls, with work queued.
  auto enqueue = [&](int i) { CKD(cuMemsetD32Async(buf, static_cast<unsigned>(i), 1024, CU_STREAM_LEGACY)); };
  busy("busy_enqueue", 64, [&](int i) { enqueue(i); });
  busy("busy_record_legacy_enqueue", 64, [&](int i) {
    CKD(cuEventRecord(ev[at(i)], CU_STREAM_LEGACY));
    enqueue(i);
  });
  busy("busy_ctx_record_enqueue", 64, [&](int i) {
    CKD(cuCtxRecordEvent(ctx, ev[at(i)]));
    enqueue(i);
  });
  busy("busy_ctx_wait_done_enqueue", 64, [&](int i) {
    CKD(cuCtxWaitEvent(ctx, done));
    enqueue(i);
  });
  // A fence ordered as soon as it is recorded (the default's early reuse): the record, a wait on
  // that still-pending event, then the next work.
  busy("busy_ctx_record_wait_enqueue", 64, [&](int i) {
    CKD(cuCtxRecordEvent(ctx, ev[at(i)]));
    CKD(cuCtxWaitEvent(ctx, ev[at(i)]));
    enqueue(i);
  });
  // The promises, with nb[0] busy for milliseconds and the legacy stream idle.
  auto probe = [&](const char* what, bool ok) { std::printf("fence_costs streams=%d probe=%s ok=%d\n", k, what, ok); };
  auto keep_busy = [&] {
    for (int i = 0; i < 40; ++i) CKD(cuMemsetD32Async(buf, static_cast<unsigned>(i), big / 4, nb[0]));
  };
  CUevent ce, later;
  CKD(cuEventCreate(&ce, CU_EVENT_DISABLE_TIMING));
  CKD(cuEventCreate(&later, CU_EVENT_DISABLE_TIMING));
  keep_busy();
  CKD(cuCtxRecordEvent(ctx, ce));
  const bool covers = cuEventQuery(ce) == CUDA_ERROR_NOT_READY && cuStreamQuery(nb[0]) == CUDA_ERROR_NOT_READY;
  CKD(cuCtxSynchronize());
  probe("ctx_event_covers_nb", covers);
  // After cuCtxWaitEvent on a context-wide event taken while nb[0] runs, an event recorded on
  // stream `s` is not complete while nb[0] still runs.
  auto wait_orders = [&](CUstream s) {
    keep_busy();
    CKD(cuCtxRecordEvent(ctx, ce));
    CKD(cuCtxWaitEvent(ctx, ce));
    if (s == nullptr) CKD(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));  // a stream made after the wait
    CKD(cuEventRecord(later, s));
    const bool ok = cuEventQuery(later) == CUDA_ERROR_NOT_READY && cuStreamQuery(nb[0]) == CUDA_ERROR_NOT_READY;
    CKD(cuCtxSynchronize());
    return std::make_pair(ok, s);
  };
  probe("ctx_wait_orders_nb", wait_orders(nb[1]).first);
  const auto [orders_new, fresh] = wait_orders(nullptr);
  probe("ctx_wait_orders_new_stream", orders_new);
  CKD(cuStreamDestroy(fresh));
  CKD(cuEventDestroy(later));
  CKD(cuEventDestroy(ce));
  busy("busy_ctx_get", 64, [&](int) {
    CUcontext c;
    CKD(cuCtxGetCurrent(&c));
  });
  CKD(cuEventDestroy(pending));
  CKD(cuStreamDestroy(gather));
  CKD(cuMemFree(buf));
  for (CUevent e : ev) CKD(cuEventDestroy(e));
  CKD(cuEventDestroy(done));
  for (CUstream s : nb) CKD(cuStreamDestroy(s));
  CKD(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
