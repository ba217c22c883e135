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
# python-bench.txt, python-alloc.json and logs.tar.gz (env,
# configure/build/ctest/sanitizer logs, device info, the allocator bench's
# table). The logs are archived also when the call is stopped (SIGTERM) and
# every phase runs under a timeout of the time left, so a slow phase costs
# the later ones, not the logs. Then: python3 scripts/gpu-results.py OUTDIR
# files the run under benchmarks/results/ and updates the targets table.
# Before the device call, run scripts/gpu-deps.sh here and carry .deps: the
# GPU machine's image may lack libcjson-dev and can fetch nothing.
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
# tail_into_summary FILE N: the last N lines of FILE into summary.txt (and
# stdout), so a failure is explained without unpacking logs.tar.gz.
tail_into_summary() {
  [ -f "$1" ] || return 0
  { echo "---- last $2 lines of ${1#$out/}"; tail -n "$2" "$1"; echo "----"; } | tee -a "$out/summary.txt"
}
finish() {
  [ -d "$logs" ] && tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
}
# Stopped from outside (the device call's time limit): keep the logs.
trap 'stamp "stopped by a signal"; finish; exit 124' TERM INT
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
# Phases after the build need the build: a failed build skips them, but a
# failed test does not skip the sanitizer or the benches (their logs are
# what explains a failure).
built=1
[ -x build-gpu/fastbench ] || built=0

