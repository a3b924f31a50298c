#!/usr/bin/env bash
# Step-time A/B of PyTorch modes with many interleaved processes: the suite's best-of-3 cannot
# resolve a few percent on the lent VMs (one mode's processes spread by 10-25 %).
#   bash tests/gpu/torch_reps.sh [REPS] MODE...
# MODE: a name (native, ptexp, async, nocache, cpdef, cpcls, cpimm, cppt, cpptl) or
# NAME=CUDAPOOL_CONF for cudapool with that policy (PYTORCH_NO_CUDA_MEMORY_CACHING=1), e.g.
# h3=expandable_segments:True,expandable_headroom:0.03 (a trace_file:/tmp/t-%p.csv in it gives
# one trace per process, for tests/gpu/step_events.py), NAME=pt:CUDAPOOL_CONF for the
# pluggable path (as cppt) under that policy, or NAME=lib:PATH for another build of the library
# under the default policy (as cpdef: two builds A/B'd in the same rounds), NAME=ptlib:PATH the
# same through the pluggable path (as cppt).
# Environment: TORCH_WORKLOAD (unset or "torch": torch_train.py --d-model TORCH_D_MODEL --steps 60;
# "hf": hf_lm.py --steps HF_STEPS, HF transformers' GPT-2 with a 50257-token vocabulary, HF_STEPS
# default 30; "cnn" / "cnninf": torch_cnn.py's ResNet-50 training / inference at changing shapes,
# CNN_CYCLES passes over its shapes, default 4), CUDAPOOL_SHIM (default build/release/libcudapool.so), TORCH_D_MODEL (2048),
# REPS_BUDGET_S (start no process after this many seconds, default 420: a round may stop part
# way, its ratios then cover the modes that ran), OUT (JSON files),
# NVML_PEAK (path of tests/gpu/nvml_peak, built by build.sh: each process's NVML peak is taken),
# TORCH_PIN_CPU (the CPU each training process is pinned to, default 2, "none": tests/gpu/pin.sh).
# cppt: PyTorch's pluggable allocator on the pool (tests/gpu/with_pool.py, cudapool.torch.use())
# with the library preloaded; cpptl: the same with the library loaded by cudapool.torch.use()
# alone (no LD_PRELOAD); both under the default policy.
# HOST_SAMPLER (cnn/cnninf only): the path of tests/gpu/host_sampler.cpp built as a library;
# every process preloads it too and writes a host profile of its steady steps to
# OUT/MODE_ROUND.prof.tsv (tests/gpu/host_profile.py OUT MODE... reads them).
# tests/gpu/step_table.py shows the same files step by step.
# Prints, per mode, the median / mean / min of the per-process median step times (ms), every
# value and the median host share of a step, then each mode's median relative to the fastest
# mode's median, with `native` among the modes each mode's per-round ratio to it and their median;
# with NVML_PEAK also each mode's median peak and its ratio to `nocache`'s.
set -u
cd "$(dirname "$0")/../.."
REPS=10
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then REPS=$1; shift; fi
[ $# -gt 0 ] || { sed -n 2,28p "$0"; exit 2; }
SHIM=${CUDAPOOL_SHIM:-$PWD/build/release/libcudapool.so}
OUT=${OUT:-build/torch-reps}
mkdir -p "$OUT"
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0
NC=PYTORCH_NO_CUDA_MEMORY_CACHING=1
case ${TORCH_WORKLOAD:-torch} in  # the training program and its arguments, --out excepted
  torch) PROG=(python3 tests/gpu/torch_train.py --d-model "${TORCH_D_MODEL:-2048}" --steps 60) ;;
  hf) PROG=(python3 tests/gpu/hf_lm.py --steps "${HF_STEPS:-30}") ;;
  cnn) PROG=(python3 tests/gpu/torch_cnn.py --mode train --cycles "${CNN_CYCLES:-4}") ;;
  cnninf) PROG=(python3 tests/gpu/torch_cnn.py --mode infer --cycles "${CNN_CYCLES:-4}") ;;
  *) echo "unknown TORCH_WORKLOAD ${TORCH_WORKLOAD} (torch, hf, cnn or cnninf)" >&2; exit 2 ;;
