#!/usr/bin/env bash
# Runs tests/gpu/run.sh on this machine (no GPU needed) with stand-in programs (mock/fakeprog),
# twice: with a well-behaved pool every check must PASS; with a broken one (MOCK_BROKEN=1) the
# checks that guard against it must FAIL. This tests the suite's plumbing and its verdicts,
# not the shim. Run by `make test` (tests/mk/gpu.mk).
set -u
read -r -a CXXV <<< "${CXX:-g++}"  # CXX may be a command with arguments ("ccache g++")
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
for p in correctness correctness_shared driver_api race free_host_sync ipc stream_ordered graph_capture device_reset \
         legacy_app alloc_bench torch_alloc_bench nvml_peak; do
  ln -s "$PWD/tests/gpu/mock/fakeprog" "$work/bin/$p"
done
echo 'int cudapool_mock_marker;' >"$work/empty.c"
cc -shared -fPIC -o "$work/libfake.so" "$work/empty.c" || exit 1
cp "$work/libfake.so" "$work/bin/floor_shim.so"  # run.sh preloads it for the latency floor

failures=0
expect() {  # expect RESULTS_TSV "check name prefix" STATUS
  local got
  got=$(awk -F'\t' -v c="$2" 'index($1, c) == 1 { print $6; exit }' "$1")
  if [ "$got" = "$3" ]; then echo "PASS $2 -> $3"
  else echo "FAIL $2: expected $3, got '${got:-no row}'"; failures=$((failures + 1)); fi
}

checks="load correctness race ordered legacy latency"
OUT=$work/good GPU_BIN=$work/bin CUDAPOOL_SHIM=$work/libfake.so GPU_ONLY=$checks \
  bash tests/gpu/run.sh >"$work/good.txt" 2>&1
rc_good=$?
r=$work/good/results.tsv
expect "$r" "shim loads" PASS
expect "$r" "correctness (static cudart): output" PASS
expect "$r" "correctness (shared cudart): served by the pool" PASS
expect "$r" "driver API, -lcuda: served by the pool" PASS
expect "$r" "reuse race, default (gpu_wait)" PASS
expect "$r" "reuse race, free_sync:fenced" PASS
expect "$r" "reuse race, free_sync:device" PASS
expect "$r" "reuse race, free_sync:immediate shows it" PASS
expect "$r" "reuse race, classic segments" PASS
expect "$r" "cudaFree host wait, default" INFO
expect "$r" "cudaFree host wait, free_host_sync:True" PASS
expect "$r" "correctness, classic segments" PASS
expect "$r" "cudaDeviceReset mid-run" PASS
expect "$r" "cudaMalloc during global capture" FAIL   # the mock pool answers 0 where CUDA says 900
expect "$r" "legacy app: time in cudaMalloc/cudaFree" PASS
expect "$r" "legacy app: wall vs buffers allocated once" PASS
expect "$r" "alloc+free pair, tight, immediate" PASS
expect "$r" "pair vs same-run floor, tight, immediate" INFO
expect "$r" "pair vs same-run floor, bursts, default" INFO
expect "$r" "16 threads vs 1 thread" PASS
expect "$r" "16 threads, default vs PyTorch" PASS
grep -q '^check ' "$work/good.txt" || { echo "FAIL no table printed"; failures=$((failures + 1)); }
[ "$(tail -n 1 "$work/good.txt" | grep -c 'PASS')" = 1 ] || { echo "FAIL table is not last"; failures=$((failures + 1)); }
[ -s "$work/good/results.md" ] || { echo "FAIL no results.md"; failures=$((failures + 1)); }
[ "$rc_good" = 1 ] || { echo "FAIL run.sh must exit 1 when a check fails (got $rc_good)"; failures=$((failures + 1)); }

OUT=$work/bad GPU_BIN=$work/bin CUDAPOOL_SHIM=$work/libfake.so GPU_ONLY=$checks MOCK_BROKEN=1 \
  bash tests/gpu/run.sh >"$work/bad.txt" 2>&1
