/* cudapool's C API, exported by libcudapool.so. A program that wants to look at the pool
 * declares these itself or includes this header, and resolves them with dlsym(RTLD_DEFAULT, …)
 * so that it still runs without the shim preloaded. All functions are thread-safe and never
 * start CUDA: before the first CUDA allocation they report an empty pool. */
#ifndef CUDAPOOL_H
#define CUDAPOOL_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDAPOOL_API_VERSION 4

/* A few headline counters of one device's pool (PyTorch memory_stats names in comments). */
struct cudapool_stats {
  int device;
  int64_t allocated_bytes;      /* allocated_bytes.all.current */
  int64_t allocated_bytes_peak; /* allocated_bytes.all.peak */
  int64_t reserved_bytes;       /* reserved_bytes.all.current */
  int64_t reserved_bytes_peak;  /* reserved_bytes.all.peak */
  int64_t allocations;          /* allocation.all.current */
  int64_t segments;             /* segment.all.current */
  int64_t cache_hits;
  int64_t cache_misses;
  int64_t pending_bytes; /* freed, waiting for a fence */
  int64_t num_device_alloc;
  int64_t num_device_free;
  int64_t num_ooms;
  int64_t bad_frees;
};

/* CUDAPOOL_API_VERSION of the loaded library. */
int cudapool_api_version(void);
/* 1 when allocations go through the pool, 0 when the shim passes everything through (policy
 * backend:passthrough, CUDAPOOL_ON_ERROR=passthrough) or CUDA has not been used yet. */
int cudapool_active(void);
/* Sums the pools of `device` (several contexts on one device add up) into *out.
 * Returns 0, or -1 when no pool of that device exists yet. */
int cudapool_get_stats(int device, struct cudapool_stats* out);
/* Every counter of the pools of `device` (summed over its contexts) as one JSON object, keyed
 * by torch.cuda.memory_stats()'s names ("allocated_bytes.all.current", "num_ooms", …, then
 * cudapool's own: cache_hits, fence_waits, …; docs/trace-format.md lists them), values integers.
 * "{}" when no pool of that device exists yet. Writes at most `size` bytes including the NUL;
 * returns the full length without it (snprintf-style). Since API version 2. */
size_t cudapool_memory_stats_json(int device, char* buf, size_t size);
/* Pass-through decisions so far of one kind: "backend", "foreign_pointer", "capture",
 * "no_context", "exiting". -1 for an unknown kind. */
int64_t cudapool_passthrough_count(const char* kind);
/* Every pool's segments and blocks as JSON text (the fields of PyTorch's memory snapshot), and
 * once the library has started, "allocator_settings": the policy under the names PyTorch's
 * snapshot gives it (PYTORCH_CUDA_ALLOC_CONF, max_split_size, ...). Writes at most `size` bytes
 * including the terminating NUL; returns the full length without the NUL (snprintf-style: call
 * with size 0 to learn it). */
size_t cudapool_snapshot_json(char* buf, size_t size);
/* Waits for pending frees and releases every fully free segment of every pool. Returns the
 * bytes given back to the driver. */
size_t cudapool_empty_cache(void);
/* PyTorch's pluggable allocator (since API version 3):
 *   torch.cuda.memory.CUDAPluggableAllocator("libcudapool.so", "cudapool_torch_alloc", "cudapool_torch_free")
 * (the Python module's cudapool.torch.use() does this, and turns a failed allocation into
 * torch.OutOfMemoryError). The pool serves `size` bytes for `stream` of `device` (which must be
 * the current context's device) as a stream-ordered allocation; the free makes the block
 * reusable at once on `stream`, by other streams once an event on `stream` has completed. NULL
 * for size <= 0 and when the pool cannot serve it (cudapool_last_oom_message() says why). On a
 * capturing stream, under backend:passthrough or without a current context the driver's
 * cuMemAllocAsync serves it (and cuMemFreeAsync frees it). A pointer of the pool may also be
 * freed with cudaFree (and memory from cudaMalloc under the preloaded library with
 * cudapool_torch_free): one pool serves both. */
void* cudapool_torch_alloc(ssize_t size, int device, void* stream);
void cudapool_torch_free(void* ptr, ssize_t size, int device, void* stream);
/* Tensor.record_stream(stream) of the pool's block at `ptr` (PyTorch's
 * CUDAPluggableAllocator::set_record_stream_fn; cudapool.torch.use() wires it): the block is used
 * on `stream` too, so cudapool_torch_free of it takes cudapool_torch_free_device's fenced path
 * rather than being reused at once on its own stream. A pointer not of the pool is ignored. */
void cudapool_torch_record_stream(void* ptr, void* stream);
/* The same free with cudaFree's meaning (reused only behind a device-wide fence, per free_sync),
 * for blocks used on other streams than their own: those recorded with
 * cudapool_torch_record_stream, or every block where record_stream cannot be passed on. */
