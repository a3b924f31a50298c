#!/usr/bin/env python3
"""CuPy workload with varying array sizes: GEMM, FFT, sort and reductions.

--pool none   cupy.cuda.set_allocator(None): every array is a cudaMalloc/cudaFree, so under
              LD_PRELOAD the shim serves them; without it this is the no-caching floor.
--pool default  CuPy's own memory pool (the baseline to beat).
Writes JSON: per-iteration results (compared across runs), median iteration time.
"""
import argparse
import json
import random
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool", choices=["none", "default"], required=True)
    ap.add_argument("--iters", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import cupy as cp
    if args.pool == "none":
        cp.cuda.set_allocator(None)
    rs = cp.random.RandomState(seed=5)
    shape_rng = random.Random(3)
    results, times = [], []
    for _ in range(args.iters):
        m = shape_rng.choice([256, 512, 1024, 1536, 2048])
        n = shape_rng.choice([100_000, 500_000, 2_000_000, 4_000_000])
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        a = rs.standard_normal((m, m), dtype=cp.float32)
        g = a @ a.T
        spec = cp.fft.rfft(a, axis=1)
        v = rs.standard_normal(n, dtype=cp.float32)
        med = cp.sort(v)[n // 2]
        value = float(g.sum()) + float(cp.abs(spec).sum()) + float(med)
        times.append(time.perf_counter() - t0)
        results.append(value)
        del a, g, spec, v, med
    out = {"results": results, "step_s": times,
           "median_step_ms": 1e3 * statistics.median(times[args.warmup:]), "pool": args.pool,
           "cupy_version": cp.__version__}
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"cupy pool={args.pool}: median {out['median_step_ms']:.3f} ms")


if __name__ == "__main__":
    main()
