#!/usr/bin/env bash
# Hostile and careless inputs, tried the way an attacker or a careless user would, against the
# built programs: the library under the fake driver (no GPU) and the `cudapool` command. Each row
# of docs/design.md's trust model that can be tried here has a section below that prints
#   row N: <what was tried> -> <what happened>
# and the script exits 1 when any row misbehaves (a hang, a crash, another user's file written, a
# refusal without its message). Every attempt runs under `timeout`. Rows that need a second user
# give files away with chown, so they need root; elsewhere they print "skipped".
# Usage: bash tests/tools/hostile_inputs.sh [BUILD_DIR]   (default build/release)
set -u
build=${1:-build/release}
cp=$build/cudapool
shim=$(readlink -f "$build/libcudapool.so")
fake_dir=$(readlink -f "$build/tests/fakecuda")
app=$fake_dir/app_cudart
traces=tests/traces
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
limit=20  # seconds; every attempt here answers at once, so reaching it means the attempt hung
other_uid=65534
bad=0

for f in "$cp" "$shim" "$app" "$fake_dir/libcuda.so.1"; do
  [ -e "$f" ] || { echo "FAIL: $f not built"; exit 1; }
done

# In a sanitizer build the instrumented shim needs the sanitizer runtimes loaded before it
# (CUDAPOOL_SAN_PRELOAD, set by the wrapper); it leaks its pools on purpose (no teardown at exit).
san_preload=${CUDAPOOL_SAN_PRELOAD:-}
unset CUDAPOOL_CONF CUDAPOOL_CONFIG CUDAPOOL_PROFILE CUDAPOOL_TRACE CUDAPOOL_STATS CUDAPOOL_ON_ERROR
# "${under_shim[@]}" [VAR=value…] "$app" SCENARIO: the fake-driver program under the library.
under_shim=(env LD_PRELOAD="${san_preload:+$san_preload }$shim" LD_LIBRARY_PATH="$fake_dir" CUDAPOOL_LIBRARY=
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1}"
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" TSAN_OPTIONS="${TSAN_OPTIONS:-die_after_fork=0}")

# attempt ROW WHAT WANT_RC PATTERN -- CMD…: runs CMD under timeout; the row holds when CMD exits
# with WANT_RC and says something matching PATTERN (an extended regex), which is then shown.
attempt() {
  local row=$1 what=$2 want=$3 pattern=$4
  shift 5
  timeout -k 5 "$limit" "$@" >"$tmp/out" 2>&1
  local rc=$? said
  said=$(grep -E -m1 -o -- "$pattern" "$tmp/out")
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "row $row: $what -> HUNG: killed after $limit s"
    bad=1
  elif [ "$rc" -ne "$want" ] || [ -z "$said" ]; then
    echo "row $row: $what -> exit $rc (wanted $want, saying /$pattern/):"
    sed 's/^/    /' "$tmp/out" | tail -n 8
    bad=1
  else
    echo "row $row: $what -> exit $rc: $said"
  fi
}

# plant PATH: a file of another user (uid 65534), writable by everyone, as a careless or hostile
# user leaves it in a shared directory. False where files cannot be given away (not root).
plant() {
  echo "another user's file" >"$1" && chmod 666 "$1" && chown "$other_uid:$other_uid" "$1" 2>/dev/null
}
# untouched ROW PATH: the planted file still holds its text and still belongs to its owner.
untouched() {
  if [ "$(cat "$2" 2>/dev/null)" = "another user's file" ] && [ "$(stat -c %u "$2")" = "$other_uid" ]; then
    echo "row $1: ... and $(basename "$2") is untouched, still uid $other_uid's"
  else
    echo "row $1: ... and $(basename "$2") was WRITTEN or replaced: $(stat -c 'uid %u, %s bytes' "$2" 2>&1)"
    bad=1
  fi
}

