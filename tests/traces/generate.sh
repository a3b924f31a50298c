#!/usr/bin/env bash
# Regenerates the sample traces of this directory (see README.md). Run from anywhere:
#   bash tests/traces/generate.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s -j2 build/release/cudapool-gen-trace
gen=build/release/cudapool-gen-trace
# GPT-style training: 8 layers, hidden 1024, 6 steps with sequence lengths 512-2048, 16 GiB device.
$gen --pattern train --steps 6 --layers 8 --hidden 1024 --seed 1 --device-memory 16GiB -o tests/traces/train.csv
# LLM serving with continuous batching: KV caches grown by reallocation, 200 steps.
$gen --pattern serve --steps 200 --layers 8 --hidden 1024 --seed 2 --device-memory 16GiB -o tests/traces/serve.csv
# The serving trace as a plain RMM log (first six columns, allocate/free rows only): what
# `replay` and `report` get from RMM's logging_resource_adaptor.
awk -F, 'NR == 1 { print "Thread,Time,Action,Pointer,Size,Stream"; next }
         $3 == "allocate" || $3 == "free" { print $1 "," $2 "," $3 "," $4 "," $5 "," $6 }' \
  tests/traces/serve.csv > tests/traces/serve_rmm.csv
ls -l tests/traces/*.csv
