#!/usr/bin/env bash
# The real-GPU suite: correctness under the shim, the reuse race and cudaFree's host-side wait,
# CUDA IPC of pooled memory, stream-ordered / graph / reset, allocation latency, a legacy program,
# PyTorch / CuPy / JAX, DDP when two GPUs are present.
#   bash tests/gpu/run.sh
# Needs build/release/libcudapool.so (built by `make` elsewhere and carried here: this script never
# rebuilds it, which proves that library loads on this machine). Compiles its own test programs
# with nvcc into a scratch directory (or uses build/gpu-bin if nvcc is missing).
# Writes everything under $OUT (default build/gpu-out): logs/, details/, results.tsv, results.md,
# env.txt. Prints the table last. Exit status 1 when any check FAILs.
# Knobs: GPU_SUITE_BUDGET_S (default 540: a run's time limit shrinks to what is left of it, and
# runs with under 10 s left are skipped and reported as MISS), LAT_REPS / TORCH_REPS (default 3:
# processes per latency mode / per timed PyTorch mode, interleaved; the best counts),
# TORCH_D_MODEL (default 2048; 512 makes the step almost all host time: docs/history.md),
# TORCH_PIN_CPU (default 2: the CPU the PyTorch training processes are pinned to; "none"),
# CNN_REPS (default 3: interleaved processes per mode of the CPU-bound PyTorch workloads),
# BENCH_ROUNDS (default 3: rounds of the size sweep inside one latency process),
# CUDAPOOL_SHIM (path of the library), GPU_ONLY (space-separated check names to run, for reruns:
# load correctness race ipc ordered park legacy latency torch cnn pluggable pinned warm cupy jax ddp; race also
# runs alias_race and free_host_sync, ipc also runs torch_ipc.py, torch also runs torch_side_stream.py),
# GPU_BIN (use programs already built there instead of compiling; default: compile into
# build/gpu-scratch).
set -u
cd "$(dirname "$0")/../.."
command -v nvcc >/dev/null || PATH=$PATH:/usr/local/cuda/bin
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-out}
mkdir -p "$OUT/logs" "$OUT/details"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/results.tsv"
rm -f "$OUT"/details/*.md
SHIM=${CUDAPOOL_SHIM:-$ROOT/build/release/libcudapool.so}
BUDGET=${GPU_SUITE_BUDGET_S:-540}
START=$(date +%s)
REPORT=(python3 "$ROOT/tests/gpu/report.py")
ONLY=" ${GPU_ONLY:-load correctness race ipc ordered park legacy latency torch cnn pluggable pinned warm cupy jax ddp} "

say() { printf '[%4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }
want() { [[ "$ONLY" == *" $1 "* ]]; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# run NAME LIMIT_S [VAR=value ...] -- COMMAND...
# Runs COMMAND with the given environment, stdout/stderr/status into logs/NAME.{out,err,rc}.
# The limit shrinks to what is left of the suite's budget; under 10 s left, the run is skipped
# (no .rc file, so the report says MISS).
run() {
  local name=$1 limit=$2; shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  rm -f "$OUT/logs/$name".*
  if [ "$(left)" -lt 10 ]; then
    say "$name: skipped, the suite's budget of $BUDGET s is spent"
    return 0
  fi
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  local t0 rc
  t0=$(date +%s%N)
  timeout -k 5 "$limit" env "${envs[@]}" "$@" >"$OUT/logs/$name.out" 2>"$OUT/logs/$name.err"
  rc=$?
  echo "$rc" >"$OUT/logs/$name.rc"
  say "$name: rc=$rc ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
}
# The environment of a run under the shim: the policy, and the JSON summary written at exit to
# logs/NAME.stats.json (policy key stats_file, docs/policy.md; CUDAPOOL_STATS as well).
shim_env() {  # shim_env NAME [EXTRA_CUDAPOOL_CONF]
  echo "LD_PRELOAD=$SHIM"
  echo "CUDAPOOL_STATS=$OUT/logs/$1.stats.json"
  echo "CUDAPOOL_CONF=stats_file:$OUT/logs/$1.stats.json${2:+,$2}"
}
peak() { echo "$BIN/nvml_peak" "$OUT/logs/$1.peak.json" --; }  # NVML peak wrapper for run NAME

# ---------------------------------------------------------------- environment and build
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "host: $(hostname)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "cuda: $( (command -v nvcc >/dev/null && nvcc --version | tail -n 1) || echo 'nvcc not found')"
  # Versions from package metadata: importing torch, CuPy and JAX here would cost seconds.
  python3 -c 'import importlib.metadata as m
for d in m.distributions():
    n = d.metadata["Name"] or ""
    if n.lower().startswith(("torch", "cupy", "jax", "nvidia-nccl")): print(f"python: {n} {d.version}")' 2>/dev/null | sort -u
  # The library's own commit when it was carried with one (COMMIT beside it): the checkout here
  # may be at another commit than the one the library was built from.
  echo "shim: $SHIM ($(stat -c %s "$SHIM" 2>/dev/null || echo missing) bytes, git $(cat "$(dirname "$SHIM")/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null))"
} >"$OUT/env.txt" 2>&1
say "$(grep '^gpu:' "$OUT/env.txt" | head -n 2 | tr '\n' ' ')"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')

BIN=${GPU_BIN:-}
BUILD=0
if [ -z "$BIN" ]; then
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    BIN=$ROOT/build/gpu-scratch BUILD=1
  else
    BIN=$ROOT/build/gpu-bin
    say "no nvcc here: using the programs in $BIN"
  fi
fi
TORCH_BUILD_PID=
if [ "$BUILD" = 1 ]; then
  bash tests/gpu/build.sh "$BIN" torch >"$OUT/logs/build-torch.txt" 2>&1 &
  TORCH_BUILD_PID=$!
  say "building the test programs into $BIN"
  bash tests/gpu/build.sh "$BIN" cuda >"$OUT/logs/build.txt" 2>&1 || { cat "$OUT/logs/build.txt"; }
  cp "$BIN"/build-*.log "$OUT/logs/" 2>/dev/null
fi
missing=()
for p in correctness correctness_shared driver_api race race_shared alias_race free_host_sync ipc stream_ordered graph_capture device_reset \
         park legacy_app alloc_bench nvml_peak; do
  [ -x "$BIN/$p" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  "${REPORT[@]}" row "$OUT" "build of the GPU test programs" FAIL "missing: ${missing[*]} (see logs/build.txt)"
else
  "${REPORT[@]}" row "$OUT" "build of the GPU test programs" PASS "$(grep '^cuda:' "$OUT/env.txt")"
fi

# ---------------------------------------------------------------- the shim loads here
if want load; then
  if [ ! -f "$SHIM" ]; then
    "${REPORT[@]}" row "$OUT" "shim loads (built on another machine)" FAIL "no $SHIM: run make there and carry it"
  else
    run load_true 20 "LD_PRELOAD=$SHIM" -- /bin/true
    run load_python 30 "LD_PRELOAD=$SHIM" -- python3 -c 'print("ok")'
    if [ "$(cat "$OUT/logs/load_true.rc" 2>/dev/null)" = 0 ] && grep -qx ok "$OUT/logs/load_python.out" &&
       ! grep -qi 'error' "$OUT/logs/load_true.err" "$OUT/logs/load_python.err"; then
      "${REPORT[@]}" row "$OUT" "shim loads (built on another machine)" PASS "non-CUDA processes run undisturbed"
    else
      "${REPORT[@]}" row "$OUT" "shim loads (built on another machine)" FAIL \
        "$(cat "$OUT/logs/load_true.err" "$OUT/logs/load_python.err" 2>/dev/null | head -c 200)"
    fi
  fi
fi

# ---------------------------------------------------------------- 1. correctness, static and shared cudart
if want correctness; then
  for kind in static shared; do
    exe=$BIN/correctness; [ "$kind" = shared ] && exe=$BIN/correctness_shared
    run "correct_${kind}_ref" 60 -- "$exe"
    run "correct_${kind}_shim" 60 $(shim_env "correct_${kind}_shim") -- "$exe"
    "${REPORT[@]}" compare "$OUT" "correctness ($kind cudart): output" "correct_${kind}_ref" "correct_${kind}_shim"
    "${REPORT[@]}" pooled "$OUT" "correctness ($kind cudart): served by the pool" "correct_${kind}_shim"
  done
  "${REPORT[@]}" runtime_api "$OUT" "correctness (shared cudart): cudaMalloc answered without cudart's wrapper" \
    correct_shared_shim
  # The same program with the pool growing by mapped pages instead of segments.
  run correct_static_classic 60 $(shim_env correct_static_classic expandable_segments:False) -- "$BIN/correctness"
  "${REPORT[@]}" compare "$OUT" "correctness, classic segments: output" correct_static_ref correct_static_classic
  run driver_ref 60 -- "$BIN/driver_api"
  run driver_shim 60 $(shim_env driver_shim) -- "$BIN/driver_api"
  "${REPORT[@]}" compare "$OUT" "driver API, -lcuda: output" driver_ref driver_shim
  "${REPORT[@]}" pooled "$OUT" "driver API, -lcuda: served by the pool" driver_shim
fi

# ---------------------------------------------------------------- 2. cross-stream reuse race
# race: memory freed while a kernel still uses it, reused and written from other streams (the
# default, gpu_wait, must hand A's address out again and make the writers wait on the GPU; with
# shared cudart too, where the shim answers cudaMalloc / cudaFree itself).
# free_host_sync: whether cudaFree still waits on the host for the device's work.
if want race; then
  run race_ref 60 -- "$BIN/race"
  run race_default 60 $(shim_env race_default) -- "$BIN/race"
  run race_fenced 60 $(shim_env race_fenced free_sync:fenced) -- "$BIN/race"
  run race_device 60 $(shim_env race_device free_sync:device) -- "$BIN/race"
  run race_immediate 60 $(shim_env race_immediate free_sync:immediate) -- "$BIN/race"
  run race_classic 60 $(shim_env race_classic expandable_segments:False) -- "$BIN/race"
  run race_shared_default 60 $(shim_env race_shared_default) -- "$BIN/race_shared"
  run race_shared_immediate 60 $(shim_env race_shared_immediate free_sync:immediate) -- "$BIN/race_shared"
  "${REPORT[@]}" race "$OUT"
  run alias_ref 60 -- "$BIN/alias_race"
  run alias_default 60 $(shim_env alias_default) -- "$BIN/alias_race"
  run alias_immediate 60 $(shim_env alias_immediate free_sync:immediate) -- "$BIN/alias_race"
  run alias_async_ref 60 -- "$BIN/alias_race" async
  run alias_async_default 60 $(shim_env alias_async_default) -- "$BIN/alias_race" async
  "${REPORT[@]}" alias "$OUT"
  run free_host_sync_ref 30 -- "$BIN/free_host_sync"
  run free_host_sync_default 30 $(shim_env free_host_sync_default) -- "$BIN/free_host_sync"
  run free_host_sync_on 30 $(shim_env free_host_sync_on free_host_sync:True) -- "$BIN/free_host_sync"
  "${REPORT[@]}" free_host_sync "$OUT"
fi

# ---------------------------------------------------------------- 2b. CUDA IPC of pooled memory
# ipc: handles of pooled blocks (split 4 KiB blocks, 30 MiB, 600 MiB) opened, checked, written
# and closed by child processes; with --expect-shim also the shim's handle marker, a block freed
# while a child holds it, stale handles, and the real driver given a cudapool handle. Without
# the shim the same sharing checks run against the driver. torch_ipc.py: a tensor shared with a
# torch.multiprocessing child (spawn) without caching, and with PyTorch's cache on the shim.
if want ipc; then
  run ipc_ref 60 -- "$BIN/ipc"
  run ipc_default 60 $(shim_env ipc_default) -- "$BIN/ipc" --expect-shim
  run ipc_classic 60 $(shim_env ipc_classic expandable_segments:False) -- "$BIN/ipc" --expect-shim
  TI=(python3 "$ROOT/tests/gpu/torch_ipc.py")
  run torch_ipc_ref 90 PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- "${TI[@]}"
  run torch_ipc_shim 90 PYTORCH_NO_CUDA_MEMORY_CACHING=1 $(shim_env torch_ipc_shim) -- "${TI[@]}"
  run torch_ipc_cached_shim 90 $(shim_env torch_ipc_cached_shim) -- "${TI[@]}"
  "${REPORT[@]}" ipc "$OUT"
fi

# ---------------------------------------------------------------- 3. stream-ordered, graphs, device reset
if want ordered; then
  for p in stream_ordered graph_capture device_reset; do
    run "${p}_ref" 60 -- "$BIN/$p"
    run "${p}_shim" 60 $(shim_env "${p}_shim") -- "$BIN/$p"
  done
  "${REPORT[@]}" compare "$OUT" "cudaMallocAsync/FreeAsync across streams" stream_ordered_ref stream_ordered_shim
  "${REPORT[@]}" compare "$OUT" "CUDA graph with cudaMallocAsync, replayed" graph_capture_ref graph_capture_shim graph:
  "${REPORT[@]}" compare "$OUT" "cudaMalloc during global capture: answer" graph_capture_ref graph_capture_shim "malloc during"
  "${REPORT[@]}" compare "$OUT" "cudaDeviceReset mid-run" device_reset_ref device_reset_shim
fi

# ---------------------------------------------------------------- 3b. parking
# park move: 4 GiB of live blocks parked and restored (by cudapool_unpark and by the next launch),
# every byte checked, NVML showing the memory given back, the times per GiB against a pinned
# 1 GiB cudaMemcpy in the same process. park race: a thread launching without pause while the
# process is parked and restored 200 times. tests/gpu/park.cu prints its rows itself.
if want park; then
  run park_move 120 $(shim_env park_move) -- "$BIN/park" move 4
  run park_race 120 $(shim_env park_race) -- "$BIN/park" race 200
  for name in park_move park_race; do
    if ! grep -q '^ROW|' "$OUT/logs/$name.out" 2>/dev/null; then
      "${REPORT[@]}" row "$OUT" "parking ($name)" FAIL \
        "rc=$(cat "$OUT/logs/$name.rc" 2>/dev/null || echo none): $(head -c 300 "$OUT/logs/$name.err" 2>/dev/null)"
      continue
    fi
    grep '^ROW|' "$OUT/logs/$name.out" | while IFS='|' read -r _ check status note; do
      "${REPORT[@]}" row "$OUT" "$check" "$status" "$note"
    done
    rc=$(cat "$OUT/logs/$name.rc" 2>/dev/null)
    [ "$rc" = 0 ] || [ "$rc" = 1 ] || "${REPORT[@]}" row "$OUT" "parking ($name)" FAIL "exit $rc: $(head -c 300 "$OUT/logs/$name.err")"
  done
fi

# ---------------------------------------------------------------- 6. legacy program
if want legacy; then
  run legacy_ref 90 -- "$BIN/legacy_app"
  run legacy_shim 90 $(shim_env legacy_shim) -- "$BIN/legacy_app"
  # Against the floor (the same program with its buffers allocated once, no shim): LEGACY_REPS
  # interleaved processes each (default 5), medians.
  for rep in $(seq 1 "${LEGACY_REPS:-5}"); do
    run legacy_once_r$rep 90 -- "$BIN/legacy_app" --once
    run legacy_shim_r$rep 90 $(shim_env legacy_shim_r$rep) -- "$BIN/legacy_app"
  done
  "${REPORT[@]}" legacy "$OUT"
fi

# ---------------------------------------------------------------- 5. allocation latency
if want latency; then
  if [ -n "$TORCH_BUILD_PID" ]; then  # no compiler competing with the 16-thread measurements
    say "waiting for the PyTorch C++ benchmark build"
    wait "$TORCH_BUILD_PID"
    cp "$BIN"/build-torch_alloc_bench.log "$OUT/logs/" 2>/dev/null
  fi
  run lat_raw 60 -- "$BIN/alloc_bench" raw malloc
  run lat_floor 60 "LD_PRELOAD=$BIN/floor_shim.so" -- "$BIN/alloc_bench" floor malloc
  run lat_driverpool 60 -- "$BIN/alloc_bench" driverpool async --release-max
  run lat_passthrough 60 $(shim_env lat_passthrough backend:passthrough) -- "$BIN/alloc_bench" passthrough malloc
  run lat_cudapool-immediate 60 $(shim_env lat_cudapool-immediate free_sync:immediate) -- \
    "$BIN/alloc_bench" cudapool-immediate malloc
  run lat_cudapool-default 60 $(shim_env lat_cudapool-default) -- "$BIN/alloc_bench" cudapool-default malloc
  run lat_cudapool-default-async 60 $(shim_env lat_cudapool-default-async) -- \
    "$BIN/alloc_bench" cudapool-default-async async
  # The same pairs in a program that first created one (idle) non-blocking stream, as most
  # programs and every framework do: the pool's device fences must then cover that stream too.
  run lat_cudapool-default-side 60 $(shim_env lat_cudapool-default-side) -- \
    "$BIN/alloc_bench" cudapool-default-side malloc --side-stream
  # A whole process can run slow on these shared machines (run 7: immediate 0.42 us per pair at
  # every size and in every round while default ran at 0.23 us): the pool's own modes and the
  # floor run LAT_REPS times in all, interleaved, and report.py keeps each size's best process.
  for rep in $(seq 2 "${LAT_REPS:-3}"); do
    run lat_floor_r$rep 60 "LD_PRELOAD=$BIN/floor_shim.so" -- "$BIN/alloc_bench" floor malloc
    run lat_cudapool-immediate_r$rep 60 $(shim_env lat_cudapool-immediate_r$rep free_sync:immediate) -- \
      "$BIN/alloc_bench" cudapool-immediate malloc
    run lat_cudapool-default_r$rep 60 $(shim_env lat_cudapool-default_r$rep) -- "$BIN/alloc_bench" cudapool-default malloc
    run lat_cudapool-default-side_r$rep 60 $(shim_env lat_cudapool-default-side_r$rep) -- \
      "$BIN/alloc_bench" cudapool-default-side malloc --side-stream
  done
  if [ -x "$BIN/torch_alloc_bench" ]; then
    run lat_torch 60 -- "$BIN/torch_alloc_bench"
  else
    say "no PyTorch C++ benchmark: $(tail -n 3 "$OUT/logs/build-torch.txt" 2>/dev/null)"
  fi
  "${REPORT[@]}" latency "$OUT"
  # The driver's own VMM costs per physical allocation (no shim), for 2 MiB and 20 MiB pages.
  if [ -x "$BIN/vmm_costs" ]; then
    run vmm_costs 60 -- "$BIN/vmm_costs"
    "${REPORT[@]}" row "$OUT" "VMM cost per handle, create+map+access (2 MiB / 20 MiB pages)" INFO \
      "$(python3 - "$OUT/logs/vmm_costs.out" <<'PY'
import re, sys
c = {}
for line in open(sys.argv[1]):
    m = re.match(r"vmm page_mib=(\S+) op=(\S+) gpu=idle us_per_call=(\S+)", line)
    if m: c[(m[1], m[2])] = float(m[3])
def per_handle(p):
    n = 400 / float(p)  # pages in the 400 MiB run: one cuMemSetAccess for all of them
    return c[(p, "create")] + c[(p, "map")] + c[(p, "set_access_run")] / n
try:
    print(f"{per_handle('2'):.1f} us / {per_handle('20'):.1f} us; move {c[('2', 'move')]:.1f} / {c[('20', 'move')]:.1f} us (logs/vmm_costs.out)")
except KeyError:
    print("no numbers (see logs/vmm_costs.out)")
PY
)"
    # What sharing pages would add: creation with a file-descriptor handle type against none,
    # and the export of one handle to a file descriptor.
    "${REPORT[@]}" row "$OUT" "VMM shareable pages: create fd vs none, export per handle (2 MiB / 20 MiB pages)" INFO \
      "$(python3 - "$OUT/logs/vmm_costs.out" <<'PY'
import re, sys
c, err = {}, []
for line in open(sys.argv[1]):
    m = re.match(r"vmm page_mib=(\S+) op=(\S+) gpu=idle us_per_call=(\S+)", line)
    if m: c[(m[1], m[2])] = float(m[3])
    e = re.match(r"vmm page_mib=(\S+) op=(\S+) error=(\S+)", line)
    if e: err.append(f"{e[2]} {e[1]} MiB: error {e[3]}")
def page(p):
    s = f"{p} MiB: create {c[(p, 'create_fd')]:.1f} vs {c[(p, 'create_none')]:.1f} us"
    if (p, "export_fd") in c: s += f", export {c[(p, 'export_fd')]:.1f} us"
    if (p, "import_fd") in c: s += f", import {c[(p, 'import_fd')]:.1f} us"
    return s
try:
    print(f"{page('2')}; {page('20')}" + (f"; {', '.join(err)}" if err else "") + " (logs/vmm_costs.out)")
except KeyError:
    print("no numbers" + (f": {', '.join(err)}" if err else "") + " (see logs/vmm_costs.out)")
PY
)"
  fi
  # A device fence over 16 idle non-blocking streams: a sweep asking each, one gathering them,
  # one context-wide event (shim/fences/cuda_fences.h), with the GPU idle and with work queued on the
  # legacy stream (no shim); and the driver's promises the context-wide fences rest on.
  if [ -x "$BIN/fence_costs" ]; then
    run fence_costs 60 -- "$BIN/fence_costs" 16
    fence_figures() {  # fence_figures ROW: one row's figures from logs/fence_costs.out
      python3 - "$OUT/logs/fence_costs.out" "$1" <<'PY'
import re, sys
c = {}
for line in open(sys.argv[1]):
    m = re.match(r"fence_costs streams=\d+ op=(\S+) us_per_call=(\S+)", line)
    if m: c[m[1]] = float(m[2])
try:
    if sys.argv[2] == "fence":
        print(f"{c['sweep_query']:.1f} / {c['sweep_gather']:.1f} / {c['ctx_record']:.2f} us; {c['busy_sweep_query']:.1f} / "
              f"{c['busy_sweep_gather']:.1f} / {c['busy_ctx_record']:.2f} us (logs/fence_costs.out)")
    else:
        print(" / ".join(f"{c['busy_' + k + 'enqueue']:.2f}" for k in
                         ("", "record_legacy_", "ctx_record_", "ctx_wait_done_", "ctx_record_wait_")) +
              " us a group (logs/fence_costs.out)")
except KeyError:
    print("no numbers (see logs/fence_costs.out)")
PY
    }
    "${REPORT[@]}" row "$OUT" "fence over 16 idle streams: asking / gathering / context-wide (GPU idle; work queued)" INFO \
      "$(fence_figures fence)"
    # Whether a fence call makes the work issued after it dearer to enqueue (a small memset on
    # the legacy stream), work queued.
    "${REPORT[@]}" row "$OUT" "next enqueue after: nothing / legacy record / ctx record / ctx wait / record+wait (work queued)" INFO \
      "$(fence_figures enqueue)"
    probes=$(grep -c "probe=.* ok=1" "$OUT/logs/fence_costs.out")
    failed=$(grep "probe=.* ok=0" "$OUT/logs/fence_costs.out" | sed 's/.*probe=\(\S*\).*/\1/' | tr '\n' ' ')
    status=FAIL
    [ "$probes" -eq 3 ] && [ -z "$failed" ] && status=PASS
    "${REPORT[@]}" row "$OUT" "context-wide event covers, and its wait orders, every stream" "$status" \
      "$probes of 3 probes hold${failed:+; failed: $failed} (logs/fence_costs.out)"
  fi
