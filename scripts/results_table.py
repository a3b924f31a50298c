#!/usr/bin/env python3
"""Renders README.md's results table from docs/results.tsv.

The table sits between `<!-- results:begin -->` and `<!-- results:end -->`. Every figure in it
comes from one row of the TSV, which names the measurement's device, date, library commit, command
and the docs/benchmarks.md section that documents it; the only arithmetic done here is the peak
ratios, from two peaks of the same run.

  python3 scripts/results_table.py            # rewrite README.md's table
  python3 scripts/results_table.py --check    # exit 1 when README.md's table differs
"""

import argparse
import os
import re
import sys

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
COLUMNS = ["id", "workload", "metric", "mode", "value", "unit", "device", "date", "commit", "command", "section"]
MODES = [("native", "PyTorch native caching allocator"), ("ptexp", "PyTorch expandable segments"),
         ("default", "cudapool default (path A)")]
WORKLOADS = {
    "resnet50_infer": "ResNet-50 inference",
    "hf_gpt2_train": "HF GPT-2 training",
    "resnet50_train": "ResNet-50 training",
}
MISSING = "not in that run"


class ResultsError(Exception):
    pass


def read_rows(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ResultsError(f"cannot read {path}: {e.strerror}; run from the repository root or pass --tsv")
    if not lines or lines[0].split("\t") != COLUMNS:
        raise ResultsError(f"{path}: the first line must be the header: {' '.join(COLUMNS)} (tab-separated)")
    rows = {}
    for n, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        if len(cells) != len(COLUMNS):
            raise ResultsError(f"{path}:{n}: {len(cells)} fields, expected {len(COLUMNS)} (tab-separated)")
        row = dict(zip(COLUMNS, cells))
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]):
            raise ResultsError(f"{path}:{n}: date '{row['date']}' is not YYYY-MM-DD")
        if row["commit"] != "n/a" and not re.fullmatch(r"[0-9a-f]{7,40}", row["commit"]):
            raise ResultsError(f"{path}:{n}: commit '{row['commit']}' is neither a commit hash nor n/a")
        if not row["section"] or not row["command"]:
            raise ResultsError(f"{path}:{n}: '{row['id']}' names no command or no section")
        if row["id"] in rows:
            raise ResultsError(f"{path}:{n}: id '{row['id']}' appears twice")
        rows[row["id"]] = row
    return rows


