#!/usr/bin/env python3
"""Loads snapshots written by `cudapool report --snapshot` with PyTorch's own torch.cuda._memory_viz.

Usage: python3 tests/gpu/snapshot_viz.py [--cudapool build/release/cudapool] [--out DIR] [PICKLE...]

Without PICKLE it writes snapshots of sample traces first (classic segments at the peak, one at a
chosen moment, expandable segments). For each snapshot: segsum (asserts that blocks and free
space add up to every segment), trace (walks device_traces), memory/segments (flamegraph input,
without fetching flamegraph.pl), trace_plot and segment_plot (the HTML pages pytorch.org/memory_viz
shows; their embedded pickle must load back to the same snapshot). With a GPU it also takes a
snapshot of a small PyTorch workload and prints which fields PyTorch has that ours lacks.
Exit status 0 when every snapshot renders.
"""
import argparse
import base64
import os
import pickle
import re
import subprocess
import sys
import tempfile

import torch
from torch.cuda import _memory_viz as viz


def make_snapshots(cudapool, out):
    jobs = [
        ("train_peak", ["tests/traces/train.csv"]),
        ("serve_at", ["tests/traces/serve.csv", "--at", "0.2"]),
        ("torch_expandable", ["tests/traces/gpu_torch_d2048.csv", "--conf", "expandable_segments:True"]),
    ]
    paths = []
    for name, args in jobs:
        path = os.path.join(out, name + ".pickle")
        subprocess.run([cudapool, "report", *args, "--snapshot", path], check=True, stdout=subprocess.DEVNULL)
        paths.append(path)
    return paths


def embedded_snapshot(html):
    m = re.search(r'"base64": "([A-Za-z0-9+/=]+)"', html)
    assert m, "no embedded snapshot in the page"
    return pickle.loads(base64.b64decode(m.group(1)))


def check(path, out):
    with open(path, "rb") as f:
        data = pickle.load(f)
    reserved = sum(s["total_size"] for s in data["segments"])
    text = viz.segsum(data)  # asserts free + allocated == reserved, per segment and in total
    assert f"segments: {len(data['segments'])}" in text, text[-400:]
    tr = viz.trace(data)
    n = sum(len(t) for t in data["device_traces"])
    assert f"{len(data['device_traces'][-1])} entries" in tr, tr[:200]
    lines = viz.memory(data, format_flamegraph=lambda s: s)
    assert sum(int(l.rsplit(" ", 1)[1]) for l in lines.splitlines() if l) == reserved, "memory() does not add up"
    viz.segments(data, format_flamegraph=lambda s: s)
    for name, page in (("trace_plot", viz.trace_plot(data)), ("segment_plot", viz.segment_plot(data))):
        back = embedded_snapshot(page)
        assert back["segments"] == data["segments"], f"{name}: the embedded snapshot differs"
        with open(os.path.join(out, os.path.basename(path) + f".{name}.html"), "w") as f:
            f.write(page)
    print(f"ok {path}: {len(data['segments'])} segments, {reserved} B reserved, {n} trace events; "
          f"segsum, trace, memory, segments, trace_plot, segment_plot render")
    return data


def compare_with_torch(ours):
    if not torch.cuda.is_available():
        print("no GPU: skipping the comparison with a snapshot PyTorch takes itself")
        return
    torch.cuda.memory._record_memory_history(max_entries=1000)
    xs = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 30)]
    del xs[1]
    theirs = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    def keys(kind, d):
        if kind == "top":
            return set(d)
        if kind == "segment":
            return set(d["segments"][0]) if d["segments"] else set()
        if kind == "block":
            return set(d["segments"][0]["blocks"][0]) if d["segments"] else set()
        ev = [e for t in d["device_traces"] for e in t]
        return set(ev[0]) if ev else set()
    for kind in ("top", "segment", "block", "trace entry"):
        missing = keys(kind, theirs) - keys(kind, ours)
        print(f"{kind}: fields PyTorch {torch.__version__} has that the cudapool snapshot lacks: "
              f"{sorted(missing) if missing else 'none'}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cudapool", default="build/release/cudapool")
    ap.add_argument("--out", default=None, help="keep the pickles and HTML pages here")
    ap.add_argument("pickles", nargs="*")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="cudapool_viz_")
    os.makedirs(out, exist_ok=True)
    paths = a.pickles or make_snapshots(a.cudapool, out)
    data = None
    for p in paths:
        data = check(p, out)
    compare_with_torch(data)
    print(f"PASS snapshot_viz ({len(paths)} snapshots; pages in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