fi

# ---------------------------------------------------------------- 4. PyTorch, CuPy, JAX
# Fixed seeds and deterministic algorithms, so losses can be compared exactly.
DET=(CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0)
NOCACHE=PYTORCH_NO_CUDA_MEMORY_CACHING=1
# Each training process runs pinned to one CPU (tests/gpu/pin.sh); nvml_peak stays unpinned.
source "$ROOT/tests/gpu/pin.sh"
# One PyTorch training run in MODE as run NAME (its JSON, NVML peak and stats under that name).
torch_mode() {  # torch_mode MODE NAME
  local mode=$1 name=$2
  local T=("${TORCH_PIN[@]}" python3 "$ROOT/tests/gpu/torch_train.py" --steps 60 --d-model "${TORCH_D_MODEL:-2048}" --out "$OUT/logs/$name.json")
  case $mode in
    native) run "$name" 100 "${DET[@]}" -- $(peak "$name") "${T[@]}" ;;
    expandable) run "$name" 100 "${DET[@]}" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- $(peak "$name") "${T[@]}" ;;
    async) run "$name" 100 "${DET[@]}" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync -- $(peak "$name") "${T[@]}" ;;
    nocache) run "$name" 100 "${DET[@]}" $NOCACHE -- $(peak "$name") "${T[@]}" ;;
    # The shim is preloaded into the measured process only (env inside nvml_peak's command).
    cudapool) run "$name" 100 "${DET[@]}" $NOCACHE -- $(peak "$name") env $(shim_env "$name") "${T[@]}" ;;
    cudapool_classic) run "$name" 100 "${DET[@]}" $NOCACHE -- $(peak "$name") \
      env $(shim_env "$name" expandable_segments:False) "${T[@]}" ;;
    cudapool_exph) run "$name" 100 "${DET[@]}" $NOCACHE -- $(peak "$name") \
      env $(shim_env "$name" expandable_segments:True,expandable_headroom:0.03) "${T[@]}" ;;
    cudapool_imm) run "$name" 100 "${DET[@]}" $NOCACHE -- $(peak "$name") \
      env $(shim_env "$name" free_sync:immediate,expandable_segments:True) "${T[@]}" ;;
  esac
}
if want torch; then
  # A correct side-stream program (X read late on a side stream, X.record_stream(side), del X,
  # Y allocated at once on the default stream): PyTorch's cache, no caching, cudapool default and
  # expandable must keep it correct; free_sync:immediate must corrupt it (the negative control).
  S=(python3 "$ROOT/tests/gpu/torch_side_stream.py")
  run side_stream_native 60 -- "${S[@]}"
  run side_stream_nocache 60 $NOCACHE -- "${S[@]}"
  run side_stream_default 60 $NOCACHE $(shim_env side_stream_default) -- "${S[@]}"
  run side_stream_classic 60 $NOCACHE $(shim_env side_stream_classic expandable_segments:False) -- "${S[@]}"
  run side_stream_immediate 60 $NOCACHE $(shim_env side_stream_immediate free_sync:immediate,expandable_segments:True) \
    -- "${S[@]}"
  "${REPORT[@]}" torch_side_stream "$OUT"
  for m in native expandable async nocache cudapool cudapool_classic cudapool_imm cudapool_exph; do torch_mode $m torch_$m; done
  # Step times of one mode move by tens of percent between processes on these shared machines
  # (13-20 ms for PyTorch native across earlier runs), far more than the allocators differ. So
  # the timed modes run TORCH_REPS times in all, interleaved, and report.py takes each mode's
  # best median (interference only adds time). Peaks and losses come from the first pass.
  for rep in $(seq 2 "${TORCH_REPS:-3}"); do
    for m in native expandable async cudapool cudapool_classic cudapool_imm cudapool_exph; do torch_mode $m torch_${m}_t$rep; done
  done
  "${REPORT[@]}" torch "$OUT"
