#!/usr/bin/env bash
# Every repository path that docs/design.md names in backquotes (`dir/file.ext`, a glob such as
# `shim/fences/cuda_fences.*` too) exists, so the document's tables ("Where each rule lives", "Where
# things live") cannot point a reader at a file that moved or was split. A path is a backquoted
# token of one or more folders and a file name with an extension, nothing else in the quotes.
# The check also runs on a copy of the document with a missing path added and must fail there.
# Needs only bash and the usual text tools (grep, sed, sort); run from anywhere. Usage: design_paths_test.sh [DOC]
# shellcheck disable=SC2016  # the backquotes below are Markdown's, meant literally
set -u
cd "$(dirname "$0")/../.." || exit 1
doc=${1:-docs/design.md}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The paths of DOC, one a line.
paths_of() {
  grep -oE '`[^`]+`' "$1" | tr -d '`' | grep -E '^([A-Za-z0-9_.-]+/)+[A-Za-z0-9_.*-]+\.[A-Za-z0-9*]+$' | sort -u
}

# Prints each path of DOC that names nothing in the repository; fails when there is one.
check() {
  local doc=$1 missing=0 p
  while IFS= read -r p; do
    if [[ $p == *'*'* ]]; then
      compgen -G "$p" >/dev/null || { echo "  missing: $p"; missing=1; }
    elif [ ! -e "$p" ]; then
      echo "  missing: $p"
      missing=1
    fi
  done < <(paths_of "$doc")
  return "$missing"
}

n=$(paths_of "$doc" | wc -l)
if [ "$n" -lt 50 ]; then
  echo "FAIL only $n backquoted paths found in $doc (the pattern no longer matches the document?)"
  fail=1
fi
if check "$doc" >"$tmp/out"; then
  echo "ok   every one of the $n backquoted paths in $doc exists"
else
  echo "FAIL $doc names paths that do not exist:"
  cat "$tmp/out"
  fail=1
fi

# The check itself: a moved file and a split one (a glob that matches nothing) are caught.
{ cat "$doc"; printf '\n| a rule | `shim/no_such_file.cpp` | `tests/unit/no_such_test.cpp` |\n'; } >"$tmp/moved.md"
if check "$tmp/moved.md" >"$tmp/out"; then
  echo "FAIL a path that does not exist was not reported"
  fail=1
elif ! grep -q 'missing: shim/no_such_file.cpp' "$tmp/out" || ! grep -q 'missing: tests/unit/no_such_test.cpp' "$tmp/out"; then
  echo "FAIL the report does not name the missing paths:"
  cat "$tmp/out"
  fail=1
else
  echo "ok   a path that does not exist is reported"
fi
{ cat "$doc"; printf '\nsplit into `shim/no_such_part.*`\n'; } >"$tmp/glob.md"
if check "$tmp/glob.md" >"$tmp/out" || ! grep -q 'missing: shim/no_such_part\.\*' "$tmp/out"; then
  echo "FAIL a glob that matches no file was not reported"
  fail=1
else
  echo "ok   a glob that matches no file is reported"
fi

if [ "$fail" -ne 0 ]; then
  echo "design_paths_test: FAILED"
  exit 1
fi
echo "design_paths_test: PASS"
