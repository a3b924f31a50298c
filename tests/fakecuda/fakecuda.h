// Control functions of the fake libcuda.so.1 (tests/fakecuda/fakecuda.cpp). Test programs call
// them to make GPU work "pending" on a stream and to count what reached the "driver".
#pragma once
#include <cstddef>
#include <cstdint>

#include "shim/cuda_abi.h"

extern "C" {
// Work on `s` is pending from now until fakecuda_release_stream(s) (or a cuEventSynchronize
// on an event that waits for it). s: a stream handle, 0/CU_STREAM_LEGACY = the legacy stream,
// CU_STREAM_PER_THREAD = the calling thread's per-thread stream.
void fakecuda_hold_stream(cudaabi::CUstream s);
void fakecuda_release_stream(cudaabi::CUstream s);

// Counters since load (this process).
long fakecuda_alloc_calls();  // successful cuMemAlloc*/cuMemAllocAsync* calls (any flavour)
long fakecuda_free_calls();   // successful cuMemFree/cuMemFreeAsync calls
long fakecuda_live_allocations();
std::size_t fakecuda_live_bytes();  // on the current context's device
long fakecuda_graph_allocs();       // cuMemAllocAsync calls on a capturing stream
long fakecuda_event_records();      // successful cuEventRecord calls
long fakecuda_event_syncs();        // cuEventSynchronize calls that had to wait
long fakecuda_event_queries();      // cuEventQuery calls
long fakecuda_stream_queries();     // cuStreamQuery calls
long fakecuda_stream_waits();       // successful cuStreamWaitEvent calls
long fakecuda_capture_waits();      // cuStreamWaitEvent calls that hit a capture (and broke it)
long fakecuda_ctx_records();        // successful cuCtxRecordEvent calls
long fakecuda_ctx_waits();          // successful cuCtxWaitEvent calls
// Per stream (handles as for fakecuda_hold_stream): successful cuEventRecord calls on it, and
// successful cuStreamWaitEvent calls that made it wait.
long fakecuda_records_on(cudaabi::CUstream s);
long fakecuda_waits_by(cudaabi::CUstream s);
// 1 if work issued now on `s` would run only after the work now pending on `held` (its own
// order, cuStreamWaitEvent waits, the legacy stream's implicit order); 0 if it could run before;
// -1 if nothing is pending on `held`. Handles as for fakecuda_hold_stream.
int fakecuda_would_wait(cudaabi::CUstream s, cudaabi::CUstream held);
long fakecuda_trim_calls();  // cuMemPoolTrimTo calls
// Driver entry points the CALLING THREAD made (context, alloc/free, capture query, event and
// pointer-attribute calls; not cuGetProcAddress): what a hook costs in driver calls.
long fakecuda_thread_driver_calls();
// Calls of one driver function by every thread since load, by its name without _v2/_ptsz
// ("cuEventRecord", "cuCtxGetCurrent", "cuMemMap", ...: FAKE_CALL_KINDS in fakecuda.cpp); -1 for a
// function not counted. FAKECUDA_CALL_COST_NS="cuEventRecord=250,cuMemMap=5000,..." makes each
// call of a named function spin for that many nanoseconds (unset: no cost).
long fakecuda_calls(const char* name);
long fakecuda_charged_ns(int nominal);  // time all threads spent in those spins (or asked for), since load
const char* fakecuda_call_name(int i);  // the counted functions' names, i = 0, 1, ...; then nullptr
// Destroys device `dev`'s primary context like cuDevicePrimaryCtxReset, but under a name the
// shim does not hook (a reset it cannot see).
void fakecuda_reset_primary_unseen(cudaabi::CUdevice dev);
// 1 if `p` lies in live memory of the fake driver: a cuMemAlloc allocation or a mapped page.
int fakecuda_is_live(cudaabi::CUdeviceptr p);
// Virtual memory management (expandable segments). Granularity: FAKECUDA_VMM_GRANULARITY_KB,
// default 4 MiB. Bad calls: misaligned sizes/addresses, maps outside a reservation or over a
// mapping, partial unmaps, set-access on unmapped memory, unknown handles.
std::size_t fakecuda_vmm_mapped_bytes();    // bytes currently mapped (all devices)
long fakecuda_vmm_live_handles();           // cuMemCreate handles not yet released
std::size_t fakecuda_vmm_handle_bytes();    // their sizes, summed
std::size_t fakecuda_vmm_reserved_bytes();  // address space reserved
long fakecuda_vmm_ranges();                 // live reservations
std::size_t fakecuda_vmm_granularity();
long fakecuda_vmm_bad_calls();
long fakecuda_vmm_map_calls();
long fakecuda_vmm_create_calls();  // successful cuMemCreate calls, ever
long fakecuda_vmm_unmap_calls();
long fakecuda_vmm_peer_descs();                  // access descriptors beyond the first, summed
long fakecuda_vmm_access_calls();                // cuMemSetAccess calls
std::size_t fakecuda_vmm_device_bytes(int dev);  // physical bytes of live handles on `dev`
// 1 when every byte of [p, p+bytes) is mapped with read/write access for device `dev`.
int fakecuda_vmm_access_ok(cudaabi::CUdeviceptr p, std::size_t bytes, int dev);
long fakecuda_peer_enables();  // successful cuCtxEnablePeerAccess calls
int fakecuda_vmm_is_mapped(cudaabi::CUdeviceptr p);
long fakecuda_ctx_syncs();  // cuCtxSynchronize calls
// CUDA IPC: legacy handles opened in this process that mapped memory (first opens of an
// allocation in a context), and imported allocations mapped now.
long fakecuda_ipc_opens();
long fakecuda_ipc_mapped();
// Page-locked host memory: successful cuMemHostAlloc/cuMemAllocHost calls, successful
// cuMemFreeHost calls, bytes allocated now, whether `p` lies in such an allocation, and
// cuMemHostRegister/Unregister calls.
long fakecuda_host_alloc_calls();
long fakecuda_host_free_calls();
std::size_t fakecuda_host_live_bytes();
int fakecuda_host_is_live(const void* p);
long fakecuda_host_register_calls();
long fakecuda_host_unregister_calls();
// cuMemHostAlloc(flags 0) under a name the shim does not hook (pinned memory it never saw made).
cudaabi::CUresult fakecuda_host_alloc_unseen(void** pp, std::size_t size);
// Creates a non-primary context on `dev` and makes it current (cuCtxCreate without its ABI).
cudaabi::CUresult fakecuda_create_context(cudaabi::CUcontext* ctx, int dev);
// The test kernel's handle for cuLaunchKernel (it reads and writes its arguments' memory on the
// fake's worker thread: fakecuda.cpp, "kernels and copies"), the words it found wrong so far, and
// the kernels it ran.
cudaabi::CUfunction fakecuda_test_kernel();
long fakecuda_kernel_mismatches();
long fakecuda_kernels_done();
}
