#!/usr/bin/env bash
# Runs each test binary or script given, counts GoogleTest cases, prints one closing line.
set -u
passed=0; failed=0; failed_names=()
for t in "$@"; do
  echo "== $t"
  out=$("$t" 2>&1); rc=$?
  printf '%s\n' "$out" | grep -E '^\[  (FAILED|PASSED) |^\[ RUN|^FAIL|^PASS' | grep -v '^\[ RUN' | tail -n 20
  p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
  f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
  if [ -z "$p" ] && [ -z "$f" ]; then        # a script: one case
    if [ $rc -eq 0 ]; then p=1; f=0; else p=0; f=1; fi
  fi
  p=${p:-0}; f=${f:-0}
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed without a gtest summary
  if [ "$f" -gt 0 ]; then failed_names+=("$t"); printf '%s\n' "$out" | tail -n 60; fi
  passed=$((passed + p)); failed=$((failed + f))
done
[ ${#failed_names[@]} -gt 0 ] && echo "failing: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
