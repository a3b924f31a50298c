#!/usr/bin/env bash
# Builds the GPU test programs into DIR (default build/gpu-bin), in parallel.
#   bash tests/gpu/build.sh [DIR] [all|cuda|torch]
# cuda: the .cu programs and nvml_peak; torch: only the PyTorch C++ benchmark (slow to compile,
# so run.sh builds it in the background while the first checks run).
# Environment: NVCC (default: nvcc on PATH or /usr/local/cuda/bin/nvcc), GPU_ARCH (default: the
# first GPU's compute capability from nvidia-smi, else sm_90), TORCH_BENCH=0 to skip the PyTorch
# C++ benchmark (it needs torch's headers: python3 -c 'import torch').
# Exit status: 0 when every CUDA program built; the PyTorch benchmark may fail on its own (its
# absence shows up as MISS rows, not as a build failure). Logs: DIR/build-*.log.
set -u
read -r -a CXXV <<< "${CXX:-g++}"  # CXX may be a command with arguments ("ccache g++")
cd "$(dirname "$0")/../.."
DIR=${1:-build/gpu-bin}
WHAT=${2:-all}
mkdir -p "$DIR"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ -z "${GPU_ARCH:-}" ]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
  GPU_ARCH=sm_${cc:-90}
fi
CUDA_LIB=$(cd "$(dirname "$NVCC")/.." && pwd)/lib64
FLAGS=(-arch="$GPU_ARCH" -O2 -std=c++17 -Xcompiler=-Wall,-Wextra)

pids=()
build() {  # build NAME command...
  local name=$1; shift
  rm -f "$DIR/$name"  # a failed build must not leave an old binary behind
  ( timeout 300 "$@" >"$DIR/build-$name.log" 2>&1 || { echo "build of $name failed:"; tail -n 20 "$DIR/build-$name.log"; exit 1; } ) &
  pids+=($!)
}
[ "$WHAT" = torch ] || for p in correctness race alias_race free_host_sync ipc stream_ordered graph_capture device_reset park legacy_app alloc_bench; do
  build "$p" "$NVCC" "${FLAGS[@]}" -o "$DIR/$p" "tests/gpu/$p.cu"   # static cudart (nvcc default)
done
# Shared cudart: cudaMalloc / cudaFree reach the shim's own definitions (shim/hooks/hooks_runtime_api.cpp).
for p in correctness race; do
  [ "$WHAT" = torch ] || build ${p}_shared "$NVCC" "${FLAGS[@]}" -cudart shared -Xlinker -rpath -Xlinker "$CUDA_LIB" \
    -o "$DIR/${p}_shared" tests/gpu/$p.cu
done
# Driver API only, linked with -lcuda (the toolkit's stub at build time, libcuda.so.1 at run time).
[ "$WHAT" = torch ] || build driver_api "$NVCC" -cudart none -O2 -std=c++17 -Xcompiler=-Wall,-Wextra \
  -o "$DIR/driver_api" tests/gpu/driver_api.cpp -lcuda
# What the driver's VMM calls cost (no shim): the numbers behind expandable_page_mb.
[ "$WHAT" = torch ] || build vmm_costs "$NVCC" "${FLAGS[@]}" -o "$DIR/vmm_costs" tests/gpu/vmm_costs.cu -lcuda
# What the driver calls behind the shim's fences and sweeps cost (no shim).
[ "$WHAT" = torch ] || build fence_costs "$NVCC" -cudart none -O2 -std=c++17 -Xcompiler=-Wall,-Wextra \
  -o "$DIR/fence_costs" tests/gpu/fence_costs.cpp -lcuda
# The latency floor (a one-size free list behind the same hooks), preloaded by run.sh.
[ "$WHAT" = torch ] || build floor_shim.so "${CXXV[@]}" -std=c++17 -O2 -Wall -Wextra -shared -fPIC \
  -o "$DIR/floor_shim.so" tests/gpu/floor_shim.cpp -ldl
[ "$WHAT" = torch ] || build nvml_peak "${CXXV[@]}" -std=c++17 -O2 -Wall -Wextra -o "$DIR/nvml_peak" tests/gpu/nvml_peak.cpp -ldl

torch_pid=
if [ "$WHAT" != cuda ] && [ "${TORCH_BENCH:-1}" != 0 ]; then
  TORCH_DIR=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)
  if [ -n "$TORCH_DIR" ]; then
    rm -f "$DIR/torch_alloc_bench"
    ( timeout 150 "${CXXV[@]}" -std=c++20 -O2 -I"$TORCH_DIR/include" -I"$(dirname "$NVCC")/../include" \
        tests/gpu/torch_alloc_bench.cpp -o "$DIR/torch_alloc_bench" \
        -L"$TORCH_DIR/lib" -lc10_cuda -lc10 -Wl,-rpath,"$TORCH_DIR/lib" -pthread \
        >"$DIR/build-torch_alloc_bench.log" 2>&1 || echo "torch_alloc_bench did not build (see $DIR/build-torch_alloc_bench.log)" ) &
    torch_pid=$!
  else
    echo "torch not importable: no PyTorch C++ benchmark"
  fi
fi

rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ -n "$torch_pid" ] && wait "$torch_pid"
exit $rc