fi

if want cnn; then
  # CPU-bound PyTorch: ResNet-50 training and inference at changing shapes (torch_cnn.py) and HF
  # GPT-2 training (hf_lm.py), CNN_REPS interleaved pinned processes of each mode, medians, peaks
  # against the no-caching floor (docs/benchmarks.md has the table). Benchmarks: INFO rows.
  for w in cnn cnninf hf; do
    OUT=$OUT/reps-$w CUDAPOOL_SHIM=$SHIM NVML_PEAK=$BIN/nvml_peak TORCH_WORKLOAD=$w REPS_BUDGET_S=$(( $(left) / 4 )) \
      bash tests/gpu/torch_reps.sh "${CNN_REPS:-3}" native ptexp nocache cpdef >"$OUT/logs/reps-$w.txt" 2>&1
    "${REPORT[@]}" row "$OUT" "CPU-bound PyTorch ($w): step and peak, medians of processes" INFO \
      "$(grep -E '^relative|^peak' "$OUT/logs/reps-$w.txt" | tr '\n' ' ')"
  done
fi

if want pluggable; then
  # PyTorch's pluggable allocator through cudapool.torch.use() (tests/gpu/torch_pluggable.sh):
  # torch.cuda's statistics against the pool's, cuDNN's benchmark mode, the OOM type, record_stream,
  # the largest GPT-2 batch under a cap. Then the step time and peak of ResNet-50 training and
  # GPT-2 through it (cppt) against PyTorch native and PyTorch's expandable segments (ptexp: the
  # peak to stay under), interleaved pinned processes (INFO rows).
  OUT=$OUT/pluggable CUDAPOOL_SHIM=$SHIM timeout -k 5 "$(( $(left) / 3 ))" bash tests/gpu/torch_pluggable.sh \
    >"$OUT/logs/pluggable.txt" 2>&1
  rc=$?
  "${REPORT[@]}" row "$OUT" "PyTorch pluggable path: stats, cuDNN benchmark, OOM, record_stream, largest batch" \
    "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" \
    "$(grep -E '^largest batch|^pluggable >=|^torch_pluggable:' "$OUT/logs/pluggable.txt" | tr '\n' ' ')"
  for w in cnn hf; do
    OUT=$OUT/reps-pt-$w CUDAPOOL_SHIM=$SHIM NVML_PEAK=$BIN/nvml_peak TORCH_WORKLOAD=$w REPS_BUDGET_S=$(( $(left) / 3 )) \
      bash tests/gpu/torch_reps.sh "${CNN_REPS:-3}" native ptexp cppt >"$OUT/logs/reps-pt-$w.txt" 2>&1
    "${REPORT[@]}" row "$OUT" "PyTorch pluggable path ($w): step and peak against native, expandable" INFO \
      "$(grep -E '^relative|^peak' "$OUT/logs/reps-pt-$w.txt" | tr '\n' ' ')"
  done
