#!/usr/bin/env bash
# The shim's layers: nothing the runtime is built on includes the runtime (shim/runtime.h) or the
# hooks above it (shim/hooks.h). Starting from what shim/runtime.{h,cpp} include, every shim
# header and its .cpp are followed; any of them naming those headers fails the check, listed with
# the way it was reached. (What a lower layer needs of the runtime it takes as parameters or
# small interfaces, as shim/group.h's ProcessPools.)
set -u
cd "$(dirname "$0")/.." || exit 2
forbidden='shim/runtime.h|shim/hooks.h'
includes() { sed -n 's/^#include "\(shim\/[^"]*\.h\)".*/\1/p' "$1" 2>/dev/null; }
declare -A seen=() via=()
queue=()
for f in $(includes shim/runtime.h) $(includes shim/runtime.cpp); do
  [ "$f" = shim/runtime.h ] && continue
  [ -z "${seen[$f]:-}" ] && { seen[$f]=1; via[$f]="shim/runtime"; queue+=("$f"); }
done
bad=0; checked=0
while [ ${#queue[@]} -gt 0 ]; do
  h=${queue[0]}; queue=("${queue[@]:1}")
  for file in "$h" "${h%.h}.cpp"; do
    [ -f "$file" ] || continue
    checked=$((checked + 1))
    if grep -Eq "^#include \"($forbidden)\"" "$file"; then
      echo "FAIL: $file (reached from ${via[$h]}) includes $(grep -Eo "^#include \"($forbidden)\"" "$file" | head -1)"
      bad=1
    fi
    for g in $(includes "$file"); do
      [[ "$g" =~ ^($forbidden)$ ]] && continue  # reported above; not followed
      [ -z "${seen[$g]:-}" ] && { seen[$g]=1; via[$g]="${via[$h]} -> $h"; queue+=("$g"); }
    done
  done
done
if [ $checked -lt 10 ]; then echo "FAIL: only $checked files below the runtime were found: is the script reading the tree?"; exit 1; fi
[ $bad -eq 0 ] && echo "PASS shim layers: $checked files below the runtime, none includes it or the hooks"
exit $bad
