#!/usr/bin/env bash
# Checks the tracked text files against .editorconfig's rules that a script can check: each ends
# with a newline, no line ends in whitespace, no tabs in C++/CUDA sources. Fuzzer seeds
# (tests/fuzz/corpus/) and binary files are left out. Prints FILE:LINE: PROBLEM; exits 1 if any.
set -uo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files)
else
  mapfile -t files < <(find . -path ./build -prune -o -path ./.git -prune -o -type f -print | sed 's|^\./||' | sort)
fi
n=0; checked=0
for f in "${files[@]}"; do
  case "$f" in tests/fuzz/corpus/*) continue ;; esac
  [ -f "$f" ] && [ -s "$f" ] || continue
  grep -qI . "$f" || continue   # binary (or no text at all)
  checked=$((checked + 1))
  if [ -n "$(tail -c 1 "$f")" ]; then echo "$f: no newline at end of file"; n=$((n + 1)); fi
  while IFS= read -r hit; do echo "$f:${hit%%:*}: trailing whitespace"; n=$((n + 1)); done \
    < <(grep -n -E '[[:space:]]$' "$f")
  case "$f" in
    *.cpp | *.h | *.cu)
      while IFS= read -r hit; do echo "$f:${hit%%:*}: tab"; n=$((n + 1)); done < <(grep -n -P '\t' "$f") ;;
  esac
done
if [ "$n" -gt 0 ]; then echo "editorconfig-check: $n problem(s)" >&2; exit 1; fi
echo "editorconfig-check: $checked files clean"