# Debian packages carried from the developer's machine (scripts/gpu-deps.sh,
# carry .deps): the GPU machine fetches nothing, and the build needs cJSON.
cmake_deps=()
if [ ! -f /usr/include/cjson/cJSON.h ] && ls .deps/debs/*.deb >/dev/null 2>&1; then
  mkdir -p .deps/root
  for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
  hdr=$(find "$PWD/.deps/root" -name cJSON.h -path "*cjson*" | head -n1)
  lib=$(find "$PWD/.deps/root" -name "libcjson.so*" | sort | head -n1)
  if [ -n "$hdr" ] && [ -n "$lib" ]; then
    cmake_deps=(-DCJSON_INCLUDE_DIR="$(dirname "$(dirname "$hdr")")" -DCJSON_LIBRARY="$lib")
    export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    stamp "cJSON from the carried .deps: $lib"
  fi
fi

if want build; then
  built=0
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
  arch=${arch:-90}
  cuda_arch=$arch
  [ "$arch" = "90" ] && cuda_arch="90a" # Hopper: wgmma/TMA code paths
  gen=(-G Ninja)
  if ! command -v ninja >/dev/null 2>&1; then
    gen=()
    [ -f build-gpu/CMakeCache.txt ] && grep -q "CMAKE_GENERATOR:INTERNAL=Ninja" build-gpu/CMakeCache.txt && rm -rf build-gpu
  fi
  stamp "configure for sm_$cuda_arch (${gen[1]:-default generator})"
  if ! timeout "$(left)" cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES="$cuda_arch" -DFASTPATH_TSAN_TESTS=OFF \
       -DFASTPATH_EMU_TESTS=OFF "${cmake_deps[@]}" \
       > "$logs/configure.log" 2>&1; then
    stamp "configure FAILED (logs/configure.log)"
    tail_into_summary "$logs/configure.log" 30
    rc=1
  elif timeout "$(left)" cmake --build build-gpu -j "$FP_JOBS" > "$logs/build.log" 2>&1; then
    built=1
    stamp "built"
  else
    r=$?
    stamp "build FAILED$([ $r -eq 124 ] && echo ': out of time (rerun with FP_GPU_CHECK_PHASES=build: build-gpu is reused)') (logs/build.log)"
    grep -E "error|Error" "$logs/build.log" | head -20 >> "$out/summary.txt"
    tail_into_summary "$logs/build.log" 30
    rc=1
  fi
fi
if [ $built -eq 0 ] && ! want build; then stamp "build-gpu/ has no build: run the build phase first"; rc=1; fi

if [ $built -eq 1 ] && want_time tests 60; then
  # CPU tests in parallel; gpu tests one at a time beside them, so the
  # timing checks (copy bandwidth vs peak, graph vs plain) do not measure
  # each other.
  t=$(left)
  # (label emu: CUDA code on the CPU emulation, for machines without a GPU; not built here
  # (FASTPATH_EMU_TESTS=OFF) and excluded for a build dir configured otherwise)
  timeout "$t" ctest --test-dir build-gpu --output-on-failure -LE "gpu|emu" -j "$FP_JOBS" > "$logs/ctest-cpu.log" 2>&1 &
  cpu_pid=$!
  timeout "$t" ctest --test-dir build-gpu --output-on-failure -L gpu -j 1 > "$logs/ctest-gpu.log" 2>&1
  r_gpu=$?
  wait $cpu_pid
  r_cpu=$?
  [ $r_cpu -ne 0 -o $r_gpu -ne 0 ] && rc=1
  for k in cpu gpu; do
    r=$r_cpu; [ $k = gpu ] && r=$r_gpu
    stamp "ctest $k rc=$r$([ $r -eq 124 ] && echo ' (out of time)'): $(grep -E 'tests passed|tests failed' "$logs/ctest-$k.log" | tail -1)"
    grep -E "^[[:space:]]*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception|Child|Not Run)" "$logs/ctest-$k.log" | tail -20 | tee -a "$out/summary.txt"
  done
fi

if [ $built -eq 1 ] && want_time sanitizer 60; then
  if command -v compute-sanitizer >/dev/null 2>&1; then
    # Every gpu test under memcheck, in their reduced form, 3 at a time.
    # --report-api-errors no: the tests provoke CUDA API errors on purpose
    # (out of memory, a sync during capture, a double cudaHostRegister);
    # memcheck must count memory errors only.
    tests=$(ctest --test-dir build-gpu -L gpu -N -V 2>/dev/null | sed -n 's/^[0-9]*: Test command: //p' | awk '{print $1}')
    n_tests=$(printf '%s\n' $tests | grep -c .)
    waves=$(( (n_tests + 2) / 3 )); [ $waves -lt 1 ] && waves=1
    per_test=$(( ($(left) - 10) / waves )); [ $per_test -gt 240 ] && per_test=240
    printf '%s\n' $tests | FP_TEST_QUICK=1 xargs -P 3 -I{} sh -c \
      'n=$(basename {}); timeout '"$per_test"' compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 {} > "'"$logs"'/san-$n.log" 2>&1; r=$?; echo "$n rc=$r"' \
      > "$logs/sanitizer.txt" 2>&1
    bad=$(grep -v -E "rc=(0|77)$" "$logs/sanitizer.txt")
    [ -n "$bad" ] && rc=1
    stamp "compute-sanitizer memcheck (rc 99: memory errors, 124: out of time): $(tr '\n' ' ' < "$logs/sanitizer.txt")"
    for n in $(printf '%s\n' "$bad" | awk '{print $1}'); do
      grep -m 5 -E "=========  ?(Invalid|Out of bounds|Program hit|Error|Leaked|Uninitialized)" "$logs/san-$n.log" \
        | sed "s/^/$n: /" >> "$out/summary.txt"
    done
  else
    stamp "compute-sanitizer not found: skipped"
  fi
fi

# Time for the python phase when it is asked for (it gets what is left).
py_time=0
want python && py_time=120
if [ $built -eq 1 ] && want_time bench $(( 60 + py_time )); then
  timeout 60 ./build-gpu/fastbench info --json "$logs/info.json" > "$logs/info.txt" 2>&1
  [ $# -eq 0 ] && set -- --max-time 0.5
  bench_time=$(( $(left) - py_time ))
  stamp "fastbench run $* (${bench_time}s)"
  timeout "$bench_time" ./build-gpu/fastbench run "$@" --json "$out/fastbench.json" > "$out/fastbench.txt" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=1
  stamp "fastbench rc=$r$([ $r -eq 124 ] && echo ' (out of time: fastbench.json holds the scenarios that finished, complete=false)')"
  tail -n 40 "$out/fastbench.txt"
fi

if [ $built -eq 1 ] && want_time python 30; then
  if python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    export FASTPATH_LIB=$PWD/build-gpu/libfastpath.so PYTHONPATH=$PWD/bindings/python
    # Two thirds of the time for the drop-ins (norm, SDPA), the rest for the
    # allocator beside torch's (--pluggable: torch running on libfastpath).
    t=$(( $(left) * 2 / 3 ))
    timeout "$t" python3 benchmarks/python/bench_torch.py --compiled --json "$out/python-bench.json" \
      > "$out/python-bench.txt" 2>&1
    r=$?
    [ $r -ne 0 ] && rc=1
    stamp "python bench rc=$r$([ $r -eq 124 ] && echo ' (out of time)')"
    [ $r -ne 0 ] && tail_into_summary "$out/python-bench.txt" 15
    if [ "$(left)" -gt 20 ]; then
      timeout "$(( $(left) - 5 ))" python3 benchmarks/python/bench_alloc_torch.py --quick --pluggable \
        --json "$out/python-alloc.json" > "$logs/python-alloc.txt" 2>&1
      r=$?
      [ $r -ne 0 ] && rc=1
      stamp "python allocator bench rc=$r$([ $r -eq 124 ] && echo ' (out of time)') (table in logs/python-alloc.txt)"
      [ $r -ne 0 ] && tail_into_summary "$logs/python-alloc.txt" 15
    fi
  else
    stamp "python benches skipped: no torch with CUDA"
  fi
fi

trap - TERM INT
finish
stamp "done rc=$rc"
cat "$out/summary.txt"
exit $rc
