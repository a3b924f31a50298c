#!/usr/bin/env bash
# A trainer and an evaluator sharing one GPU (tests/gpu/train_eval_worker.py): GPT-2 training
# steps whose memory swings every step, next to a larger GPT-2 that scores a big batch every
# second and sleeps in between. Under one cudapool group budget, against the same pair on
# PyTorch's own caching allocator, unlimited and statically partitioned.
#
#   bash tests/gpu/share_train_eval.sh
#
# Environment: SHIM (build/release/libcudapool.so), GPU_BIN (build/gpu-bin: nvml_peak, from
# `bash tests/gpu/build.sh build/gpu-bin cuda`), OUT (build/train-eval-out), BUDGET_GIB (38:
# the two live peaks together, ~18 GiB each, plus 2; well below what the pair holds on PyTorch's
# allocator, ~49 GiB), WINDOW_S (15), EVAL_BATCH (32 sequences of 1024 tokens a burst),
# TIGHT_GIB (unset: an extra group run under this smaller budget, reported for information),
# PAIRS_ONLY=1 with PAIR_REPS (3): instead of all the above, PAIR_REPS interleaved rounds of the
# pair in the group and on PyTorch's allocator unlimited, and the median ratios (the throughput of
# one pair of processes varies by tens of percent from run to run),
# WAIT_MS (group_release_wait_ms, 2000), STARTUP_S (30: time to import torch and build both
# models before the common window), GPU (0).
#
# Runs, in order: the trainer alone and the evaluator alone under the shim; both at once under
# the shim in one group (NVML peak); both at once on PyTorch's allocator without limits (NVML
# peak); both at once on PyTorch's allocator with set_per_process_memory_fraction splitting the
# budget in proportion to the peaks each reserved in the unlimited run (the best static
# partition). The trainer is pinned to CPU 2, the evaluator to CPU 3 (where there are CPUs).
# Prints one table and the verdicts; writes them to $OUT/summary.md. Exit 1 when a group process
# ran out of memory, the group's NVML peak exceeded the budget plus 1.5 GiB per process, or the
# trainer's or the evaluator's losses in the group differ from its losses alone; with PAIRS_ONLY,
# when a group process ran out of memory or a round is missing.
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
SHIM=${SHIM:-$REPO/build/release/libcudapool.so}
GPU_BIN=${GPU_BIN:-$REPO/build/gpu-bin}
OUT=${OUT:-$REPO/build/train-eval-out}
BUDGET_GIB=${BUDGET_GIB:-38}
WINDOW_S=${WINDOW_S:-15}
EVAL_BATCH=${EVAL_BATCH:-32}
WAIT_MS=${WAIT_MS:-2000}
STARTUP_S=${STARTUP_S:-30}
GPU=${GPU:-0}
TIGHT_GIB=${TIGHT_GIB:-}
GROUP=traineval$$
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log
[ -f "$SHIM" ] || { echo "no shim at $SHIM (build it with make, carry build/release/libcudapool.so)"; exit 2; }
python3 -c 'import torch, transformers; assert torch.cuda.is_available()' ||
  { echo "torch with CUDA and transformers are needed"; exit 2; }
echo "share_train_eval: budget $BUDGET_GIB GiB, window $WINDOW_S s, eval batch $EVAL_BATCH, group $GROUP"

