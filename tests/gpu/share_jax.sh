#!/usr/bin/env bash
# A JAX process and a PyTorch process in one cudapool group. JAX's default allocator sizes its
# preallocation from the total the shim reports (the budget) and takes it with cuMemCreate, which
# the pool never sees: the shim counts it in the group's ledger all the same. Checks, on the GPU:
# `cudapool top` lists the JAX process's preallocation as its external memory; a PyTorch member
# that then asks for more than the budget has left gets out-of-memory; one that asks for less
# gets it; the NVML peak of the whole run stays within the budget plus the two contexts.
#
#   bash tests/gpu/share_jax.sh
#
# Environment: SHIM (build/release/libcudapool.so), GPU_BIN (build/gpu-bin, for nvml_peak),
# OUT (build/share-jax-out), BUDGET_GIB (30), GPU (0). Exit 1 when a check fails.
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
SHIM=${SHIM:-$REPO/build/release/libcudapool.so}
GPU_BIN=${GPU_BIN:-$REPO/build/gpu-bin}
OUT=${OUT:-$REPO/build/share-jax-out}
BUDGET_GIB=${BUDGET_GIB:-30}
GPU=${GPU:-0}
GROUP=sharejax$$
mkdir -p "$OUT"
rm -f "$OUT"/jax.ready "$OUT"/jax.log "$OUT"/top.json "$OUT"/top.err "$OUT"/left_gib "$OUT"/torch_* "$OUT"/nvml.json \
  "$OUT"/summary.md
[ -f "$SHIM" ] || { echo "no shim at $SHIM"; exit 2; }
[ -x "$REPO/build/release/cudapool" ] || { echo "no build/release/cudapool (for cudapool top)"; exit 2; }
[ -x "$GPU_BIN/nvml_peak" ] || { echo "no $GPU_BIN/nvml_peak (bash tests/gpu/build.sh $GPU_BIN cuda)"; exit 2; }
CONF="group:$GROUP,group_budget_mb:$((BUDGET_GIB * 1024)),group_release_wait_ms:200"
export CUDA_VISIBLE_DEVICES=$GPU

run_all() {
  # The JAX member: preallocates (XLA's default: 75 % of the total it sees), runs one op, holds.
  env LD_PRELOAD="$SHIM" CUDAPOOL_CONF="$CONF" python3 -c '
import sys, time
import jax, jax.numpy as jnp
x = jnp.ones((4096, 4096)); (x @ x).block_until_ready()
open(sys.argv[1], "w").write("ready\n")
time.sleep(40)
' "$OUT/jax.ready" >"$OUT/jax.log" 2>&1 &
  local jax_pid=$!
  for _ in $(seq 1 600); do [ -f "$OUT/jax.ready" ] && break; sleep 0.1; done
  [ -f "$OUT/jax.ready" ] || { echo "JAX never got ready (see $OUT/jax.log)"; kill $jax_pid; return 1; }
  sleep 0.6  # two publications of its stats record
  "$REPO/build/release/cudapool" top --once --json - >"$OUT/top.json" 2>"$OUT/top.err"
  # The PyTorch member, without PyTorch's cache: asks for SIZE_GIB at once, prints ok or oom.
  local left
  left=$(python3 - "$OUT/top.json" "$BUDGET_GIB" <<'PY'
import sys
sys.path.insert(0, "tests/gpu")
from share_files import top_external_gib
print(f"{float(sys.argv[2]) - top_external_gib(sys.argv[1]):.2f}")
PY
)
  echo "$left" >"$OUT/left_gib"
  for ask in over under; do
    local gib
    gib=$(python3 -c "print(max(0.5, $left + 2) if '$ask' == 'over' else max(0.5, $left - 3))")
    env LD_PRELOAD="$SHIM" CUDAPOOL_CONF="$CONF" PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 -c '
import sys, torch
try:
    x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda"); x.fill_(1)
    torch.cuda.synchronize(); print("ok")
except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
    print("oom" if "out of memory" in str(e) else "error: " + str(e))
' "$gib" >"$OUT/torch_$ask.out" 2>"$OUT/torch_$ask.log"
    echo "$gib" >"$OUT/torch_$ask.gib"
  done
  kill $jax_pid 2>/dev/null
  wait $jax_pid 2>/dev/null
  return 0
}
export -f run_all
export SHIM CONF OUT BUDGET_GIB REPO
"$GPU_BIN/nvml_peak" "$OUT/nvml.json" -- bash -c run_all

python3 - "$OUT" "$BUDGET_GIB" <<'PY'
import os, sys
sys.path.insert(0, "tests/gpu")
from share_files import nvml_peak_gib, top_external_gib
out, budget = sys.argv[1], float(sys.argv[2])
def read(name, default=""):
    try:
        return open(os.path.join(out, name)).read().strip()
    except OSError:
        return default
failed = False
verdicts = []
ext = top_external_gib(os.path.join(out, "top.json"))
ok = ext > 0.5 * budget
failed |= not ok
verdicts.append(f"{'PASS' if ok else 'FAIL'} JAX's preallocation counted: {ext:.2f} GiB of external memory in `cudapool top` (budget {budget:g} GiB)")
for ask, want in (("over", "oom"), ("under", "ok")):
    got = read(f"torch_{ask}.out", "missing")
    ok = got == want
    failed |= not ok
    verdicts.append(f"{'PASS' if ok else 'FAIL'} PyTorch member asking {read(f'torch_{ask}.gib')} GiB with {read('left_gib')} GiB left in the budget: {got} (want {want})")
peak = nvml_peak_gib(os.path.join(out, "nvml.json"))
if peak is None:
    failed = True
    verdicts.append("FAIL NVML peak not measured")
else:
    ok = peak <= budget + 3.0
    failed |= not ok
    verdicts.append(f"{'PASS' if ok else 'FAIL'} NVML peak {peak:.2f} GiB <= budget {budget:g} GiB + 3 GiB for 2 contexts")
text = "\n".join(verdicts) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text, end="")
sys.exit(1 if failed else 0)
PY