def check_sections(rows, docs):
    """Each row's section is a heading of docs/benchmarks.md (or of docs/history.md)."""
    headings = set()
    for name in ("benchmarks.md", "history.md"):
        path = os.path.join(docs, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                headings.update(line.lstrip("#").strip() for line in f if line.startswith("#"))
    for row in rows.values():
        if row["section"] not in headings:
            raise ResultsError(f"results.tsv: '{row['id']}' cites the section '{row['section']}', "
                               f"which is no heading of {docs}/benchmarks.md; fix the row's section")


class Notes:
    """One footnote per source (section, device, date); cells cite them by number."""

    def __init__(self):
        self.keys = []
        self.commits = {}

    def mark(self, *rows):
        marks = []
        for row in rows:
            key = (row["section"], row["device"], row["date"])
            if key not in self.keys:
                self.keys.append(key)
                self.commits[key] = []
            if row["commit"] != "n/a" and row["commit"] not in self.commits[key]:
                self.commits[key].append(row["commit"])
            mark = f"[{self.keys.index(key) + 1}]"
            if mark not in marks:
                marks.append(mark)
        return "".join(marks)

    def lines(self):
        out = []
        for i, key in enumerate(self.keys, start=1):
            section, device, date = key
            commits = self.commits[key]
            lib = f"cudapool {', '.join(commits)}" if commits else "cudapool's commit not named there"
            out.append(f"[{i}] {device}, {date}, {lib}: docs/benchmarks.md, \"{section}\".")
        return out


def find(rows, workload, metric, mode):
    for row in rows.values():
        if row["workload"] == workload and row["metric"] == metric and row["mode"] == mode:
            return row
    return None


def step_cell(rows, notes, workload, mode):
    step = find(rows, workload, "step_ms", mode)
    if step is None:
        return MISSING
    if mode == "native":
        return f"1× ({step['value']} ms) {notes.mark(step)}"
    ratio = find(rows, workload, "step_vs_native", mode)
    if ratio is None:
        raise ResultsError(f"results.tsv: {workload} {mode} has a step time but no step_vs_native row")
    bold = "**" if mode == "default" else ""
    return f"{bold}{ratio['value']}×{bold} ({step['value']} ms) {notes.mark(ratio, step)}"


def peak_cell(rows, notes, workload, mode):
    peak = find(rows, workload, "peak_gib", mode)
    if peak is None:
        return MISSING
    parts = [f"{peak['value']} GiB"]
    native = find(rows, workload, "peak_gib", "native")
    floor = find(rows, workload, "peak_gib", "nocache")
    used = [peak]
    if mode != "native" and native is not None and native["section"] == peak["section"]:
        parts.append(f"{float(peak['value']) / float(native['value']):.2f}× native")
        used.append(native)
    if floor is not None and floor["section"] == peak["section"]:
        parts.append(f"{float(peak['value']) / float(floor['value']):.3f}× floor")
        used.append(floor)
    text = parts[0] + (" = " + ", ".join(parts[1:]) if len(parts) > 1 else "")
    if mode == "default":
        text = f"**{text}**"
    return f"{text} {notes.mark(*used)}"


def simple_cell(rows, notes, workload, metric, mode, fmt):
    row = find(rows, workload, metric, mode)
    if row is None:
        return MISSING
    return f"{fmt(row)} {notes.mark(row)}"


def pair_text(row):
    return f"**{row['value']} ns**" if row["mode"] == "default" else f"{row['value']} ns"


def share_cell(rows, notes, mode, how):
    served = find(rows, "share_5_servers_7gib", "served", mode)
    lost = find(rows, "share_5_servers_7gib", "lost", mode)
    if served is None or lost is None:
        return MISSING
    bold = "**" if mode == "default" else ""
    return f"{bold}{served['value']}{bold} served, {lost['value']} lost ({how}) {notes.mark(served, lost)}"


def park_cell(rows, notes):
    got = [find(rows, "share_5_servers_park_7gib", metric, "default") for metric in ("served", "lost", "peak_gib")]
    if any(r is None for r in got):
        return MISSING
    served, lost, peak = got
    return (f"**{served['value']}** served, {lost['value']} lost, NVML peak {peak['value']} GiB "
            f"(group budget with parking) {notes.mark(served, lost, peak)}")


def render(rows):
    notes = Notes()
    head = "| figure | " + " | ".join(m[1] for m in MODES) + " |"
    out = [head, "|---" * (len(MODES) + 1) + "|"]

    def line(label, cells):
        out.append(f"| {label} | " + " | ".join(cells) + " |")

    for wl, name in WORKLOADS.items():
        line(f"step time vs native, {name}", [step_cell(rows, notes, wl, m) for m, _ in MODES])
    for wl, name in WORKLOADS.items():
        line(f"peak GPU memory (NVML), {name}", [peak_cell(rows, notes, wl, m) for m, _ in MODES])
    line("largest GPT-2 small batch under a 12 GiB cap",
         [simple_cell(rows, notes, "hf_gpt2_small_cap12gib", "largest_batch", m, lambda r: r["value"])
          for m, _ in MODES])
    line("5 HF model servers sharing one GPU in 7 GiB: requests served, processes lost",
         [share_cell(rows, notes, "native", "`set_per_process_memory_fraction`"), MISSING,
          share_cell(rows, notes, "default", "one group budget")])
    line("5 HF model servers needing 1.45× a 7 GiB budget, with parking: requests served, processes lost, NVML peak",
         ["no way to move a process's memory out", MISSING, park_cell(rows, notes)])
    line("`cudaMalloc`/`cudaFree` pair, 256 B–512 MiB: a tight loop in a program with no other stream",
         [simple_cell(rows, notes, "alloc_free_pair_tight", "pair_ns", m, pair_text) for m, _ in MODES])
    out.append("")
    out.append("Step: the median over rounds of each round's ratio to that round's native process (the "
               "step in ms: median over processes). Floor: the same run's PyTorch with no cache at all "
               "(`PYTORCH_NO_CUDA_MEMORY_CACHING=1`). Generated from docs/results.tsv by "
               "`make docs`; each row there names its command.")
    out.append("")
    notes_lines = notes.lines()
    out.extend(text + ("\\" if i + 1 < len(notes_lines) else "") for i, text in enumerate(notes_lines))
    return "\n".join(out) + "\n"


def splice(text, table, path):
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ResultsError(f"{path}: needs exactly one '{BEGIN}' followed by one '{END}'")
    start = text.index(BEGIN) + len(BEGIN)
    return text[:start] + "\n" + table + text[text.index(END):]


def main(argv):
    ap = argparse.ArgumentParser(description="README.md's results table from docs/results.tsv")
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md's table differs from the render")
    ap.add_argument("--readme", default="README.md")
    ap.add_argument("--tsv", default="docs/results.tsv")
    ap.add_argument("--docs", default="docs", help="the folder holding benchmarks.md")
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.tsv)
        check_sections(rows, args.docs)
        table = render(rows)
        try:
            with open(args.readme, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ResultsError(f"cannot read {args.readme}: {e.strerror}")
        new = splice(text, table, args.readme)
    except ResultsError as e:
        print(f"results_table: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"results_table: {args.readme}'s results table differs from {args.tsv}; "
                  "run `make docs` (or python3 scripts/results_table.py) and commit both", file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
