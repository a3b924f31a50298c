#!/usr/bin/env python3
"""A language model with a large vocabulary, trained on random tokens: HF transformers' GPT-2
(12 layers, d 768, 12 heads, vocabulary 50257, built from its config: nothing is downloaded),
bf16 autocast, AdamW, batch size and sequence length varying per step from a fixed seeded
schedule. The allocator sees what torch_train.py's small transformer does not: logits of
tokens x 50257 (up to 1.2 GB in bf16, 2.5 GB once the loss upcasts them to fp32, and as much
again for their gradient) that come and go every step at a different size, next to the
activations of twelve layers.

Writes the same JSON as torch_train.py (--out): the exact loss of every step, every step's time,
its host share and its wall-clock start, the median step after --warmup, torch's peak-reserved
figure; so torch_reps.sh (TORCH_WORKLOAD=hf), step_table.py, step_events.py and report.py read
it unchanged. As there, the allocator is chosen by the environment alone (PYTORCH_CUDA_ALLOC_CONF,
PYTORCH_NO_CUDA_MEMORY_CACHING, LD_PRELOAD of libcudapool.so), and the process is pinned to a CPU
from outside (tests/gpu/pin.sh), not here.

Reproducibility: fixed seeds (model init, dropout, token batches), CUBLAS_WORKSPACE_CONFIG, and
torch.use_deterministic_algorithms(True) in its strict form (warn_only=False). The strict form
is needed for one op: the backward of scaled_dot_product_attention, which HF's GPT-2 uses
(attn_implementation "sdpa"). Its flash and memory-efficient kernels are nondeterministic by
default (atomic adds into dQ, split keys) and switch to their deterministic algorithms only when
determinism is strict; under warn_only=True (torch_train.py's setting) they only warn ("Flash
Attention defaults to a non-deterministic algorithm") and losses differ between runs. The cuDNN
attention backend is excluded (sdpa_kernel below), so a backend whose backward determinism we
cannot control is never picked. Every other op of this model (embedding, layer norm, GELU,
dropout, addmm, 2-D cross entropy, AdamW's foreach ops) has a deterministic CUDA implementation,
so the strict mode raises on none of them; should a later torch version add one that raises
("... does not have a deterministic implementation"), --warn-only runs on with warnings, and
the losses are then not guaranteed identical.

Step size: at most --max-tokens (12288) tokens a step, about 11 TFLOP of forward+backward and
~20 GB of memory traffic for the logits: tens of milliseconds on an H200, well under 0.3 s.
"""
import argparse
import json
import os
import random
import statistics
import time

VOCAB = 50257
BATCHES = (4, 8, 12, 16)
SEQS = (128, 192, 256, 384, 512, 640, 768, 896, 1024)


def schedule(steps, max_tokens):
    """(batch, sequence) per step, from a fixed seed; a draw over max_tokens draws the sequence
    length again (deterministically), so big batches get shorter sequences."""
    rng = random.Random(7)
    shapes = []
    for _ in range(steps):
        b, s = rng.choice(BATCHES), rng.choice(SEQS)
        while b * s > max_tokens:
            s = rng.choice(SEQS)
        shapes.append((b, s))
    return shapes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=12288,
                    help="cap on batch x sequence of a step (at least %d)" % (max(BATCHES) * min(SEQS)))
    ap.add_argument("--warn-only", action="store_true",
                    help="use_deterministic_algorithms(True, warn_only=True): warn instead of raising on an op "
                         "without a deterministic implementation (attention's backward is then nondeterministic)")
    args = ap.parse_args()
    if args.max_tokens < max(BATCHES) * min(SEQS):
        ap.error(f"--max-tokens must be at least {max(BATCHES) * min(SEQS)}")
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")

    # cuBLAS is deterministic only with a fixed workspace configuration (set before CUDA starts).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no GPU")
    dev = torch.device("cuda", torch.cuda.current_device())

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=args.warn_only)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = True

    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=VOCAB, n_positions=1024, use_cache=False)
    model = GPT2LMHeadModel(config).to(dev)  # initialised on the CPU from the seed, then moved
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    # Flash first, then memory-efficient, math only if neither fits; never cuDNN (see above).
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    shapes = schedule(args.steps, args.max_tokens)
    gen = torch.Generator(device=dev)
    losses, times, starts, host = [], [], [], []
    with sdpa_kernel(backends):
        for step, (b, s) in enumerate(shapes):
            gen.manual_seed(step)
            ids = torch.randint(0, VOCAB, (b, s), generator=gen, device=dev)
            torch.cuda.synchronize()
            starts.append(time.time_ns())  # wall clock, to line steps up with a cudapool trace
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                # HF shifts the labels itself; only the loss is kept, so the logits go at once.
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            host.append(time.perf_counter() - t0)  # the host's part: launching, allocating
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            del ids, loss

    result = {
        "rank": 0,
        "losses": losses,
        "step_s": times,
        "step_start_unix_ns": starts,
        "step_host_s": host,
        "median_step_ms": 1e3 * statistics.median(times[args.warmup:]),
        "torch_max_reserved": torch.cuda.max_memory_reserved(dev),
        "torch_version": torch.__version__,
        "d_model": config.n_embd,
        "workload": "hf_gpt2",
        "transformers_version": transformers.__version__,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "deterministic": "warn_only" if args.warn_only else "strict",
        "shapes": shapes,
        "env": {k: os.environ.get(k, "") for k in
                ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "CUDAPOOL_CONF", "LD_PRELOAD")},
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(f"hf gpt2: final loss {losses[-1]!r} median step {result['median_step_ms']:.2f} ms "
          f"(attention {result['attn_implementation']}, {len(shapes)} steps, max {max(b * s for b, s in shapes)} tokens)")


if __name__ == "__main__":
    main()