r=$work/bad/results.tsv
expect "$r" "correctness (static cudart): output" FAIL
expect "$r" "correctness (static cudart): served by the pool" FAIL
expect "$r" "reuse race, default (gpu_wait)" FAIL
expect "$r" "reuse race, free_sync:fenced" FAIL
expect "$r" "cudaFree host wait, free_host_sync:True" FAIL
expect "$r" "cudaDeviceReset mid-run" FAIL
expect "$r" "legacy app: time in cudaMalloc/cudaFree" FAIL
expect "$r" "legacy app: wall vs buffers allocated once" FAIL
expect "$r" "alloc+free pair, tight, default" FAIL
expect "$r" "16 threads vs 1 thread" FAIL

# Rows that measured nothing must not pass: a program that made no allocation calls (pooled),
# legacy times of 0 (no infinite ratio).
mkdir -p "$work/zero/logs"
printf '0\n' >"$work/zero/logs/p.rc"; printf 'alloc_calls=0\n' >"$work/zero/logs/p.err"
echo '{"device": {"cache_misses": 0}}' >"$work/zero/logs/p.stats.json"
for n in legacy_ref legacy_shim; do
  printf '0\n' >"$work/zero/logs/$n.rc"; echo "legacy: iterations=3000 result=42" >"$work/zero/logs/$n.out"
done
printf 'wall_s=0.9 alloc_s=0.6\n' >"$work/zero/logs/legacy_ref.err"; printf 'wall_s=0.3 alloc_s=0.000000\n' >"$work/zero/logs/legacy_shim.err"
python3 tests/gpu/report.py pooled "$work/zero" "pooled with no calls" p >/dev/null
python3 tests/gpu/report.py legacy "$work/zero" >/dev/null
expect "$work/zero/results.tsv" "pooled with no calls" FAIL
expect "$work/zero/results.tsv" "legacy app: time in cudaMalloc/cudaFree" FAIL

# The budget: with none left, runs are skipped and reported as MISS, not as PASS.
OUT=$work/late GPU_BIN=$work/bin CUDAPOOL_SHIM=$work/libfake.so GPU_ONLY=race GPU_SUITE_BUDGET_S=5 \
  bash tests/gpu/run.sh >"$work/late.txt" 2>&1
expect "$work/late/results.tsv" "reuse race, default (gpu_wait)" MISS
expect "$work/late/results.tsv" "cudaFree host wait, free_host_sync:True" MISS

# A table in which nothing passed (every row MISS or INFO) measured nothing: exit status 1.
mkdir -p "$work/allmiss"
printf 'reuse race, default (gpu_wait): corrupted bytes\t\t\t\t0\tMISS\tbudget spent\nlegacy app: wall time\t1\t1\t1x\t\tINFO\t\n' \
  >"$work/allmiss/results.tsv"
if python3 tests/gpu/report.py table "$work/allmiss" >/dev/null 2>&1; then
  echo "FAIL a table of MISS and INFO rows exits 0"; failures=$((failures + 1))
else echo "PASS a table of MISS and INFO rows exits 1"; fi
# No row measured at all (an empty results.tsv, or none: run.sh died first) is no pass either.
mkdir -p "$work/norows" "$work/emptyrows"; : >"$work/emptyrows/results.tsv"
for d in norows emptyrows; do
  if python3 tests/gpu/report.py table "$work/$d" >/dev/null 2>&1; then
    echo "FAIL a table without rows ($d) exits 0"; failures=$((failures + 1))
  else echo "PASS a table without rows ($d) exits 1"; fi
done

# gpu_wait must be seen at work: no corruption but no reuse either is not a PASS for the default.
OUT=$work/noreuse GPU_BIN=$work/bin CUDAPOOL_SHIM=$work/libfake.so GPU_ONLY=race MOCK_RACE_NO_REUSE=1 \
  bash tests/gpu/run.sh >"$work/noreuse.txt" 2>&1
expect "$work/noreuse/results.tsv" "reuse race, default (gpu_wait)" FAIL
expect "$work/noreuse/results.tsv" "reuse race, free_sync:fenced" PASS

# The latency harness itself, over host malloc: it must end (bounded bursts and loops) and print
# one well-formed line per size x pattern and per thread count.
if "${CXXV[@]}" -std=c++17 -O2 -Wall -Wextra -Werror -pthread -o "$work/host_bench" tests/gpu/mock/host_bench.cpp; then
  timeout 30 "$work/host_bench" >"$work/host_bench.csv"
  lines=$(awk -F, 'NR > 1 && NF == 11 && $10 == 0 && ($3 == "threads" ? $9 > 0 : $6 > 0 && $7 > 0 && $11 >= $7)' "$work/host_bench.csv" | wc -l)
  if [ "$lines" = 19 ]; then echo "PASS latency harness: 19 measurements"
  else echo "FAIL latency harness: $lines good lines of 19"; cat "$work/host_bench.csv"; failures=$((failures + 1)); fi