mkdir -m 1777 "$tmp/shared"  # a directory like /tmp: anyone may create files, sticky
fifo_says="not a regular file \(a FIFO\): give the path of a regular file"
owner_says="owned by uid $other_uid, not by this process's user \(uid [0-9]+\): remove it or choose another path"

# ---- row 1: a FIFO at a path the library or the tools open ---------------------------------
# open(2) of a FIFO waits for the other end: without O_NONBLOCK and a check of what was opened,
# the program would hang for ever. Anyone can create one in a shared directory.
f=$tmp/shared/f.fifo
mkfifo "$f"
attempt 1 "FIFO at trace_file (CUDAPOOL_TRACE)" 78 "trace_file .* is $fifo_says" -- \
  "${under_shim[@]}" CUDAPOOL_TRACE="$f" "$app" alloc_once
attempt 1 "FIFO at stats_file (CUDAPOOL_STATS)" 78 "stats_file .* is $fifo_says" -- \
  "${under_shim[@]}" CUDAPOOL_STATS="$f" "$app" alloc_once
attempt 1 "FIFO at log_file (the log stays on stderr, the program runs)" 0 "cannot open log file .*: $fifo_says" -- \
  "${under_shim[@]}" CUDAPOOL_CONF="log_file:$f" "$app" alloc_once
attempt 1 "FIFO at CUDAPOOL_CONFIG" 78 "CUDAPOOL_CONFIG=.*: $fifo_says" -- \
  "${under_shim[@]}" CUDAPOOL_CONFIG="$f" "$app" alloc_once
attempt 1 "FIFO at cudapool check --config" 78 "--config .*: $fifo_says" -- "$cp" check --config "$f"
attempt 1 "FIFO at cudapool plan -o" 66 "-o .* is $fifo_says" -- "$cp" plan "$traces/train.csv" -o "$f"
attempt 1 "FIFO at cudapool report --json" 66 "--json .* is $fifo_says" -- "$cp" report "$traces/train.csv" --json "$f"
attempt 1 "FIFO as the trace cudapool replay reads" 66 "cannot open trace .*: not a regular file.*" -- "$cp" replay "$f"
attempt 1 "FIFO as a warm-start plan (the pool starts cold)" 0 "warm_start: .*not a regular file" -- \
  "${under_shim[@]}" CUDAPOOL_CONF="warm_start:$f,log_level:info" "$app" alloc_once
rm -f "$f"

# ---- row 3: another user's file at trace_file / log_file -------------------------------------
# Mode 0666 in a shared directory: writing into it would hand the trace or the log (command
# lines, addresses) to that user. Never written: the trace is refused at start, the log stays on
# stderr.
if plant "$tmp/shared/t.csv" && plant "$tmp/shared/log.txt"; then
  attempt 3 "another user's 0666 file at trace_file" 78 "trace_file .* is $owner_says" -- \
    "${under_shim[@]}" CUDAPOOL_TRACE="$tmp/shared/t.csv" "$app" alloc_once
  untouched 3 "$tmp/shared/t.csv"
  attempt 3 "another user's 0666 file at log_file" 0 "cannot open log file .*: $owner_says" -- \
    "${under_shim[@]}" CUDAPOOL_CONF="log_file:$tmp/shared/log.txt,log_level:info" "$app" alloc_once
  untouched 3 "$tmp/shared/log.txt"
  attempt 3 "another user's 0666 file at cudapool plan -o" 66 "-o .* is $owner_says" -- \
    "$cp" plan "$traces/train.csv" -o "$tmp/shared/log.txt"
  untouched 3 "$tmp/shared/log.txt"
else
  echo "row 3: skipped: giving a file to uid $other_uid needs root"
fi

