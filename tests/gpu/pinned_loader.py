#!/usr/bin/env python3
"""Pinned host memory of a data-loading loop: pinned bytes held against live, time per batch.

Batches of changing size (--min-batch..--max-batch images of 3x224x224 float32, a new size each
step) are staged in pinned host memory, copied to the GPU with non_blocking=True on a side
stream, and consumed by a small kernel; --inflight batches are in flight at once (the loader's
prefetch). Two ways of getting the pinned memory:

  --mode torch   a DataLoader with pin_memory=True: PyTorch's own caching host allocator
                 (the baseline; held = torch.cuda.host_memory_stats()["allocated_bytes.current"]:
                 PyTorch's HostStats count the pinned blocks it owns, in use and cached, under
                 allocated_bytes; active_bytes is the part handed out)
  --mode raw     cudaHostAlloc / cudaFreeHost per batch through the CUDA runtime, as programs
                 without a host cache do (under the shim with pinned_cache:True: the pinned
                 pool, held = cudapool_get_host_stats(); without it: the driver, every call)

Prints one JSON line: mode, steps, median and mean ms per batch (after --warmup), peak live
pinned bytes, peak held pinned bytes, their ratio, and, under the shim, the pool's hits.
tests/gpu/pinned_loader.sh runs the modes and compares them.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch

IMAGE = 3 * 224 * 224 * 4


def cudart():
    # The runtime PyTorch itself loaded (so the shim sees the same library's calls).
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
    sys.exit("pinned_loader: no libcudart found")


def shim_stats():
    try:
        lib = ctypes.CDLL(None)
        fn = lib.cudapool_get_host_stats
    except (OSError, AttributeError):
        return None

    class Stats(ctypes.Structure):
        _fields_ = [(n, ctypes.c_int64) for n in (
            "requested_bytes", "requested_bytes_peak", "allocated_bytes", "allocated_bytes_peak", "reserved_bytes",
            "reserved_bytes_peak", "cached_bytes", "blocks", "cache_hits", "cache_misses", "fence_skips",
            "num_host_alloc", "num_host_free", "bad_frees")]

    s = Stats()
    return s if fn(ctypes.byref(s)) == 0 else None


def sizes(args):
    g = torch.Generator().manual_seed(args.seed)
    return [int(torch.randint(args.min_batch, args.max_batch + 1, (1,), generator=g)) for _ in range(args.steps)]


class Images(torch.utils.data.Dataset):
    def __init__(self, batch_sizes):
        self.batch_sizes = batch_sizes

    def __len__(self):
        return len(self.batch_sizes)

    def __getitem__(self, i):
        return torch.full((self.batch_sizes[i], 3, 224, 224), float(i % 7))


def consume(x):
    return (x * 2.0).sum()


def torch_pinned_held():
    """Bytes of pinned memory PyTorch's host allocator holds now (blocks in use and cached).

    PyTorch's host statistics name them allocated_bytes (its HostStats: "bytes allocated by this
    allocator, free and in-use blocks"); there is no reserved_bytes or segment key for the host
    allocator, so a missing key is an error here rather than a silent 0.
    """
    st = torch.cuda.host_memory_stats()
    if "allocated_bytes.current" not in st:
        raise SystemExit("pinned_loader: torch.cuda.host_memory_stats() has no allocated_bytes.current "
                         f"(PyTorch {torch.__version__}; keys: {sorted(st)[:8]}...)")
    return int(st["allocated_bytes.current"])


def run_torch(args, batch_sizes, side):
    loader = torch.utils.data.DataLoader(Images(batch_sizes), batch_size=None, pin_memory=True,
                                         num_workers=args.workers, prefetch_factor=args.inflight if args.workers else None)
    times, live_peak, held_peak, acc = [], 0, 0, torch.zeros((), device="cuda")
    inflight = []
    t = time.perf_counter()
    for i, batch in enumerate(loader):
        with torch.cuda.stream(side):
            dev = batch.to("cuda", non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        acc += consume(dev)
        inflight.append(batch)
        if len(inflight) > args.inflight:
            inflight.pop(0)
        live_peak = max(live_peak, sum(b.numel() * 4 for b in inflight))
        held_peak = max(held_peak, torch_pinned_held())
        torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - t)
        t = now
    return times, live_peak, held_peak, None


def run_raw(args, batch_sizes, side):
    rt = cudart()
    rt.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    rt.cudaFreeHost.argtypes = [ctypes.c_void_p]
    times, live_peak, held_peak, acc = [], 0, 0, torch.zeros((), device="cuda")
    inflight = []  # (pointer, bytes, host tensor)
    t = time.perf_counter()
    for i, n in enumerate(batch_sizes):
        nbytes = n * IMAGE
        p = ctypes.c_void_p()
        if rt.cudaHostAlloc(ctypes.byref(p), nbytes, 0) != 0:
            sys.exit(f"pinned_loader: cudaHostAlloc({nbytes}) failed")
        buf = (ctypes.c_float * (nbytes // 4)).from_address(p.value)
        host = torch.frombuffer(buf, dtype=torch.float32).view(n, 3, 224, 224)
        host.fill_(float(i % 7))
        with torch.cuda.stream(side):
            dev = host.to("cuda", non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        acc += consume(dev)
        inflight.append((p, nbytes, host))
        live_peak = max(live_peak, sum(b for _, b, _ in inflight))
        if len(inflight) > args.inflight:
            old, _, _ = inflight.pop(0)
            rt.cudaFreeHost(old)  # the copy may still run: cudaFreeHost's own wait, or the pool's fence
        s = shim_stats()
        held_peak = max(held_peak, s.reserved_bytes if s else sum(b for _, b, _ in inflight))
        torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - t)
        t = now
    for p, _, _ in inflight:
        rt.cudaFreeHost(p)
    return times, live_peak, held_peak, shim_stats()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["torch", "raw"], required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--min-batch", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.cuda.init()
    side = torch.cuda.Stream()
    batch_sizes = sizes(args)
    times, live, held, st = (run_torch if args.mode == "torch" else run_raw)(args, batch_sizes, side)
    steady = times[args.warmup:] or times
    out = {
        "mode": args.mode,
        "shim": "libcudapool" in os.environ.get("LD_PRELOAD", ""),
        "conf": os.environ.get("CUDAPOOL_CONF", ""),
        "steps": len(times),
        "median_ms": 1000 * statistics.median(steady),
        "mean_ms": 1000 * statistics.fmean(steady),
        "live_peak_bytes": live,
        "held_peak_bytes": held,
        "held_over_live": held / live if live else 0.0,
    }
    if st is not None:
        out.update(pool_hits=st.cache_hits, pool_misses=st.cache_misses, pool_fence_skips=st.fence_skips,
                   pool_driver_allocs=st.num_host_alloc, pool_driver_frees=st.num_host_free,
                   pool_reserved_peak=st.reserved_bytes_peak)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
