#!/usr/bin/env bash
# Pinned host memory of a data-loading loop (tests/gpu/pinned_loader.py), three ways, N rounds
# interleaved: PyTorch's DataLoader with pin_memory=True (its caching host allocator, the
# baseline), cudaHostAlloc/cudaFreeHost per batch on the driver (no shim), and the same under the
# shim's pinned pool (pinned_cache:True). Prints one JSON line per run, then the comparison:
# the pool's pinned bytes held at peak over the live bytes (target <= 1.25, PyTorch's beside it)
# and its median time per batch over PyTorch's (target <= 1.0).
#   bash tests/gpu/pinned_loader.sh [ROUNDS]     (SHIM=path/libcudapool.so, default the release build)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHIM=${SHIM:-$ROOT/build/release/libcudapool.so}
ROUNDS=${1:-3}
OUT=${OUT:-$ROOT/build/gpu-out}
mkdir -p "$OUT"
LOG="$OUT/pinned_loader.jsonl"
: >"$LOG"
PY=(python3 "$ROOT/tests/gpu/pinned_loader.py" ${PINNED_ARGS:-})
for r in $(seq "$ROUNDS"); do
  "${PY[@]}" --mode torch | tee -a "$LOG"
  "${PY[@]}" --mode raw | tee -a "$LOG"
  CUDAPOOL_CONF="pinned_cache:True" LD_PRELOAD="$SHIM" "${PY[@]}" --mode raw | tee -a "$LOG"
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def pick(mode, shim):
    return [r for r in rows if r["mode"] == mode and r["shim"] == shim]
torch_rows, driver_rows, pool_rows = pick("torch", False), pick("raw", False), pick("raw", True)
med = lambda rs, k: statistics.median(r[k] for r in rs)
print("| run | median ms/batch | held/live at peak | note |")
print("|---|---|---|---|")
for name, rs in (("PyTorch pin_memory (baseline)", torch_rows), ("cudaHostAlloc per batch, driver", driver_rows),
                 ("cudaHostAlloc per batch, cudapool pinned_cache", pool_rows)):
    note = f"hits {rs[0].get('pool_hits')} / misses {rs[0].get('pool_misses')}" if rs and "pool_hits" in rs[0] else ""
    print(f"| {name} | {med(rs, 'median_ms'):.3f} | {med(rs, 'held_over_live'):.3f} | {note} |")
held = med(pool_rows, "held_over_live")
speed = med(pool_rows, "median_ms") / med(torch_rows, "median_ms")
print(f"pool held/live {held:.3f} (target <= 1.25): {'PASS' if held <= 1.25 else 'FAIL'}")
print(f"pool time/batch over PyTorch's {speed:.3f} (target <= 1.0): {'PASS' if speed <= 1.0 else 'FAIL'}")
PY
