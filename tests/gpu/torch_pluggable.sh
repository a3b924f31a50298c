#!/usr/bin/env bash
# PyTorch's pluggable-allocator path (cudapool.torch.use()) on the GPU: stats agreement, OOM type
# and message, what PyTorch raises on the LD_PRELOAD path, and the largest GPT-2 small batch
# under a cap through each allocator. Needs build/release/libcudapool.so (carried), torch and
# transformers; ~3 minutes on an H200.
#   bash tests/gpu/torch_pluggable.sh            # results in $OUT (default build/torch-pluggable)
# CAP_GIB (default 12) is the cap of the batch search. Prints every check's line, then a summary;
# exit 1 when a check that must pass failed (INFO lines never fail).
set -u
cd "$(dirname "$0")/../.."
SHIM=${CUDAPOOL_SHIM:-$PWD/build/release/libcudapool.so}
OUT=${OUT:-build/torch-pluggable}
CAP=${CAP_GIB:-12}
CAP_MB=$(python3 -c "print(int($CAP * 1024))")
mkdir -p "$OUT"
P=(python3 tests/gpu/torch_pluggable.py)
fail=0
# side NAME must|info|must_rs ENV...: tests/gpu/torch_side_stream.py through cudapool.torch.use();
# the line is its totals and use()'s mode. must: no corrupted case; must_rs: that, with the
# default stream-ordered free and record_stream reaching the pool (the C++ registration).
side() {
  local name=$1 kind=$2; shift 2
  timeout 300 env "$@" python3 tests/gpu/with_pool.py tests/gpu/torch_side_stream.py >"$OUT/$name.out" 2>&1
  local rc=$? tot mode
  tot=$(grep -m1 '^corrupted_cases=' "$OUT/$name.out")
  mode=$(grep -m1 '^with_pool: free=' "$OUT/$name.out")
  printf '%-26s %-7s %s %s [%s]\n' "$name" "$kind" "${tot:-no totals (exit $rc; see $OUT/$name.out)}" \
    "$(grep -m1 '^reused_cases=' "$OUT/$name.out")" "${mode#with_pool: }"
  if [ "$kind" != info ] && [[ "$tot" != corrupted_cases=0\ * ]]; then fail=1; fi
  if [ "$kind" = must_rs ] && [ "$mode" != "with_pool: free=stream record_stream=1 registration=c++" ]; then fail=1; fi
}
check() {  # check NAME must|info ENV... -- CMD...
  local name=$1 kind=$2; shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  timeout 300 env "${envs[@]}" "$@" >"$OUT/$name.out" 2>&1
  local rc=$? line
  line=$(grep -m1 '^torch_pluggable CHECK=' "$OUT/$name.out" || echo "no result (exit $rc; see $OUT/$name.out)")
  printf '%-22s %-4s %s\n' "$name" "$kind" "$line"
  if [ "$kind" = must ] && [ $rc -ne 0 ]; then fail=1; fi
}
check stats_preloaded must "LD_PRELOAD=$SHIM" CUDAPOOL_CONF= -- "${P[@]}" stats
check stats_loaded must "CUDAPOOL_LIBRARY=$SHIM" CUDAPOOL_CONF= -- "${P[@]}" stats
check cudnn_preloaded must "LD_PRELOAD=$SHIM" CUDAPOOL_CONF= -- "${P[@]}" cudnn
check cudnn_loaded must "CUDAPOOL_LIBRARY=$SHIM" CUDAPOOL_CONF= -- "${P[@]}" cudnn
check oom_preloaded must "LD_PRELOAD=$SHIM" "CUDAPOOL_CONF=max_reserved_mb:$CAP_MB" -- "${P[@]}" oom
check oom_loaded must "CUDAPOOL_LIBRARY=$SHIM" "CUDAPOOL_CONF=max_reserved_mb:$CAP_MB" -- "${P[@]}" oom
# use() registers in C++ so that Tensor.record_stream reaches the pool: the default stream-ordered
# free must not corrupt this program (preloaded or loaded alone); neither must free=device.
side side_stream_cppt must_rs "LD_PRELOAD=$SHIM" CUDAPOOL_CONF=
side side_stream_cpptl must_rs "CUDAPOOL_LIBRARY=$SHIM" CUDAPOOL_CONF=
side side_stream_cppt_device must "LD_PRELOAD=$SHIM" CUDAPOOL_CONF= CUDAPOOL_TORCH_FREE=device
side side_stream_cpptl_device must "CUDAPOOL_LIBRARY=$SHIM" CUDAPOOL_CONF= CUDAPOOL_TORCH_FREE=device
check oomtype_native info -- "${P[@]}" oomtype
check oomtype_ldpreload info PYTORCH_NO_CUDA_MEMORY_CACHING=1 "LD_PRELOAD=$SHIM" CUDAPOOL_CONF= -- "${P[@]}" oomtype
check oomtranslate_ldpreload must PYTORCH_NO_CUDA_MEMORY_CACHING=1 "LD_PRELOAD=$SHIM" CUDAPOOL_CONF= -- "${P[@]}" oomtranslate
check maxbatch_native must -- "${P[@]}" maxbatch --cap-gib "$CAP"
check maxbatch_ptexp must PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- "${P[@]}" maxbatch --cap-gib "$CAP"
check maxbatch_cppt must "LD_PRELOAD=$SHIM" "CUDAPOOL_CONF=max_reserved_mb:$CAP_MB" -- "${P[@]}" maxbatch --pool --cap-gib "$CAP"
check maxbatch_cpptl must "CUDAPOOL_LIBRARY=$SHIM" "CUDAPOOL_CONF=max_reserved_mb:$CAP_MB" -- "${P[@]}" maxbatch --pool --cap-gib "$CAP"
check maxbatch_ldpreload info PYTORCH_NO_CUDA_MEMORY_CACHING=1 "LD_PRELOAD=$SHIM" "CUDAPOOL_CONF=max_reserved_mb:$CAP_MB" \
  -- "${P[@]}" maxbatch --cap-gib "$CAP"
python3 - "$OUT" <<'PY'
import os, re, sys
out = sys.argv[1]
best = {}
for n in ("native", "ptexp", "cppt", "cpptl", "ldpreload"):
    p = os.path.join(out, f"maxbatch_{n}.out")
    m = re.search(r"largest_batch=(\d+)", open(p).read()) if os.path.exists(p) else None
    best[n] = int(m.group(1)) if m else None
print("largest batch under the cap: " + ", ".join(f"{k} {v}" for k, v in best.items()))
if None not in (best["cppt"], best["ptexp"]):
    print(f"pluggable >= PyTorch expandable: {'PASS' if best['cppt'] >= best['ptexp'] else 'FAIL'}")
PY
[ $fail -eq 0 ] && echo "torch_pluggable: PASS" || echo "torch_pluggable: FAIL"
exit $fail
