#!/usr/bin/env bash
# Multi-process model serving under one memory budget on one GPU: five HF transformers model
# servers (tests/gpu/serve_worker.py: a 1.1B Llama, GPT-2 large, medium and small generating with
# KV caches, a BERT-large encoder; random weights built from configs, nothing downloaded), each
# serving REQUESTS requests at once with the others, under each way of sharing:
#   fraction    PyTorch's allocator, set_per_process_memory_fraction(budget / 5) each: the static
#               partition, the baseline
#   group       cudapool, one group budget on each process's whole footprint (the default)
#   group_pool  cudapool, one group budget on the pools only (group_budget_counts:pool)
#   group_park  cudapool, one group budget with parking (group_park:on): idle servers' memory
#               moves to their host memory and comes back, at the same addresses, at their next
#               request; reported with each model's request latency (p50/p99) and the times of
#               the parks and restores from the servers' logs
#   unlimited   PyTorch's allocator, no limit: what the five need together
# For each: requests served and lost, processes lost (could not load their model), and the NVML
# peak of the GPU above its idle level (tests/gpu/nvml_peak.cpp) against the budget.
#
#   bash tests/gpu/share_serve.sh            (about 10 minutes on one H200: seven rounds)
#
# Environment: SHIM (build/release/libcudapool.so), GPU_BIN (build/gpu-bin: nvml_peak, from
# `bash tests/gpu/build.sh build/gpu-bin cuda`), OUT (build/serve-out), BUDGETS_GIB ("7 10": one
# round of the budgeted modes per budget), REQUESTS (8), STARTUP_S (40: time for every process to
# import torch and build its model before the common start), GPU (0), MODES (unlimited fraction
# group group_pool; group_park is asked for by name), GAP_S (0: seconds each server idles between
# its requests), PARK_IDLE_MS (500: group_park_idle_ms of the group_park mode).
# Writes $OUT/summary.md. Exit 1 when, in a group run at a budget the unlimited run's peak fits
# under, a process or a request was lost, the NVML peak exceeded the budget by more than 2 %, or
# fewer requests were served than under static fractions at the same budget; and when, in a
# group_park run at a budget the unlimited peak exceeds, a process or a request was lost or the
# NVML peak exceeded the budget by more than 2 %.
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
MODELS=(llama-1b gpt2-large gpt2-medium gpt2-small bert-large)
K=${#MODELS[@]}
if [ "${1:-}" = __concurrent ]; then
  # Internal: the K servers of mode $2 at budget $3 GiB, with a common start; waits for all.
  mode=$2 budget=$3
  start_at=$(python3 -c "import time; print(time.time() + ${STARTUP_S:-40})")
  pids=()
  for i in $(seq 0 $((K - 1))); do
    m=${MODELS[$i]}
    envs=(CUDA_VISIBLE_DEVICES="$GPU")
    conf="group:$GROUP$budget,group_budget_mb:$((budget * 1024)),group_release_wait_ms:2000,expandable_segments:True,log_level:info"
    case $mode in
      group) envs+=(LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_CONF="$conf") ;;
      group_park) envs+=(LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1
                         CUDAPOOL_CONF="${conf/group:$GROUP/group:${GROUP}k},group_park:on,group_park_idle_ms:$PARK_IDLE_MS,group_park_wait_ms:120000") ;;
      group_pool) envs+=(LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1
                         CUDAPOOL_CONF="${conf/group:$GROUP/group:${GROUP}p},group_budget_counts:pool") ;;
      fraction) envs+=(SERVE_FRACTION="$(python3 -c "print(min(1.0, $budget * 1024 / $K / $TOTAL_MIB))")") ;;
    esac
    env "${envs[@]}" timeout 600 python3 "$REPO/tests/gpu/serve_worker.py" --model "$m" --seed "$i" \
      --requests "$REQUESTS" --gap "$GAP_S" --start-at "$start_at" --out "$OUT/${mode}_${budget}_$m.json" \
      >"$OUT/${mode}_${budget}_$m.log" 2>&1 &
    pids+=($!)
  done
  if [[ "$mode" = group* ]] && [ -x "$REPO/build/release/cudapool" ]; then
    ( sleep "$(python3 -c "print(${STARTUP_S:-40} + 5)")"
      "$REPO/build/release/cudapool" top --once >"$OUT/top_${mode}_$budget.txt" 2>&1 ) &
  fi
  for p in "${pids[@]}"; do wait "$p"; done
  wait
  exit 0
fi

