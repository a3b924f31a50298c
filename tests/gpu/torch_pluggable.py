#!/usr/bin/env python3
"""PyTorch's pluggable-allocator path on a real GPU, one check per process:

  torch_pluggable.py stats     cudapool.torch.use(); tensors of known sizes made and freed on
                               the default and a side stream: the pool's requested_bytes and
                               allocation counts follow them exactly; a tensor freed on its stream
                               gives its address to the next one of its size there; values right;
                               with the glue's allocator class, torch.cuda.memory_allocated,
                               memory_reserved, memory_stats, reset_peak_memory_stats and
                               empty_cache agree with the pool.
  torch_pluggable.py cudnn     use() with torch.backends.cudnn.benchmark: convolutions of a few
                               shapes, forward and backward, run (cuDNN asks the allocator's
                               cacheInfo, which PyTorch's own pluggable class refuses).
  torch_pluggable.py oom       use() under a cap (CUDAPOOL_CONF=max_reserved_mb:...): a tensor over
                               it raises torch.OutOfMemoryError whose message is the pool's
                               diagnosis (== cudapool.last_oom_message()); the process goes on.
  torch_pluggable.py oomtype   no use(): what PyTorch raises for an allocation over the device in
                               the current mode (LD_PRELOAD with PYTORCH_NO_CUDA_MEMORY_CACHING=1:
                               the uncached allocator's RuntimeError; PyTorch's cache: OOM).
  torch_pluggable.py oomtranslate
                               the LD_PRELOAD path: inside cudapool.torch.translate_oom() that
                               RuntimeError comes out as torch.OutOfMemoryError with the pool's
                               diagnosis.
  torch_pluggable.py maxbatch [--pool] [--cap-gib 12]
                               the largest GPT-2 small batch (sequence 1024, bf16 autocast, AdamW)
                               whose training step fits under the cap, found as automatic
                               batch-size finders do: try 1, 2, 3, ... and stop at the first
                               torch.OutOfMemoryError. --pool: through cudapool.torch.use() with
                               max_reserved_mb (set CUDAPOOL_CONF); else PyTorch's allocator with
                               set_per_process_memory_fraction(cap / total), or, when the shim is
                               preloaded, the shim's cap. Any other exception than
                               torch.OutOfMemoryError ends the search as a FAIL, except the
                               LD_PRELOAD path's RuntimeError("CUDA error: out of memory"), which
                               is reported as such (the finder would not have caught it).
Prints one line "torch_pluggable CHECK=<name> ok=0/1 ..." and exits 0 when ok.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("CUDAPOOL_LIBRARY", os.path.join(ROOT, "build", "release", "libcudapool.so"))
GiB, MiB = 1 << 30, 1 << 20


def verdict(name, ok, **fields):
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"torch_pluggable CHECK={name} ok={int(bool(ok))} {extra}".rstrip(), flush=True)
    sys.exit(0 if ok else 1)


def check_stats():
    import torch
    import cudapool
    import cudapool.torch
    cudapool.torch.use()
    dev = torch.device("cuda", 0)
    base = cudapool.memory_stats(0)
    req0, n0 = base.get("requested_bytes.all.current", 0), base.get("allocation.all.current", 0)
    sizes = [1, 1000, 4096, 1 << 20, 3 * MiB + 7, 64 * MiB, 300 * MiB]
    ts = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ts.append(torch.full((5 * MiB,), 3, dtype=torch.uint8, device=dev))
    side.synchronize()
    st = cudapool.memory_stats(0)
    want = sum(sizes) + 5 * MiB
    req = st["requested_bytes.all.current"] - req0
    count = st["allocation.all.current"] - n0
    torch_sum = sum(t.untyped_storage().nbytes() for t in ts)
    ok = req == want == torch_sum and count == len(ts)
    # Freed on its stream, reused there at once.
    x = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    addr = x.data_ptr()
    del x
    y = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    reused = y.data_ptr() == addr
    y.fill_(7)
    ok = ok and reused and int(y.sum().item()) == 7 * 8 * MiB and int(ts[-1].sum().item()) == 3 * 5 * MiB
    del ts, y
    torch.cuda.synchronize()
    after = cudapool.memory_stats(0)
    ok = ok and after["requested_bytes.all.current"] == req0 and after["allocation.all.current"] == n0
    # torch.cuda's own statistics calls, answered by the glue's allocator class from the pool.
    torch_stats = cudapool.torch.status()["torch_stats"]
    agree = torch_stats
    if torch_stats:
        z = torch.empty(16 * MiB, dtype=torch.uint8, device=dev)
        agree = (torch.cuda.memory_allocated(0) == cudapool.memory_allocated(0) and
                 torch.cuda.memory_reserved(0) == cudapool.memory_reserved(0) and
                 torch.cuda.memory_stats(0)["requested_bytes.all.current"] ==
                 cudapool.memory_stats(0)["requested_bytes.all.current"])
        del z
        torch.cuda.reset_peak_memory_stats(0)
        agree = agree and torch.cuda.max_memory_allocated(0) == torch.cuda.memory_allocated(0)
        before = torch.cuda.memory_reserved(0)
        torch.cuda.empty_cache()
        agree = agree and torch.cuda.memory_reserved(0) < before
    ok = ok and agree
    verdict("stats", ok, requested=req, expected=want, torch_nbytes=torch_sum, allocations=count,
            same_stream_reuse=int(reused), how=cudapool.torch._state["how"], torch_stats=int(torch_stats),
            torch_stats_agree=int(agree), max_allocated=cudapool.max_memory_allocated(0),
            reserved=cudapool.memory_reserved(0))


def check_cudnn():
    """cuDNN's benchmark mode asks the allocator for the largest workspace it may try (cacheInfo):
    PyTorch's own pluggable-allocator class refuses, so every convolution failed; the glue's class
    answers from the pool. Convolutions of a few shapes, forward and backward, under use()."""
    import torch
    import cudapool
    import cudapool.torch
    cudapool.torch.use()
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", 0)
    try:
        conv = torch.nn.Conv2d(64, 128, 3, padding=1).to(dev).to(memory_format=torch.channels_last)
        for side in (56, 28, 56, 112):
            x = torch.randn(16, 64, side, side, device=dev).to(memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                conv(x).float().sum().backward()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the type is the finding
        verdict("cudnn", False, type=type(e).__name__, message=repr(str(e)[:300]))
    verdict("cudnn", True, torch_stats=int(cudapool.torch.status()["torch_stats"]),
            reserved=cudapool.memory_reserved(0))


def check_oom():
    import torch
    import cudapool
    import cudapool.torch
    cudapool.torch.use()
    dev = torch.device("cuda", 0)
    keep = torch.ones(256 * MiB, dtype=torch.uint8, device=dev)
    free, total = cudapool.mem_get_info(0)
    try:
        torch.empty(total + GiB, dtype=torch.uint8, device=dev)
    except torch.OutOfMemoryError as e:
        msg = str(e)
        ok = "Tried to allocate" in msg and "cudapool reserved" in msg and cudapool.last_oom_message() in msg
        ok = ok and isinstance(e, torch.cuda.OutOfMemoryError)
        after = torch.ones(64 * MiB, dtype=torch.uint8, device=dev)  # the process goes on
        ok = ok and int(after.sum().item()) == 64 * MiB and int(keep.sum().item()) == 256 * MiB
        verdict("oom", ok, type=type(e).__name__, total=total, free=free, ooms=cudapool.memory_stats(0)["num_ooms"],
                message=repr(msg[:300]))
    except Exception as e:  # noqa: BLE001 - the type is the finding
        verdict("oom", False, type=type(e).__name__, message=repr(str(e)[:300]))
    verdict("oom", False, type="none", message="'no exception'")


def check_oomtype():
    import torch
    dev = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(total + GiB, dtype=torch.uint8, device=dev)
    except Exception as e:  # noqa: BLE001
        is_oom = isinstance(e, torch.OutOfMemoryError)
        # INFO: what PyTorch raises in this mode; ok means the process can go on.
        after = torch.ones(MiB, dtype=torch.uint8, device=dev)
        verdict("oomtype", int(after.sum().item()) == MiB, type=type(e).__name__, torch_oom=int(is_oom),
                message=repr(str(e)[:200]))
    verdict("oomtype", False, type="none")


def check_oomtranslate():
    """The LD_PRELOAD path: translate_oom() turns PyTorch's RuntimeError into OutOfMemoryError."""
    import torch
    import cudapool
    import cudapool.torch
    dev = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        with cudapool.torch.translate_oom():
            torch.empty(total + GiB, dtype=torch.uint8, device=dev)
    except torch.OutOfMemoryError as e:
        ok = "Tried to allocate" in str(e) and str(e) == cudapool.last_oom_message()
        verdict("oomtranslate", ok, type=type(e).__name__, cause=type(e.__cause__).__name__,
                message=repr(str(e)[:200]))
    except Exception as e:  # noqa: BLE001
        verdict("oomtranslate", False, type=type(e).__name__, message=repr(str(e)[:200]))
    verdict("oomtranslate", False, type="none")


