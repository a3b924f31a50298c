#!/usr/bin/env bash
# The legacy churn program (legacy_app.cu) against its floor (the same program with its buffers
# allocated once, no shim) under several libraries and policies: REPS (5) interleaved rounds, each
# process pinned like the PyTorch runs (tests/gpu/pin.sh). Prints, per LIB::CONF, the median wall
# time of the loop and its ratio to the floor's median, the spread, the median time inside
# cudaMalloc/cudaFree, and the pool's counters from the first round's stats_file. Exit 1 when a
# run failed or printed other results than the floor.
#   REPS=5 bash tests/gpu/legacy_ab.sh BIN OUTDIR LIB::CONF [LIB::CONF...]
# BIN: where `bash tests/gpu/build.sh BIN cuda` put legacy_app; LIB: a libcudapool.so; CONF: a
# CUDAPOOL_CONF string, empty for the default ("LIB::").
set -u
[ $# -ge 3 ] || { sed -n 2,10p "$0"; exit 2; }
BIN=$1 OUTD=$2 REPS=${REPS:-5}
shift 2
source "$(dirname "$0")/pin.sh"
mkdir -p "$OUTD"
for rep in $(seq 1 "$REPS"); do
  "${TORCH_PIN[@]}" "$BIN/legacy_app" --once >"$OUTD/once_$rep.out" 2>"$OUTD/once_$rep.err"
  i=0
  for c in "$@"; do
    lib=${c%%::*} conf=${c#*::}
    env LD_PRELOAD="$lib" CUDAPOOL_CONF="stats_file:$OUTD/c${i}_$rep.json${conf:+,$conf}" "${TORCH_PIN[@]}" \
      "$BIN/legacy_app" >"$OUTD/c${i}_$rep.out" 2>"$OUTD/c${i}_$rep.err"
    i=$((i + 1))
  done
done
python3 - "$OUTD" "$REPS" "$@" <<'PY'
import json, os, re, statistics, sys
d, reps, confs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
failed = False
def run(name):
    try:
        err, out = open(f"{d}/{name}.err").read(), open(f"{d}/{name}.out").read()
    except OSError:
        return None, None, None
    m = re.search(r"wall_s=([0-9.]+) alloc_s=([0-9.]+)", err)
    return (float(m.group(1)), float(m.group(2)), out) if m else (None, None, out)
once = [run(f"once_{r}") for r in range(1, reps + 1)]
ow = [w for w, _, _ in once if w is not None]
if not ow:
    sys.exit("the floor (legacy_app --once) never ran: see " + d)
floor_out = once[0][2]
floor = statistics.median(ow)
print(f"once (floor): wall median {floor:.4f} s, spread {min(ow):.4f}-{max(ow):.4f}")
for i, c in enumerate(confs):
    runs = [run(f"c{i}_{r}") for r in range(1, reps + 1)]
    ok = [x for x in runs if x[0] is not None]
    wrong = sum(1 for x in runs if x[2] != floor_out)
    if len(ok) < len(runs) or wrong:
        failed = True
        print(f"[{c}] FAIL: {len(runs) - len(ok)} runs without timing, {wrong} with other results than the floor")
    if not ok:
        continue
    w = statistics.median(x[0] for x in ok)
    a = statistics.median(x[1] for x in ok)
    try:
        st = json.load(open(f"{d}/c{i}_1.json"))["devices"][0]["stats"]
        keys = ("fences_recorded", "gpu_waits", "fence_waits", "num_device_map", "num_device_unmap",
                "num_device_alias", "num_device_alloc", "upstream_ns", "reserved_bytes.all.peak")
        counters = " ".join(f"{k}={st.get(k)}" for k in keys)
    except (OSError, ValueError, KeyError, IndexError) as e:
        counters = f"(no stats: {e})"
    print(f"[{c}] wall {w:.4f} s = {w / floor:.4f}x the floor, spread {min(x[0] for x in ok):.4f}-"
          f"{max(x[0] for x in ok):.4f}, in cudaMalloc/cudaFree {a * 1e3:.1f} ms; {counters}")
sys.exit(1 if failed else 0)
PY