pin() {  # pin CPU: the taskset prefix, or nothing
  if command -v taskset >/dev/null && [ "$(nproc)" -gt "$1" ]; then echo "taskset -c $1"; fi
}
# worker MODE ROLE START_AT [FRACTION]
worker() {
  local mode=$1 role=$2 start=$3 frac=${4:-}
  local cpu=2
  [ "$role" = eval ] && cpu=3
  local envs=(CUDA_VISIBLE_DEVICES="$GPU" CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0
              PYTHONPATH="$REPO/tests/gpu")
  case $mode in
    shim_alone) envs+=(LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1
                       CUDAPOOL_CONF="group:${GROUP}_$role,group_budget_mb:$((BUDGET_GIB * 1024)),group_release_wait_ms:$WAIT_MS") ;;
    group) envs+=(LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1
                  CUDAPOOL_CONF="group:$GROUP,group_budget_mb:$((BUDGET_GIB * 1024)),group_release_wait_ms:$WAIT_MS,log_level:info") ;;
    group_tight) envs+=(LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1
                        CUDAPOOL_CONF="group:${GROUP}t,group_budget_mb:$((TIGHT_GIB * 1024)),group_release_wait_ms:$WAIT_MS,log_level:info") ;;
    torch_frac) envs+=(SHARE_FRACTION="$frac") ;;
  esac
  # shellcheck disable=SC2046
  env "${envs[@]}" timeout 300 $(pin $cpu) python3 "$REPO/tests/gpu/train_eval_worker.py" --role "$role" \
    --out "$OUT/${mode}${RUN_TAG}_$role.json" --start-at "$start" --window "$WINDOW_S" --eval-batch "$EVAL_BATCH" \
    >"$OUT/${mode}${RUN_TAG}_$role.log" 2>&1
}
RUN_TAG=
export REPO SHIM OUT GROUP BUDGET_GIB TIGHT_GIB WAIT_MS WINDOW_S EVAL_BATCH GPU RUN_TAG
export -f pin worker
start_time() { python3 -c "import time; print(time.time() + $STARTUP_S)"; }
# both MODE [FRACTION_TRAIN FRACTION_EVAL]: the two at once, under nvml_peak when it was built.
both() {
  local mode=$1 ft=${2:-} fe=${3:-} at
  at=$(start_time)
  local peak=()
  [ -x "$GPU_BIN/nvml_peak" ] && peak=("$GPU_BIN/nvml_peak" "$OUT/nvml_$mode$RUN_TAG.json" --)
  "${peak[@]}" bash -c "worker $mode train $at $ft & worker $mode eval $at $fe & wait"
  echo "$mode$RUN_TAG: done"
}

if [ "${PAIRS_ONLY:-0}" = 1 ]; then
  for r in $(seq 1 "${PAIR_REPS:-3}"); do
    export RUN_TAG=_r$r
    both group
    both torch
  done
  export RUN_TAG=
  python3 - "$OUT" "${PAIR_REPS:-3}" <<'PY'
import os, statistics, sys
sys.path.insert(0, "tests/gpu")
from share_files import load_json
out, reps = sys.argv[1], int(sys.argv[2])
def load(name):
    return load_json(os.path.join(out, name + ".json"))
rows, tr, ev, ooms, missing = [], [], [], 0, 0
for r in range(1, reps + 1):
    g = [load(f"group_r{r}_{x}") for x in ("train", "eval")]
    t = [load(f"torch_r{r}_{x}") for x in ("train", "eval")]
    if None in g or None in t:
        rows.append(f"round {r}: missing")
        missing += 1
        continue
    ooms += g[0]["ooms"] + g[1]["ooms"]
    tr.append(g[0]["steps_per_s"] / t[0]["steps_per_s"])
    ev.append(g[1]["median_step_ms"] / t[1]["median_step_ms"] if g[1]["median_step_ms"] and t[1]["median_step_ms"] else None)
    rows.append(f"round {r}: trainer {g[0]['steps_per_s']:.2f} vs {t[0]['steps_per_s']:.2f} steps/s, "
                f"evaluator burst {g[1]['median_step_ms'] or 0:.1f} vs {t[1]['median_step_ms'] or 0:.1f} ms, group OOMs {g[0]['ooms'] + g[1]['ooms']}")
print("\n".join(rows))
if tr:
    print(f"trainer steps/s, group / PyTorch pair: median {statistics.median(tr):.3f} (spread {min(tr):.3f}-{max(tr):.3f}, {len(tr)} rounds)")
ev = [v for v in ev if v is not None]
if ev:
    print(f"evaluator burst time, group / PyTorch pair: median {statistics.median(ev):.3f} (spread {min(ev):.3f}-{max(ev):.3f})")
print(f"group OOMs in all rounds: {ooms}")
sys.exit(1 if ooms or missing or not tr else 0)
PY
  exit $?
fi

for role in train eval; do
  worker shim_alone "$role" 0 ||
    echo "shim_alone $role failed (see $OUT/shim_alone_$role.log)"
done
both group
# Optional: the same pair under a budget below their two live peaks together, where one must wait
# for memory the other gives back after its step (informational: when both are mid-step with
# too little left for either, one gets out-of-memory after group_release_wait_ms).
[ -n "$TIGHT_GIB" ] && both group_tight
both torch
fractions=$(python3 - "$OUT" "$BUDGET_GIB" <<'PY'
import json, os, subprocess, sys
out, budget = sys.argv[1], float(sys.argv[2]) * 2**30
total = int(subprocess.check_output(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                                     "-i", os.environ.get("GPU", "0")]).decode().split()[0]) * 2**20
peaks = []
for role in ("train", "eval"):
    try:
        peaks.append(json.load(open(os.path.join(out, f"torch_{role}.json")))["torch_max_reserved"])
    except Exception:
        peaks.append(1)
