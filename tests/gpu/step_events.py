#!/usr/bin/env python3
"""Lines a cudapool event trace up with the steps of torch_train.py: per step, its time, the
allocations, and the driver work the pool did in it (expandable pages mapped / unmapped and
segments allocated / freed, with the time those calls took).

    python3 tests/gpu/step_events.py TRACE.csv RUN.json [REFERENCE.json]

RUN.json is torch_train.py's output (step_start_unix_ns, step_s); REFERENCE.json, when given,
adds a column with the same step of another run (e.g. PyTorch native); fence waits (host stalls)
are counted per step too. Prints a table and a
last line with totals: steps with driver calls against steps without, median step time of each.
"""
import bisect
import csv
import json
import statistics
import sys

DRIVER = ("segment_map", "segment_unmap", "segment_alloc", "segment_free")


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    run = json.load(open(sys.argv[2]))
    ref = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None
    starts = run["step_start_unix_ns"]
    n = len(starts)
    allocs = [0] * n
    calls = [0] * n
    mib = [0.0] * n
    call_ms = [0.0] * n
    waits = [0] * n
    wait_ms = [0.0] * n
    with open(sys.argv[1], newline="") as f:
        for row in csv.DictReader(f):
            t = int(row["time_ns"])
            i = bisect.bisect_right(starts, t) - 1
            if i < 0:
                continue
            if row["Action"] == "allocate":
                allocs[i] += 1
            elif row["Action"] == "fence_wait":
                waits[i] += 1
                wait_ms[i] += int(row["duration_ns"]) / 1e6
            elif row["Action"] in DRIVER:
                calls[i] += 1
                mib[i] += int(row["Size"]) / 2**20
                call_ms[i] += int(row["duration_ns"]) / 1e6
    host = run.get("step_host_s", [0.0] * n)
    print("step  ms      host_ms  ref_ms  allocs  driver_events  MiB     driver_ms  waits  wait_ms")
    for i in range(n):
        r = f"{1e3 * ref['step_s'][i]:7.2f}" if ref else "      -"
        print(f"{i:4d}  {1e3 * run['step_s'][i]:6.2f}  {1e3 * host[i]:7.2f}  {r}  {allocs[i]:6d}  {calls[i]:13d}  "
              f"{mib[i]:6.0f}  {call_ms[i]:9.2f}  {waits[i]:5d}  {wait_ms[i]:7.2f}")
    warm = range(5, n)
    with_calls = [1e3 * run["step_s"][i] for i in warm if calls[i]]
    without = [1e3 * run["step_s"][i] for i in warm if not calls[i]]
    med = lambda v: f"{statistics.median(v):.2f} ms" if v else "-"
    print(f"after warm-up: {len(with_calls)} steps with driver calls (median {med(with_calls)}), "
          f"{len(without)} without (median {med(without)}); driver time {sum(call_ms[5:]):.1f} ms, "
          f"{sum(waits[5:])} fence waits {sum(wait_ms[5:]):.1f} ms in all")


if __name__ == "__main__":
    main()