else
  echo "FAIL latency harness does not compile warning-free"; failures=$((failures + 1))
fi

# Latency repeats (run.sh's lat_LABEL_rK): each size keeps its best process, so one slow process
# (here the first and third immediate ones, 5 and 4 us) does not decide the verdict; the worst
# round of any process is kept too.
python3 - "$work/lat" <<'PY'
import os, sys
logs = os.path.join(sys.argv[1], "logs"); os.makedirs(logs)
head = "label,api,pattern,size,threads,samples,median_ns,p99_ns,pairs_per_s,failed,median_max_ns\n"
def put(name, label, median):
    with open(f"{logs}/{name}.rc", "w") as f: f.write("0\n")
    with open(f"{logs}/{name}.out", "w") as f:
        f.write(head)
        for size in (256, 1048576):
            for pat in ("tight", "burst"):
                f.write(f"{label},malloc,{pat},{size},1,100,{median},{median * 2},{1e9 / median:.0f},0,{median + 10}\n")
put("lat_raw", "raw", 60000); put("lat_floor", "floor", 150)
put("lat_cudapool-immediate", "cudapool-immediate", 5000); put("lat_cudapool-immediate_r2", "cudapool-immediate", 200)
put("lat_cudapool-immediate_r3", "cudapool-immediate", 4000)
PY
python3 tests/gpu/report.py latency "$work/lat" >/dev/null
expect "$work/lat/results.tsv" "alloc+free pair, tight, immediate" PASS
grep -q "0.200 / 0.400 (5.010)" "$work/lat/details/latency.md" && echo "PASS worst round of any process shown" ||
  { echo "FAIL latency details do not show the slow process's round"; failures=$((failures + 1)); }

# The Python workloads' verdicts, from hand-made results: identical losses and a small peak pass;
# a loss that differs in the last bit, a slower step or a larger peak fail.
python3 - "$work/py" <<'PY'
import json, os, sys
logs = os.path.join(sys.argv[1], "logs"); os.makedirs(logs)
def put(name, losses, step_ms, peak, rc=0):
    with open(f"{logs}/{name}.rc", "w") as f: f.write(f"{rc}\n")
    with open(f"{logs}/{name}.json", "w") as f: json.dump({"losses": losses, "results": losses, "median_step_ms": step_ms}, f)
    with open(f"{logs}/{name}.peak.json", "w") as f: json.dump({"devices": [{"peak_delta": peak}]}, f)
l = [2.5, 2.25, 2.0000001]
put("torch_native", l, 10.0, 5e9); put("torch_expandable", l, 11.0, 4e9); put("torch_async", l, 12.0, 4e9)
put("torch_nocache", l, 30.0, 3.0e9); put("torch_cudapool", l, 9.5, 3.05e9)
put("torch_cudapool_classic", l[:2] + [2.0000002], 9.8, 3.5e9)
# Timing repeats (run.sh's NAME_tK): each mode's best median counts, failed repeats do not.
# Default passes only through its own repeat (8.9 <= native's repeat 9.0; its first pass is 9.5);
# classic (9.8) fails only because native's repeat counts (9.8 <= 10.0 otherwise) and its own
# failed repeat (1.0 ms, rc 1) is ignored.
put("torch_native_t2", l, 9.0, 5e9); put("torch_cudapool_t2", l, 8.9, 3.05e9)
put("torch_cudapool_classic_t3", l, 1.0, 3.5e9, rc=1)
PY
python3 tests/gpu/report.py torch "$work/py" >/dev/null
r=$work/py/results.tsv
expect "$r" "PyTorch training: losses, cudapool default" PASS
expect "$r" "PyTorch training: losses, cudapool classic" FAIL
expect "$r" "PyTorch step time, cudapool default" PASS
expect "$r" "PyTorch step time, cudapool classic" FAIL
expect "$r" "PyTorch peak memory, cudapool default" PASS
expect "$r" "PyTorch peak memory, cudapool classic" INFO

