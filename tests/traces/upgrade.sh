#!/usr/bin/env bash
# Brings a trace written before the `detail` column (10 columns) up to the current format with
# facts known about its recording that the old format could not hold (see README.md):
#   bash tests/traces/upgrade.sh IN OUT POLICY FREE_KIND GRANULARITY_BYTES
# POLICY becomes the policy row (the recording's effective policy, as a CUDAPOOL_CONF string),
# FREE_KIND (sync = cudaFree, async = cudaFreeAsync) the detail of every free row, and the device
# rows get the device's page size and this build's allocation units (docs/trace-format.md).
set -euo pipefail
in=$1 out=$2 policy=$3 kind=$4 gran=$5
head -n 1 "$in" | grep -qx 'Thread,Time,Action,Pointer,Size,Stream,device,requested,time_ns,duration_ns' ||
  { echo "upgrade.sh: $in is not a 10-column cudapool trace" >&2; exit 1; }
case $kind in sync|async) ;; *) echo "upgrade.sh: FREE_KIND is sync or async" >&2; exit 1 ;; esac
units='min_block:512,small_size:1048576,small_buffer:2097152,min_large_alloc:10485760,large_buffer:20971520,round_large:2097152'
awk -F, -v OFS=, -v policy="$policy" -v kind="$kind" -v facts="granularity:$gran,$units" '
  NR == 1 { print $0 ",detail"; next }
  NR == 2 { print $1, $2, "policy", "0x0", 0, "0x0", $7, 0, $9, 0, "\"" policy "\"" }
  $3 == "free" { print $0 "," kind; next }
  $3 == "device" { print $0 ",\"" facts "\""; next }
  { print $0 "," }' "$in" > "$out"