# ---- row 9: another user's file at stats_file -------------------------------------------------
# The summary is written at exit by a rename over the path: found only then, it would be lost (or,
# for root, replace the other user's file). The start check refuses it, as any output path that
# cannot be written: exit 78 before the first allocation, or the program without the pool when
# CUDAPOOL_ON_ERROR=passthrough.
if plant "$tmp/shared/s.json"; then
  attempt 9 "another user's 0666 file at stats_file, sticky directory" 78 "stats_file .* is $owner_says" -- \
    "${under_shim[@]}" CUDAPOOL_STATS="$tmp/shared/s.json" "$app" alloc_once
  untouched 9 "$tmp/shared/s.json"
  attempt 9 "the same with CUDAPOOL_ON_ERROR=passthrough (runs without the pool)" 0 "active=0" -- \
    "${under_shim[@]}" CUDAPOOL_STATS="$tmp/shared/s.json" CUDAPOOL_ON_ERROR=passthrough "$app" alloc_once
  untouched 9 "$tmp/shared/s.json"
else
  echo "row 9: skipped: giving a file to uid $other_uid needs root"
fi

# ---- row 7: idle connections to a process's CUDA IPC socket ---------------------------------
# A process of the same user opens 1100 connections to an exporter's socket, more than the 1024 it
# serves at once, and never says anything; then another process imports a block for real. The
# silent connections that hold nothing make room (and go after 30 s idle); an importer that
# holds a block open keeps its connection, so its block is not handed out again
# (tests/fakecuda/ipc_app.cpp, scenario `crowd`, checks each).
ipc_app=$fake_dir/ipc_app
hard=$(ulimit -Hn)
if [ ! -x "$ipc_app" ]; then
  echo "row 7: FAIL: $ipc_app not built"
  bad=1
elif [ "$hard" != unlimited ] && [ "$hard" -lt 2200 ]; then
  echo "row 7: skipped: 1100 connections on each end need a hard descriptor limit of 2200, not $hard"
else
  attempt 7 "1100 silent connections to an exporter's IPC socket, then a real cuIpcOpenMemHandle" 0 \
    "crowd: 1100 idle connections, [0-9]+ of them dropped by the exporter" -- \
    env LD_PRELOAD="${san_preload:+$san_preload }$shim" LD_LIBRARY_PATH="$fake_dir" CUDAPOOL_LIBRARY= "$ipc_app" crowd
fi

# ---- row 5: a huge trace ---------------------------------------------------------------------
# A 15 MB gzip file of 60 M valid rows (a member of 1 M rows, repeated; gzip allows that) replayed
# under `ulimit -v 2000000`: the row bound stops it at 5 M rows with one line and exit 65, never a
# std::bad_alloc abort. Then one line of 1 GiB (1024 gzip members of 1 MiB): refused at its first
# 64 KiB, not after inflating the whole of it. Reading 5 M rows takes seconds on a loaded machine:
# these attempts get a longer limit, which is there only to tell a hang.
printf 'Thread,Time,Action,Pointer,Size,Stream\n' | gzip -1 >"$tmp/r5.csv.gz"
yes '1,00:00:00.000001,allocate,0x10,512,0x0' | head -n 1000000 | gzip -1 >"$tmp/r5.rows.gz"
for _ in $(seq 60); do cat "$tmp/r5.rows.gz"; done >>"$tmp/r5.csv.gz"
# A sanitizer's shadow memory needs terabytes of address space: there the row bound is tried
# without the address-space limit.
vlimit=2000000
[ -n "$san_preload" ] && vlimit=unlimited
limit=300 attempt 5 "60 M valid rows, $(($(stat -c %s "$tmp/r5.csv.gz") / 1000000)) MB of gzip, to replay under ulimit -v $vlimit" \
  65 "more than 5000000 rows \(the limit\): pass --max-rows N to raise it" -- \
  bash -c 'ulimit -v "$2" && exec "$0" replay "$1"' "$cp" "$tmp/r5.csv.gz" "$vlimit"
if [ "$(wc -l <"$tmp/out")" -ne 1 ]; then
  echo "row 5: ... but the refusal is $(wc -l <"$tmp/out") lines, not one"
  bad=1
