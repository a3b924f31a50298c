#!/usr/bin/env python3
"""One model server of tests/gpu/share_serve.sh: builds one HF transformers model from its config
(random weights: nothing is downloaded, the GPU machine has no network), then serves --requests
requests from --start-at on: generation with a KV cache for the causal LMs, a forward pass for
the encoder. A request that runs out of memory is retried (--retries, after a short sleep, with
the cache emptied) and then counted as lost; a model that cannot be loaded loses the process.

Models (--model): llama-1b (TinyLlama-1.1B's shape), gpt2-large, gpt2-medium, gpt2-small,
bert-large. The allocator is chosen by the environment alone (LD_PRELOAD of libcudapool.so with
PYTORCH_NO_CUDA_MEMORY_CACHING=1, or PyTorch's own); SERVE_FRACTION=F sets
torch.cuda.set_per_process_memory_fraction(F), the static partition.

Writes JSON (--out): model, loaded, served, lost requests, OOMs, seconds, the latency of each
request served (seconds, retries and any wait for memory included), torch's peak reserved.
"""
import argparse
import json
import os
import time

import torch


def build(name):
    import transformers as tf

    if name == "llama-1b":
        cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                             num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
        return tf.LlamaForCausalLM(cfg), True
    gpt2 = {"gpt2-large": (1280, 36, 20), "gpt2-medium": (1024, 24, 16), "gpt2-small": (768, 12, 12)}
    if name in gpt2:
        d, n, h = gpt2[name]
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=d, n_layer=n, n_head=h)), True
    if name == "bert-large":
        cfg = tf.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
        return tf.BertModel(cfg), False
    raise SystemExit(f"unknown model {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--start-at", type=float, default=0.0, help="epoch seconds to start serving (0: now)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--retries", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between requests (a server that idles between them)")
    args = ap.parse_args()
    result = {"model": args.model, "loaded": False, "served": 0, "lost": args.requests, "ooms": 0, "seconds": 0.0,
              "latencies": []}

    def write():
        result["peak_reserved"] = torch.cuda.max_memory_reserved() if torch.cuda.is_initialized() else 0
        with open(args.out, "w") as f:
            json.dump(result, f)

    frac = os.environ.get("SERVE_FRACTION")
    if frac:
        torch.cuda.set_per_process_memory_fraction(float(frac))
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    try:
        model, causal = build(args.model)
        model = model.to(device=dev, dtype=torch.bfloat16).eval()
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as e:
        print(f"{args.model}: out of memory loading the model: {e}", flush=True)
        result["ooms"] += 1
        write()
        return 3
    result["loaded"] = True
    vocab = model.config.vocab_size
    while time.time() < args.start_at:
        time.sleep(0.01)
    t0 = time.time()
    served = 0
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    for r in range(args.requests):
        if r > 0 and args.gap > 0:
            time.sleep(args.gap)
        t_req = time.time()
        ids = torch.randint(0, vocab, (args.batch, args.prompt), generator=g).to(dev)
        ok = False
        for attempt in range(args.retries + 1):
            try:
                with torch.inference_mode():
                    if causal:
                        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                             min_new_tokens=args.new_tokens, do_sample=False, use_cache=True,
                                             pad_token_id=0)
                        assert out.shape[1] == args.prompt + args.new_tokens
                    else:
                        out = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
                        assert out.shape[:2] == ids.shape
                    torch.cuda.synchronize()
                ok = True
                break
            except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
                # A launch can fail with the driver's out-of-memory too (a parked process whose
                # memory could not be had back in time): a RuntimeError saying so.
                if not isinstance(e, torch.cuda.OutOfMemoryError) and "out of memory" not in str(e):
                    raise
                result["ooms"] += 1
                print(f"{args.model}: request {r} attempt {attempt}: out of memory: {str(e).splitlines()[0]}", flush=True)
                out = None
                torch.cuda.empty_cache()
                time.sleep(0.5)
        served += ok
        if ok:
            result["latencies"].append(time.time() - t_req)
        print(f"{args.model}: request {r}: {'served' if ok else 'lost'}", flush=True)
    result["served"] = served
    result["lost"] = args.requests - served
    result["seconds"] = time.time() - t0
    write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