# torch_reps.sh: a stand-in python3 answers torch_train.py with fixed step times (cudapool with
# a policy 10 % slower than native); the summary must rank native first and say 1.100x.
mkdir -p "$work/fakepy"
{
  echo '#!/bin/bash'
  echo "real=$(command -v python3)"
  cat <<'SH'
if [[ "$1" == *torch_train.py ]]; then
  out=; while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
  ms=20; [ -n "${CUDAPOOL_CONF:-}" ] && ms=22
  exec "$real" -c "import json,sys; json.dump({'step_s': [$ms / 1000.0] * 60}, open(sys.argv[1], 'w'))" "$out"
fi
if [[ "$1" == *torch_ipc.py ]]; then  # shares without caching; "refuses" with PyTorch's cache
  if [ "${PYTORCH_NO_CUDA_MEMORY_CACHING:-}" = 1 ]; then echo "torch_ipc: PASS sizes=1024 (stand-in)"
  else echo "torch_ipc: REFUSED RuntimeError: stand-in refusal"; fi
  exit 0
fi
if [[ "$1" == *hf_lm.py ]]; then  # TORCH_WORKLOAD=hf: --steps HF_STEPS, no --d-model
  out= steps=
  while [ $# -gt 0 ]; do
    case $1 in --out) out=$2 ;; --steps) steps=$2 ;; --d-model) echo "hf_lm.py got --d-model" >&2; exit 3 ;; esac
    shift
  done
  ms=30; [ -n "${CUDAPOOL_CONF:-}" ] && ms=36
  exec "$real" -c "import json,sys; json.dump({'step_s': [$ms / 1000.0] * $steps}, open(sys.argv[1], 'w'))" "$out"
fi
exec "$real" "$@"
SH
} >"$work/fakepy/python3"
chmod +x "$work/fakepy/python3"
reps=$(PATH="$work/fakepy:$PATH" OUT="$work/reps" bash tests/gpu/torch_reps.sh 2 native slow=expandable_segments:True 2>&1)
if grep -q "relative to the fastest median (native): native 1.000x, slow 1.100x" <<<"$reps" &&
   grep -q "^slow .*n= 2" <<<"$reps"; then
  echo "PASS torch_reps.sh ranks the modes"
else
  echo "FAIL torch_reps.sh summary: $reps"; failures=$((failures + 1))
fi
# With NVML_PEAK: a stand-in nvml_peak records 2 GB, or 3 GB for a cudapool policy, then runs
# the command; peaks must be reported against the no-caching mode.
cat >"$work/fakepy/nvml_peak" <<'SH'
#!/bin/bash
out=$1; shift 2
peak=2000000000; [[ " $* " == *" CUDAPOOL_CONF="* ]] && peak=3000000000
echo "{\"devices\": [{\"peak_delta\": $peak}]}" >"$out"
exec "$@"
SH
chmod +x "$work/fakepy/nvml_peak"
reps=$(PATH="$work/fakepy:$PATH" OUT="$work/reps2" NVML_PEAK="$work/fakepy/nvml_peak" \
  bash tests/gpu/torch_reps.sh 1 nocache slow=expandable_segments:True 2>&1)
if grep -q "peak / no caching: nocache 1.000x, slow 1.500x" <<<"$reps"; then
  echo "PASS torch_reps.sh reports peaks against no caching"
else
  echo "FAIL torch_reps.sh peaks: $reps"; failures=$((failures + 1))
fi

# TORCH_WORKLOAD=hf runs hf_lm.py --steps HF_STEPS instead (cudapool 20 % slower in the stand-in).
reps=$(PATH="$work/fakepy:$PATH" OUT="$work/reps_hf" TORCH_WORKLOAD=hf HF_STEPS=12 \
  bash tests/gpu/torch_reps.sh 2 native slow=expandable_segments:True 2>&1)
if grep -q "relative to the fastest median (native): native 1.000x, slow 1.200x" <<<"$reps" &&
   python3 -c 'import json, sys; sys.exit(len(json.load(open(sys.argv[1]))["step_s"]) != 12)' "$work/reps_hf/slow_2.json"; then
  echo "PASS torch_reps.sh TORCH_WORKLOAD=hf runs hf_lm.py"
else
  echo "FAIL torch_reps.sh TORCH_WORKLOAD=hf: $reps"; failures=$((failures + 1))
