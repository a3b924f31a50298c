#!/usr/bin/env bash
# README.md's results table is the render of docs/results.tsv (scripts/results_table.py), and the
# check catches a table that was edited by hand, a TSV changed without `make docs`, and a row
# citing a section that docs/benchmarks.md does not have. Needs only python3; run from anywhere.
set -u
cd "$(dirname "$0")/../.." || exit 1
script=scripts/results_table.py
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect() {  # expect WANTED_RC LABEL ARGS...
  local want=$1 label=$2
  shift 2
  python3 "$script" "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL $label: exit $rc, expected $want"
    sed 's/^/  /' "$tmp/out"
    fail=1
  else
    echo "ok   $label"
  fi
}

expect 0 "README.md's table is the render of docs/results.tsv" --check

# A number edited by hand in the README's table.
sed 's/| 1× (4\.64 ms) \[1\] |/| 1× (4.60 ms) [1] |/' README.md >"$tmp/readme_edited.md"
if cmp -s README.md "$tmp/readme_edited.md"; then
  echo "FAIL the edit for the hand-edited case did not apply (the table changed: update this test)"
  fail=1
fi
expect 1 "a figure edited by hand in README.md" --check --readme "$tmp/readme_edited.md"

# A TSV value changed without rendering again.
sed 's/\t0\.973\t/\t0.970\t/' docs/results.tsv >"$tmp/results_changed.tsv"
expect 1 "a results.tsv value changed without make docs" --check --tsv "$tmp/results_changed.tsv"

# Rendering writes the table: after it, the check passes on the copy.
cp "$tmp/readme_edited.md" "$tmp/readme_fixed.md"
expect 0 "rendering rewrites a stale table" --readme "$tmp/readme_fixed.md"
expect 0 "the rewritten table passes the check" --check --readme "$tmp/readme_fixed.md"
if ! cmp -s README.md "$tmp/readme_fixed.md"; then
  echo "FAIL the rewritten copy differs from README.md outside the table"
  fail=1
fi

# A row citing a section that is not a heading of docs/benchmarks.md.
sed 's/\tThe open batch kept 1 ms where ordering is free (H100/\tNo such section (H100/' docs/results.tsv \
  >"$tmp/results_badsection.tsv"
expect 2 "a row citing a missing section" --check --tsv "$tmp/results_badsection.tsv"

# A malformed row: the error names the line.
printf 'only\ttwo\n' | cat docs/results.tsv - >"$tmp/results_short.tsv"
expect 2 "a row with too few fields" --check --tsv "$tmp/results_short.tsv"
if ! grep -q 'results_short.tsv:[0-9]*: 2 fields' "$tmp/out"; then
  echo "FAIL the short-row error does not name the line"
  fail=1
fi

# README without the markers.
grep -v 'results:end' README.md >"$tmp/readme_nomarker.md"
expect 2 "README.md without the end marker" --check --readme "$tmp/readme_nomarker.md"

if [ "$fail" -ne 0 ]; then
  echo "results_table_test: FAILED"
  exit 1
fi
echo "results_table_test: PASS"