fi
rm -f "$tmp/r5.csv.gz" "$tmp/r5.rows.gz"
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,' | gzip -1 >"$tmp/r5.line.csv.gz"
head -c 1048576 /dev/zero | tr '\0' 7 | gzip -1 >"$tmp/r5.mib.gz"
for _ in $(seq 10); do cat "$tmp/r5.mib.gz" "$tmp/r5.mib.gz" >"$tmp/r5.2.gz" && mv "$tmp/r5.2.gz" "$tmp/r5.mib.gz"; done
cat "$tmp/r5.mib.gz" >>"$tmp/r5.line.csv.gz"
limit=300 attempt 5 "one line of 1 GiB in a gzip trace" 65 "line.csv.gz:2: line longer than 65536 bytes \(not a trace\?\)" -- \
  "$cp" replay "$tmp/r5.line.csv.gz"

# ---- row 6: a process named with escapes, bidi controls and invalid UTF-8 --------------------
# A pooled process whose argv[0] holds U+202E (RIGHT-TO-LEFT OVERRIDE), a raw 0xff and an escape
# sequence publishes its stats; `cudapool top --json -` must be JSON that a strict parser reads
# (Python's json.loads on the bytes), with U+202E and ESC escaped and 0xff as U+FFFD.
share_app=$fake_dir/share_app
if [ ! -x "$share_app" ]; then
  echo "row 6: FAIL: $share_app not built"
  bad=1
else
  mkdir -m 700 "$tmp/r6shm"
  name=$'evil\xe2\x80\xaegnp.exe\xff\x1b[2J'
  shown='evil<U+202E>gnp.exe<0xff><ESC>[2J'  # the name itself would reorder this script's output
  env CUDAPOOL_SHM_DIR="$tmp/r6shm" LD_PRELOAD="${san_preload:+$san_preload }$shim" LD_LIBRARY_PATH="$fake_dir" \
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1} \
    timeout -k 5 120 bash -c 'exec -a "$0" "$1" hold-live 20' "$name" "$share_app" >"$tmp/r6.app" 2>&1 &
  holder=$!
  found=0
  for _ in $(seq 300); do  # until it has published (every 250 ms once ready); at most 60 s
    if grep -q ready "$tmp/r6.app"; then
      timeout -k 5 "$limit" env CUDAPOOL_SHM_DIR="$tmp/r6shm" "$cp" top --once --json - >"$tmp/r6.json" 2>"$tmp/r6.err"
      if grep -q '"pid":' "$tmp/r6.json"; then found=1; break; fi
    fi
    sleep 0.2
  done
  kill -TERM "$holder" 2>/dev/null
  wait "$holder" 2>/dev/null
  if [ "$found" -eq 0 ]; then
    echo "row 6: FAIL: the process never showed in top: $(cat "$tmp/r6.app" "$tmp/r6.err" | head -c 400)"
    bad=1
  elif said=$(python3 - "$tmp/r6.json" 2>&1 <<'PY'
import json, sys
raw = open(sys.argv[1], "rb").read()
cmd = json.loads(raw)["processes"][0]["command"]  # bytes: decoded as strict UTF-8
assert "\u202e" in cmd and "\ufffd" in cmd and "\x1b" in cmd, ascii(cmd)
assert b"\xe2\x80\xae" not in raw and b"\x1b" not in raw, "a control character passed raw"
print("json.loads reads it; command " + ascii(cmd) + " (U+202E and ESC written as \\u202e and \\u001b)")
PY
  ); then
    echo "row 6: a process named $shown, then top --json -> $said"
  else
    echo "row 6: a process named $shown, then top --json -> NOT strict JSON: $said"
    bad=1
  fi
fi