fi
# Pinned (tests/gpu/pin.sh) on CPU 0, which every machine has: the stand-in still answers
# through taskset, and the summary says how the processes ran.
if command -v taskset >/dev/null; then
  reps=$(PATH="$work/fakepy:$PATH" OUT="$work/reps3" TORCH_PIN_CPU=0 \
    bash tests/gpu/torch_reps.sh 1 native slow=expandable_segments:True 2>&1)
  if grep -q "^training processes: taskset -c 0$" <<<"$reps" && grep -q "slow 1.100x" <<<"$reps"; then
    echo "PASS torch_reps.sh pins the training processes"
  else
    echo "FAIL torch_reps.sh pinning: $reps"; failures=$((failures + 1))
  fi
fi
# The ipc section of run.sh with stand-ins (ipc: mock/fakeprog; torch_ipc.py: the python3
# stand-in above): each run gets --expect-shim exactly when it runs under the shim.
OUT=$work/ipcrun GPU_BIN=$work/bin CUDAPOOL_SHIM=$work/libfake.so GPU_ONLY=ipc PATH="$work/fakepy:$PATH" \
  bash tests/gpu/run.sh >"$work/ipcrun.txt" 2>&1
r=$work/ipcrun/results.tsv
expect "$r" "CUDA IPC, no shim (the driver): ipc.cu checks" PASS
expect "$r" "CUDA IPC, cudapool default: ipc.cu checks" PASS
expect "$r" "CUDA IPC, cudapool classic segments: ipc.cu checks" PASS
expect "$r" "CUDA IPC, PyTorch no caching, no shim" PASS
expect "$r" "CUDA IPC, PyTorch no caching, cudapool default" PASS
expect "$r" "CUDA IPC, PyTorch caching allocator on cudapool" INFO
expect "$r" "CUDA IPC: the driver given a cudapool handle" INFO
expect "$r" "CUDA IPC: pidfd_getfd" INFO
OUT=$work/ipcbad GPU_BIN=$work/bin CUDAPOOL_SHIM=$work/libfake.so GPU_ONLY=ipc PATH="$work/fakepy:$PATH" MOCK_BROKEN=1 \
  bash tests/gpu/run.sh >"$work/ipcbad.txt" 2>&1
expect "$work/ipcbad/results.tsv" "CUDA IPC, no shim (the driver): ipc.cu checks" PASS
expect "$work/ipcbad/results.tsv" "CUDA IPC, cudapool default: ipc.cu checks" FAIL

# step_table.py: each process's median step / host time, per-step medians over the processes.
mkdir -p "$work/steps"
python3 - "$work/steps" <<'PY'
import json, sys
for rep, (step, host) in enumerate([(0.020, 0.012), (0.030, 0.020), (0.022, 0.014)], 1):
    s = [step] * 60
    s[17] = 2 * step  # a growth step
    json.dump({"step_s": s, "step_host_s": [host] * 60}, open(f"{sys.argv[1]}/m_{rep}.json", "w"))
PY
tab=$(python3 tests/gpu/step_table.py "$work/steps" m --steps 17,20 2>&1)
if grep -q "processes (step/host ms): 20.00/12.00 30.00/20.00 22.00/14.00" <<<"$tab" &&
   grep -q "s17 44.00 s20 22.00  |  steady (from 18) 22.00" <<<"$tab"; then
  echo "PASS step_table.py medians per process and per step"
else
  echo "FAIL step_table.py: $tab"; failures=$((failures + 1))
fi

# torch_side_stream.py's verdicts, from hand-made outputs: no corruption passes for the correct
# modes and fails for the negative control; corruption fails the former and passes the latter; a
# missing run is MISS, a crash or an output without totals FAIL.
python3 - "$work/side" <<'PY'
import os, sys
logs = os.path.join(sys.argv[1], "logs"); os.makedirs(logs)
def put(name, cc, nbytes, rc=0, totals=True):
    with open(f"{logs}/{name}.rc", "w") as f: f.write(f"{rc}\n")
    with open(f"{logs}/{name}.out", "w") as f:
        f.write(f"size 4096: corrupted_cases={cc} cases=30 corrupted={nbytes} reused=30\n")
        if totals:
            f.write(f"corrupted_cases={cc} cases=30\ncorrupted_bytes={nbytes}\nreused_cases=30\n")