def check_maxbatch(pool, cap_gib):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    if pool:
        import cudapool
        import cudapool.torch
        cudapool.torch.use()
    from transformers import GPT2Config, GPT2LMHeadModel
    dev = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(0).total_memory
    preloaded = "libcudapool" in os.environ.get("LD_PRELOAD", "")
    if not pool and not preloaded:
        torch.cuda.set_per_process_memory_fraction(cap_gib * GiB / total, 0)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024, use_cache=False)
    model = GPT2LMHeadModel(config).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    best, stopped_by = 0, "none"
    for b in range(1, 65):
        try:
            for _ in range(2):  # a second step: AdamW's state exists from the first one on
                ids = torch.randint(0, 50257, (b, 1024), device=dev)
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                opt.step()
                del ids, loss
            torch.cuda.synchronize()
            best = b
        except torch.OutOfMemoryError:
            stopped_by = "OutOfMemoryError"
            break
        except RuntimeError as e:
            stopped_by = "RuntimeError" if "out of memory" in str(e) else "other:" + repr(str(e)[:120])
            break
        finally:
            opt.zero_grad(set_to_none=True)
            if pool:
                cudapool.empty_cache()
            else:
                torch.cuda.empty_cache()
    mode = "pool" if pool else ("shim" if preloaded else "torch")
    verdict("maxbatch", best > 0 and stopped_by == "OutOfMemoryError", mode=mode, largest_batch=best,
            stopped_by=stopped_by, cap_gib=cap_gib, conf=repr(os.environ.get("CUDAPOOL_CONF", "")),
            alloc_conf=repr(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("check", choices=("stats", "cudnn", "oom", "oomtype", "oomtranslate", "maxbatch"))
    ap.add_argument("--pool", action="store_true", help="maxbatch through cudapool.torch.use()")
    ap.add_argument("--cap-gib", type=float, default=12.0)
    args = ap.parse_args()
    {"stats": check_stats, "cudnn": check_cudnn, "oom": check_oom, "oomtype": check_oomtype,
     "oomtranslate": check_oomtranslate}.get(
        args.check, lambda: check_maxbatch(args.pool, args.cap_gib))()


if __name__ == "__main__":
    main()
