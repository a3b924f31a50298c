#!/usr/bin/env bash
# Warm start (policy key warm_start) on the GPT-2 suite (tests/gpu/hf_lm.py, path A: LD_PRELOAD
# with PYTORCH_NO_CUDA_MEMORY_CACHING=1). Run 1 records a trace (trace_file); `cudapool plan`
# makes the plan from it; then ROUNDS rounds, each one process without and one with
# warm_start:PLAN (interleaved, pinned to one CPU by tests/gpu/pin.sh), report the first step's
# time and the median steady step (after the warm-up), and the ratio first/steady of each mode.
# The target: with warm start, the first step within 10 % of a steady step (ratio <= 1.10).
# Both modes pay what a first step costs outside the pool (cuBLAS handles, lazy kernel loading),
# so the difference between the two ratios is what the warm start removed.
#   bash tests/gpu/warm_start.sh [ROUNDS]        (ROUNDS >= 5, default 5)
# Environment: CUDAPOOL_SHIM (default build/release/libcudapool.so), CUDAPOOL_BIN (the cudapool
# command, default build/release/cudapool), OUT (default build/gpu-out/warm-start), HF_STEPS
# (default 20), WARM_CONF (more policy for every run, e.g. expandable_segments:False),
# TORCH_PIN_CPU (tests/gpu/pin.sh). Writes OUT/record.csv, OUT/run.plan, one JSON, log and
# stats file per process, and OUT/summary.txt. Exit status 1 when a run failed or the target is
# missed.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
ROUNDS=${1:-5}
[[ "$ROUNDS" =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 5 ] || { sed -n 2,17p "$0"; exit 2; }
SHIM=${CUDAPOOL_SHIM:-$ROOT/build/release/libcudapool.so}
BIN=${CUDAPOOL_BIN:-$ROOT/build/release/cudapool}
OUT=${OUT:-$ROOT/build/gpu-out/warm-start}
STEPS=${HF_STEPS:-20}
EXTRA=${WARM_CONF:-}
for f in "$SHIM" "$BIN"; do [ -e "$f" ] || { echo "warm_start.sh: $f is missing (build it, or set CUDAPOOL_SHIM / CUDAPOOL_BIN)" >&2; exit 2; }; done
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log "$OUT"/*.out "$OUT"/record.csv "$OUT"/run.plan "$OUT"/summary.txt
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0
source tests/gpu/pin.sh
echo "training processes: ${TORCH_PIN[*]:-not pinned}"
failed=0

# one NAME CONF: one GPT-2 process under the shim with policy CONF (+ WARM_CONF), its JSON,
# stats file and log (log_level info: the warm start says what it preallocated) under OUT.
one() {
  local name=$1 conf=$2
  conf="stats_file:$OUT/$name.stats.json,log_file:$OUT/$name.log,log_level:info${conf:+,$conf}${EXTRA:+,$EXTRA}"
  if ! timeout 300 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$SHIM" CUDAPOOL_CONF="$conf" "${TORCH_PIN[@]}" \
      python3 tests/gpu/hf_lm.py --steps "$STEPS" --out "$OUT/$name.json" >"$OUT/$name.out" 2>&1; then
    echo "$name failed (see $OUT/$name.out)"
    failed=1
  fi
}

# 1. The recorded run, and its plan.
one record "trace_file:$OUT/record.csv"
[ -s "$OUT/record.csv" ] || { echo "warm_start.sh: the recorded run wrote no trace ($OUT/record.out)" >&2; exit 1; }
"$BIN" plan "$OUT/record.csv" -o "$OUT/run.plan" || { echo "warm_start.sh: cudapool plan failed" >&2; exit 1; }
grep -c '^segment ' "$OUT/run.plan" | sed 's/^/plan segments: /'

# 2. Interleaved processes without and with the plan.
for r in $(seq 1 "$ROUNDS"); do
  one "cold_$r" ""
  one "warm_$r" "warm_start:$OUT/run.plan"
done

python3 - "$OUT" "$ROUNDS" "$failed" >"$OUT/summary.txt" <<'PY'
import json, os, re, statistics as st, sys
out, rounds, failed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
WARMUP = 5  # hf_lm.py's default --warmup: steps after it are steady
rows = {}
for mode in ("cold", "warm"):
    first, steady, ratio, pre = [], [], [], []
    for r in range(1, rounds + 1):
        name = f"{mode}_{r}"
        try:
            d = json.load(open(os.path.join(out, name + ".json")))
        except (OSError, ValueError):
            continue
        s = d["step_s"]
        f_ms, s_ms = 1e3 * s[0], 1e3 * st.median(s[WARMUP:])
        first.append(f_ms), steady.append(s_ms), ratio.append(f_ms / s_ms)
        log = open(os.path.join(out, name + ".log"), errors="replace").read() if os.path.exists(
            os.path.join(out, name + ".log")) else ""
        m = re.search(r"warm_start: device 0: (\d+) MiB preallocated", log)
        pre.append(int(m.group(1)) if m else 0)
        if "warm_start: the plan" in log or "no memory is preallocated" in log:
            print(f"{name}: the warm start warned: " + next(l for l in log.splitlines() if "warm_start" in l))
    rows[mode] = (first, steady, ratio, pre)

print("| mode | processes | first step ms (median) | steady step ms (median) | first/steady (median) | "
      "per process | preallocated MiB |")
print("|---|---|---|---|---|---|---|")
for mode, label in (("cold", "no warm start"), ("warm", "warm_start:PLAN")):
    first, steady, ratio, pre = rows[mode]
    if not first:
        print(f"| {label} | 0 | | | | | |")
        continue
    print(f"| {label} | {len(first)} | {st.median(first):.1f} | {st.median(steady):.1f} | {st.median(ratio):.3f} | "
          + " ".join(f"{x:.2f}" for x in ratio) + f" | {st.median(pre)} |")
ok = bool(rows["warm"][0]) and bool(rows["cold"][0]) and not failed
if ok:
    warm_ratio, cold_ratio = st.median(rows["warm"][2]), st.median(rows["cold"][2])
    print(f"first step over a steady one: {cold_ratio:.3f}x without, {warm_ratio:.3f}x with warm start "
          f"(first step {st.median(rows['cold'][0]):.1f} -> {st.median(rows['warm'][0]):.1f} ms)")
    if min(rows["warm"][3]) == 0:
        print("FAIL: a warm-start process preallocated nothing (see its log)")
        ok = False
    verdict = warm_ratio <= 1.10
    print(f"warm start: first step within 10 % of a steady step: {'PASS' if verdict else 'FAIL'} ({warm_ratio:.3f}x)")
    ok = ok and verdict
else:
    print("FAIL: runs missing or failed")
sys.exit(0 if ok else 1)
PY
verdict=$?
cat "$OUT/summary.txt"
exit "$verdict"