put("side_stream_native", 0, 0); put("side_stream_nocache", 0, 0, totals=False)
put("side_stream_default", 3, 12288); put("side_stream_immediate", 30, 4096 * 30)
# side_stream_classic: not run
PY
python3 tests/gpu/report.py torch_side_stream "$work/side" >/dev/null
r=$work/side/results.tsv
expect "$r" "PyTorch side stream, PyTorch caching allocator" PASS
expect "$r" "PyTorch side stream, no caching, no shim" FAIL
expect "$r" "PyTorch side stream, no caching, cudapool default" FAIL
expect "$r" "PyTorch side stream, no caching, cudapool classic" MISS
expect "$r" "PyTorch side stream, negative control" PASS
python3 - "$work/side2" <<'PY'
import os, sys
logs = os.path.join(sys.argv[1], "logs"); os.makedirs(logs)
for name in ("side_stream_native", "side_stream_nocache", "side_stream_default", "side_stream_classic",
             "side_stream_immediate"):
    with open(f"{logs}/{name}.rc", "w") as f: f.write("0\n")
    with open(f"{logs}/{name}.out", "w") as f: f.write("corrupted_cases=0 cases=30\ncorrupted_bytes=0\nreused_cases=0\n")
with open(f"{logs}/side_stream_native.rc", "w") as f: f.write("1\n")  # crashed
PY
python3 tests/gpu/report.py torch_side_stream "$work/side2" >/dev/null
r=$work/side2/results.tsv
expect "$r" "PyTorch side stream, PyTorch caching allocator" FAIL
expect "$r" "PyTorch side stream, no caching, cudapool default" PASS
expect "$r" "PyTorch side stream, no caching, cudapool classic" PASS
expect "$r" "PyTorch side stream, negative control" FAIL

# report.py ipc from hand-made logs: a passing run, a failing one (with its failed check in the
# note), a missing one (MISS); torch_ipc.py crashed (FAIL), missing (MISS), refused (INFO).
python3 - "$work/ipc" <<'PY'
import os, sys
logs = os.path.join(sys.argv[1], "logs"); os.makedirs(logs)
def put(name, rc, text):
    with open(f"{logs}/{name}.rc", "w") as f: f.write(f"{rc}\n")
    with open(f"{logs}/{name}.out", "w") as f: f.write(text)
put("ipc_ref", 0, "pidfd_getfd: errno=1 (EPERM)\nptrace_scope: 1\nipc CHECK=read_a4k ok=1 detail=bad=0\nipc: PASS n=1\n")
put("ipc_default", 1, "ipc CHECK=read_b4k ok=0 detail=bad=4096 of 4096 bytes\n"
    "ipc CHECK=noshim_importer_a4k ok=1 detail=err=400 (cudaErrorInvalidResourceHandle)\n"
    "ipc: FAIL n=2 failed=read_b4k\n")
put("torch_ipc_ref", 1, "")
put("torch_ipc_cached_shim", 0, "torch_ipc: REFUSED RuntimeError: invalid device pointer\n")
PY
python3 tests/gpu/report.py ipc "$work/ipc" >/dev/null
r=$work/ipc/results.tsv
expect "$r" "CUDA IPC, no shim (the driver): ipc.cu checks" PASS
expect "$r" "CUDA IPC, cudapool default: ipc.cu checks" FAIL
expect "$r" "CUDA IPC, cudapool classic segments: ipc.cu checks" MISS
expect "$r" "CUDA IPC, PyTorch no caching, no shim" FAIL
expect "$r" "CUDA IPC, PyTorch no caching, cudapool default" MISS
expect "$r" "CUDA IPC, PyTorch caching allocator on cudapool" INFO
expect "$r" "CUDA IPC: the driver given a cudapool handle" INFO
expect "$r" "CUDA IPC: pidfd_getfd" INFO
grep -q "read_b4k: bad=4096 of 4096 bytes" "$r" && echo "PASS ipc FAIL row names the failed check" ||
  { echo "FAIL ipc FAIL row does not name the failed check"; failures=$((failures + 1)); }

