#!/usr/bin/env python3
"""Host time per step by shared object, from tests/gpu/host_sampler.cpp's profiles.

    python3 tests/gpu/host_profile.py OUT MODE... [--lib UNSTRIPPED_LIBCUDAPOOL]

OUT holds what `HOST_SAMPLER=... tests/gpu/torch_reps.sh` wrote: MODE_ROUND.json (the step
times; its steady steps are the sampled ones) and MODE_ROUND.prof.tsv. For each mode, the median
over its processes of the sampled thread's milliseconds per step, spent in each object (self: the
leaf frame) and under it (incl: anywhere on the stack); then, where libcudapool.so was on the
stack, which object the time went to below it, and with --lib the library's own functions
(addr2line on the unstripped build of the same code). Milliseconds per step are
samples / all samples * sampled seconds / steady steps: they add up to the thread's wall time
per step, comparable between modes whatever the sampling rate.
"""
import argparse
import collections
import json
import os
import statistics as st
import subprocess
import sys


def load(out, mode):
    runs = []
    for f in sorted(os.listdir(out)):
        if not (f.startswith(mode + "_") and f.endswith(".prof.tsv")):
            continue
        stem = f[:-len(".prof.tsv")]
        if not stem[len(mode) + 1:].isdigit():
            continue
        res = os.path.join(out, stem + ".json")
        if not os.path.exists(res):
            continue
        d = json.load(open(res))
        steps = len(d["step_s"]) - d.get("warmup", 0)
        prof = collections.defaultdict(dict)
        total = secs = 0
        for line in open(os.path.join(out, f)):
            p = line.rstrip("\n").split("\t")
            if p[0] == "total":
                total, secs = int(p[1]), float(p[2])
            elif p[0] in ("self", "incl"):
                prof[p[0]][p[1]] = int(p[2])
            elif p[0] == "under":
                prof["under"][(p[1], p[2])] = int(p[3])
            elif p[0] == "off":
                prof["off"][int(p[1], 16)] = int(p[2])
        if total <= 0 or steps <= 0:
            continue
        scale = 1e3 * secs / total / steps  # ms per step for one sample
        runs.append({k: {o: c * scale for o, c in v.items()} for k, v in prof.items()} |
                    {"step": 1e3 * secs / steps, "n": total})
    return runs


def med(runs, kind, key):
    return st.median(r.get(kind, {}).get(key, 0.0) for r in runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("modes", nargs="+")
    ap.add_argument("--lib", help="the unstripped libcudapool.so the profiled one was stripped from")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    data = {m: load(a.out, m) for m in a.modes}
    data = {m: r for m, r in data.items() if r}
    if not data:
        sys.exit("no profiles found")
    objs = set()
    for runs in data.values():
        for r in runs:
            objs |= set(r.get("self", {})) | set(r.get("incl", {}))
    print("ms per step of the sampled thread, median over processes (self = leaf frame, incl = on the stack)")
    print(f"{'object':34s}" + "".join(f"{m + ' self':>14s}{m + ' incl':>14s}" for m in data))
    rows = sorted(objs, key=lambda o: -max(med(r, "self", o) for r in data.values()))
    for o in rows:
        vals = [(med(r, "self", o), med(r, "incl", o)) for r in data.values()]
        if max(max(v) for v in vals) < 0.005:
            continue
        print(f"{o[:34]:34s}" + "".join(f"{s:14.3f}{i:14.3f}" for s, i in vals))
    print(f"{'step (sampled wall)':34s}" + "".join(f"{st.median(r['step'] for r in runs):28.3f}" for runs in data.values()))
    print("processes: " + ", ".join(f"{m} {len(r)} ({sum(x['n'] for x in r)} samples)" for m, r in data.items()))
    for m, runs in data.items():
        under = collections.Counter()
        for r in runs:
            for k, v in r.get("under", {}).items():
                under[k] += v / len(runs)
        if under:
            print(f"{m}: below libcudapool.so / libcudart, ms per step (mean over processes): " +
                  ", ".join(f"{k[0]}->{k[1]} {v:.3f}" for k, v in under.most_common(8)))
        offs = collections.Counter()
        for r in runs:
            for k, v in r.get("off", {}).items():
                offs[k] += v / len(runs)
        if offs and a.lib:
            top = offs.most_common(200)
            names = subprocess.run(["addr2line", "-f", "-C", "-e", a.lib] + [hex(o) for o, _ in top],
                                   capture_output=True, text=True).stdout.split("\n")
            by_fn = collections.Counter()
            for i, (o, v) in enumerate(top):
                fn = names[2 * i] if 2 * i < len(names) else "?"
                by_fn[fn[:100]] += v
            print(f"{m}: innermost libcudapool.so frame, ms per step:")
            for k, v in by_fn.most_common(a.top):
                print(f"  {v:7.3f}  {k}")


if __name__ == "__main__":
    main()
