#!/usr/bin/env bash
# Checks tests/run_tests.sh itself on stand-in test binaries (scripts that print what GoogleTest
# prints): skipped tests are counted and named, a binary that ran no test fails, a crash without
# a summary fails, and a plain script counts as one case.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fake() {  # fake NAME EXIT_STATUS LINES...
  local name=$1 rc=$2; shift 2
  { echo '#!/usr/bin/env bash'; for l in "$@"; do printf 'echo %q\n' "$l"; done; echo "exit $rc"; } >"$work/$name"
  chmod +x "$work/$name"
}
fake passing 0 '[==========] Running 3 tests from 1 test suite.' '[  PASSED  ] 3 tests.'
fake skipping 0 '[==========] Running 3 tests from 1 test suite.' '[  PASSED  ] 1 test.' \
  '[  SKIPPED ] 2 tests, listed below:' '[  SKIPPED ] Suite.NeedsGpu' '[  SKIPPED ] Suite.NeedsRoot'
fake empty 0 '[==========] Running 0 tests from 0 test suites.' '[  PASSED  ] 0 tests.'
fake cut_short 0 '[==========] Running 2 tests from 1 test suite.' '[ RUN      ] Suite.Exits'
fake crashed 134 '[==========] Running 2 tests from 1 test suite.' '[ RUN      ] Suite.Crashes'
fake failing 1 '[==========] Running 2 tests from 1 test suite.' '[  PASSED  ] 1 test.' \
  '[  FAILED  ] 1 test, listed below:' '[  FAILED  ] Suite.Broken'
fake script_ok 0 'PASS something'

check() {  # check WHAT EXPECTED_RC EXPECTED_LAST_LINE BINARIES...
  local what=$1 want_rc=$2 want_last=$3; shift 3
  local out rc
  out=$(bash "$root/tests/run_tests.sh" "$@" 2>&1); rc=$?
  if [ "$rc" != "$want_rc" ] || [ "$(printf '%s\n' "$out" | tail -n 1)" != "$want_last" ]; then
    echo "FAIL $what: exit $rc (want $want_rc), output:"; printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "PASS $what"
  fi
  printf '%s\n' "$out" >"$work/last.txt"
}
check "passing binary and script" 0 "4 passed, 0 failed, 0 skipped" "$work/passing" "$work/script_ok"
check "skipped tests are counted" 0 "1 passed, 0 failed, 2 skipped" "$work/skipping"
if grep -q "skipped tests in: $work/skipping" "$work/last.txt" && grep -q 'SKIPPED \] Suite.NeedsGpu' "$work/last.txt"; then
  echo "PASS skipped tests are named"
else
  echo "FAIL skipped tests are not named:"; sed 's/^/    /' "$work/last.txt"; failures=$((failures + 1))
fi
check "a binary that ran no test fails" 1 "3 passed, 1 failed, 0 skipped" "$work/passing" "$work/empty"
grep -q "FAIL: $work/empty ran no tests" "$work/last.txt" || { echo "FAIL no 'ran no tests' line"; failures=$((failures + 1)); }
check "a binary cut short without a summary fails" 1 "0 passed, 1 failed, 0 skipped" "$work/cut_short"
check "a crash without a summary fails" 1 "0 passed, 1 failed, 0 skipped" "$work/crashed"
check "a failed test fails" 1 "1 passed, 1 failed, 0 skipped" "$work/failing"
# A binary that hangs fails once its time is up, and says so.
printf '#!/usr/bin/env bash\necho "[==========] Running 1 test from 1 test suite."\nsleep 30\n' >"$work/hangs"
chmod +x "$work/hangs"
TEST_TIMEOUT_S=1 check "a hung binary fails at its time limit" 1 "0 passed, 1 failed, 0 skipped" "$work/hangs"
grep -q "FAIL: $work/hangs did not finish within 1 s" "$work/last.txt" ||
  { echo "FAIL no time-limit line"; failures=$((failures + 1)); }
[ "$failures" -eq 0 ]