esac
env_of() {  # env_of MODE: the environment of one run, one assignment a line
  case $1 in
    native) ;;
    ptexp) echo PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
    async) echo PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
    nocache) echo $NC ;;
    cpcls) printf '%s\n' $NC "LD_PRELOAD=$SHIM" CUDAPOOL_CONF=expandable_segments:False ;;
    cpimm) printf '%s\n' $NC "LD_PRELOAD=$SHIM" CUDAPOOL_CONF=free_sync:immediate ;;
    cpdef) printf '%s\n' $NC "LD_PRELOAD=$SHIM" CUDAPOOL_CONF= ;;
    cppt) printf '%s\n' "LD_PRELOAD=$SHIM" CUDAPOOL_CONF= ;;
    cpptl) printf '%s\n' "CUDAPOOL_LIBRARY=$SHIM" CUDAPOOL_CONF= ;;
    *=lib:*) printf '%s\n' $NC "LD_PRELOAD=${1#*=lib:}" CUDAPOOL_CONF= ;;
    *=ptlib:*) printf '%s\n' "LD_PRELOAD=${1#*=ptlib:}" CUDAPOOL_CONF= ;;
    *=pt:*) printf '%s\n' "LD_PRELOAD=$SHIM" "CUDAPOOL_CONF=${1#*=pt:}" ;;
    *=*) printf '%s\n' $NC "LD_PRELOAD=$SHIM" "CUDAPOOL_CONF=${1#*=}" ;;
    *) echo "unknown mode $1" >&2; exit 2 ;;
  esac
}
name_of() { echo "${1%%=*}"; }
for m in "$@"; do env_of "$m" >/dev/null || exit 2; done
source tests/gpu/pin.sh
echo "training processes: ${TORCH_PIN[*]:-not pinned}"
END=$((SECONDS + ${REPS_BUDGET_S:-420}))
for rep in $(seq 1 "$REPS"); do
  [ "$SECONDS" -lt "$END" ] || { echo "budget spent after $((rep - 1)) rounds"; break; }
  for m in "$@"; do
    [ "$SECONDS" -lt "$END" ] || { echo "budget spent in round $rep, before $(name_of "$m")"; break 2; }
    n=$(name_of "$m")
    mapfile -t envs < <(env_of "$m")
    if [ -n "${HOST_SAMPLER:-}" ]; then
      pre=
      for i in "${!envs[@]}"; do
        case ${envs[$i]} in LD_PRELOAD=*) envs[$i]="${envs[$i]}:$HOST_SAMPLER"; pre=1 ;; esac
      done
      [ -n "$pre" ] || envs+=("LD_PRELOAD=$HOST_SAMPLER")
      envs+=("HOST_SAMPLER_OUT=$OUT/${n}_$rep.prof.tsv")
    fi
    peak=()
    [ -n "${NVML_PEAK:-}" ] && peak=("$NVML_PEAK" "$OUT/${n}_$rep.peak.json" --)
    prog=("${PROG[@]}")
    case $m in cppt | cpptl | *=pt:* | *=ptlib:*) prog=(python3 tests/gpu/with_pool.py "${PROG[@]:1}") ;; esac
    timeout 120 "${peak[@]}" env "${envs[@]}" "${TORCH_PIN[@]}" "${prog[@]}" \
      --out "$OUT/${n}_$rep.json" >"$OUT/${n}_$rep.out" 2>&1 || echo "$n round $rep failed (see $OUT/${n}_$rep.out)"
  done
done
python3 - "$OUT" "$@" <<'PY'
import json, os, statistics as st, sys
out, modes = sys.argv[1], [m.split("=", 1)[0] for m in sys.argv[2:]]
med, peaks, by_round = {}, {}, {}
for n in modes:
    v, host, cpu, pk = [], [], [], []
    for f in sorted(os.listdir(out)):
        if f.startswith(n + "_") and f.endswith(".json") and f[len(n) + 1:-5].isdigit():
            d = json.load(open(os.path.join(out, f)))
            w = d.get("warmup", 5)
            v.append(1e3 * st.median(d["step_s"][w:]))
            by_round.setdefault(n, {})[int(f[len(n) + 1:-5])] = v[-1]
            if "step_host_s" in d:
                host.append(st.median(h / t for h, t in zip(d["step_host_s"][w:], d["step_s"][w:])))
            if "step_cpu_s" in d:
                cpu.append(1e3 * st.median(d["step_cpu_s"][w:]))
            pf = os.path.join(out, f[:-5] + ".peak.json")
            if os.path.exists(pf):
                pk.append(json.load(open(pf))["devices"][0]["peak_delta"])
    if v:
        med[n] = st.median(v)
        extra = f"  host {100 * st.median(host):.1f} %" if host else ""
        if cpu:
            extra += f"  cpu {st.median(cpu):.2f} ms"
        if pk:
            peaks[n] = st.median(pk)
            extra += f"  peak {peaks[n] / 2**30:.3f} GiB"
        print(f"{n:10s} n={len(v):2d} median {med[n]:7.2f} mean {st.mean(v):7.2f} min {min(v):7.2f}{extra}  "
              + " ".join(f"{x:.2f}" for x in v))
if med:
    best = min(med, key=med.get)
    print("relative to the fastest median (" + best + "): " + ", ".join(f"{n} {med[n] / med[best]:.3f}x" for n in med))
if "native" in by_round:  # the ratio of each round, then their median: rounds share the VM's state
    nat = by_round["native"]
    for n in med:
        r = [by_round[n][k] / nat[k] for k in sorted(by_round[n]) if k in nat]
        if n != "native" and r:
            print(f"{n} / native per round: median {st.median(r):.3f}x (" + ", ".join(f"{x:.2f}" for x in r) + ")")
if "nocache" in peaks:
    print("peak / no caching: " + ", ".join(f"{n} {peaks[n] / peaks['nocache']:.3f}x" for n in peaks))
PY
