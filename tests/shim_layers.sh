#!/usr/bin/env bash
# The shim's layers, two checks.
# 1. Nothing the runtime is built on includes the runtime (shim/runtime.h) or the hooks above it
#    (shim/hooks/hooks.h). Starting from what shim/runtime.{h,cpp} include, every shim header and
#    its .cpp are followed; any of them naming those headers fails the check, listed with the way
#    it was reached. (What a lower layer needs of the runtime it takes as parameters or small
#    interfaces, as shim/group/group.h's ProcessPools.)
# 2. The sub-folders by concern include each other only downwards: fences/ and upstream/ (the
#    device side of the pool) include no other sub-folder; parking/ builds on them; group/ on
#    parking/ and upstream/; warm_start/ on fences/ and group/; ipc/ and hooks/ (interposition) on
#    any. The headers at shim/'s top (driver, scoped context, log, ...) are open to all; the
#    runtime and the C API at the top are not (check 1).
set -u
cd "$(dirname "$0")/.." || exit 2
forbidden='shim/runtime.h|shim/hooks/hooks.h'
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

declare -A may=(
  [fences]=""
  [upstream]=""
  [parking]="fences upstream ipc"
  [group]="parking upstream"
  [warm_start]="fences group"
  [ipc]="fences upstream parking group hooks"
  [hooks]="fences upstream parking group warm_start ipc"
)
files=0
for sub in "${!may[@]}"; do
  for file in shim/"$sub"/*.h shim/"$sub"/*.cpp; do
    [ -f "$file" ] || continue
    files=$((files + 1))
    for g in $(includes "$file"); do
      other=$(echo "$g" | sed -n 's#^shim/\([a-z_]*\)/.*#\1#p')
      [ -z "$other" ] || [ "$other" = "$sub" ] && continue
      if [[ " ${may[$sub]} " != *" $other "* ]]; then
        echo "FAIL: $file includes $g: shim/$sub/ may include ${may[$sub]:+only }${may[$sub]:-no other sub-folder}"
        bad=1
      fi
    done
  done
done
if [ $files -lt 40 ]; then echo "FAIL: only $files files in shim's sub-folders: is the script reading the tree?"; exit 1; fi
[ $bad -eq 0 ] && echo "PASS shim sub-folders: $files files include each other only downwards"
exit $bad
