#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, build for the local
# architecture, run the whole suite (gpu tests included), run the gpu tests
# again under compute-sanitizer memcheck, run fastbench with JSON output, and
# leave logs and JSON in OUTDIR. Budget: 10 minutes on an H100.
#   scripts/gpu-check.sh OUTDIR [fastbench run args...]
# Default fastbench args: every scenario with --max-time 0.5 (GPU timings
# converge in a few samples; this keeps the whole check inside 10 minutes).
# Then: python3 scripts/gpu-results.py OUTDIR files the run under
# benchmarks/results/ and updates the targets table.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh OUTDIR [fastbench args]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
source scripts/env.sh
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$out/summary.txt"; }

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
export FASTPATH_GIT_COMMIT=$commit
{ echo "commit $commit"; date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1; nvcc --version | tail -1; } > "$out/env.txt"
stamp "commit $commit"

arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
arch=${arch:-90}
cuda_arch=$arch
[ "$arch" = "90" ] && cuda_arch="90a" # Hopper: wgmma/TMA code paths
stamp "configure for sm_$cuda_arch"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$cuda_arch" \
      -DFASTPATH_TSAN_TESTS=OFF > "$out/configure.log" 2>&1 || { stamp "configure FAILED"; exit 1; }
cmake --build build-gpu -j "$FP_JOBS" > "$out/build.log" 2>&1 || { stamp "build FAILED (see build.log)"; tail -30 "$out/build.log"; exit 1; }
stamp "built"

ctest --test-dir build-gpu --output-on-failure -j 4 > "$out/ctest.log" 2>&1
rc_tests=$?
stamp "ctest rc=$rc_tests: $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"

rc_san=0
if command -v compute-sanitizer >/dev/null 2>&1; then
  : > "$out/sanitizer.log"
  for t in $(ctest --test-dir build-gpu -L gpu -N -V 2>/dev/null | sed -n 's/^[0-9]*: Test command: //p' | awk '{print $1}'); do
    echo "== $t" >> "$out/sanitizer.log"
    FP_TEST_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 "$t" >> "$out/sanitizer.log" 2>&1
    r=$?
    [ $r -ne 0 ] && [ $r -ne 77 ] && { rc_san=1; echo "FAILED rc=$r: $t" >> "$out/sanitizer.log"; }
  done
  stamp "compute-sanitizer memcheck rc=$rc_san"
else
  stamp "compute-sanitizer not found: skipped"
fi

./build-gpu/fastbench info --json "$out/info.json" > "$out/info.txt" 2>&1
[ $# -eq 0 ] && set -- --max-time 0.5
remaining=$(( 480 - ($(date +%s) - start) ))
stamp "fastbench run (${remaining}s left)"
timeout "$remaining" ./build-gpu/fastbench run "$@" --json "$out/fastbench.json" > "$out/fastbench.txt" 2>&1
rc_bench=$?
stamp "fastbench rc=$rc_bench"

# PyTorch comparison (fastpath drop-ins vs torch eager), when torch is there.
rc_py=0
if python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  remaining=$(( 590 - ($(date +%s) - start) ))
  if [ "$remaining" -gt 20 ]; then
    FASTPATH_LIB=$PWD/build-gpu/libfastpath.so PYTHONPATH=$PWD/bindings/python \
      timeout "$remaining" python3 benchmarks/python/bench_torch.py --json "$out/python-bench.json" \
      > "$out/python-bench.txt" 2>&1
    rc_py=$?
    stamp "python bench rc=$rc_py"
  else
    stamp "python bench skipped: out of time"
  fi
else
  stamp "python bench skipped: no torch with CUDA"
fi
tail -n 60 "$out/fastbench.txt"
cat "$out/summary.txt"
[ $rc_tests -eq 0 ] && [ $rc_san -eq 0 ] && [ $rc_bench -eq 0 ] && [ $rc_py -eq 0 ]
