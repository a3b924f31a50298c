#!/usr/bin/env bash
# The speed sweep (docs/design.md, "Tests and the pool's clock"): the pool tests and the
# fake-driver tests with the pool's clock frozen (it never moves by itself: a machine infinitely
# fast, where no batch window, back-off or sweep gap passes between two calls) and racing (every
# reading 50 ms past the last: each has passed by the next call). A test that passes on the
# library's own clock but fails under either depends on how fast the machine is: it must drive
# the clock (PoolRig::advance_clock, drive_pool_clock) or wait for the state it checks.
# Usage: bash tests/speed_sweep.sh [--quick] [BUILD_DIR]  (default build/release; the tests must
# be built). --quick (what `make test` runs) leaves out PoolStress, whose randomized threads take
# half a minute a run. Prints one line per run and the failing tests; exits 1 if any failed.
set -u
quick=0
[ "${1:-}" = --quick ] && { quick=1; shift; }
build=${1:-build/release}
pool=$build/tests/pool_tests
shim=$build/tests/shim_tests
for b in "$pool" "$shim"; do
  [ -x "$b" ] || { echo "FAIL speed sweep: $b is not built (make BUILD=$build $b)"; exit 1; }
done
pool_args=()
[ $quick -eq 1 ] && pool_args=(--gtest_filter=-PoolStress.*)
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for clock in frozen racing; do
  for b in "$pool" "$shim"; do
    args=()
    [ "$b" = "$pool" ] && args=("${pool_args[@]}")
    t0=$SECONDS
    TEST_POOL_CLOCK=$clock "$b" "${args[@]}" >"$out" 2>&1
    rc=$?
    n=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n 1)
    if [ $rc -eq 0 ]; then
      echo "PASS clock $clock: $(basename "$b"), ${n:-0} tests ($((SECONDS - t0)) s)"
    else
      failed=1
      echo "FAIL clock $clock: $(basename "$b") (exit $rc, $((SECONDS - t0)) s)"
      grep -E '^\[  FAILED  \] [A-Za-z]' "$out" | sed 's/ ([0-9]* ms)$//' | sort -u | sed 's/^/    /'
      grep -E '^FAIL |: Failure$' -A4 "$out" | head -n 60 | sed 's/^/    /'
    fi
  done
done
exit $failed
