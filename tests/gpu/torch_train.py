#!/usr/bin/env python3
"""A small transformer trained with varying batch size and sequence length (fixed seeds,
deterministic algorithms), so the allocator sees a realistic, shifting mix of tensor sizes.

Writes JSON: the exact loss of every step (compared across runs by report.py), every step's
time, the median step time after warm-up, and torch's own peak-reserved figure. Which allocator
runs is decided entirely by the environment run.sh sets (PYTORCH_CUDA_ALLOC_CONF,
PYTORCH_NO_CUDA_MEMORY_CACHING, LD_PRELOAD of libcudapool.so); this script does not know.
With --ddp it runs under torchrun, one process per GPU, and writes one file per rank
(the string RANK in --out is replaced by the rank).
"""
import argparse
import json
import os
import random
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ddp", action="store_true")
    # The default model is small: the host (Python dispatch) takes ~99.7 % of a step on an H200,
    # so step time measures the CPU. At --d-model 2048 the GPU's share grows (the host has queued
    # everything after 80-90 % of the step), closer to real training.
    ap.add_argument("--d-model", type=int, default=512)
    args = ap.parse_args()

    # cuBLAS is deterministic only with a fixed workspace configuration.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no GPU")

    rank = 0
    if args.ddp:
        import torch.distributed as dist
        rank = int(os.environ["RANK"])
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
    dev = torch.device("cuda", torch.cuda.current_device())

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = True

    d_model, heads, layers, classes, d_in = args.d_model, 8, 4, 1000, 64

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.fc1 = nn.Linear(d_model, 4 * d_model)
            self.fc2 = nn.Linear(4 * d_model, d_model)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, d_model // heads).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-2, -1)) * (d_model // heads) ** -0.5
            causal = torch.ones(s, s, device=x.device, dtype=torch.bool).triu(1)
            att = att.masked_fill(causal, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d_model))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    model = nn.Sequential(nn.Linear(d_in, d_model), *[Block() for _ in range(layers)],
                          nn.LayerNorm(d_model), nn.Linear(d_model, classes)).to(dev)
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    shape_rng = random.Random(7)
    shapes = [(shape_rng.choice([4, 8, 12, 16]), shape_rng.choice([128, 192, 256, 384, 512]))
              for _ in range(args.steps)]
    gen = torch.Generator(device=dev)
    losses, times, starts, host = [], [], [], []
    for step, (b, s) in enumerate(shapes):
        gen.manual_seed(100003 * rank + step)
        x = torch.randn(b, s, d_in, generator=gen, device=dev)
        y = torch.randint(0, classes, (b, s), generator=gen, device=dev)
        torch.cuda.synchronize()
        starts.append(time.time_ns())  # wall clock, to line steps up with a cudapool trace
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, classes), y.reshape(-1))
        loss.backward()
        opt.step()
        host.append(time.perf_counter() - t0)  # the host's part: launching, allocating
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        del x, y, loss

    result = {
        "rank": rank,
        "losses": losses,
        "step_s": times,
        "step_start_unix_ns": starts,
        "step_host_s": host,
        "median_step_ms": 1e3 * statistics.median(times[args.warmup:]),
        "torch_max_reserved": torch.cuda.max_memory_reserved(dev),
        "torch_version": torch.__version__,
        "d_model": d_model,
        "env": {k: os.environ.get(k, "") for k in
                ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "CUDAPOOL_CONF", "LD_PRELOAD")},
    }
    with open(args.out.replace("RANK", str(rank)), "w") as f:
        json.dump(result, f)
    print(f"rank {rank}: final loss {losses[-1]!r} median step {result['median_step_ms']:.2f} ms")
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
