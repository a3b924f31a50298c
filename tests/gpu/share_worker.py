#!/usr/bin/env python3
"""One process of tests/gpu/share_group.sh: an inference-like loop on one GPU for --window
seconds: small MLP steps with a batch that varies per step (so the allocator sees changing
sizes), plus one "burst" from --big-at to --big-at + --big-for seconds into the window during
which it also holds a --big-gib working buffer (a KV cache, a large batch) and touches it every
step. After the burst the buffer is freed: PyTorch's caching allocator and cudapool's pool both
keep it cached, which is what the other processes of a group then need.

The allocator is chosen by the environment alone (LD_PRELOAD, PYTORCH_NO_CUDA_MEMORY_CACHING);
SHARE_FRACTION=F sets torch.cuda.set_per_process_memory_fraction(F) (a static partition, the
way to share a GPU without cudapool). Out-of-memory errors are counted, never fatal.

Writes JSON (--out): steps, steps per second over the window, median step time, OOM count,
whether the burst buffer was ever obtained, and torch's peak reserved figure.
"""
import argparse
import json
import os
import random
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--start-at", type=float, default=0.0, help="epoch seconds to start the window (0: now)")
    ap.add_argument("--window", type=float, default=12.0)
    ap.add_argument("--big-gib", type=float, default=20.0)
    ap.add_argument("--big-at", type=float, default=2.0)
    ap.add_argument("--big-for", type=float, default=1.5)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    dev = torch.device("cuda")
    frac = os.environ.get("SHARE_FRACTION")
    if frac:
        torch.cuda.set_per_process_memory_fraction(float(frac))
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    d = args.d_model
    weights = [(torch.randn(d, 4 * d, device=dev, dtype=torch.bfloat16) * 0.02,
                torch.randn(4 * d, d, device=dev, dtype=torch.bfloat16) * 0.02) for _ in range(args.layers)]
    torch.cuda.synchronize()

    start = args.start_at if args.start_at > 0 else time.time()
    while time.time() < start:
        time.sleep(0.002)
    steps, ooms, step_ms = 0, 0, []
    big, big_done, big_ok = None, False, False
    big_elems = int(args.big_gib * (1 << 30)) // 2
    while True:
        now = time.time()
        rel = now - start
        if rel >= args.window:
            break
        in_burst = args.big_at <= rel < args.big_at + args.big_for
        t0 = time.perf_counter()
        try:
            if in_burst and big is None and not big_done:
                big = torch.empty(big_elems, device=dev, dtype=torch.bfloat16)
                big.fill_(1.0)
                big_ok = True
            if not in_burst and big is not None:
                big = None
                big_done = True
            if big is not None:
                big.mul_(1.0)
            x = torch.randn(rng.randint(args.batch // 4, args.batch), d, device=dev, dtype=torch.bfloat16)
            for w1, w2 in weights:
                x = torch.nn.functional.gelu(x @ w1) @ w2
            torch.cuda.synchronize()
            steps += 1
            step_ms.append((time.perf_counter() - t0) * 1e3)
        except torch.cuda.OutOfMemoryError:
            ooms += 1
            x = None
            time.sleep(0.005)
    window = time.time() - start
    result = {
        "name": args.name,
        "steps": steps,
        "steps_per_s": steps / window if window > 0 else 0.0,
        "median_step_ms": statistics.median(step_ms) if step_ms else None,
        "ooms": ooms,
        "big_ok": big_ok,
        "torch_max_reserved": torch.cuda.max_memory_reserved(),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(f"{args.name}: {steps} steps, {result['steps_per_s']:.1f}/s, ooms {ooms}, burst {'ok' if big_ok else 'MISSING'}")


if __name__ == "__main__":
    main()
