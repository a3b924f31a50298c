#!/usr/bin/env python3
"""A correct PyTorch side-stream program (by PyTorch's documented rules, "CUDA semantics: stream
semantics of backward passes / record_stream"), run under every allocator mode by run.sh to show
which ones keep it correct.

Each case, for a size in --sizes and --reps repetitions:
  1. R, the result, is allocated on the side stream (torch.cuda.Stream(): a non-blocking stream,
     so the legacy default stream does not wait for it);
  2. X is allocated on the default stream and filled with a pattern (X[i] = i ^ key);
  3. the side stream waits for the default stream (side.wait_stream), then sleeps ~--sleep-ms
     on the GPU (torch.cuda._sleep) and only then reads X: R = X ^ key, which must give R[i] = i;
  4. X.record_stream(side), as PyTorch requires for a tensor used on another stream, then
     `del X`: with PYTORCH_NO_CUDA_MEMORY_CACHING=1 that is a cudaFree at once (the uncached
     allocator ignores record_stream), with PyTorch's cache the block waits for the side stream;
  5. Y, of X's size, is allocated at once on the default stream and filled with 0x5A5A5A5A. If Y
     got X's bytes while the side stream still sleeps, the side stream reads Y's fill, not X;
  6. after torch.cuda.synchronize(), R is compared with 0..n-1.

Prints per size and in total: `corrupted_cases=N cases=M`, `corrupted_bytes=K` (4 per wrong
int32 of R), `reused_cases=U` (Y handed X's address: shows whether the reuse that can race
happened at all). Exit 0 whatever it finds; report.py decides (`torch_side_stream`).

The real cudaFree waits for the whole device, so without the shim the program is correct in
both PyTorch modes; cudapool's default (gpu_wait) makes the default stream wait on the GPU for
the free's fence, so Y's fill runs after the side stream's read; free_sync:immediate reuses X's
bytes at once on the default stream: the negative control, which must corrupt.

torch.cuda._sleep(cycles) launches one single-thread kernel that spins for `cycles` GPU clock
cycles (clock64) on the current stream; the cycles per millisecond are measured at start with
CUDA events, as the SM clock differs between GPUs and clock states.
"""
import argparse
import os

FILL = 0x5A5A5A5A  # Y's fill; X ^ key differs from it, R[i] = i cannot equal FILL ^ key for i < n
KEY_BASE = 0x3C000000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8388608,67108864", help="bytes, comma-separated (multiples of 4)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--sleep-ms", type=float, default=20.0, help="how late the side stream reads X")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or any(s <= 0 or s % 4 for s in sizes):
        ap.error("--sizes must be positive multiples of 4")

    import torch
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no GPU")
    dev = torch.device("cuda", torch.cuda.current_device())
    default = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(dev)
    print(f"allocator: {torch.cuda.get_allocator_backend()} "
          f"PYTORCH_NO_CUDA_MEMORY_CACHING={os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING', '')} "
          f"CUDAPOOL_CONF={os.environ.get('CUDAPOOL_CONF', '')} shim={'yes' if os.environ.get('LD_PRELOAD') else 'no'}")
    print(f"streams: default {default.cuda_stream:#x}, side {side.cuda_stream:#x}")

    # Cycles per millisecond of torch.cuda._sleep on this GPU now (after a warm-up launch).
    probe = 20_000_000
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000)
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        torch.cuda._sleep(probe)
        t1.record()
    t1.synchronize()
    probe_ms = t0.elapsed_time(t1)
    cycles_per_ms = probe / max(probe_ms, 1e-3)
    cycles = max(int(args.sleep_ms * cycles_per_ms), 1_000_000)
    print(f"sleep: {probe} cycles took {probe_ms:.2f} ms ({cycles_per_ms / 1e3:.0f} MHz); "
          f"{cycles} cycles per case (~{cycles / cycles_per_ms:.1f} ms)")

    total_cases = total_bad_cases = total_bytes = total_reused = 0
    for si, size in enumerate(sizes):
        n = size // 4
        bad_cases = bad_bytes = reused = 0
        for rep in range(args.reps):
            key = KEY_BASE | (si << 12) | rep
            with torch.cuda.stream(side):
                r = torch.empty(n, dtype=torch.int32, device=dev)  # the result, owned by the side stream
            x = torch.arange(n, dtype=torch.int32, device=dev)  # on the default stream
            x.bitwise_xor_(key)
            x_ptr = x.data_ptr()
            side.wait_stream(default)  # X's fill is done before the side stream reads it
            with torch.cuda.stream(side):
                torch.cuda._sleep(cycles)  # the read comes late ...
                torch.bitwise_xor(x, key, out=r)  # ... and must still see X: r[i] = i
            x.record_stream(side)  # PyTorch's rule for a tensor used on another stream
            del x  # no caching: cudaFree now
            y = torch.empty(n, dtype=torch.int32, device=dev)  # at once, on the default stream
            y.fill_(FILL)
            hit = y.data_ptr() == x_ptr
            torch.cuda.synchronize()
            wrong = int((r != torch.arange(n, dtype=torch.int32, device=dev)).sum().item())
            del r, y
            bad_cases += wrong > 0
            bad_bytes += 4 * wrong
            reused += hit
            print(f"case size={size} rep={rep} corrupted_bytes={4 * wrong} reused={int(hit)}")
        print(f"size {size}: corrupted_cases={bad_cases} cases={args.reps} corrupted={bad_bytes} reused={reused}")
        total_cases += args.reps
        total_bad_cases += bad_cases
        total_bytes += bad_bytes
        total_reused += reused
    print(f"corrupted_cases={total_bad_cases} cases={total_cases}")
    print(f"corrupted_bytes={total_bytes}")
    print(f"reused_cases={total_reused}")


if __name__ == "__main__":
    main()
