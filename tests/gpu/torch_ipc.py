#!/usr/bin/env python3
"""A CUDA tensor shared from a parent to a child process with torch.multiprocessing (start
method "spawn", the one CUDA allows), as PyTorch documents it ("Multiprocessing best practices:
CUDA in multiprocessing").

For each size in --sizes (bytes, multiples of 4; default 1 KiB and 30 MiB) the parent makes an
int32 tensor holding a pattern (value i -> (i * 2654435761 + 40503 * tag) mod 2**31). Every
tensor goes to one child as a Process argument: PyTorch pickles a CUDA tensor as an IPC handle of
its storage's allocation (cudaIpcGetMemHandle) plus the offset in it, and the child opens it
(cudaIpcOpenMemHandle). The child compares each tensor with the pattern, writes the pattern of
tag + 100 into it, synchronizes and reports through a queue. After the child has exited the
parent must see the child's writes; it keeps the tensors alive all along (PyTorch's rule for the
producer of a shared CUDA tensor).

run.sh runs it with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor its own cudaMalloc, which is
what puts cudapool under PyTorch), without and with the shim, and once with PyTorch's caching
allocator on top of the shim (segments from cudaMalloc, shared with their offsets).

Output, last line one of:
  torch_ipc: PASS sizes=...                 the child read every pattern, the parent saw every write
  torch_ipc: REFUSED <exception>            PyTorch would not share the tensor in this mode (in the
                                            parent, while pickling it): a property of PyTorch's
                                            allocator mode, not of the shim; exit status 0
  torch_ipc: FAIL <what>                    wrong values, an error in the child, a child that died
                                            or did not answer; exit status 1
"""
import argparse
import os
import sys
import traceback

TAG = 11


def pattern(n_bytes, tag, device):
    import torch
    i = torch.arange(n_bytes // 4, dtype=torch.int64, device=device)
    return ((i * 2654435761 + 40503 * tag) % (1 << 31)).to(torch.int32)


def child(tensors, tags, queue):
    """Runs in the spawned process: check, overwrite, report (never raises)."""
    try:
        import torch
        results = []
        for t, tag in zip(tensors, tags):
            n = t.numel() * 4
            read_ok = bool(torch.equal(t, pattern(n, tag, t.device)))
            t.copy_(pattern(n, tag + 100, t.device))
            results.append((n, read_ok, f"{t.data_ptr():#x}"))
        torch.cuda.synchronize()
        tensors = t = None  # drop the imported storages (their handles close) before reporting
        queue.put(("ok", results))
    except Exception as e:  # reported to the parent, which prints it
        queue.put(("error", f"{type(e).__name__}: {e}".replace("\n", " ")[:400]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=f"1024,{30 << 20}", help="bytes, comma-separated (multiples of 4)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the child")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or any(s <= 0 or s % 4 for s in sizes):
        ap.error("--sizes must be positive multiples of 4")

    try:
        import torch
        import torch.multiprocessing as mp
    except Exception as e:
        print(f"torch_ipc: FAIL import torch: {e}")
        return 1
    if not torch.cuda.is_available():
        print("torch_ipc: FAIL torch sees no GPU")
        return 1
    print(f"torch_ipc: torch {torch.__version__} allocator={torch.cuda.get_allocator_backend()} "
          f"PYTORCH_NO_CUDA_MEMORY_CACHING={os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING', '')} "
          f"shim={'yes' if os.environ.get('LD_PRELOAD') else 'no'}", flush=True)

    dev = torch.device("cuda", 0)
    tags = [TAG + k for k in range(len(sizes))]
    tensors = [pattern(n, tag, dev) for n, tag in zip(sizes, tags)]
    torch.cuda.synchronize()

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(tensors, tags, queue))
    try:
        proc.start()  # pickles the tensors: where PyTorch exports (or refuses to export) them
    except Exception as e:
        traceback.print_exc()
        print(f"torch_ipc: REFUSED {type(e).__name__}: {e}".replace("\n", " ")[:500])
        return 0

    try:
        status, payload = queue.get(timeout=args.timeout)
    except Exception as e:
        status, payload = "error", f"no answer from the child within {args.timeout:g} s ({type(e).__name__})"
    proc.join(timeout=args.timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        print(f"torch_ipc: FAIL the child did not exit ({payload if status == 'error' else 'after answering'})")
        return 1
    if status != "ok":
        print(f"torch_ipc: FAIL in the child: {payload} (exit code {proc.exitcode})")
        return 1

    torch.cuda.synchronize()
    bad = []
    for (n, read_ok, child_ptr), t, tag in zip(payload, tensors, tags):
        seen = bool(torch.equal(t, pattern(n, tag + 100, dev)))
        print(f"torch_ipc size={n} child_read={'ok' if read_ok else 'WRONG'} "
              f"parent_sees_write={'ok' if seen else 'NO'} "
              f"parent_ptr={t.data_ptr():#x} child_ptr={child_ptr}")
        if not read_ok:
            bad.append(f"{n} B: child read wrong values")
        if not seen:
            bad.append(f"{n} B: parent does not see the child's write")
    if proc.exitcode != 0:
        bad.append(f"child exit code {proc.exitcode}")
    if bad:
        print("torch_ipc: FAIL " + "; ".join(bad))
        return 1
    print("torch_ipc: PASS sizes=" + ",".join(str(n) for n in sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
