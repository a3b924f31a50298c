#!/usr/bin/env python3
"""One process of tests/gpu/share_train_eval.sh: a trainer or an evaluator sharing one GPU.

--role train: HF transformers' GPT-2 (12 layers, d 768, vocabulary 50257, built from its config,
nothing downloaded) trained with AdamW under bf16 autocast, batch and sequence length varying per
step from hf_lm.py's seeded schedule, for --window seconds. Its memory swings every step: the
logits and their fp32 copy for the loss come and go at a different size each time.

--role eval: a larger GPT-2 (24 layers, d 1024) in eval mode that wakes every --every seconds and
scores --eval-batch sequences of 1024 tokens (no_grad, bf16): a burst of several GiB of logits,
freed at once; in between it sleeps and its allocator keeps the burst cached.

Both start their window at --start-at (epoch seconds) so that runs line up. The allocator is
chosen by the environment alone (LD_PRELOAD of libcudapool.so, PYTORCH_NO_CUDA_MEMORY_CACHING);
SHARE_FRACTION=F sets torch.cuda.set_per_process_memory_fraction(F), the static partition.
Out-of-memory errors are counted and the step retried later, never fatal.

Writes JSON (--out): steps, steps per second, median step time, OOMs, the loss of every step
(for the trainer: the first --check-steps losses must be bit-identical between modes), and
torch's peak reserved figure.
"""
import argparse
import json
import os
import random
import statistics
import time

VOCAB = 50257


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=("train", "eval"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--start-at", type=float, default=0.0, help="epoch seconds to start the window (0: now)")
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--every", type=float, default=1.0, help="eval: seconds between the starts of two bursts")
    ap.add_argument("--eval-batch", type=int, default=48, help="eval: sequences of 1024 tokens per burst")
    ap.add_argument("--max-tokens", type=int, default=12288, help="train: cap on batch x sequence of a step")
    args = ap.parse_args()

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import GPT2Config, GPT2LMHeadModel

    import hf_lm  # the trainer's schedule, shared with the single-process benchmark

    dev = torch.device("cuda", torch.cuda.current_device())
    frac = os.environ.get("SHARE_FRACTION")
    if frac:
        torch.cuda.set_per_process_memory_fraction(float(frac))
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = True
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    if args.role == "train":
        config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=VOCAB, n_positions=1024, use_cache=False)
    else:
        config = GPT2Config(n_layer=24, n_embd=1024, n_head=16, vocab_size=VOCAB, n_positions=1024, use_cache=False)
    model = GPT2LMHeadModel(config).to(dev)
    opt = None
    if args.role == "train":
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        shapes = hf_lm.schedule(1000, args.max_tokens)
    else:
        model.eval()
    gen = torch.Generator(device=dev)
    torch.cuda.synchronize()

    start = args.start_at if args.start_at > 0 else time.time()
    while time.time() < start:
        time.sleep(0.002)
    steps, ooms, step_ms, losses = 0, 0, [], []
    next_burst = start
    with sdpa_kernel(backends):
        while time.time() - start < args.window:
            if args.role == "eval":
                now = time.time()
                if now < next_burst:
                    time.sleep(min(0.01, next_burst - now))
                    continue
            t0 = time.perf_counter()
            try:
                gen.manual_seed(steps)
                if args.role == "train":
                    b, s = shapes[steps % len(shapes)]
                    ids = torch.randint(0, VOCAB, (b, s), generator=gen, device=dev)
                    opt.zero_grad(set_to_none=True)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                    loss.backward()
                    opt.step()
                else:
                    ids = torch.randint(0, VOCAB, (args.eval_batch, 1024), generator=gen, device=dev)
                    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                losses.append(loss.item())  # synchronises
                del ids, loss
                steps += 1
                step_ms.append((time.perf_counter() - t0) * 1e3)
                next_burst += args.every
            except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
                # Without PyTorch's cache (under the shim) an out-of-memory answer of cudaMalloc
                # inside a library call can surface as a plain CUDA error.
                if not isinstance(e, torch.cuda.OutOfMemoryError) and "out of memory" not in str(e):
                    raise
                ooms += 1
                ids = loss = None
                if opt is not None:
                    opt.zero_grad(set_to_none=True)
                time.sleep(0.005)
    window = time.time() - start
    result = {
        "role": args.role,
        "steps": steps,
        "steps_per_s": steps / window if window > 0 else 0.0,
        "median_step_ms": statistics.median(step_ms) if step_ms else None,
        "ooms": ooms,
        "losses": losses,
        "torch_max_reserved": torch.cuda.max_memory_reserved(dev),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(f"{args.role}: {steps} steps, {result['steps_per_s']:.2f}/s, median {result['median_step_ms']} ms, "
          f"ooms {ooms}")


if __name__ == "__main__":
    main()
