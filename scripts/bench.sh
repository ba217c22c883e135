#!/usr/bin/env bash
# Builds libfastpath and fastbench, then runs fastbench. With no arguments it
# runs every scenario on the default device (the GPU if present, else the CPU).
#   scripts/bench.sh                              all scenarios
#   scripts/bench.sh run norm --dtype bf16 --json out.json
#   scripts/bench.sh list | info | compare OLD.json NEW.json
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$FP_JOBS" --target fastbench
if [ $# -eq 0 ]; then set -- run; fi
exec ./build/fastbench "$@"
