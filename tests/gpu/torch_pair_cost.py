#!/usr/bin/env python3
"""What one tensor's allocation and free cost on the host, through whatever allocator the
environment selects (PyTorch's caching allocator, its expandable segments, or
PYTORCH_NO_CUDA_MEMORY_CACHING=1 with or without the shim): the path every tensor of a training
step takes, Python's own overhead included (the same in every mode, so differences between modes
are the allocators'). Two patterns per size: `tight` (allocate, free, repeat) and `burst` (64
tensors of sizes around it live at once, then freed in reverse). Prints one JSON object:
{"mode": ..., "rows": [{"pattern", "bytes", "ns_per_pair"}...]}, the median of ROUNDS rounds.
   python3 tests/gpu/torch_pair_cost.py MODE [--rounds 5] [--out FILE]
"""
import argparse
import json
import statistics
import time

import torch

SIZES = [512, 64 << 10, 1 << 20, 16 << 20, 128 << 20]


def tight(n, iters):
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        del x
    return (time.perf_counter_ns() - t0) / iters


def burst(n, iters):
    sizes = [max(512, n * (k % 7 + 1) // 4) for k in range(64)]  # 0.25x-1.75x of n
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        live = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
        while live:
            live.pop()
    return (time.perf_counter_ns() - t0) / (iters * len(sizes))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.cuda.init()
    torch.empty(1, device="cuda")  # context and allocator set up outside the timing
    rows = []
    for n in SIZES:
        for name, fn, iters in (("tight", tight, 4000), ("burst", burst, 60)):
            fn(n, iters // 4)  # warm: the pool reaches its size, the code its caches
            per = [fn(n, iters) for _ in range(a.rounds)]
            rows.append({"pattern": name, "bytes": n, "ns_per_pair": statistics.median(per)})
    torch.cuda.synchronize()
    doc = {"mode": a.mode, "rows": rows}
    text = json.dumps(doc)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
