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
LD_PRELOAD=$shim LD_LIBRARY_PATH=$fake PYTHONPATH=$PWD/python CUDAPOOL_LOG_LEVEL=warn CUDAPOOL_TEST_SHIM=$shim \
  python3 tests/python/module_test.py 2>&1 || rc=1
# `pip install ./python` offline: the package's own build backend needs nothing from the network,
# so a fresh venv with no index and build isolation on must install it.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if python3 -m venv "$tmp/venv" >/dev/null 2>&1 && "$tmp/venv/bin/python" -m pip --version >/dev/null 2>&1; then
  # As in the repository: python/ beside the LICENSE its metadata names.
  mkdir "$tmp/repo" && cp -r python "$tmp/repo/python" && cp LICENSE "$tmp/repo/"
  if "$tmp/venv/bin/python" -m pip install --quiet --no-index "$tmp/repo/python" >"$tmp/log" 2>&1 &&
     "$tmp/venv/bin/python" -c 'import cudapool, cudapool.torch, os, sys; sys.exit(0 if cudapool.is_loaded() is False and os.path.isfile(cudapool.torch._GLUE) else 1)' &&
     "$tmp/venv/bin/python" - <<'PY' >>"$tmp/log" 2>&1; then
# The installed metadata names the license, and the license text is installed with it.
from importlib import metadata
m = metadata.metadata("cudapool")
assert m["License"] == "Apache-2.0", m["License"]
text = [f for f in metadata.files("cudapool") if f.name == "LICENSE"]
assert text and "Apache License" in text[0].read_text(), text
PY
    echo "pip install --no-index ./python: ok"
  else
    echo "FAIL: pip install --no-index ./python"; cat "$tmp/log"; rc=1
  fi
else
  echo "note: python3 -m venv with pip is missing: the install from python/ was not tried"
fi
[ $rc -eq 0 ] && echo "PASS python module" || echo "FAIL python module"
exit $rc
