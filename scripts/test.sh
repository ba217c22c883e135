#!/usr/bin/env bash
# Builds libfastpath with its tests and runs the whole suite (CTest). Tests that
# need a GPU skip themselves (exit 77) when there is none.
#   scripts/test.sh [extra ctest args]      e.g. scripts/test.sh -L cpu
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTPATH_WERROR=ON
cmake --build build -j "$FP_JOBS"
ctest --test-dir build --output-on-failure -j "$FP_JOBS" "$@"
