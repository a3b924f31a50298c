#!/usr/bin/env python3
"""JAX workload: an MLP's value-and-grad step at four batch sizes in turn (four compiled
programs, so buffer sizes change from step to step).

The allocator is chosen by the environment run.sh sets: XLA_PYTHON_CLIENT_ALLOCATOR=platform
(allocate and free on demand through the driver: what the shim serves, or the floor without it),
or XLA's BFC pool with or without preallocation. Writes JSON: per-step losses (compared
across runs), median step time.
"""
import argparse
import json
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=80)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    if jax.default_backend() != "gpu":  # a CPU fallback would measure nothing of interest
        raise SystemExit(f"jax runs on {jax.default_backend()}, not on a GPU")

    dim = 2048
    batches = [1024, 4096, 8192, 16384]

    def loss_fn(w, x):
        h = jnp.tanh(x @ w[0])
        h = jnp.tanh(h @ w[1])
        return jnp.mean((h @ w[2]) ** 2)

    @jax.jit
    def step(w, x):
        loss, grads = jax.value_and_grad(loss_fn)(w, x)
        return loss, [wi - 1e-2 * gi for wi, gi in zip(w, grads)]

    key = jax.random.PRNGKey(0)
    w = [0.02 * jax.random.normal(jax.random.fold_in(key, 1000 + i), (dim, dim)) for i in range(3)]
    for b in batches:  # compile every shape before timing
        step(w, jnp.zeros((b, dim)))[0].block_until_ready()

    losses, times = [], []
    for i in range(args.iters):
        x = jax.random.normal(jax.random.fold_in(key, i), (batches[i % len(batches)], dim))
        x.block_until_ready()
        t0 = time.perf_counter()
        loss, w = step(w, x)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        del x
    out = {"results": losses, "step_s": times, "median_step_ms": 1e3 * statistics.median(times),
           "jax_version": jax.__version__,
           "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "bfc"),
           "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")}
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"jax: median {out['median_step_ms']:.3f} ms")


if __name__ == "__main__":
    main()