export SHIM=${SHIM:-$REPO/build/release/libcudapool.so}
export GPU_BIN=${GPU_BIN:-$REPO/build/gpu-bin}
export OUT=${OUT:-$REPO/build/serve-out}
export REQUESTS=${REQUESTS:-8}
export STARTUP_S=${STARTUP_S:-40}
export GPU=${GPU:-0}
export GAP_S=${GAP_S:-0}
export PARK_IDLE_MS=${PARK_IDLE_MS:-500}
export GROUP=serve$$
BUDGETS_GIB=${BUDGETS_GIB:-7 10}
MODES=${MODES:-unlimited fraction group group_pool}
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log "$OUT"/top_*.txt
[ -f "$SHIM" ] || { echo "no shim at $SHIM (build it with make, carry build/release/libcudapool.so)"; exit 2; }
[ -x "$GPU_BIN/nvml_peak" ] || { echo "no $GPU_BIN/nvml_peak (bash tests/gpu/build.sh $GPU_BIN cuda)"; exit 2; }
python3 -c 'import torch, transformers; assert torch.cuda.is_available()' || { echo "torch with CUDA and transformers are needed"; exit 2; }
export TOTAL_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "$GPU" | tr -d ' ')
echo "share_serve: ${MODELS[*]}, $REQUESTS requests each ${GAP_S}s apart, budgets $BUDGETS_GIB GiB of $TOTAL_MIB MiB"

for mode in $MODES; do
  budgets=$BUDGETS_GIB
  [ "$mode" = unlimited ] && budgets=0
  for b in $budgets; do
    "$GPU_BIN/nvml_peak" "$OUT/nvml_${mode}_$b.json" -- bash "$0" __concurrent "$mode" "$b"
    echo "$mode at $b GiB: done"
  done
done

python3 - "$OUT" "$REQUESTS" "$BUDGETS_GIB" "$MODES" "${MODELS[@]}" <<'PY'
import os, sys
sys.path.insert(0, "tests/gpu")
from share_files import load_json, nvml_peak_gib
out, requests, budgets, modes, models = sys.argv[1], int(sys.argv[2]), [int(b) for b in sys.argv[3].split()], sys.argv[4].split(), sys.argv[5:]
def run(mode, b):
    rs = [load_json(os.path.join(out, f"{mode}_{b}_{m}.json")) for m in models]
    served = sum(r["served"] for r in rs if r)
    lost_procs = sum(1 for r in rs if not r or not r["loaded"])
    return {"served": served, "total": requests * len(models), "lost_procs": lost_procs,
            "lost_requests": requests * len(models) - served, "peak": nvml_peak_gib(os.path.join(out, f"nvml_{mode}_{b}.json")),
            "per_model": {m: (r["served"] if r else None) for m, r in zip(models, rs)}}
names = {"unlimited": "no limit (PyTorch)", "fraction": "PyTorch per-process fraction (budget/5 each)",
         "group": "cudapool group budget, whole footprint", "group_pool": "cudapool group budget, pools only",
         "group_park": "cudapool group budget with parking"}
lines = ["| sharing | budget | served | processes lost | NVML peak above idle | per model served |", "|---|---|---|---|---|---|"]
results = {}
for mode in modes:
    for b in ([0] if mode == "unlimited" else budgets):
        r = results[(mode, b)] = run(mode, b)
        peak = "n/a" if r["peak"] is None else f"{r['peak']:.2f} GiB"
        per = ", ".join(f"{m} {v if v is not None else 'lost'}" for m, v in r["per_model"].items())
        lines.append(f"| {names[mode]} | {'—' if b == 0 else f'{b} GiB'} | {r['served']} of {r['total']} | {r['lost_procs']} | {peak} | {per} |")
verdicts, failed = [], False
def peak_verdict(mode, b, r):
    """The NVML peak of a budgeted run against the budget + 2 %: a verdict line; false when over."""
    if r["peak"] is None:
        return True
    ok = r["peak"] <= b * 1.02
    verdicts.append(f"{'PASS' if ok else 'FAIL'} {mode} at {b} GiB: NVML peak {r['peak']:.2f} GiB <= budget + 2 % ({b * 1.02:.2f} GiB)")
    return ok
