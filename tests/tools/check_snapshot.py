#!/usr/bin/env python3
"""Checks a PyTorch memory snapshot written by `cudapool report --snapshot` (standard library only).

Usage: check_snapshot.py SNAPSHOT.pickle [REPORT_OUTPUT]

The schema is the one torch.cuda.memory._snapshot() returns and torch.cuda._memory_viz reads;
the numbers must hold together (blocks tile their segment, segment sums are the blocks' sums,
the device trace replays to the segments and blocks of the snapshot) and, given the text that
`cudapool report` printed, agree with report's own figures. Exits 1 naming the first problem.
"""
import pickle
import re
import sys

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}


class Bad(Exception):
    pass


def need(cond, what):
    if not cond:
        raise Bad(what)


def fields(d, spec, where):
    need(isinstance(d, dict), f"{where} is not a dict")
    for name, types in spec.items():
        need(name in d, f"{where} lacks '{name}'")
        need(isinstance(d[name], types) and not (types is int and isinstance(d[name], bool)),
             f"{where}['{name}'] is {type(d[name]).__name__}, wanted {types}")


def check(snap):
    fields(snap, {"segments": list, "device_traces": list, "external_annotations": list}, "snapshot")
    figures = {"segments": 0, "reserved": 0, "allocated": 0, "requested": 0, "blocks": 0, "active": 0, "framed": 0}
    live_blocks = set()
    for i, s in enumerate(snap["segments"]):
        where = f"segments[{i}]"
        fields(s, {"device": int, "address": int, "total_size": int, "allocated_size": int, "active_size": int,
                   "requested_size": int, "stream": int, "segment_type": str, "segment_pool_id": tuple,
                   "is_expandable": bool, "frames": list, "blocks": list}, where)
        need(s["segment_type"] in ("large", "small"), f"{where} segment_type {s['segment_type']!r}")
        need(len(s["segment_pool_id"]) == 2, f"{where} segment_pool_id is not a pair")
        at, alloc, active, req = s["address"], 0, 0, 0
        for j, b in enumerate(s["blocks"]):
            bw = f"{where}.blocks[{j}]"
            fields(b, {"address": int, "size": int, "requested_size": int, "state": str, "frames": list}, bw)
            need(b["state"] in STATES, f"{bw} state {b['state']!r}")
            need(b["address"] == at, f"{bw} starts at {b['address']:#x}, the previous block ends at {at:#x}")
            need(b["size"] > 0, f"{bw} is empty")
            at += b["size"]
            for k, fr in enumerate(b["frames"]):  # PyTorch's frame: filename, line, name
                fields(fr, {"filename": str, "line": int, "name": str}, f"{bw}.frames[{k}]")
                need(fr["filename"], f"{bw}.frames[{k}] has no filename")
            need(not b["frames"] or b["state"] == "active_allocated", f"{bw} is not active but has frames")
            if b["state"] == "active_allocated":
                figures["framed"] += 1 if b["frames"] else 0
                need(b["requested_size"] <= b["size"], f"{bw} requested more than its size")
                alloc += b["size"]
                live_blocks.add(b["address"])
                figures["active"] += 1
            if b["state"] != "inactive":
                active += b["size"]
                req += b["requested_size"]
            figures["blocks"] += 1
        need(at - s["address"] == s["total_size"], f"{where}: blocks cover {at - s['address']} of {s['total_size']} bytes")
        need(alloc == s["allocated_size"], f"{where} allocated_size {s['allocated_size']} != its blocks' {alloc}")
        need(active == s["active_size"], f"{where} active_size {s['active_size']} != its blocks' {active}")
        need(req == s["requested_size"], f"{where} requested_size {s['requested_size']} != its blocks' {req}")
        figures["segments"] += 1
        figures["reserved"] += s["total_size"]
        figures["allocated"] += alloc
        figures["requested"] += req
    # The device trace, replayed, must end where the snapshot is.
    events = 0
    for d, trace in enumerate(snap["device_traces"]):
        need(isinstance(trace, list), f"device_traces[{d}] is not a list")
        live, reserved, last = {}, 0, None
        for k, e in enumerate(trace):
            ew = f"device_traces[{d}][{k}]"
            fields(e, {"action": str, "addr": int, "size": int, "stream": int, "time_us": int, "frames": list,
                       "compile_context": str, "user_metadata": str}, ew)
            need(e["action"] in ACTIONS, f"{ew} action {e['action']!r}")
            need(last is None or e["time_us"] >= last, f"{ew} goes back in time")
            last = e["time_us"]
            a = e["action"]
            if a == "alloc":
                need(e["addr"] not in live, f"{ew} allocates {e['addr']:#x} twice")
                live[e["addr"]] = e["size"]
            elif a == "free_completed":
                need(live.pop(e["addr"], None) is not None, f"{ew} frees {e['addr']:#x}, which is not allocated")
            elif a in ("segment_alloc", "segment_map"):
                reserved += e["size"]
            elif a in ("segment_free", "segment_unmap"):
                reserved -= e["size"]
            elif a == "oom":
                need("device_free" in e, f"{ew} (oom) lacks device_free")
            events += 1
        if trace:
            seg_bytes = sum(s["total_size"] for s in snap["segments"] if s["device"] == d)
            need(reserved == seg_bytes, f"device {d}: the trace reserves {reserved} B, the segments hold {seg_bytes} B")
            dev_blocks = {b["address"] for s in snap["segments"] if s["device"] == d
                          for b in s["blocks"] if b["state"] == "active_allocated"}
            need(set(live) == dev_blocks, f"device {d}: {len(live)} allocations live in the trace, "
                 f"{len(dev_blocks)} active blocks in the segments")
    figures["events"] = events
    return figures


def check_report(figures, text):
    m = re.search(r"^snapshot at [0-9.]+ s \(([^)]*)\): (\d+) segments, (\d+) B reserved, (\d+) B allocated, "
                  r"(\d+) B requested, (\d+) of (\d+) blocks active, (\d+) trace events, "
                  r"(\d+) active blocks with call sites$", text, re.M)
    need(m, "the report output has no 'snapshot at …' line")
    said = dict(segments=int(m[2]), reserved=int(m[3]), allocated=int(m[4]), requested=int(m[5]),
                active=int(m[6]), blocks=int(m[7]), events=int(m[8]), framed=int(m[9]))
    for k, v in said.items():
        need(figures[k] == v, f"report says {v} for {k}, the snapshot has {figures[k]}")
    if m[1] == "the moment of peak reserved":
        p = re.search(r"peak reserved ([0-9.]+) (\w+), fragmentation [0-9.]+ %; at the peak (\d+) segments", text)
        need(p, "the report output has no peak line")
        peak = float(p[1]) * UNITS[p[2]]
        need(abs(peak - figures["reserved"]) <= 0.006 * UNITS[p[2]],
             f"report's peak reserved {p[1]} {p[2]} is not the snapshot's {figures['reserved']} B")
        need(int(p[3]) == figures["segments"], f"report has {p[3]} segments at the peak, the snapshot {figures['segments']}")


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1], "rb") as f:
            snap = pickle.load(f)
        figures = check(snap)
        if len(sys.argv) == 3:
            with open(sys.argv[2]) as f:
                check_report(figures, f.read())
    except Bad as e:
        print(f"check_snapshot: {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    print(f"check_snapshot: {sys.argv[1]}: ok ({figures['segments']} segments, {figures['events']} events)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
