#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, build for the local
# architecture, run the whole suite (gpu tests included), run the gpu tests
# again under compute-sanitizer memcheck, run fastbench with JSON output and
# the PyTorch comparison, and leave the results in OUTDIR.
#
#   scripts/gpu-check.sh OUTDIR [fastbench run args...]
#
# Default fastbench args: every scenario with --max-time 0.5 (GPU timings
# converge in a few samples). Environment:
#   FP_GPU_CHECK_PHASES  comma list of build,tests,sanitizer,bench,python
#                        (default: all). The build dir (build-gpu) is reused,
#                        so a session can split the check over several
#                        10-minute device calls, e.g. "build,tests,sanitizer"
#                        then "bench,python".
#   FP_GPU_CHECK_BUDGET  seconds for the whole call (default 560); a phase
#                        that would start with too little time left is
#                        skipped and says so in summary.txt.
# OUTDIR ends with at most 8 files (what a device call brings back):
# summary.txt, fastbench.json, fastbench.txt, python-bench.json,
# python-bench.txt, and logs.tar.gz (env, configure/build/ctest/sanitizer
# logs, device info). Then: python3 scripts/gpu-results.py OUTDIR files the
# run under benchmarks/results/ and updates the targets table.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh OUTDIR [fastbench args]}
shift
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
logs=$out/logs
cd "$(dirname "$0")/.."
source scripts/env.sh
phases=",${FP_GPU_CHECK_PHASES:-build,tests,sanitizer,bench,python},"
budget=${FP_GPU_CHECK_BUDGET:-560}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
left() { echo $(( budget - $(elapsed) )); }
stamp() { echo "[$(elapsed)s] $*" | tee -a "$out/summary.txt"; }
want() { case "$phases" in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# want_time PHASE SECONDS: the phase is asked for and SECONDS are left.
want_time() {
  want "$1" || return 1
  if [ "$(left)" -lt "$2" ]; then stamp "$1 skipped: $(left)s left, needs ~$2s"; return 1; fi
}

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
export FASTPATH_GIT_COMMIT=$commit
{ echo "commit $commit"; date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  nvcc --version | tail -1; } > "$logs/env.txt"
stamp "commit $commit, phases ${phases//,/ }, budget ${budget}s"
rc=0

if want build; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
  arch=${arch:-90}
  cuda_arch=$arch
  [ "$arch" = "90" ] && cuda_arch="90a" # Hopper: wgmma/TMA code paths
  stamp "configure for sm_$cuda_arch"
  if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$cuda_arch" \
       -DFASTPATH_TSAN_TESTS=OFF > "$logs/configure.log" 2>&1 &&
     cmake --build build-gpu -j "$FP_JOBS" > "$logs/build.log" 2>&1; then
    stamp "built"
  else
    stamp "build FAILED (logs/build.log)"
    tail -30 "$logs/build.log"
    rc=1
  fi
fi

if [ $rc -eq 0 ] && want_time tests 60; then
  timeout "$(left)" ctest --test-dir build-gpu --output-on-failure -j 4 > "$logs/ctest.log" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=1
  stamp "ctest rc=$r: $(grep -E 'tests passed|tests failed' "$logs/ctest.log" | tail -1)"
  grep -E "^[0-9]+ - |Failed|\*\*\*" "$logs/ctest.log" | tail -20
fi

if [ $rc -eq 0 ] && want_time sanitizer 60; then
  if command -v compute-sanitizer >/dev/null 2>&1; then
    # Every gpu test under memcheck, in their reduced form, 3 at a time.
    tests=$(ctest --test-dir build-gpu -L gpu -N -V 2>/dev/null | sed -n 's/^[0-9]*: Test command: //p' | awk '{print $1}')
    per_test=$(( $(left) - 10 )); [ $per_test -gt 240 ] && per_test=240
    printf '%s\n' $tests | FP_TEST_QUICK=1 xargs -P 3 -I{} sh -c \
      'n=$(basename {}); timeout '"$per_test"' compute-sanitizer --tool memcheck --error-exitcode 99 {} > "'"$logs"'/san-$n.log" 2>&1; r=$?; echo "$n rc=$r"' \
      > "$logs/sanitizer.txt" 2>&1
    bad=$(grep -v -E "rc=(0|77)$" "$logs/sanitizer.txt")
    [ -n "$bad" ] && rc=1
    stamp "compute-sanitizer memcheck: $(tr '\n' ' ' < "$logs/sanitizer.txt")"
  else
    stamp "compute-sanitizer not found: skipped"
  fi
fi

if want_time bench 60; then
  ./build-gpu/fastbench info --json "$logs/info.json" > "$logs/info.txt" 2>&1
  [ $# -eq 0 ] && set -- --max-time 0.5
  # Keep 60 s for the Python bench when it is asked for.
  bench_time=$(left)
  want python && bench_time=$(( bench_time - 60 ))
  stamp "fastbench run $* (${bench_time}s)"
  timeout "$bench_time" ./build-gpu/fastbench run "$@" --json "$out/fastbench.json" > "$out/fastbench.txt" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=1
  stamp "fastbench rc=$r$([ $r -eq 124 ] && echo ' (out of time: fastbench.json holds the scenarios that finished, complete=false)')"
  tail -n 40 "$out/fastbench.txt"
fi

if want_time python 30; then
  if python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    FASTPATH_LIB=$PWD/build-gpu/libfastpath.so PYTHONPATH=$PWD/bindings/python \
      timeout "$(left)" python3 benchmarks/python/bench_torch.py --json "$out/python-bench.json" \
      > "$out/python-bench.txt" 2>&1
    r=$?
    [ $r -ne 0 ] && rc=1
    stamp "python bench rc=$r"
  else
    stamp "python bench skipped: no torch with CUDA"
  fi
fi

tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
stamp "done rc=$rc"
cat "$out/summary.txt"
exit $rc