fi

if want pinned; then
  # Pinned host memory of a data loader (tests/gpu/pinned_loader.sh): held/live at peak and time
  # per batch of the pinned pool against PyTorch's pin_memory, rounds interleaved.
  OUT=$OUT/pinned SHIM=$SHIM timeout -k 5 "$(( $(left) / 6 ))" bash tests/gpu/pinned_loader.sh "${PINNED_ROUNDS:-3}" \
    >"$OUT/logs/pinned.txt" 2>&1
  for t in "held/live" "time/batch"; do
    line=$(grep -E "^pool $t" "$OUT/logs/pinned.txt" | tail -1)
    case "$line" in *PASS*) st=PASS ;; *FAIL*) st=FAIL ;; *) st=MISS line="no verdict (logs/pinned.txt)" ;; esac
    "${REPORT[@]}" row "$OUT" "pinned pool ($t) vs PyTorch pin_memory" "$st" "$line"
  done
fi

if want warm; then
  # Warm start on GPT-2 (tests/gpu/warm_start.sh): first step over a steady one, with and without
  # a plan made from the first run's trace; 5 interleaved rounds.
  OUT=$OUT/warm-start CUDAPOOL_SHIM=$SHIM CUDAPOOL_BIN=${CUDAPOOL_BIN:-$ROOT/build/release/cudapool} \
    timeout -k 5 "$(( $(left) / 5 ))" bash tests/gpu/warm_start.sh "${WARM_ROUNDS:-5}" >"$OUT/logs/warm.txt" 2>&1
  rc=$?
  line=$(grep -E "^warm start:|^first step|^FAIL" "$OUT/logs/warm.txt" | tr '\n' ' ')
  "${REPORT[@]}" row "$OUT" "warm start: first step within 10 % of a steady one" \
    "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" "${line:-no summary (logs/warm.txt)}"
