#!/usr/bin/env bash
# K PyTorch processes sharing one GPU in one cudapool group (group budget + cooperative release),
# against the same processes on PyTorch's own caching allocator. Each process runs an
# inference-like loop (tests/gpu/share_worker.py) with one burst of BIG_GIB at its own moment;
# the bursts come one after another, so the processes never need more than one burst at a time,
# but each keeps its burst cached afterwards.
#
#   bash tests/gpu/share_group.sh [K]            (K defaults to 4)
#
# Environment: SHIM (build/release/libcudapool.so), GPU_BIN (build/gpu-bin: nvml_peak, from
# `bash tests/gpu/build.sh build/gpu-bin cuda`), OUT (build/share-out), BIG_GIB (20),
# BUDGET_GIB (BIG_GIB + 3*K + 4: one burst plus every process's small working set),
# WAIT_MS (group_release_wait_ms, 2000), STARTUP_S (25: time for every process to import torch
# and start CUDA before the common window starts), GPU (0).
#
# Runs, in order: every process alone under the shim; every process alone on PyTorch's
# allocator; all K at once under the shim in one group (NVML peak, `cudapool top --once` in the
# middle); all K at once on PyTorch's allocator without limits (NVML peak); all K at once on
# PyTorch's allocator with set_per_process_memory_fraction(budget / K) (the static partition).
# Prints one table and the verdicts; writes them to $OUT/summary.md. Exit 1 when a group process
# ran out of memory or missed its burst, or the group's NVML peak exceeded the budget plus 1.5 GiB
# per process (contexts, cuBLAS workspaces).
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
if [ "${1:-}" = __concurrent ]; then
  # Internal: start K workers of mode $2 with a common window and wait for all of them.
  shift
  mode=$1
  start_at=$(python3 -c "import time; print(time.time() + ${STARTUP_S:-25})")
  pids=()
  for i in $(seq 0 $((K - 1))); do
    worker "$mode" "$i" "$start_at" &
    pids+=($!)
  done
  if [ "$mode" = group ] && [ -x "$REPO/build/release/cudapool" ]; then
    ( sleep "$(python3 -c "print(${STARTUP_S:-25} + ${WINDOW_S} / 2)")"
      "$REPO/build/release/cudapool" top --once >"$OUT/top_group.txt" 2>&1 ) &
  fi
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  wait
  exit $rc
fi

export K=${1:-4}
export SHIM=${SHIM:-$REPO/build/release/libcudapool.so}
export GPU_BIN=${GPU_BIN:-$REPO/build/gpu-bin}
export OUT=${OUT:-$REPO/build/share-out}
export BIG_GIB=${BIG_GIB:-20}
export BUDGET_GIB=${BUDGET_GIB:-$((BIG_GIB + 3 * K + 4))}
export WAIT_MS=${WAIT_MS:-2000}
export STARTUP_S=${STARTUP_S:-25}
export GPU=${GPU:-0}
export GAP_S=2.5
export WINDOW_S=$(python3 -c "print(1.0 + $K * $GAP_S + 1.5)")
export GROUP=sharegpu$$
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log
[ -f "$SHIM" ] || { echo "no shim at $SHIM (build it with make, carry build/release/libcudapool.so)"; exit 2; }
python3 -c 'import torch; assert torch.cuda.is_available()' || { echo "torch with CUDA is needed"; exit 2; }
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "$GPU" | tr -d ' ')
export FRACTION=$(python3 -c "print(min(1.0, $BUDGET_GIB * 1024 / $K / $total_mib))")
echo "share_group: K=$K bursts of $BIG_GIB GiB, budget $BUDGET_GIB GiB of ${total_mib} MiB, window ${WINDOW_S} s, group $GROUP"

# worker MODE I START_AT: process I in MODE (shim_alone, torch_alone, group, torch, torch_frac).
worker() {
  local mode=$1 i=$2 start=$3
  local args=(--name "p$i" --out "$OUT/${mode}_p$i.json" --start-at "$start" --window "$WINDOW_S"
              --big-gib "$BIG_GIB" --big-at "$(python3 -c "print(1.0 + $i * $GAP_S)")" --big-for 1.5 --seed "$i")
  local envs=(CUDA_VISIBLE_DEVICES="$GPU")
  case $mode in
    shim_alone) envs+=(LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1
                       CUDAPOOL_CONF="group:${GROUP}_alone$i,group_budget_mb:$((BUDGET_GIB * 1024)),group_release_wait_ms:$WAIT_MS,expandable_segments:True") ;;
    group) envs+=(LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1
                  CUDAPOOL_CONF="group:$GROUP,group_budget_mb:$((BUDGET_GIB * 1024)),group_release_wait_ms:$WAIT_MS,expandable_segments:True,log_level:info") ;;
    torch_frac) envs+=(SHARE_FRACTION="$FRACTION") ;;
  esac
  env "${envs[@]}" timeout 240 python3 "$REPO/tests/gpu/share_worker.py" "${args[@]}" >"$OUT/${mode}_p$i.log" 2>&1
}
export -f worker

