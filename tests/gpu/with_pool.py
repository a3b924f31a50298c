#!/usr/bin/env python3
"""Runs a PyTorch program with its CUDA tensors on cudapool's pool through PyTorch's pluggable
allocator: `python3 tests/gpu/with_pool.py PROGRAM.py ARGS...` calls cudapool.torch.use() (from
this repository's python/) before the program starts, then runs it as __main__. With
libcudapool.so preloaded that copy serves it; without, the library named by CUDAPOOL_LIBRARY
(default build/release/libcudapool.so) is loaded.

torch.cuda's memory counters raise under PyTorch's own pluggable-allocator class; the glue's
class answers them from the pool (status()["torch_stats"]). Where that class is not in use, the
few the workloads read (max_memory_reserved, max_memory_allocated, memory_allocated,
memory_reserved) are answered by the pool's counters here. Prints "with_pool: <library> (<how>)",
"with_pool: free=<mode> record_stream=<0|1> registration=<c++|python>" and "with_pool:
torch_stats=<0|1>" (cudapool.torch.status()) on stderr.
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("CUDAPOOL_LIBRARY", os.path.join(ROOT, "build", "release", "libcudapool.so"))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts, as the workloads set it

import torch  # noqa: E402

import cudapool  # noqa: E402
import cudapool.torch  # noqa: E402

path = cudapool.torch.use()
st = cudapool.torch.status()
print(f"with_pool: {path} ({st['library']})", file=sys.stderr)
print(f"with_pool: free={st['free']} record_stream={int(st['record_stream'])} registration={st['registration']}",
      file=sys.stderr)
print(f"with_pool: torch_stats={int(st['torch_stats'])}", file=sys.stderr)
if not st["torch_stats"]:
    for name in ("max_memory_reserved", "max_memory_allocated", "memory_allocated", "memory_reserved"):
        setattr(torch.cuda, name, getattr(cudapool, name))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
