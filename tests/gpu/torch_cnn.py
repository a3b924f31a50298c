#!/usr/bin/env python3
"""A CNN the way people train and serve one, on a CPU-bound budget: torchvision's ResNet-50 with
bf16 autocast, channels_last and cuDNN autotuning (cudnn.benchmark), the image side and the batch
changing every step. Eager PyTorch at this size is CPU-bound (step time ~ the process's CPU time),
so every host microsecond an allocator spends per tensor shows in the step.

--mode train: forward, backward (PyTorch's autograd thread frees what the main thread
allocated), SGD step. --mode infer: forward under inference_mode, no autograd thread.

The shapes cycle through a fixed list, so after the first cycle (the warm-up, where cuDNN tunes
each shape) every shape is known. Writes the same JSON as torch_train.py (step_s, step_host_s,
median_step_ms, torch_max_reserved, env) plus step_cpu_s (process CPU time per step) and warmup.
Which allocator runs is decided by the environment, as for torch_train.py.

HOST_SAMPLER_OUT=PATH with tests/gpu/host_sampler.cpp's library preloaded: the steps after the
warm-up are sampled (host time of the main thread, by shared object) and the profile written to
PATH; tests/gpu/host_profile.py reads it.
"""
import argparse
import json
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("train", "infer"), default="train")
    ap.add_argument("--cycles", type=int, default=4, help="passes over the shape list (the first is warm-up)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    import torchvision
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no GPU")
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True

    model = torchvision.models.resnet50(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    train = args.mode == "train"
    if train:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        model.eval()
    # (batch, image side): every step a different shape, as with variable-size crops.
    shapes = [(16, 160), (24, 192), (8, 224), (16, 208), (32, 128), (12, 176)]
    warmup = len(shapes)
    steps = shapes * args.cycles
    gen = torch.Generator(device=dev)
    times, host, cpu, losses = [], [], [], []
    sampler_out = os.environ.get("HOST_SAMPLER_OUT")
    sampler = None
    if sampler_out:
        import ctypes
        sampler = ctypes.CDLL(None)  # the preloaded host_sampler.so
        if not hasattr(sampler, "host_sampler_start"):
            raise SystemExit("HOST_SAMPLER_OUT is set but host_sampler.so is not preloaded")
    for step, (b, side) in enumerate(steps):
        if sampler is not None and step == warmup:
            torch.cuda.synchronize()
            if sampler.host_sampler_start() != 0:
                raise SystemExit("host_sampler_start failed")
        gen.manual_seed(step)
        x = torch.randn(b, 3, side, side, generator=gen, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), generator=gen, device=dev)
        torch.cuda.synchronize()
        c0 = time.process_time()
        t0 = time.perf_counter()
        if train:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        else:
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        losses.append(loss.item())
        del x, y, loss
    if sampler is not None:
        torch.cuda.synchronize()
        if sampler.host_sampler_stop(sampler_out.encode()) != 0:
            raise SystemExit(f"host_sampler_stop could not write {sampler_out}")

    result = {
        "workload": "resnet50-" + args.mode,
        "losses": losses,
        "step_s": times,
        "step_host_s": host,
        "step_cpu_s": cpu,
        "warmup": warmup,
        "median_step_ms": 1e3 * statistics.median(times[warmup:]),
        "median_cpu_ms": 1e3 * statistics.median(cpu[warmup:]),
        "torch_max_reserved": torch.cuda.max_memory_reserved(dev),
        "torch_version": torch.__version__,
        "env": {k: os.environ.get(k, "") for k in
                ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "CUDAPOOL_CONF", "LD_PRELOAD")},
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(f"{result['workload']}: median step {result['median_step_ms']:.2f} ms, "
          f"CPU {result['median_cpu_ms']:.2f} ms, last loss {losses[-1]!r}")


if __name__ == "__main__":
    main()