# ---- rows 2, 4, 8: the group ledger and the stats records in a shared-memory directory ---------
share_app=$fake_dir/share_app
gpu0=GPU-a5a6a7a8-a9aa-abac-adae-afb0b1b2b300  # the fake's device 0
me=$(id -u)
group_conf=group:hostile,group_budget_mb:40,group_outside_growth_mb:0,log_level:info
refused_says="will be refused: the group ledger [^;]*"
# Row 2: whatever is at the ledger's path that the process cannot open or check, the group's
# allocations are refused (share_app's `need` exits 3 at the first one) with a message naming
# the file, its owner and the fix; never exit 0, which would mean the budget was silently off.
shm2=$(mktemp -d /tmp/cudapool-hostile-shm-XXXXXX)  # outside $tmp: uid 65534 must reach it
chmod 1777 "$shm2"                                  # like /dev/shm
l2=$shm2/cudapool-$me-g-$gpu0-hostile
ledger_env=(CUDAPOOL_SHM_DIR="$shm2" CUDAPOOL_CONF="$group_conf")
mkdir "$l2"
attempt 2 "a directory at the group ledger's path" 3 "$refused_says" -- \
  "${under_shim[@]}" "${ledger_env[@]}" "$share_app" need 20
rmdir "$l2"
mkfifo "$l2"
attempt 2 "a FIFO at the group ledger's path" 3 "$refused_says" -- \
  "${under_shim[@]}" "${ledger_env[@]}" "$share_app" need 20
rm -f "$l2"
printf 'junk' >"$l2"
chmod 600 "$l2"
attempt 2 "a file of this user at the ledger's path that is not a ledger" 3 "$refused_says" -- \
  "${under_shim[@]}" "${ledger_env[@]}" "$share_app" need 20
rm -f "$l2"
if [ "$me" = 0 ] && command -v setpriv >/dev/null; then
  # Running the program as uid 65534 needs a build directory that user may reach (a checkout in a
  # private directory, as mktemp -d makes, is not): otherwise that half is skipped, saying so.
  as_other=(setpriv --reuid="$other_uid" --regid="$other_uid" --clear-groups)
  reaches=0
  "${as_other[@]}" sh -c 'test -x "$1" && test -r "$2" && test -r "$3"' _ "$share_app" "$shim" "$fake_dir/libcuda.so.1" &&
    reaches=1
  for mode in 600 644; do
    l=$shm2/cudapool-$other_uid-g-$gpu0-hostile
    head -c 8192 /dev/zero >"$l" && chmod "$mode" "$l"  # root's file at uid 65534's ledger name
    if [ "$reaches" = 1 ]; then
      attempt 2 "root's file (mode 0$mode) at uid $other_uid's ledger path, which it cannot open" 3 "$refused_says" -- \
        "${as_other[@]}" "${under_shim[@]}" "${ledger_env[@]}" "$share_app" need 20
    else
      echo "row 2: root's file at uid $other_uid's ledger path -> skipped: uid $other_uid cannot reach $share_app"
    fi
    rm -f "$l"
    head -c 8192 /dev/zero >"$l2" && chmod "$mode" "$l2" && chown "$other_uid:$other_uid" "$l2"
    attempt 2 "uid $other_uid's file (mode 0$mode) at root's ledger path" 3 "$refused_says" -- \
      "${under_shim[@]}" "${ledger_env[@]}" "$share_app" need 20
    rm -f "$l2"
  done
else
  echo "row 2: another user's file at the ledger's path -> skipped (needs root and setpriv)"
fi
rm -rf "$shm2"

# Row 4: a process of the same user truncates the ledger and writes it back, again and again,
# while 40 processes join. None may die of a signal (SIGBUS before) or hang; each either joins
# or refuses the group's allocations with its message.
mkdir -m 700 "$tmp/shm4"
l4=$tmp/shm4/cudapool-$me-g-$gpu0-hostile
env4=(CUDAPOOL_SHM_DIR="$tmp/shm4" CUDAPOOL_CONF=group:hostile,group_budget_mb:100000,log_level:warn)
timeout -k 5 "$limit" "${under_shim[@]}" "${env4[@]}" "$share_app" need 20 >/dev/null 2>&1
cp "$l4" "$tmp/valid-ledger"
(for _ in $(seq 1 20000); do cp "$tmp/valid-ledger" "$l4" 2>/dev/null; : >"$l4"; done) &
truncator=$!
joiners=()
for i in $(seq 1 40); do
  timeout -k 5 60 "${under_shim[@]}" "${env4[@]}" "$share_app" need 20 >"$tmp/join.$i" 2>&1 &
  joiners+=($!)
