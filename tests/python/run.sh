#!/usr/bin/env bash
# Runs the Python module's tests with the shim preloaded over the fake driver, then checks that
# `pip install ./python` installs the package (when pip and setuptools are there).
# Usage: bash tests/python/run.sh [BUILD_DIR]  (default build/release)
set -u
build=${1:-build/release}
shim=$(readlink -f "$build/libcudapool.so")
fake=$(readlink -f "$build/tests/fakecuda")
[ -f "$shim" ] && [ -f "$fake/libcuda.so.1" ] || { echo "FAIL: build $shim and $fake/libcuda.so.1 first"; exit 1; }
unset CUDAPOOL_CONF CUDAPOOL_CONFIG CUDAPOOL_PROFILE CUDAPOOL_TRACE CUDAPOOL_STATS
rc=0
LD_PRELOAD=$shim LD_LIBRARY_PATH=$fake PYTHONPATH=$PWD/python CUDAPOOL_LOG_LEVEL=warn \
  python3 tests/python/module_test.py 2>&1 || rc=1
if python3 -m pip --version >/dev/null 2>&1 && python3 -c 'import setuptools, wheel' 2>/dev/null; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  cp -r python "$tmp/src"
  if python3 -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$tmp/site" "$tmp/src" >"$tmp/log" 2>&1 &&
     PYTHONPATH=$tmp/site python3 -c 'import cudapool, sys; sys.exit(0 if cudapool.is_loaded() is False else 1)'; then
    echo "pip install ./python: ok"
  else
    echo "FAIL: pip install ./python"; cat "$tmp/log"; rc=1
  fi
else
  echo "note: pip, setuptools or wheel missing (an offline build needs all three): the install from python/ was not tried"
fi
[ $rc -eq 0 ] && echo "PASS python module" || echo "FAIL python module"
exit $rc