void cudapool_torch_free_device(void* ptr, ssize_t size, int device, void* stream);
/* The calling thread's last out-of-memory diagnosis (else the process's; "" when none): the
 * requested size, the device's capacity and free memory, what the pool reserved, allocated and
 * holds freed, and its cap. snprintf-style like cudapool_snapshot_json. Since API version 3. */
size_t cudapool_last_oom_message(char* buf, size_t size);
/* The file this library was loaded from. snprintf-style. Since API version 3. */
size_t cudapool_library_path(char* buf, size_t size);
/* The driver's device count, or -1 when CUDA is not initialised in this process (never
 * initialises it). Since API version 3. */
int cudapool_device_count(void);
/* Resets the peak counters (the *.peak values) of `device`'s pools to their current values.
 * 0, or -1 when no pool of that device exists yet. Since API version 3. */
int cudapool_reset_peak_stats(int device);
/* `device`'s free and total memory as cuMemGetInfo reports them to the program: the pool's cached
 * bytes count as free, and a cap (max_reserved_mb, per_process_memory_fraction) is the total
 * (the group budget aside). 0, or -1 when no pool of that device exists yet. Since API version 3. */
int cudapool_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes);
/* Parking (since API version 4): the process's device memory given back while it idles and
 * restored, at the same addresses, before its next call that can make the GPU touch memory
 * (a launch, a copy, a set, an allocation; docs/design.md, "Parking"). Only pages of expandable
 * segments move; classic segments, the context and memory the program maps itself stay.
 * cudapool_park: waits for the calls in flight, drains the devices, gives idle cached pages back,
 * copies the live pages' bytes to host memory (with `discard` non-zero they are dropped instead:
 * the pages come back zeroed or with any contents, as a KV cache the program rebuilds) and
 * releases them. Returns 0 when parked, -1 when not (refused or failed; the process is left as it
 * was: cudapool_park_why says why, e.g. a block exported over CUDA IPC, peer access, a graph
 * capture in progress, no expandable-segment memory). Never from inside a CUDA callback.
 * cudapool_unpark: restores now (the next GPU call would anyway). 0 when nothing is parked
 * afterwards, -1 when the memory could not be had back (cudapool_park_why).
 * cudapool_parked: 1 while parked, else 0; *parked_bytes (when not NULL): the bytes given back.
 * cudapool_park_why: the calling thread's last reason from cudapool_park / cudapool_unpark ("" when
 * none), snprintf-style like cudapool_snapshot_json. */
int cudapool_park(int discard);
int cudapool_unpark(void);
int cudapool_parked(size_t* parked_bytes);
size_t cudapool_park_why(char* buf, size_t size);
/* Changes the log level ("trace" "debug" "info" "warn" "error" "critical" "off").
 * Returns 0, or -1 for an unknown name. */
int cudapool_set_log_level(const char* level);

/* The pinned host pool (policy pinned_cache): cudaHostAlloc / cudaMallocHost memory. */
struct cudapool_host_stats {
  int64_t requested_bytes; /* what the program asked for, of its live blocks */
  int64_t requested_bytes_peak;
  int64_t allocated_bytes; /* the live blocks' sizes */
  int64_t allocated_bytes_peak;
  int64_t reserved_bytes; /* all pinned memory held: live, cached, reserve */
  int64_t reserved_bytes_peak;
  int64_t cached_bytes; /* freed blocks kept for reuse */
  int64_t blocks;       /* live blocks */
  int64_t cache_hits;
  int64_t cache_misses;
  int64_t fence_skips; /* cached blocks passed over while the device could still use them */
  int64_t num_host_alloc;
  int64_t num_host_free;
  int64_t bad_frees;
};
/* Fills *out; returns 0, or -1 before the pinned pool's first allocation (or when it is off).
 * Absent from libraries older than the pinned pool: resolve it with dlsym. */
int cudapool_get_host_stats(struct cudapool_host_stats* out);
/* Waits for the device to finish with every cached pinned block and gives them back (the
 * reserve segment stays). Returns the bytes given back. */
size_t cudapool_host_empty_cache(void);

/* For tests: the pool's clock becomes `clock` (monotonic nanoseconds), or the library's own again
 * for NULL. It times only heuristics, never what is safe: when a batch of frees gets its fence,
 * how often a running fence is asked again. A test program drives it so that its checks do not
 * depend on how fast the machine is. Install it before the first CUDA allocation, with readings
 * no earlier than the library's own clock (CLOCK_MONOTONIC): a reading behind an earlier one
 * counts as no time passed. */
void cudapool_set_clock_for_testing(int64_t (*clock)(void));

#ifdef __cplusplus
}
#endif
#endif /* CUDAPOOL_H */
