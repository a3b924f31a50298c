#!/usr/bin/env bash
# `make install` / `make uninstall` into a scratch DESTDIR: every program, the library, the header
# and the pkg-config file arrive, binaries are stripped, the installed command runs, uninstall
# removes everything it put there. Usage: bash tests/tools/install_test.sh [SAN]
set -u
san=${1:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset MAKEFLAGS MFLAGS MAKELEVEL
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
mkdir -p "$tmp/opt/cudapool/bin" && echo keep >"$tmp/opt/cudapool/bin/someone-elses-tool"
make -s --no-print-directory install SAN="$san" DESTDIR="$tmp" PREFIX=/opt/cudapool >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; echo "FAIL: make install"; exit 1; }
root=$tmp/opt/cudapool
for f in bin/cudapool bin/cudapool-gen-trace lib/libcudapool.so include/cudapool.h lib/pkgconfig/cudapool.pc; do
  [ -f "$root/$f" ] || fail "$f not installed"
done
for f in bin/cudapool bin/cudapool-gen-trace lib/libcudapool.so; do
  [ -f "$root/$f" ] || continue
  if readelf -S "$root/$f" | grep -q '\.debug_info'; then fail "$f is not stripped"; fi
done
version=$(sed -n 's/.*kVersion\[\] = "\(.*\)";/\1/p' config/version.h)
[ -n "$version" ] || fail "no version in config/version.h"
out=$("$root/bin/cudapool" --version 2>&1) || fail "installed cudapool --version failed"
[ "$out" = "cudapool $version" ] || fail "cudapool --version printed '$out', wanted 'cudapool $version'"
grep -qx "Version: $version" "$root/lib/pkgconfig/cudapool.pc" || fail "pkg-config file lacks Version: $version"
grep -qx "prefix=/opt/cudapool" "$root/lib/pkgconfig/cudapool.pc" || fail "pkg-config prefix is not the PREFIX"
# Stripped: a small installed program, the build tree keeps the debug info. A sanitizer build's
# instrumented program is several times larger: the bound is for release builds only.
size=$(stat -c %s "$root/bin/cudapool" 2>/dev/null || echo 0)
limit=$((8 * 1024 * 1024)); [ -n "$san" ] && limit=$((64 * 1024 * 1024))
[ "$size" -gt 0 ] && [ "$size" -lt "$limit" ] || fail "installed cudapool is $size bytes"
make -s --no-print-directory uninstall SAN="$san" DESTDIR="$tmp" PREFIX=/opt/cudapool >"$tmp/log" 2>&1 || fail "make uninstall"
left=$(find "$tmp/opt" -type f ! -name someone-elses-tool 2>/dev/null)
[ -z "$left" ] || fail "uninstall left: $left"
[ -f "$tmp/opt/cudapool/bin/someone-elses-tool" ] || fail "uninstall removed a file install did not put there"
[ "$fails" -eq 0 ] && echo "PASS install" || { echo "FAIL install ($fails)"; exit 1; }