done
joined=0 refused=0 signalled=0 hung=0 other=0
for pid in "${joiners[@]}"; do
  wait "$pid"
  case $? in
    0) joined=$((joined + 1)) ;;
    3) refused=$((refused + 1)) ;;
    124 | 137) hung=$((hung + 1)) ;;
    13[0-9] | 14[0-9]) signalled=$((signalled + 1)) ;;
    *) other=$((other + 1)) ;;
  esac
done
kill "$truncator" 2>/dev/null
wait "$truncator" 2>/dev/null
r4="$joined joined, $refused refused the group's allocations, $signalled killed by a signal, $hung hung, $other other"
echo "row 4: 40 processes join while another truncates and rewrites the ledger -> $r4"
if [ "$signalled" -ne 0 ] || [ "$hung" -ne 0 ] || [ "$other" -ne 0 ]; then bad=1; fi

# Row 8: forked children that allocate, log and exit at once leave no stats record; `cudapool
# top` removes an old empty record of this user without a warning, keeps a young one (it may be
# in creation) and another user's file at one of this user's record names.
mkdir -m 1777 "$tmp/shm8"
# (ThreadSanitizer sleeps a second at every exit unless told not to: 200 children would look hung.)
attempt 8 "200 forked children that allocate, log and exit at once" 0 "200 children, 0 records left" -- \
  "${under_shim[@]}" TSAN_OPTIONS=die_after_fork=0:atexit_sleep_ms=0 CUDAPOOL_SHM_DIR="$tmp/shm8" \
  CUDAPOOL_CONF=log_level:info "$share_app" fork-exit 200
ghost=4000000
while [ -e "/proc/$ghost" ]; do ghost=$((ghost - 1)); done
old8=$tmp/shm8/cudapool-$me-p-$ghost young8=$tmp/shm8/cudapool-$me-p-$((ghost - 1))
foreign8=$tmp/shm8/cudapool-$me-p-$((ghost - 2))
: >"$old8" && chmod 600 "$old8" && touch -d '1 hour ago' "$old8"
: >"$young8" && chmod 600 "$young8"
foreign=no
if [ "$me" = 0 ]; then
  : >"$foreign8" && touch -d '1 hour ago' "$foreign8" && chown "$other_uid:$other_uid" "$foreign8" && foreign=yes
fi
CUDAPOOL_SHM_DIR=$tmp/shm8 timeout -k 5 "$limit" "$cp" top --once >/dev/null 2>"$tmp/top8.err"
rc=$?
what="an hour-old empty record of a dead pid, a new empty one and another user's old one, then top"
if [ "$rc" -eq 0 ] && [ ! -e "$old8" ] && [ -e "$young8" ] && { [ "$foreign" = no ] || [ -e "$foreign8" ]; } &&
  ! grep -q -- "-p-$ghost\b" "$tmp/top8.err" && ! grep -q -- "-p-$((ghost - 1))\b" "$tmp/top8.err"; then
  echo "row 8: $what -> exit 0: the old one removed silently, the new one kept$([ $foreign = yes ] && echo ", the other user's kept")"
else
  echo "row 8: $what -> exit $rc; left: $(ls "$tmp/shm8" | tr '\n' ' '); stderr: $(head -c 300 "$tmp/top8.err")"
  bad=1
fi

if [ "$bad" -eq 0 ]; then echo "PASS hostile inputs"; else echo "FAIL hostile inputs"; fi
exit "$bad"