# warm_start.sh with stand-ins: hf_lm.py's first step costs 90 ms against 30 ms steady, 31 ms
# when the policy names a plan and the stand-in "preallocates" (its log says so, as the shim's
# does); the recorded run writes a trace and a stand-in `cudapool plan` a plan. With
# WARM_BROKEN=1 the stand-in ignores the plan: the verdict must then FAIL.
mkdir -p "$work/fakewarm"
{
  echo '#!/bin/bash'
  echo "real=$(command -v python3)"
  cat <<'SH'
if [[ "$1" == *hf_lm.py ]]; then
  out= steps=
  while [ $# -gt 0 ]; do case $1 in --out) out=$2 ;; --steps) steps=$2 ;; esac; shift; done
  conf=",${CUDAPOOL_CONF:-},"
  trace=$(sed -n 's/.*,trace_file:\([^,]*\),.*/\1/p' <<<"$conf")
  log=$(sed -n 's/.*,log_file:\([^,]*\),.*/\1/p' <<<"$conf")
  [ -n "$trace" ] && echo "Thread,Time,Action,Pointer,Size,Stream,device,requested,time_ns,duration_ns,detail" >"$trace"
  first=90
  if [[ "$conf" == *,warm_start:* && -z "${WARM_BROKEN:-}" ]]; then
    first=31
    [ -n "$log" ] && echo "[cudapool 1] [info] warm_start: device 0: 512 MiB preallocated (2 MiB small pool)" >"$log"
  fi
  exec "$real" -c "import json,sys; json.dump({'step_s': [$first / 1000.0] + [0.03] * ($steps - 1)}, open(sys.argv[1], 'w'))" "$out"
fi
exec "$real" "$@"
SH
} >"$work/fakewarm/python3"
printf '#!/bin/bash\n[ "$1" = plan ] && [ -s "$2" ] && [ "$3" = -o ] && printf "cudapool-warm-start-plan 1\\nsegment 0 large classic 20971520\\n" >"$4"\n' \
  >"$work/fakewarm/cudapool"
chmod +x "$work/fakewarm/python3" "$work/fakewarm/cudapool"
warm=$(PATH="$work/fakewarm:$PATH" OUT="$work/warm" CUDAPOOL_SHIM=$work/libfake.so CUDAPOOL_BIN=$work/fakewarm/cudapool \
  TORCH_PIN_CPU=none bash tests/gpu/warm_start.sh 5 2>&1)
rc_warm=$?
if [ $rc_warm = 0 ] && grep -q "3.000x without, 1.033x with warm start" <<<"$warm" &&
   grep -q "^| warm_start:PLAN | 5 | 31.0 | 30.0 | 1.033 |.* | 512 |$" <<<"$warm" &&
   grep -q "first step within 10 % of a steady step: PASS" <<<"$warm"; then
  echo "PASS warm_start.sh compares first and steady steps"
else
  echo "FAIL warm_start.sh (rc $rc_warm): $warm"; failures=$((failures + 1))
fi
warm=$(PATH="$work/fakewarm:$PATH" OUT="$work/warm2" CUDAPOOL_SHIM=$work/libfake.so CUDAPOOL_BIN=$work/fakewarm/cudapool \
  TORCH_PIN_CPU=none WARM_BROKEN=1 bash tests/gpu/warm_start.sh 5 2>&1)
rc_warm=$?
if [ $rc_warm = 1 ] && grep -q "FAIL: a warm-start process preallocated nothing" <<<"$warm" &&
   grep -q "first step within 10 % of a steady step: FAIL (3.000x)" <<<"$warm"; then
  echo "PASS warm_start.sh fails when the plan changes nothing"
else
  echo "FAIL warm_start.sh with a warm start that does nothing (rc $rc_warm): $warm"; failures=$((failures + 1))
fi
# run.sh's warm section turns warm_start.sh's verdict into a row of the table.
for broken in "" 1; do
  d=$work/runwarm${broken}
  PATH="$work/fakewarm:$PATH" OUT=$d GPU_BIN=$work/bin CUDAPOOL_SHIM=$work/libfake.so \
    CUDAPOOL_BIN=$work/fakewarm/cudapool TORCH_PIN_CPU=none WARM_BROKEN=$broken GPU_ONLY=warm \
    bash tests/gpu/run.sh >"$d.txt" 2>&1
  expect "$d/results.tsv" "warm start: first step within 10 %" "$([ -z "$broken" ] && echo PASS || echo FAIL)"
done

if [ "$failures" -gt 0 ]; then
  echo "--- run.sh output (good pool):"; tail -n 40 "$work/good.txt"
  exit 1
fi
echo "selftest: all expectations met"
