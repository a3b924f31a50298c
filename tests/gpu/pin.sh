# Sourced by run.sh and torch_reps.sh: TORCH_PIN, the command prefix that pins a PyTorch
# training process to one CPU (TORCH_PIN_CPU, default 2; "none", a missing taskset or too few
# CPUs: no prefix). Unpinned, one mode's processes spread by 10-25 % on the lent VMs, pinned by
# ~2 % (docs/history.md). Only the training process is pinned: a measuring
# wrapper (nvml_peak) must not compete with it for that CPU.
TORCH_PIN=()
if [ "${TORCH_PIN_CPU:-2}" != none ] && command -v taskset >/dev/null && [ "$(nproc)" -gt "${TORCH_PIN_CPU:-2}" ]; then
  TORCH_PIN=(taskset -c "${TORCH_PIN_CPU:-2}")
fi
