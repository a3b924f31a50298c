#!/usr/bin/env bash
# Lists the C++/CUDA sources that clang-format (.clang-format) would change; exits 1 if any.
# `make format` rewrites them in place. CLANG_FORMAT picks the binary (default clang-format).
set -uo pipefail
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-clang-format}
command -v "$cf" >/dev/null || { echo "format-check: $cf not found (apt-get install clang-format)" >&2; exit 2; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu')
else
  mapfile -t files < <(find . -path ./build -prune -o -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) -print | sed 's|^\./||' | sort)
fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  "$cf" --style=file "$f" | cmp -s - "$f" || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf '%s\n' "${bad[@]}"
  echo "format-check: ${#bad[@]} of ${#files[@]} files differ from clang-format's output; run 'make format'" >&2
  exit 1
fi
echo "format-check: ${#files[@]} files clean"
