#!/usr/bin/env python3
"""Step-by-step view of tests/gpu/torch_reps.sh output: per mode, every process's median step
and median host time (ms), then the median over the processes of each step, for the steps asked
for, and of steps from --from on (the steady state, past the growth of the first steps).

    python3 tests/gpu/step_table.py DIR MODE... [--steps 15,17,25] [--from 18]

DIR holds torch_reps.sh's MODE_REP.json files (OUT, default build/torch-reps). Steps before 5
are warm-up, as in torch_reps.sh's own summary. docs/benchmarks.md quotes this table for growth
steps and for the host time of fast and slow processes.
"""
import argparse
import json
import os
import re
import statistics as st


def runs(out, mode):
    pat = re.compile(re.escape(mode) + r"_\d+\.json$")
    return [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out)) if pat.fullmatch(f)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("modes", nargs="+")
    ap.add_argument("--steps", default="", help="comma-separated step indices to show")
    ap.add_argument("--from", dest="start", type=int, default=18, help="first step of the steady state")
    a = ap.parse_args()
    steps = [int(s) for s in a.steps.split(",") if s]
    for mode in a.modes:
        rs = runs(a.dir, mode)
        if not rs:
            print(f"{mode}: no runs in {a.dir}")
            continue
        per = [[1e3 * x for x in r["step_s"]] for r in rs]
        n = min(len(p) for p in per)
        med = [st.median(p[i] for p in per) for i in range(n)]
        procs = []
        for r, p in zip(rs, per):
            host = f"/{st.median(1e3 * h for h in r['step_host_s'][5:]):.2f}" if "step_host_s" in r else ""
            procs.append(f"{st.median(p[5:]):.2f}{host}")
        shown = " ".join(f"s{i} {med[i]:.2f}" for i in steps if i < n)
        steady = st.median(med[a.start:]) if a.start < n else float("nan")
        print(f"{mode:10s} processes (step/host ms): {' '.join(procs)}  |  per-step medians: {shown}"
              f"  |  steady (from {a.start}) {steady:.2f}")


if __name__ == "__main__":
    main()
