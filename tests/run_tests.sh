#!/usr/bin/env bash
# Runs each test binary or script given (saying how long each took), counts GoogleTest cases,
# prints one closing line.
# A GoogleTest binary that ran no test fails (a filter or a build that lost its tests would
# otherwise pass); skipped tests are counted and named in the closing line, not hidden.
# Each binary gets TEST_TIMEOUT_S seconds (default 1200): a hung test fails with its output
# instead of holding the whole run until CI's own limit.
set -u
limit=${TEST_TIMEOUT_S:-1200}
passed=0; failed=0; skipped=0; failed_names=(); skipped_names=()
for t in "$@"; do
  echo "== $t"
  t0=$SECONDS
  out=$(timeout -k 10 "$limit" "$t" 2>&1); rc=$?
  echo "   ($((SECONDS - t0)) s)"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && out+=$'\n'"FAIL: $t did not finish within $limit s (TEST_TIMEOUT_S)"
  printf '%s\n' "$out" | grep -E '^\[  (FAILED|PASSED|SKIPPED) |^\[ RUN|^FAIL|^PASS' | grep -v '^\[ RUN' | tail -n 20
  p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
  f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
  s=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -n 1)
  gtest=0; printf '%s\n' "$out" | grep -q '^\[==========\] Running' && gtest=1
  if [ $gtest -eq 0 ] && [ -z "$p" ] && [ -z "$f" ]; then  # a script: one case
    if [ $rc -eq 0 ]; then p=1; f=0; else p=0; f=1; fi
  fi
  p=${p:-0}; f=${f:-0}; s=${s:-0}
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed without a gtest summary
  if [ $gtest -eq 1 ] && [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then
    echo "FAIL: $t ran no tests"; f=1
  fi
  [ "$s" -gt 0 ] && skipped_names+=("$t")
  if [ "$f" -gt 0 ]; then
    failed_names+=("$t")
    # Each failed assertion with its message (often far above the end), then the end.
    printf '%s\n' "$out" | grep -E -A12 ': Failure$' | head -n 120
    printf '%s\n' "$out" | tail -n 40
  fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
done
[ ${#failed_names[@]} -gt 0 ] && echo "failing: ${failed_names[*]}"
[ ${#skipped_names[@]} -gt 0 ] && echo "skipped tests in: ${skipped_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
