#!/usr/bin/env bash
# The fidelity table of tests/traces/README.md: each shipped trace's recorded peak reserved and
# the peak its replay reaches under the recorded policy (`cudapool replay --check`), so the
# figures there are never written by hand.
#   bash tests/traces/fidelity.sh [--write | --check] [CUDAPOOL]   (default build/release/cudapool)
# --write puts the table between the README's fidelity markers; --check exits 1 when the README's
# table differs from a fresh one (a test of `make test`); no flag prints it.
set -u
cd "$(dirname "$0")/../.."
mode=print
case ${1:-} in --write|--check) mode=${1#--}; shift ;; esac
cp=${1:-build/release/cudapool}
readme=tests/traces/README.md
table=$(
  echo "| trace | recorded peak reserved | replayed | difference |"
  echo "|---|---|---|---|"
  for t in tests/traces/*.csv tests/traces/*.csv.gz; do
    line=$("$cp" replay --check --quiet "$t" 2>&1 | grep -m1 '^fidelity:')
    # "fidelity: under the recorded policy the replay peaks at X reserved, the trace recorded Y (+Z %): ..."
    if [[ $line =~ peaks\ at\ (.*)\ reserved,\ the\ trace\ recorded\ (.*)\ \((.*)\):\ (.*)$ ]]; then
      echo "| \`$(basename "$t")\` | ${BASH_REMATCH[2]} | ${BASH_REMATCH[1]} | ${BASH_REMATCH[3]} |"
    else
      echo "| \`$(basename "$t")\` | none recorded | – | – |"
    fi
  done
)
current=$(sed -n '/<!-- fidelity:begin -->/,/<!-- fidelity:end -->/p' "$readme" | sed '1d;$d')
case $mode in
  print) printf '%s\n' "$table" ;;
  check)
    if [ "$current" != "$table" ]; then
      echo "FAIL: $readme's fidelity table is stale: run make docs (or bash tests/traces/fidelity.sh --write)"
      diff <(printf '%s\n' "$current") <(printf '%s\n' "$table")
      exit 1
    fi
    echo "PASS: $readme's fidelity table matches the replays" ;;
  write)
    python3 - "$readme" "$table" <<'PY'
import sys
path, table = sys.argv[1], sys.argv[2]
s = open(path).read()
a = s.index("<!-- fidelity:begin -->") + len("<!-- fidelity:begin -->")
b = s.index("<!-- fidelity:end -->")
open(path, "w").write(s[:a] + "\n" + table + "\n" + s[b:])
PY
    ;;
esac
