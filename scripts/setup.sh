#!/usr/bin/env bash
# Installs the Debian packages cudapool builds and tests with, if any is missing.
set -euo pipefail
pkgs=(make g++ clang clang-format libclang-rt-dev libgtest-dev libbenchmark-dev libspdlog-dev libfmt-dev
      libtomlplusplus-dev libcli11-dev nlohmann-json3-dev zlib1g-dev python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