demand = results.get(("unlimited", 0), {}).get("peak")
for b in budgets:
    g, f = results.get(("group", b)), results.get(("fraction", b))
    if g is None:
        continue
    failed |= not peak_verdict("group", b, g)
    fits = demand is not None and demand <= b
    if fits:
        ok = g["lost_procs"] == 0 and g["lost_requests"] == 0
        failed |= not ok
        verdicts.append(f"{'PASS' if ok else 'FAIL'} group at {b} GiB: total demand ({demand:.2f} GiB unlimited) fits; {g['lost_procs']} processes and {g['lost_requests']} requests lost")
    else:
        verdicts.append(f"INFO group at {b} GiB: total demand {'unknown' if demand is None else f'{demand:.2f} GiB'} does not fit the budget; {g['lost_procs']} processes and {g['lost_requests']} requests lost")
    if f is not None:
        ok = g["served"] >= f["served"]
        failed |= not ok
        verdicts.append(f"{'PASS' if ok else 'FAIL'} group at {b} GiB serves {g['served']} requests, static fractions {f['served']}")
    gp = results.get(("group_pool", b))
    if gp is not None and gp["peak"] is not None:
        verdicts.append(f"INFO pools-only group at {b} GiB: NVML peak {gp['peak']:.2f} GiB ({(gp['peak'] / b - 1) * 100:+.0f} % of the budget)")
def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else None
import re
park_re = re.compile(r"parking: parked (\d+) bytes .* in ([0-9.]+) ms")
restore_re = re.compile(r"parking: restored (\d+) bytes in ([0-9.]+) ms")
lat_lines = []
for mode in ("group", "group_park", "unlimited"):
    if mode not in modes:
        continue
    for b in ([0] if mode == "unlimited" else budgets):
        lat_lines.append(f"| {names[mode]} | {'—' if b == 0 else f'{b} GiB'} | " + " | ".join(
            (lambda r: "lost" if not r or not r.get("latencies") else
             f"{pct(r['latencies'], 50):.2f} / {pct(r['latencies'], 99):.2f}")(load_json(os.path.join(out, f"{mode}_{b}_{m}.json")))
            for m in models) + " |")
if lat_lines:
    lines += ["", "Request latency per model, p50 / p99 seconds (waits for memory included):", "",
              "| sharing | budget | " + " | ".join(models) + " |", "|---|---|" + "---|" * len(models)] + lat_lines
for b in budgets:
    if "group_park" not in modes:
        break
    p = results.get(("group_park", b))
    parks, restores, per_model = [], [], {}
    for m in models:
        try:
            log = open(os.path.join(out, f"group_park_{b}_{m}.log"), errors="replace").read()
        except OSError:
            continue
        ps = [(int(n), float(ms)) for n, ms in park_re.findall(log)]
        rs = [(int(n), float(ms)) for n, ms in restore_re.findall(log)]
        parks += ps
        restores += rs
        per_model[m] = (len(ps), pct([ms for _, ms in rs], 50))
    def per_gib(xs):
        v = [ms / (n / 2**30) for n, ms in xs if n >= 2**28]
        return f"{pct(v, 50):.0f} ms per GiB (median of {len(v)})" if v else "none of 256 MiB or more"
    verdicts.append(f"INFO group_park at {b} GiB: {len(parks)} parks, {len(restores)} restores; park {per_gib(parks)}, restore {per_gib(restores)}")
    verdicts.append("INFO group_park at " + str(b) + " GiB, switch time (median restore) per model: " + ", ".join(
        f"{m} {k} parks, {'-' if r is None else f'{r / 1000:.2f} s'}" for m, (k, r) in per_model.items()))
    if p is None:
        continue
    failed |= not peak_verdict("group_park", b, p)
    need = "unknown" if demand is None else f"{demand / b:.2f}x"
    ok = p["lost_procs"] == 0 and p["lost_requests"] == 0
    failed |= not ok and demand is not None and demand >= 1.3 * b
    verdicts.append(f"{'PASS' if ok else 'FAIL'} group_park at {b} GiB (the servers need {need} the budget together): "
                    f"{p['served']} of {p['total']} requests served, {p['lost_procs']} processes lost")
text = "\n".join(lines) + "\n\n" + "\n".join(verdicts) + "\n"
# What each budgeted server's log says about refusals and parking (the logs themselves may not
# come back from a lent machine): the last lines of each kind, so a lost process can be explained.
keys = re.compile(r"refus|out of memory|parking:|group budget|lost")
for mode in modes:
    for b in ([] if mode in ("unlimited", "fraction") else budgets):
        for m in models:
            try:
                log = open(os.path.join(out, f"{mode}_{b}_{m}.log"), errors="replace").read().splitlines()
            except OSError:
                continue
            hits = [l[:300] for l in log if keys.search(l)]
            if hits:
                text += f"\n{mode} at {b} GiB, {m}: {len(hits)} lines on memory; the last 6:\n" + "\n".join(
                    "    " + l for l in hits[-6:]) + "\n"
for b in budgets:
    for mode in ("group", "group_park"):
        top = os.path.join(out, f"top_{mode}_{b}.txt")
        if os.path.exists(top):
            text += f"\n`cudapool top --once` during the {mode} run at {b} GiB:\n\n```\n" + open(top).read() + "```\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text)
sys.exit(1 if failed else 0)
PY