print(" ".join(f"{budget * p / sum(peaks) / total:.4f}" for p in peaks))
PY
)
# shellcheck disable=SC2086
both torch_frac $fractions

python3 - "$OUT" "$BUDGET_GIB" "$fractions" <<'PY'
import os, sys
sys.path.insert(0, "tests/gpu")
from share_files import load_json, nvml_peak_gib
out, budget_gib, fractions = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def load(mode, role):
    return load_json(os.path.join(out, f"{mode}_{role}.json"))
def nvml(mode):
    return nvml_peak_gib(os.path.join(out, f"nvml_{mode}.json"))
modes = ["shim_alone", "group", "torch", "torch_frac"]
if os.path.exists(os.path.join(out, "group_tight_train.json")):
    modes.insert(2, "group_tight")
lines = ["| process | " + " | ".join(f"{m}: steps/s, median ms (OOMs)" for m in modes) + " |",
         "|---|" + "---|" * len(modes)]
for role in ("train", "eval"):
    cells = []
    for m in modes:
        r = load(m, role)
        cells.append("missing" if r is None else
                     f"{r['steps_per_s']:.2f}, {r['median_step_ms'] or 0:.1f} ({r['ooms']})")
    lines.append(f"| {role} | " + " | ".join(cells) + " |")
verdicts, failed = [], False
g = [load("group", r) for r in ("train", "eval")]
fit = all(r is not None and r["ooms"] == 0 and r["steps"] > 0 for r in g)
failed |= not fit
verdicts.append(f"{'PASS' if fit else 'FAIL'} group: trainer and evaluator ran without OOM under a {budget_gib:g} GiB budget")
gp, tp, fp = nvml("group"), nvml("torch"), nvml("torch_frac")
if gp is None:
    failed = True
    verdicts.append("FAIL group NVML peak not measured (build nvml_peak into GPU_BIN)")
else:
    ok = gp <= budget_gib + 3.0
    failed |= not ok
    verdicts.append(f"{'PASS' if ok else 'FAIL'} group NVML peak {gp:.2f} GiB <= budget {budget_gib:g} GiB + 3 GiB for 2 contexts")
fmt = lambda v: "n/a" if v is None else f"{v:.2f} GiB"
if "group_tight" in modes:
    gt = [load("group_tight", r) for r in ("train", "eval")]
    verdicts.append("INFO tight group budget {} GiB: OOMs trainer {}, evaluator {}; NVML peak {}".format(
        os.environ.get("TIGHT_GIB", "?"), *(r["ooms"] if r else "missing" for r in gt), fmt(nvml("group_tight"))))
verdicts.append(f"INFO NVML peak above idle: PyTorch unlimited {fmt(tp)}, PyTorch partitioned {fmt(fp)} (fractions {fractions})")
f = [load("torch_frac", r) for r in ("train", "eval")]
verdicts.append("INFO PyTorch's static partition of the budget: OOMs trainer {}, evaluator {}".format(
    *(r["ooms"] if r else "missing" for r in f)))
for role, what in (("train", "trainer"), ("eval", "evaluator")):
    alone, grp = load("shim_alone", role), load("group", role)
    if alone and grp:
        n = min(len(alone["losses"]), len(grp["losses"]))
        same = n > 0 and alone["losses"][:n] == grp["losses"][:n]
        failed |= not same
        verdicts.append(f"{'PASS' if same else 'FAIL'} {what} losses in the group bit-identical to alone over {n} steps")
# The trainer runs flat out (steps per second); the evaluator bursts once every second, so its
# figure is the time a burst takes.
a, x, t = load("shim_alone", "train"), g[0], load("torch", "train")
if a and x and a["steps_per_s"] > 0:
    extra = ""
    if t and t["steps_per_s"] > 0:
        extra = f", {x['steps_per_s'] / t['steps_per_s']:.3f}x the pair on PyTorch's allocator unlimited"
    verdicts.append(f"INFO trainer steps/s in the group: {x['steps_per_s'] / a['steps_per_s']:.3f}x alone{extra}")
a, x, t = load("shim_alone", "eval"), g[1], load("torch", "eval")
if a and x and a["median_step_ms"] and x["median_step_ms"]:
    extra = ""
    if t and t["median_step_ms"]:
        extra = f", {x['median_step_ms'] / t['median_step_ms']:.3f}x the pair on PyTorch's allocator unlimited"
    verdicts.append(f"INFO evaluator median burst time in the group: {x['median_step_ms'] / a['median_step_ms']:.3f}x alone{extra}")
text = "\n".join(lines) + "\n\n" + "\n".join(verdicts) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text)
sys.exit(1 if failed else 0)
PY
