#!/usr/bin/env bash
# The README results table's rows that one device call can measure again, in order of what a
# shortened call should keep: the allocation pairs (the default in a program with no other stream
# and in one with an idle non-blocking stream, beside PyTorch's C++ allocator), the five model
# servers under 7 GiB with static fractions and with one group budget (the parking row's
# workload: REQUESTS=4, GAP_S=1), and the largest GPT-2 small batch under a 12 GiB cap (PyTorch
# native, PyTorch expandable segments, cudapool through LD_PRELOAD). Each stage is packed into its
# own tarball under OUT as it ends, so a call cut short still returns what finished.
#   bash tests/gpu/readme_rows.sh
# Environment: SHIM (build/release/libcudapool.so, carried; its directory's COMMIT file names the
# library's commit), GPU_BIN (build/gpu-bin: the CUDA test programs, `bash tests/gpu/build.sh DIR
# cuda`; the PyTorch C++ benchmark is built into it here), OUT (build/readme-rows), LIMIT_S (540:
# the seconds the whole may take; the serving stage runs only with 120 s left, each batch search
# only with 30 s left). Then: rows into docs/results.tsv with the commit, and `make docs`.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
SHIM=${SHIM:-$ROOT/build/release/libcudapool.so}
BIN=${GPU_BIN:-$ROOT/build/gpu-bin}
OUT=${OUT:-$ROOT/build/readme-rows}
LIMIT=${LIMIT_S:-540}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { printf '[%4ds] %s\n' "$(elapsed)" "$*"; }
pack() { local name=$1; shift; tar czf "$OUT/$name.tgz" -C "$WORK" "$@" 2>/dev/null; }

# 1. Allocation pairs. The PyTorch benchmark compiles while the pool's own modes run.
( timeout 150 bash tests/gpu/build.sh "$BIN" torch >"$WORK/build-torch.log" 2>&1 ) &
build=$!
OUT=$WORK/lat GPU_ONLY=latency GPU_BIN=$BIN CUDAPOOL_SHIM=$SHIM GPU_SUITE_BUDGET_S=160 \
  timeout 190 bash tests/gpu/run.sh >"$WORK/lat.out" 2>&1
wait "$build"
if [ -x "$BIN/torch_alloc_bench" ]; then
  timeout 60 "$BIN/torch_alloc_bench" >"$WORK/lat/logs/lat_torch.out" 2>"$WORK/lat/logs/lat_torch.err"
  echo $? >"$WORK/lat/logs/lat_torch.rc"
  python3 tests/gpu/report.py latency "$WORK/lat"
else
  say "no PyTorch C++ benchmark: $(tail -n 3 "$WORK/build-torch.log")"
fi
cp "$WORK/lat/details/latency.md" "$OUT/" 2>/dev/null
pack latency lat lat.out build-torch.log
say "pairs done"

# 2. Five model servers under 7 GiB: static fractions, one group budget.
left=$(( LIMIT - $(elapsed) - 15 ))
if [ "$left" -gt 120 ]; then
  SHIM=$SHIM GPU_BIN=$BIN OUT=$WORK/serve MODES="fraction group" BUDGETS_GIB=7 REQUESTS=4 STARTUP_S=40 GAP_S=1 \
    timeout "$left" bash tests/gpu/share_serve.sh >"$WORK/serve.out" 2>&1
  say "serving done (exit $?)"
  cp "$WORK/serve/summary.md" "$OUT/serve_summary.md" 2>/dev/null
  pack serve serve serve.out
else
  say "serving skipped: $left s left"
fi

# 3. The largest GPT-2 small batch under a 12 GiB cap.
mkdir -p "$WORK/maxbatch"
P=(python3 tests/gpu/torch_pluggable.py maxbatch --cap-gib 12)
for mode in ldpreload native ptexp; do
  left=$(( LIMIT - $(elapsed) - 10 ))
  [ "$left" -lt 30 ] && { say "batch search $mode skipped: $left s left"; continue; }
  case $mode in
    native) envs=() ;;
    ptexp) envs=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
    ldpreload) envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1 "LD_PRELOAD=$SHIM" CUDAPOOL_CONF=max_reserved_mb:12288) ;;
  esac
  timeout "$left" env "${envs[@]}" "${P[@]}" >"$WORK/maxbatch/$mode.out" 2>&1
  say "batch search $mode (exit $?): $(grep -m1 -o 'largest_batch=[0-9]*' "$WORK/maxbatch/$mode.out")"
done
pack maxbatch maxbatch
say "library $(cat "$(dirname "$SHIM")/COMMIT" 2>/dev/null || echo 'of no recorded commit'); results in $OUT"
rm -rf "$WORK"