for mode in shim_alone torch_alone; do
  for i in $(seq 0 $((K - 1))); do
    worker "$mode" "$i" 0 || echo "$mode p$i failed (see $OUT/${mode}_p$i.log)"
  done
done
for mode in group torch torch_frac; do
  if [ -x "$GPU_BIN/nvml_peak" ]; then
    "$GPU_BIN/nvml_peak" "$OUT/nvml_$mode.json" -- bash "$0" __concurrent "$mode"
  else
    bash "$0" __concurrent "$mode"
  fi
  echo "$mode: done (rc $?)"
done

python3 - "$OUT" "$K" "$BUDGET_GIB" "$BIG_GIB" <<'PY'
import os, sys
sys.path.insert(0, "tests/gpu")
from share_files import load_json, nvml_peak_gib
out, K, budget_gib, big_gib = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
def load(mode, i):
    return load_json(os.path.join(out, f"{mode}_p{i}.json"))
def nvml(mode):
    return nvml_peak_gib(os.path.join(out, f"nvml_{mode}.json"))
modes = ["shim_alone", "torch_alone", "group", "torch", "torch_frac"]
lines = ["| process | " + " | ".join(f"{m} steps/s (OOMs, burst)" for m in modes) + " |",
         "|---|" + "---|" * len(modes)]
for i in range(K):
    cells = []
    for m in modes:
        r = load(m, i)
        cells.append("missing" if r is None else f"{r['steps_per_s']:.1f} ({r['ooms']}, {'ok' if r['big_ok'] else 'MISSED'})")
    lines.append(f"| p{i} | " + " | ".join(cells) + " |")
verdicts, failed = [], False
group = [load("group", i) for i in range(K)]
fit = all(r is not None and r["ooms"] == 0 and r["big_ok"] for r in group)
failed |= not fit
verdicts.append(f"{'PASS' if fit else 'FAIL'} group: all {K} processes ran without OOM and got their {big_gib:g} GiB burst under a {budget_gib:g} GiB budget")
frac = [load("torch_frac", i) for i in range(K)]
frac_ooms = sum(r["ooms"] for r in frac if r)
frac_fit = sum(1 for r in frac if r and r["ooms"] == 0 and r["big_ok"])
verdicts.append(f"INFO PyTorch with a static partition (budget/K each): {frac_fit} of {K} processes fit, {frac_ooms} OOMs")
torch_c = [load("torch", i) for i in range(K)]
torch_fit = sum(1 for r in torch_c if r and r["ooms"] == 0 and r["big_ok"])
gp, tp, fp = nvml("group"), nvml("torch"), nvml("torch_frac")
fmt = lambda v: "n/a" if v is None else f"{v:.2f} GiB"
verdicts.append(f"INFO NVML peak above baseline: group {fmt(gp)}, PyTorch unlimited {fmt(tp)} ({torch_fit} of {K} fit), PyTorch partitioned {fmt(fp)}")
if gp is not None:
    ok = gp <= budget_gib + 1.5 * K
    failed |= not ok
    verdicts.append(f"{'PASS' if ok else 'FAIL'} group NVML peak {gp:.2f} GiB <= budget {budget_gib:g} GiB + {1.5 * K:g} GiB for {K} contexts")
def ratios(a, b):
    out = []
    for i in range(K):
        x, y = load(a, i), load(b, i)
        if x and y and y["steps_per_s"] > 0:
            out.append(x["steps_per_s"] / y["steps_per_s"])
    return out
r_alone = ratios("group", "shim_alone")
r_torch = ratios("group", "torch")
r_ta = ratios("torch_alone", "shim_alone")
if r_torch:
    ok = min(r_torch) >= 0.95
    verdicts.append(f"{'PASS' if ok else 'FAIL'} throughput, group vs the same {K} processes on PyTorch's allocator at once: min {min(r_torch):.3f}, per process {', '.join(f'{v:.3f}' for v in r_torch)} (target >= 0.95)")
if r_alone:
    verdicts.append(f"INFO throughput, group vs each process alone under the shim: min {min(r_alone):.3f}, per process {', '.join(f'{v:.3f}' for v in r_alone)} (the GPU is time-sliced between {K} processes)")
if r_ta:
    verdicts.append(f"INFO throughput alone, PyTorch's allocator vs the shim: {', '.join(f'{v:.3f}' for v in r_ta)}")
text = "\n".join(lines) + "\n\n" + "\n".join(verdicts) + "\n"
top = os.path.join(out, "top_group.txt")
if os.path.exists(top):
    text += "\n`cudapool top --once` in the middle of the group run:\n\n```\n" + open(top).read() + "```\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text)
sys.exit(1 if failed else 0)
PY
