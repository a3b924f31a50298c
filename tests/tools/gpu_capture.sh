#!/usr/bin/env bash
# On a GPU machine: records real traces with `cudapool run` and checks run/ab/replay there.
#   bash tests/tools/gpu_capture.sh OUTDIR
# Needs cudapool and libcudapool.so side by side in $CUDAPOOL_BIN_DIR (default build/release; built
# by `make` and carried to the
# GPU machine; strip them first to carry less), nvcc for the legacy program, and optionally torch for the PyTorch trace.
# Writes OUTDIR/{legacy,torch,cnninf,cnnpt,hf}.csv (traces; cnninf, cnnpt and hf gzipped too),
# *.json (summaries), ab.json, and log.txt.
set -u
out=${1:?usage: gpu_capture.sh OUTDIR}
mkdir -p "$out"
cp=${CUDAPOOL_BIN_DIR:-build/release}/cudapool
exec > >(tee "$out/log.txt") 2>&1
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
nvidia-smi -L
echo "== build legacy_app"
"$NVCC" -arch=sm_${cc:-90} -O2 -std=c++17 -o "$out/legacy_app" tests/gpu/legacy_app.cu || exit 1
echo "== run: trace and summary of the legacy program (static cudart)"
$cp run --trace "$out/legacy.csv" --stats "$out/legacy.json" -- "$out/legacy_app" 300
echo "run exit status: $?"
ls -l "$out"/legacy.*
echo "== what the trace and summary carry: the driver's page size, a normal exit's status"
grep -o ',device,.*"granularity:[0-9]*' "$out/legacy.csv" || echo "FAIL: no granularity on the device row"
grep -q '"exit_status": 0,' "$out/legacy.json" && echo "exit_status 0" || echo "FAIL: exit_status is not 0"
echo "== replay the GPU trace under its own (default) policy; --check: within 3 % of the recording?"
$cp replay "$out/legacy.csv"
$cp replay --check --quiet "$out/legacy.csv"
echo "replay --check exit status: $?"
echo "== ab on the GPU"
$cp ab --a "" --b "max_split_size_mb:64" -n 3 --hide-output --json "$out/ab.json" -- "$out/legacy_app" 300
echo "ab exit status: $?"
if python3 -c 'import torch' 2>/dev/null; then
  echo "== PyTorch transformer (no caching in torch: every tensor goes to the pool)"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 $cp run --conf trace_call_sites:True --trace "$out/torch.csv" \
    --stats "$out/torch.json" -- python3 tests/gpu/torch_train.py --steps 12 --warmup 2 --out "$out/torch_result.json"
  echo "run exit status: $?"
  ls -l "$out"/torch.*
  $cp replay "$out/torch.csv"
  $cp replay --check --quiet "$out/torch.csv"
  echo "replay --check exit status: $?"
  # Call sites: the snapshot's live blocks name where PyTorch allocated them (memory_viz frames).
  $cp report "$out/torch.csv" -o "$out/torch.html" --snapshot "$out/torch.pickle"
  # ResNet-50 inference under the default: its reserved peak stays a few percent above the
  # no-caching floor; the trace says which misses grew the pool while freed blocks waited for
  # their fences (replay it on the CPU with --fence-latency-us).
  echo "== ResNet-50 inference (torchvision, cudnn.benchmark, changing shapes)"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 $cp run --trace "$out/cnninf.csv" --stats "$out/cnninf.json" -- \
    python3 tests/gpu/torch_cnn.py --mode infer --cycles 3 --out "$out/cnninf_result.json"
  echo "run exit status: $?"
  $cp replay "$out/cnninf.csv"
  gzip -9 -n -k "$out/cnninf.csv"
  # ResNet-50 training through PyTorch's pluggable allocator (tests/gpu/with_pool.py): its NVML peak
  # sits about 1 % over PyTorch's expandable segments' (docs/benchmarks.md); its trace, replayed with
  # --free-as recorded and --sweep, says which growths make the difference.
  echo "== ResNet-50 training through the pluggable path"
  CUDAPOOL_CONF="trace_file:$out/cnnpt.csv,stats_file:$out/cnnpt.json" \
    LD_PRELOAD="$(dirname "$cp")/libcudapool.so" python3 tests/gpu/with_pool.py tests/gpu/torch_cnn.py \
    --mode train --cycles 2 --out "$out/cnnpt_result.json"
  echo "run exit status: $?"
  $cp replay --check --quiet "$out/cnnpt.csv"
  echo "replay --check exit status: $?"
  gzip -9 -n -k "$out/cnnpt.csv"
  # HF GPT-2 training under the default: tests/traces/gpu_hf_gpt2.csv.gz is this recording,
  # gzipped; so are gpu_resnet50_infer (cnninf) and gpu_resnet50_train_pt (cnnpt).
  if python3 -c 'import transformers' 2>/dev/null; then
    echo "== HF GPT-2 training (transformers, mixed sequence lengths)"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 $cp run --trace "$out/hf.csv" --stats "$out/hf.json" -- \
      python3 tests/gpu/hf_lm.py --out "$out/hf_result.json"
    echo "run exit status: $?"
    $cp replay --check --quiet "$out/hf.csv"
    echo "replay --check exit status: $?"
    gzip -9 -n -k "$out/hf.csv"
  fi
else
  echo "torch not importable: no PyTorch trace"
fi