fi

if want cupy; then
  C=(python3 "$ROOT/tests/gpu/cupy_work.py")
  run cupy_pool 60 -- $(peak cupy_pool) "${C[@]}" --pool default --out "$OUT/logs/cupy_pool.json"
  run cupy_nopool 60 -- $(peak cupy_nopool) "${C[@]}" --pool none --out "$OUT/logs/cupy_nopool.json"
  run cupy_cudapool 60 -- $(peak cupy_cudapool) env $(shim_env cupy_cudapool) "${C[@]}" --pool none \
    --out "$OUT/logs/cupy_cudapool.json"
  "${REPORT[@]}" cupy "$OUT"
fi

if want jax; then
  J=(python3 "$ROOT/tests/gpu/jax_work.py")
  run jax_bfc 60 -- $(peak jax_bfc) "${J[@]}" --out "$OUT/logs/jax_bfc.json"
  run jax_bfc_noprealloc 60 XLA_PYTHON_CLIENT_PREALLOCATE=false -- $(peak jax_bfc_noprealloc) "${J[@]}" \
    --out "$OUT/logs/jax_bfc_noprealloc.json"
  run jax_platform 60 XLA_PYTHON_CLIENT_ALLOCATOR=platform -- $(peak jax_platform) "${J[@]}" \
    --out "$OUT/logs/jax_platform.json"
  run jax_cudapool 60 XLA_PYTHON_CLIENT_ALLOCATOR=platform -- $(peak jax_cudapool) env $(shim_env jax_cudapool) \
    "${J[@]}" --out "$OUT/logs/jax_cudapool.json"
  "${REPORT[@]}" jax "$OUT"
fi

# ---------------------------------------------------------------- 7. DDP on two GPUs
if want ddp; then
  if [ "$NGPU" -ge 2 ]; then
    D=(python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$ROOT/tests/gpu/torch_train.py" --ddp --steps 40)
    run ddp_ref 120 "${DET[@]}" $NOCACHE -- $(peak ddp_ref) "${D[@]}" --out "$OUT/logs/ddp_ref.rankRANK.json"
    # Both ranks and torchrun itself (which never touches CUDA) run under the shim; no stats file,
    # as two ranks would write the same one.
    run ddp_cudapool 120 "${DET[@]}" $NOCACHE -- $(peak ddp_cudapool) env "LD_PRELOAD=$SHIM" "${D[@]}" \
      --out "$OUT/logs/ddp_cudapool.rankRANK.json"
    "${REPORT[@]}" ddp "$OUT"
  else
    "${REPORT[@]}" miss "$OUT" "DDP 2 ranks: losses" "$NGPU GPU(s) here; needs 2 (nvidia-smi -L)"
  fi
fi

say "done in $(( $(date +%s) - START )) s"
"${REPORT[@]}" table "$OUT"
