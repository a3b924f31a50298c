#!/usr/bin/env python3
"""One JSON convention for every command of `cudapool` that writes JSON (docs/tools.md, "JSON").

Runs each command with `--json -`, on success and on failure, parses stdout and checks the style:
stdout is one JSON object and nothing else; keys are snake_case; a number is a JSON number, never
a string that reads as one ("12", "4.73 GiB", "1.6 %"); a failure is
{"error": {"message": str, "exit_status": int}} with the command's own exit status.
Usage: json_style_test.py CUDAPOOL TRACES_DIR TMP_DIR
"""
import json
import os
import re
import subprocess
import sys

cp, traces, tmp = sys.argv[1:4]
NUMBER_TEXT = re.compile(r"^[+-]?[0-9]+(\.[0-9]+)?\s*(%|[KMGT]?i?B|[mun]?s|µs|x|×)?$")
KEY = re.compile(r"^[a-z][a-z0-9_.]*$")  # dots: the summary's stat names (allocation.all.peak)
failures = []


def walk(value, path, problems):
    if isinstance(value, dict):
        for k, v in value.items():
            if not KEY.match(k):
                problems.append(f"{path}: key {k!r} is not snake_case")
            walk(v, f"{path}.{k}", problems)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            walk(v, f"{path}[{i}]", problems)
    elif isinstance(value, str) and NUMBER_TEXT.match(value.strip()):
        problems.append(f"{path}: the number {value!r} is a string")


def run(name, args, want_error, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([cp] + args, capture_output=True, text=True, env=e)
    problems = []
    try:
        doc = json.loads(p.stdout)
    except ValueError as err:
        failures.append(f"{name}: stdout is not one JSON document ({err}): {p.stdout[:200]!r} / {p.stderr[-300:]!r}")
        return
    if not isinstance(doc, dict):
        problems.append("the document is not an object")
    elif want_error:
        err = doc.get("error")
        if p.returncode == 0:
            problems.append("exit status 0 for a failure")
        if not isinstance(err, dict) or set(err) != {"message", "exit_status"}:
            problems.append(f"not an error object: {doc}")
        else:
            if not isinstance(err["message"], str) or not err["message"]:
                problems.append("the error message is not a non-empty string")
            if err["exit_status"] != p.returncode:
                problems.append(f"exit_status {err['exit_status']} but the command exited {p.returncode}")
    else:
        if p.returncode != 0:
            problems.append(f"exit status {p.returncode}: {p.stderr[-300:]}")
        if "error" in doc:
            problems.append(f"an error on success: {doc['error']}")
    walk(doc, "$", problems)
    for pr in problems:
        failures.append(f"{name}: {pr}")
    print(("FAIL " if problems else "ok   ") + name)


train, serve = f"{traces}/train.csv", f"{traces}/serve.csv"
os.makedirs(f"{tmp}/shm", mode=0o700, exist_ok=True)
os.makedirs(f"{tmp}/open", exist_ok=True)
os.chmod(f"{tmp}/open", 0o777)
replay_cmd = [cp, "replay", "--quiet", train]
cases = [
    ("replay", ["replay", serve, "--conf", "", "--conf", "max_split_size_mb:64", "--json", "-"], False),
    ("replay --sweep", ["replay", serve, "--sweep", "roundup_power2_divisions=2,4", "--json", "-"], False),
    ("replay --check", ["replay", "--check", train, "--json", "-"], False),
    ("replay: missing trace", ["replay", f"{tmp}/missing.csv", "--json", "-"], True),
    ("replay: bad --sweep", ["replay", train, "--sweep", "max_split_size_mb=abc", "--json", "-"], True),
    ("replay: unknown option", ["replay", train, "--frobnicate", "--json", "-"], True),
    ("tune", ["tune", serve, "--budget", "6", "--json", "-"], False),
    ("tune: bad --conf", ["tune", serve, "--conf", "max_split_size_mb:3", "--json", "-"], True),
    ("report", ["report", train, "--json", "-"], False),
    ("report: malformed trace", ["report", f"{tmp}/junk.csv", "--json", "-"], True),
    ("check", ["check", "--conf", "max_split_size_mb:128,expandable_segments:False", "--json", "-"], False),
    ("check: invalid policy", ["check", "--conf", "max_split_size_mb:abc", "--json", "-"], True),
    ("ab", ["ab", "--no-preload", "--hide-output", "--a", "", "--b", "max_split_size_mb:64", "-n", "1",
            "--json", "-", "--"] + replay_cmd, False),
    ("ab: no such program", ["ab", "--a", "", "--b", "", "--json", "-", "--", f"{tmp}/no-such-program"], True),
    ("top", ["top", "--once", "--json", "-"], False, {"CUDAPOOL_SHM_DIR": f"{tmp}/shm"}),
    ("top: unusable directory", ["top", "--once", "--json", "-"], True, {"CUDAPOOL_SHM_DIR": f"{tmp}/open"}),
]
with open(f"{tmp}/junk.csv", "w") as f:
    f.write("hello,world\n1,2\n")
for c in cases:
    run(c[0], c[1], c[2], c[3] if len(c) > 3 else None)
# A --json file gets the same: the error object when the command fails.
p = subprocess.run([cp, "check", "--conf", "bogus:1", "--json", f"{tmp}/err.json"], capture_output=True, text=True)
try:
    doc = json.load(open(f"{tmp}/err.json"))
    assert doc["error"]["exit_status"] == p.returncode == 78 and "bogus" in doc["error"]["message"], doc
    print("ok   check --json FILE on error")
except (OSError, ValueError, KeyError, AssertionError) as err:
    failures.append(f"check --json FILE on error: {err}")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
