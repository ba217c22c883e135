#!/usr/bin/env bash
# Run here (a machine with Debian's package registry) before a device call:
# downloads the Debian packages the build needs that the GPU machine's image
# may lack (it can fetch nothing) into .deps/debs/ (git-ignored). Pass
# `carry: [".deps"]` to the device call; scripts/gpu-check.sh unpacks them into
# .deps/root and points CMake at them when the system has no cJSON or SQLite
# header.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
pkgs=(libcjson1 libcjson-dev libsqlite3-0 libsqlite3-dev)
if ! apt-get download "${pkgs[@]}" >/dev/null 2>&1; then
  apt-get update -qq
  apt-get download "${pkgs[@]}"
fi
ls -1 *.deb
