#!/usr/bin/env bash
# scripts/long_functions.py on tests/tools/fixtures/long_functions/: of a 61-line and a 60-line
# function (braces in their comments, strings, characters and raw strings), exactly the 61-line one
# is reported, with exit 1; with a limit of 61 nothing is, with exit 0. Then the rule itself: no
# function of the product (allocator, config, telemetry, shim, tools) is over 60 lines. Needs only
# python3.
set -u
cd "$(dirname "$0")/../.." || exit 1
script=scripts/long_functions.py
fixtures=tests/tools/fixtures/long_functions
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect() {  # expect WANTED_RC WANTED_OUTPUT LABEL ARGS... (WANTED_OUTPUT "*": any output)
  local want_rc=$1 want_out=$2 label=$3
  shift 3
  python3 "$script" "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$want_rc" ] || { [ "$want_out" != "*" ] && [ "$(cat "$tmp/out")" != "$want_out" ]; }; then
    echo "FAIL $label: exit $rc (expected $want_rc), output:"
    sed 's/^/  /' "$tmp/out"
    echo "  expected:"
    printf '%s\n' "$want_out" | sed 's/^/  /'
    fail=1
  else
    echo "ok   $label"
  fi
}

expect 1 "$fixtures/sample.cpp:20 long_one 61" "only the 61-line function is over 60" "$fixtures"
expect 1 "$fixtures/sample.cpp:20 long_one 61" "the default limit is 60 (-n 60 the same)" -n 60 "$fixtures"
expect 0 "" "nothing is over 61" --max-lines 61 "$fixtures"
expect 1 "$fixtures/sample.cpp:20 long_one 61
$fixtures/sample.cpp:82 just_fits 60" "both are over 59" -n 59 "$fixtures/sample.cpp"
expect 2 "*" "a missing folder is a usage error" "$tmp/no_such_folder"
expect 0 "" "no product function is over 60 lines (split it into named steps)" allocator config telemetry shim tools
if [ "$fail" -ne 0 ]; then
  echo "long_functions_test: FAILED"
  exit 1
fi
echo "long_functions_test: PASS"
