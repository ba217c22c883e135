#!/usr/bin/env bash
# The GPU check: one device call of at most ~7 minutes on a bare H100 / H200
# machine (nvcc, CMake, ninja, PyTorch, compute-sanitizer; nothing can be
# fetched) that turns a lease into a complete verdict:
#
#   scripts/gpu-check.sh OUTDIR
#
# Phases, in this order, each under its own cap (seconds) and never past
# the call's budget, so that a hang costs that phase only; a phase that
# cannot start says so in summary.txt, and the summary names what was not
# reached:
#   build      configure + build for sm_90a (the local architecture elsewhere)
#              with FASTPATH_KERNEL_WATCHDOG=ON: every in-kernel wait loop
#              traps after a deadline instead of hanging (cap 150). Built
#              there: 32 s for the whole tree on the 2-core CPU machine,
#              while a carried build (137 MB with its tests) is over the
#              64 MiB the call can carry.
#   tests      every gpu-labelled CTest test, each capped at 90 s
#              (FASTPATH_GPU_TEST_TIMEOUT), verbose: the attention tests print
#              per case which kernel ran (fp_attention_last_kernel) and fail
#              when a version asked for ran another (cap 150)
#   bench      fastbench rows for every target in
#              benchmarks/results/targets.json (one shape each; graph/ at
#              its default shapes, a few seconds in all) and the
#              flash kernel versions v1..v5 and v7 (against v1), v8 (against v5),
#              v9 (against v8)
#              at seqlen 1024, 4096 and 16384,
#              head_dim 64 / 128, causal and not, short --max-time (cap 120)
#   python     the Python tests' CUDA cases (pytest -k cuda, 60 s), the
#              drop-ins' host cost on tiny CUDA tensors against torch eager's
#              (bench_overhead.py --device cuda, 25 s), then the
#              PyTorch drop-ins vs torch eager, torch.compile and each SDPA
#              backend there, one process, same inputs (cap 130 in all)
#   sanitizer  compute-sanitizer memcheck on every gpu test (FP_TEST_QUICK=1:
#              reduced cases) and racecheck on the attention and norm
#              tests, all at once, in what is left (cap 120)
#              and examples/serve_decode on the GPU, eager, --graphs and
#              --pipeline (run name "serve"); the pipeline rows are the runs
#              "pipeline" (bandwidth, pin_wait, host_memcpy), "overlap",
#              "overlapreg" (registered host memory: nothing staged) and
#              "overlap8" / "overlap8x64" (8 staging threads), "overlapdeep" /
#              "overlapdeep8" (more chunks in flight); communication
#              (one rank on the GPU) the runs "comm" (allreduce_buckets,
#              bucket_tuner) and "collectives"; "decode1k" / "norm1row" the
#              decode step's kernels alone (1024 keys; one 4096-wide row);
#              "ab-*" the same scenarios with an environment that selects
#              the kernel a change replaces (extra.txt, not fastbench.json);
#              "prof-*" scenarios run with --profile: what bounds each
#              (compute, memory, launch, transfer, sync; extra.txt)
# Environment: FP_GPU_CHECK_BUDGET (default 420 s for the whole call),
# FP_GPU_CHECK_PHASES (comma list, default all), FP_GPU_CHECK_BENCH_CAP (the
# bench phase's cap, default 120 s), FP_GPU_CHECK_SANITIZER_CAP (the sanitizer
# phase's, default 120 s), FP_GPU_CHECK_PYTEST (pytest's selection,
# default "-k cuda tests/python"), FP_GPU_CHECK_PYBENCH=0 (no PyTorch bench), FP_GPU_CHECK_TESTS (a ctest
# -R regex narrowing the gpu tests, default all), FP_GPU_CHECK_RUNS (comma
# list of the bench phase's run names below, default all), FASTPATH_GIT_COMMIT
# (the commit checked: the device copy has no .git).
# OUTDIR ends with at most 8 files (a device call brings back no more):
# summary.txt, ctest-gpu.log, fastbench.json, fastbench.txt,
# python-bench.json, python-bench.txt, logs.tar.gz (env, configure / build
# logs, fastbench's per-run JSON, the sanitizer logs), extra.txt (the ab-
# runs; with the python phase that makes 9: leave them out of such calls). The logs are archived
# also when the call is stopped (SIGTERM). Then, here:
# python3 scripts/gpu-results.py OUTDIR files the run under
# benchmarks/results/ and updates the targets table.
# Before the device call run scripts/gpu-deps.sh here and carry .deps: the
# GPU machine's image may lack libcjson-dev and can fetch nothing.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
logs=$out/logs
cd "$(dirname "$0")/.."
source scripts/env.sh
phases=",${FP_GPU_CHECK_PHASES:-build,tests,bench,python,sanitizer},"
budget=${FP_GPU_CHECK_BUDGET:-420}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
left() { echo $(( budget - $(elapsed) )); }
stamp() { echo "[$(elapsed)s] $*" | tee -a "$out/summary.txt"; }
# tail_into_summary FILE N: the last N lines of FILE into summary.txt.
tail_into_summary() {
  [ -f "$1" ] || return 0
  { echo "---- last $2 lines of ${1#$out/}"; tail -n "$2" "$1"; echo "----"; } | tee -a "$out/summary.txt"
}
finish() {
  [ -d "$logs" ] && tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
}
trap 'stamp "stopped by a signal"; finish; exit 124' TERM INT
want() { case "$phases" in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
runs_wanted=",${FP_GPU_CHECK_RUNS:-all},"
want_run() { case "$runs_wanted" in *",all,"* | *",$1,"*) return 0 ;; *) return 1 ;; esac; }
tests_re=(-L gpu)
[ -n "${FP_GPU_CHECK_TESTS:-}" ] && tests_re+=(-R "$FP_GPU_CHECK_TESTS")
# phase_time NAME CAP: sets t to the seconds the phase may take (its cap,
# at most what is left less 8 s for the archive), or fails with a note when
# under 20 s are left.
not_reached=()
phase_time() {
  t=$(( $(left) - 8 ))
  [ "$t" -gt "$2" ] && t=$2
  if [ "$t" -lt 20 ]; then
    stamp "$1 NOT RUN: $(left)s left of the ${budget}s budget"
    not_reached+=("$1")
    return 1
  fi
}

commit=${FASTPATH_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export FASTPATH_GIT_COMMIT=$commit
{ echo "commit $commit"; date -u +%Y-%m-%dT%H:%M:%SZ; uname -a; nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv 2>&1
  nvidia-smi 2>&1 | head -20
  nvcc --version | tail -2; cmake --version | head -1; ninja --version 2>&1
  command -v compute-sanitizer ncu cuobjdump python3
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available())" 2>&1
} > "$logs/env.txt" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)
stamp "commit $commit, GPU ${gpu:-none found}, phases ${phases//,/ }, budget ${budget}s"
rc=0
built=0
[ -x build-gpu/fastbench ] && built=1

# Debian packages carried from the developer's machine (scripts/gpu-deps.sh,
# carry .deps): the GPU machine fetches nothing, and the build needs cJSON
# and SQLite's header.
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
if [ ! -f /usr/include/sqlite3.h ] && ls .deps/debs/libsqlite3*.deb >/dev/null 2>&1; then
  mkdir -p .deps/root
  for f in .deps/debs/libsqlite3*.deb; do dpkg -x "$f" .deps/root; done
  hdr=$(find "$PWD/.deps/root" -name sqlite3.h | head -n1)
  lib=$(find "$PWD/.deps/root" -name "libsqlite3.so*" | sort | head -n1)
  if [ -n "$hdr" ] && [ -n "$lib" ]; then
    cmake_deps+=(-DSQLITE3_INCLUDE_DIR="$(dirname "$hdr")" -DSQLITE3_LIBRARY="$lib")
    export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    stamp "SQLite from the carried .deps: $lib"
  fi
fi

# ---- a. build --------------------------------------------------------------
if want build && phase_time build 150; then
  built=0
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
  arch=${arch:-90}
  cuda_arch=$arch
  [ "$arch" = "90" ] && cuda_arch="90a" # Hopper: the wgmma / TMA kernels v3..v5
  gen=(-G Ninja)
  command -v ninja >/dev/null 2>&1 || gen=()
  # The communication module (issue 17) needs NCCL: nccl.h and libnccl from
  # the CUDA toolkit, the system (libnccl-dev) or pip's nvidia-nccl-cu*
  # wheel (which ships libnccl.so.2 only: the library is named to CMake).
  # Not found: built without it (comm/ scenarios skip), and said so.
  nccl=OFF
  nccl_args=()
  nccl_inc=''
  nccl_lib=''
  for d in ${CUDA_HOME:+"$CUDA_HOME"} /usr/local/cuda /usr; do
    if [ -f "$d/include/nccl.h" ]; then nccl_inc=$d/include; break; fi
  done
  nccl_root=''
  if [ -n "$nccl_inc" ]; then
    nccl_root=$(dirname "$nccl_inc")
  else
    nccl_root=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
    [ -n "$nccl_root" ] && [ -f "$nccl_root/include/nccl.h" ] && nccl_inc=$nccl_root/include
  fi
  if [ -n "$nccl_inc" ]; then
    for f in "$nccl_root"/lib64/libnccl.so "$nccl_root"/lib/libnccl.so "$nccl_root"/lib/*-linux-gnu/libnccl.so \
             /usr/lib/*-linux-gnu/libnccl.so "$nccl_root"/lib64/libnccl.so.2 "$nccl_root"/lib/libnccl.so.2 \
             /usr/lib/*-linux-gnu/libnccl.so.2; do
      if [ -f "$f" ]; then nccl_lib=$f; break; fi
    done
  fi
  if [ -n "$nccl_inc" ] && [ -n "$nccl_lib" ]; then
    nccl=ON
    nccl_args=(-DNCCL_INCLUDE_DIR="$nccl_inc" -DNCCL_LIBRARY="$nccl_lib")
    nccl_dir=$(dirname "$nccl_lib")
    export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    stamp "NCCL: $nccl_inc/nccl.h, $nccl_lib"
  else
    stamp "NCCL NOT FOUND (nccl.h in \$CUDA_HOME/include, /usr/local/cuda/include, /usr/include, pip's nvidia.nccl; or no libnccl next to it): building without it, the comm/ scenarios skip"
  fi
  b0=$(elapsed)
  if ! timeout "$t" cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES="$cuda_arch" -DFASTPATH_TSAN_TESTS=OFF -DFASTPATH_ASAN_TESTS=OFF \
       -DFASTPATH_EMU_TESTS=OFF -DFASTPATH_WITH_NCCL=$nccl -DFASTPATH_KERNEL_WATCHDOG=ON \
       -DFASTPATH_GPU_TEST_TIMEOUT=90 "${cmake_deps[@]}" "${nccl_args[@]}" > "$logs/configure.log" 2>&1; then
    stamp "configure FAILED (logs/configure.log)"
    tail_into_summary "$logs/configure.log" 30
    rc=1
  elif timeout $(( t - ($(elapsed) - b0) )) cmake --build build-gpu -j "$FP_JOBS" > "$logs/build.log" 2>&1; then
    built=1
    stamp "built for sm_$cuda_arch in $(( $(elapsed) - b0 ))s ($FP_JOBS jobs, kernel watchdog on, NCCL $nccl)"
  else
    r=$?
    stamp "build FAILED$([ $r -eq 124 ] && echo ': out of time') (logs/build.log)"
    grep -E "error|Error" "$logs/build.log" | head -20 | tee -a "$out/summary.txt"
    tail_into_summary "$logs/build.log" 30
    rc=1
  fi
fi
if [ $built -eq 0 ]; then stamp "no build: the later phases cannot run"; rc=1; fi

# ---- b. gpu tests -------------------------------------------------------------
if [ $built -eq 1 ] && want tests && phase_time tests 150; then
  # One at a time: the timing checks in them (copy bandwidth vs peak, graph
  # vs plain launches) must not measure each other.
  timeout "$t" ctest --test-dir build-gpu -V "${tests_re[@]}" -j 1 > "$out/ctest-gpu.log" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=1
  stamp "ctest gpu rc=$r$([ $r -eq 124 ] && echo ' (phase out of time)'): $(grep -E 'tests passed|tests failed' "$out/ctest-gpu.log" | tail -1)"
  grep -E "^[[:space:]]*[0-9]+/[0-9]+ Test +#[0-9]+: " "$out/ctest-gpu.log" | sed 's/^ *//' | tee -a "$out/summary.txt"
  # Which attention kernels ran, over all cases ("ran <kernel>" per case),
  # and every fallback with its reason.
  { echo "attention kernels that ran (cases):"
    grep -oE " ran [a-z0-9_]+( x[0-9]+ splits( \+ combine)?)?( \(paged\))?" "$out/ctest-gpu.log" |
      sed -E 's/ x[0-9]+ splits( \+ combine)?/ + split-KV/; s/^ ran //' | sort | uniq -c | sed 's/^/  /'
    grep -oE "fallback: .*" "$out/ctest-gpu.log" | sort | uniq -c | head -10 | sed 's/^/  /'
    grep -E "CHECK failed|returned '|, expected " "$out/ctest-gpu.log" | head -40
    grep -E "skipped|watchdog" "$out/ctest-gpu.log" | sort | uniq -c | head -10 | sed 's/^/  /'
  } | tee -a "$out/summary.txt"
fi

# ---- c. fastbench ---------------------------------------------------------------
# One run per target family (its shape options differ), then the kernel
# versions; each under the time left, each to its own JSON, merged into
# fastbench.json. Order: what the targets need first.
if [ $built -eq 1 ] && want bench && phase_time bench "${FP_GPU_CHECK_BENCH_CAP:-120}"; then
  b0=$(elapsed)
  timeout 30 ./build-gpu/fastbench info --json "$logs/info.json" > "$logs/info.txt" 2>&1
  common=(--max-time 0.25 --max-samples 60)
  runs=(
    "norm|timing/copy norm/layernorm_fwd norm/rmsnorm_fwd norm/layernorm_bwd --rows 16384 --cols 4096 --dtype bf16"
    "prefill|attention/prefill --head_dim 128 --seqlen 4096 --causal 0 --dtype bf16"
    "decode|attention/decode --batch 1 --kv 32768"
    "alloc|alloc/cache_hit alloc/trace_replay"
    "batcher|batcher/closed_loop batcher/gpu_model --clients 64"
    "graph|graph/chain graph/decode_step graph/op_host_cost trace/span_cost graph/pdl"
    "pipeline|pipeline/bandwidth pipeline/pin_wait pipeline/host_memcpy"
    "overlap|pipeline/overlap"
    "overlapreg|pipeline/overlap --registered 1"
    "comm|comm/allreduce_buckets comm/bucket_tuner"
    "collectives|comm/collectives"
    "overlap8|pipeline/overlap --staging_threads 8 --chunk_mib 8"
    "overlap8x64|pipeline/overlap --staging_threads 8 --chunk_mib 64"
    "overlapdeep|pipeline/overlap --depth 6 --chunk_mib 64"
    "overlapdeep8|pipeline/overlap --depth 8 --chunk_mib 8"
    "versions4k|attention/flash_versions --seqlen 4096 --dtype bf16"
    "versions16k|attention/flash_versions --seqlen 16384 --dtype bf16"
    "versions1k|attention/flash_versions --seqlen 1024 --dtype bf16"
    "prefill16k|attention/prefill --head_dim 128 --seqlen 16384 --causal 0 --dtype bf16"
    "decode1k|attention/decode --batch 1 --kv 1024"
    "prefillc|attention/prefill --head_dim 128 --seqlen 4096 --causal 1 --dtype bf16"
    "prefill64|attention/prefill --head_dim 64 --seqlen 4096 --causal 0 --dtype bf16"
    "prefillmma|attention/prefill --head_dim 128 --seqlen 4096 --causal 0 --dtype bf16 --kernel 1"
    "norm1row|norm/rmsnorm_fwd norm/layernorm_fwd --rows 1 --cols 4096 --dtype bf16"
    # norm backward v3 against v4 (v3 with the cp.async ring of the next
    # rows), interleaved by the timing engine, at every shape of the sweep
    "bwdring|norm/bwd_versions --dtype bf16 --baseline 3 --optimized 4"
    # A/B against the previous kernels (VAR=value words first, run with them in
    # the environment): "ab-" runs go to extra.txt, never into fastbench.json,
    # whose rows the targets table reads
    "ab-norm|FP_NORM_FWD_V2_ORDER=0 norm/layernorm_fwd norm/rmsnorm_fwd --rows 16384 --cols 4096 --dtype bf16"
    "ab-norm1row|FP_NORM_FWD_V2_ORDER=0 norm/rmsnorm_fwd norm/layernorm_fwd --rows 1 --cols 4096 --dtype bf16"
    "ab-decode1k|FP_ATTN_SPLIT_MIN_TILES=2 attention/decode --batch 1 --kv 1024"
    "ab-graph|FP_NORM_FWD_V2_ORDER=0 FP_ATTN_SPLIT_MIN_TILES=2 graph/decode_step"
    # the paged loads' page found by division for every page size (the path
    # before session 14; power-of-two pages now shift and mask); the rows
    # compare the paged output with the dense one, exactly
    "ab-paged|FP_ATTN_PAGED_DIV=1 attention/decode_paged"
    # the fused split combine's former arrival (every thread's two
    # fence.sc.gpu) against today's one acq_rel atomic: 1k / 32k keys, the step
    "ab-fence|FP_ATTN_MERGE_FENCE=sc attention/decode --batch 1 --kv 1024"
    "ab-fence32k|FP_ATTN_MERGE_FENCE=sc attention/decode --batch 1 --kv 32768"
    "ab-fencegraph|FP_ATTN_MERGE_FENCE=sc graph/decode_step"
    # the dense K / V copy loop over the flat chunk index (each copy's row
    # and 64-bit offset recomputed) against today's column loop (v1 / v2)
    "ab-flat|FP_ATTN_FLAT_LOADS=1 attention/decode --batch 1 --kv 32768"
    "ab-flat1k|FP_ATTN_FLAT_LOADS=1 attention/decode --batch 1 --kv 1024"
    "ab-flatmma|FP_ATTN_FLAT_LOADS=1 attention/prefill --head_dim 128 --seqlen 4096 --causal 0 --dtype bf16 --kernel 1"
    "ab-flatgraph|FP_ATTN_FLAT_LOADS=1 graph/decode_step"
    # the automatic backward choice taking v4 (the prefetch ring) wherever it
    # applies / never (v3: the choice before session 15), against the norm
    # run's rows (v4 with a dresidual, else v3)
    "ab-bwdring|FP_NORM_BWD_RING=1 norm/layernorm_bwd --rows 16384 --cols 4096 --dtype bf16"
    "ab-bwdv3|FP_NORM_BWD_RING=0 norm/layernorm_bwd --rows 16384 --cols 4096 --dtype bf16"
    # the norm kernels' forms against each other, interleaved in one
    # process, outputs compared (their difference: the fast forms' error on
    # the device): GELU tanh / SiLU by tanhf / expf with the activation's
    # switch per element (before session 28) against the fast forms;
    # LayerNorm's forward statistics through two reductions (the default
    # since session 44) against one (session 28's: rows layernorm_fwd_plain
    # and layernorm_fwd_fused, as session 41 measured them; the fast GELU
    # alone: layernorm_fwd_fused_two): 16384 x 4096, 4096 x 768, 8192 x
    # 8192, fwd and bwd
    "ab-normk|norm/kernel_ab --dtype bf16"
    # norm forward v4 (v2's rows in persistent CTAs, the next row's loads
    # issued before this row's reduction, streaming loads, one barrier per
    # reduction) against v2, interleaved: 16384 x 4096, 4096 x 768, 8192 x
    # 8192, 1000 x 5120, 16384 x 1024; fused LayerNorm / RMSNorm and plain.
    # Then v4 keeping gamma / beta / bias in registers against v4 reloading
    # them (more registers: half the CTAs per SM at 4096 cols)
    "ab-nfwd4|norm/fwd_versions --baseline 2 --optimized 4 --dtype bf16"
    "ab-nfwd4p|norm/fwd_versions --baseline 4 --optimized 4 --v4_params 1 --dtype bf16"
    # norm backward v4 / v3 with the dgamma / dbeta reduce fused into their
    # last CTAs against the same kernel followed by the reduce kernel,
    # interleaved, dgamma / dbeta compared exactly (NOTES.md, session 33)
    "ab-nfused|norm/bwd_versions --baseline 4 --optimized 4 --fused_reduce 1 --dtype bf16"
    "ab-nfused3|norm/bwd_versions --baseline 3 --optimized 3 --fused_reduce 1 --dtype bf16"
    # the decode kernel v6 (FP_CTX_ATTENTION_KERNEL 6: 16-row tiles, the
    # warps splitting each key tile, a K / V ring) against the default
    # decode (v1), interleaved: batch 1 x 1k / 4k / 32k keys, batch 8 x 4k;
    # then the decode step (eager vs replay) with v6 preferred, against the
    # graph run's rows
    "ab-decode6|attention/decode_versions"
    # the same rows with each kernel's CTA timeline (session 38): where the
    # decode's fixed ~15 us goes (start skew, first tile, loop spread, merge,
    # tail, time outside the CTAs)
    "anatomy|attention/decode_anatomy"
    # the prefill kernels' timelines (session 39): the default (v5 at
    # head_dim 128, v8 at 64) against v9, the SMs' busy / head / gap / tail
    # shares and the time per key tile: the causal 4k target's balance vs
    # tile rate
    "panatomy|attention/prefill_anatomy"
    "ab-graph6|graph/decode_step --kernel 6 --batch 1"
    # the fused split combine merging through shared memory (session 44:
    # every split's partials in one L2 round trip; FP_ATTN_MERGE_STAGE=1) in
    # the decode step (eager vs replay) and the decode rows, against the
    # graph and decode runs' rows; the anatomy run's merge_reg_vs_staged
    # rows time it interleaved, with each side's merge time
    "ab-mergestage|FP_ATTN_MERGE_STAGE=1 graph/decode_step attention/decode --batch 1"
    # programmatic dependent launch (FP_CTX_LAUNCH_PDL 1) on both sides of
    # the graph rows (eager vs replay, the host cost of a launch with the
    # attribute), against the graph run's rows; graph/pdl there times it
    # against without, interleaved
    "ab-pdlgraph|graph/chain graph/decode_step graph/op_host_cost --kernels 100 --batch 1 --pdl 1"
    # v10 (v8 with three consumer warpgroups, 192-row query tiles) against
    # v8, the head_dim 64 default, interleaved: 1k / 4k / 16k keys, causal
    # and not (NOTES.md, session 23)
    "ab-v10|attention/flash_versions --head_dim 64 --version 10 --dtype bf16"
    # varlen (8 packed sequences of 512..4096 tokens, 16k in all) without
    # total_k (v3, what every varlen call ran before session 24) against the
    # same call given total_k (v5 at head_dim 128, v8 at 64), interleaved
    "ab-varlen|attention/varlen --dtype bf16"
    # prefill over a paged cache (4 x 4096 over 4096, 4 x 1024 over 8192;
    # pages of 16 and 64; head_dim 128 / 64; causal): the default (v1, the
    # page gather) against the TMA kernel preferred (v5 / v8, a box per page
    # run, session 25), and the TMA kernel dense vs paged, interleaved
    "ab-pprefill|attention/paged_prefill --dtype bf16"
    # fp8 (e4m3, head_dim 128, session 26): bf16 against fp8 on the same
    # values (both v5; fp8 adds its V^T pass), and fp8 on v5 against v8:
    # seqlen 1k / 4k / 16k, causal and not, interleaved
    "ab-fp8|attention/fp8"
    # decode over an fp8 (e4m3) KV cache against a bf16 cache of the same
    # values (v1, split-KV, outputs compared exactly): dense 1 x 4k .. 8 x
    # 32k keys, paged (16-key pages) 1 x 32k and 8 x 32k
    "ab-kv8|attention/kv8"
    # prefill over an fp8 KV cache (session 34): the default (v1, tiles
    # widened in shared memory) against the TMA kernel preferred (v5 / v8
    # on the cache widened to bf16 first), and the TMA kernel on a bf16
    # cache of the same values against the fp8 one widened (compared
    # exactly): 4 x 4096 over 4096, 4 x 1024 over 8192, dense and pages of
    # 16, head_dim 128 (--head_dim 64 for the other half)
    "ab-kv8prefill|attention/kv8_prefill --head_dim 128"
    # v2 at head_dim 128 (session 29): FlashAttention-2's 128 x 64 tile on
    # mma.sync against its earlier 128 x 32 tile (row v2n_vs_v2) and against
    # v1, the mma.sync default (row v1_vs_v2), interleaved: 1k / 4k / 16k
    # keys, causal and not (issue 19's 350 TFLOP/s on the mma.sync path)
    "ab-v2tile|attention/flash_versions --head_dim 128 --version 2 --dtype bf16"
    # v5 (the Hopper default at head_dim 128) against FlashAttention-3's
    # 128 x 176 tile (row v5_vs_v5w; v1_vs_v5 rides along), 1k / 4k / 16k
    "ab-v5wide|attention/flash_versions --head_dim 128 --version 5 --dtype bf16"
    # the default Hopper kernels (v5 at head_dim 128, v8 at 64) and v9
    # against their epilogue through shared memory and TMA stores (session
    # 32; rows v5_vs_v5o, v8_vs_v8o, v9_vs_v9o), 1k / 4k / 16k, causal and not
    "ab-otma|attention/flash_versions --o_tma 1 --dtype bf16"
    # v9 with its items chained (session 30) against v8 (rows v8_vs_v9),
    # and v9 drawing each CTA's next ticket at an item's start (session 19's
    # rule) against its draw 3 key tiles before the item's end (rows
    # v9e_vs_v9, session 36), both head dims: 1k / 4k / 16k, causal and not
    "ab-v9chain|attention/flash_versions --version 9 --dtype bf16"
    # the late draw's lead swept (FP_ATTN_V9_LEAD: 1 and 6 tiles; rows
    # v9e_vs_v9 against the default 3 of ab-v9chain), head_dim 128
    "ab-v9lead1|FP_ATTN_V9_LEAD=1 attention/flash_versions --version 9 --head_dim 128 --dtype bf16"
    "ab-v9lead6|FP_ATTN_V9_LEAD=6 attention/flash_versions --version 9 --head_dim 128 --dtype bf16"
    # what bounds each (the five-dimension verdict, fastbench --profile):
    # "prof-" runs trace their timed samples; their lines go to extra.txt
    "prof-mix|attention/prefill attention/decode norm/layernorm_fwd graph/op_host_cost --dtype bf16"
  )
  : > "$out/fastbench.txt"
  for spec in "${runs[@]}"; do
    name=${spec%%|*}
    args=${spec#*|}
    want_run "$name" || continue
    envs=()
    while [[ $args =~ ^([A-Z_][A-Z0-9_]*=[^ ]*)\ (.*)$ ]]; do
      envs+=("${BASH_REMATCH[1]}")
      args=${BASH_REMATCH[2]}
    done
    txt=$out/fastbench.txt json=$logs/fb-$name.json
    if [[ $name == ab-* || $name == prof-* ]]; then txt=$out/extra.txt json=$logs/$name.json; fi
    prof=()
    if [[ $name == prof-* ]]; then prof=(--profile); fi
    tl=$(( t - ($(elapsed) - b0) ))
    [ "$tl" -gt 45 ] && tl=45 # one run cannot eat the phase
    if [ "$tl" -lt 5 ]; then
      stamp "fastbench $name NOT RUN: phase out of time"
      not_reached+=("fastbench $name")
      continue
    fi
    echo "==== fastbench run ${envs[*]} $args" >> "$txt"
    # shellcheck disable=SC2086 # args is a word list
    timeout "$tl" env "${envs[@]}" ./build-gpu/fastbench run $args "${common[@]}" "${prof[@]}" --json "$json" \
      >> "$txt" 2>&1
    r=$?
    [ $r -ne 0 ] && rc=1
    stamp "fastbench $name rc=$r$([ $r -eq 124 ] && echo ' (out of time: partial)') ($(( $(elapsed) - b0 ))s into the phase)"
  done
  # the example server on the GPU: every answer checked, eager then with
  # its graph cache (--graphs: batches padded to captured sizes)
  if want_run serve && [ -x build-gpu/examples/serve_decode ]; then
    for mode in "" --graphs --pipeline; do
      tl=$(( t - ($(elapsed) - b0) ))
      [ "$tl" -gt 40 ] && tl=40
      if [ "$tl" -lt 5 ]; then stamp "serve_decode $mode NOT RUN: phase out of time"; not_reached+=("serve_decode $mode"); continue; fi
      # shellcheck disable=SC2086 # mode is empty or one word
      timeout "$tl" ./build-gpu/examples/serve_decode --device cuda $mode > "$logs/serve${mode#--}.txt" 2>&1
      r=$?
      [ $r -ne 0 ] && rc=1
      stamp "serve_decode --device cuda $mode rc=$r: $(tail -n 3 "$logs/serve${mode#--}.txt" | tr '\n' ' ' | cut -c1-400)"
    done
  fi
  # merge: one fastbench/1 document; complete only if every run was
  nruns=0
  for spec in "${runs[@]}"; do
    [[ ${spec%%|*} == ab-* || ${spec%%|*} == prof-* ]] && continue
    want_run "${spec%%|*}" && nruns=$((nruns + 1))
  done
  python3 - "$out/fastbench.json" "$nruns" "$logs"/fb-*.json <<'EOF' 2>&1 | tee -a "$out/summary.txt"
import json, sys
docs = []
for p in sys.argv[3:]:
    try:
        docs.append(json.load(open(p)))
    except (OSError, ValueError) as e:
        print(f"fastbench merge: {p} unreadable ({e})")
if docs:
    m = dict(docs[0])
    m["results"] = [r for d in docs for r in d.get("results", [])]
    m["skipped"] = [s for d in docs for s in d.get("skipped", [])]
    m["complete"] = all(d.get("complete", False) for d in docs) and len(docs) == int(sys.argv[2])
    json.dump(m, open(sys.argv[1], "w"), indent=1)
    print(f"fastbench.json: {len(m['results'])} results from {len(docs)} runs, complete={m['complete']}")
EOF
  grep -E "^(scenario|attention/|norm/|timing/copy|alloc/|batcher/|graph/|pipeline/|comm/)" "$out/fastbench.txt" | cut -c1-200 | tail -n 60
fi

# ---- d. PyTorch ------------------------------------------------------------------
if [ $built -eq 1 ] && want python && phase_time python 130; then
  if python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    export FASTPATH_LIB=$PWD/build-gpu/libfastpath.so PYTHONPATH=$PWD/bindings/python
    # The Python tests' CUDA cases first (the drop-ins on CUDA tensors, eager
    # and compiled; CI runs only their CPU cases), at most 60 s (128 cases took
    # 43 s on the H200 and the interpreter's exit went past 45).
    p0=$(elapsed)
    # shellcheck disable=SC2086 # FP_GPU_CHECK_PYTEST is a word list
    timeout 60 python3 -m pytest -q -p no:cacheprovider ${FP_GPU_CHECK_PYTEST:--k cuda tests/python} > "$logs/pytest-cuda.txt" 2>&1
    r=$?
    [ $r -ne 0 ] && [ $r -ne 5 ] && rc=1 # 5: no test selected
    stamp "pytest ${FP_GPU_CHECK_PYTEST:--k cuda} rc=$r$([ $r -eq 124 ] && echo ' (out of time)'): $(grep -E '(passed|failed|error)' "$logs/pytest-cuda.txt" | tail -1)"
    grep -E "^(FAILED|ERROR) " "$logs/pytest-cuda.txt" | head -15 | tee -a "$out/summary.txt"
    t=$(( t - ($(elapsed) - p0) ))
    # The drop-ins' host cost on CUDA tensors (tiny bf16 tensors: the Python
    # path and the launch, against torch eager's; ~10 s), at most 25 s; its
    # table goes into the summary and after python-bench.txt's.
    p0=$(elapsed)
    PYTHONUNBUFFERED=1 timeout 25 python3 benchmarks/python/bench_overhead.py --device cuda --calls 200 --blocks 15 \
      > "$logs/overhead-cuda.txt" 2>&1
    r=$?
    [ $r -ne 0 ] && rc=1
    stamp "drop-in host cost (bench_overhead.py --device cuda) rc=$r$([ $r -eq 124 ] && echo ' (out of time)')"
    grep -E "^(layer_norm|rms_norm|add_layer_norm|sdpa|kvcache|c_call) " "$logs/overhead-cuda.txt" | tee -a "$out/summary.txt"
    t=$(( t - ($(elapsed) - p0) ))
    if [ "${FP_GPU_CHECK_PYBENCH:-1}" = 0 ]; then
      stamp "python bench not asked for (FP_GPU_CHECK_PYBENCH=0)"
    elif [ "$t" -lt 20 ]; then
      stamp "python bench NOT RUN: phase out of time"
      not_reached+=("python bench")
    else
      PYTHONUNBUFFERED=1 timeout "$t" python3 benchmarks/python/bench_torch.py --quick --compiled --only sdpa,decode,norm,rms \
        --max-seconds $(( t - 20 )) --json "$out/python-bench.json" > "$out/python-bench.txt" 2>&1
      r=$?
      [ $r -ne 0 ] && rc=1
      stamp "python bench rc=$r$([ $r -eq 124 ] && echo ' (out of time)')"
      tail_into_summary "$out/python-bench.txt" 30
      { echo; echo "== bench_overhead.py --device cuda"; cat "$logs/overhead-cuda.txt"; } >> "$out/python-bench.txt"
    fi
  else
    stamp "python bench NOT RUN: no torch with CUDA"
    not_reached+=(python)
  fi
fi

# ---- e. compute-sanitizer ----------------------------------------------------------
if [ $built -eq 1 ] && want sanitizer && phase_time sanitizer "${FP_GPU_CHECK_SANITIZER_CAP:-120}"; then
  if command -v compute-sanitizer >/dev/null 2>&1; then
    # memcheck on every gpu test and racecheck on the attention and norm
    # tests, all at once (16 cores), reduced cases. --report-api-errors no: the tests
    # provoke CUDA API errors on purpose (out of memory, a sync during
    # capture); memcheck must count memory errors only.
    tests=$(ctest --test-dir build-gpu "${tests_re[@]}" -N -V 2>/dev/null | sed -n 's/^[0-9]*: Test command: //p' | awk '{print $1}')
    jobs=()
    for x in $tests; do jobs+=("memcheck $x"); done
    # (and on the norm test: forward v4 drops a barrier per reduction by
    # alternating its shared buffers, a race the emulation cannot see)
    for x in $tests; do case $x in *attention*|*/test_norm_gpu) jobs+=("racecheck $x") ;; esac; done
    printf '%s\n' "${jobs[@]}" | FP_TEST_QUICK=1 FP_TEST_SANITIZER=1 xargs -P 10 -L 1 sh -c \
      'n=$(basename "$1"); timeout '"$(( t - 3 ))"' compute-sanitizer --tool "$0" --report-api-errors no --error-exitcode 99 "$1" > "'"$logs"'/san-$0-$n.log" 2>&1; echo "$0 $n rc=$?"' \
      > "$logs/sanitizer.txt" 2>&1
    # racecheck also instruments cuBLAS (the attention baseline's GEMMs):
    # on an H200 it reported hazards inside cuBLAS's nvjet kernels only
    # (2026-11-26), which are not this library's to fix. A racecheck run
    # fails the check when a hazard names one of this library's kernels, or
    # when it failed otherwise (a test failure, out of time).
    for f in "$logs"/san-racecheck-*.log; do
      [ -f "$f" ] || continue
      n=${f##*/san-racecheck-}; n=${n%.log}
      ours=$(grep "Race reported" "$f" | grep -c -v -E "nvjet|cublas|cutlass|gemm")
      lib=$(grep "Race reported" "$f" | grep -c -E "nvjet|cublas|cutlass|gemm")
      stamp "racecheck $n: $ours hazard(s) in fastpath kernels, $lib in library (cuBLAS) kernels"
      if [ "$ours" -eq 0 ] && grep -q "RACECHECK SUMMARY" "$f" && ! grep -q "check(s) failed" "$f"; then
        sed -i "s/^racecheck $n rc=99$/racecheck $n rc=0 (library hazards only)/" "$logs/sanitizer.txt"
      fi
    done
    bad=$(grep -v -E "rc=(0|77)( .*)?$" "$logs/sanitizer.txt")
    [ -n "$bad" ] && rc=1
    stamp "compute-sanitizer (rc 99: errors found, 124: out of time): $(sort "$logs/sanitizer.txt" | tr '\n' ' ')"
    printf '%s\n' "$bad" | while read -r tool n _; do
      [ -n "$n" ] || continue
      grep -m 6 -E "=========  ?(Invalid|Out of bounds|Program hit|Error|Race|Leaked|Uninitialized|ERROR SUMMARY|RACECHECK SUMMARY)" \
        "$logs/san-$tool-$n.log" | sed "s/^/$tool $n: /" | tee -a "$out/summary.txt"
    done
    grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs"/san-*.log | sort | uniq -c | tee -a "$out/summary.txt"
  else
    stamp "compute-sanitizer NOT RUN: not found"
    not_reached+=(sanitizer)
  fi
fi

trap - TERM INT
[ ${#not_reached[@]} -gt 0 ] && stamp "not reached: ${not_reached[*]}"
finish
stamp "done rc=$rc in $(elapsed)s"
exit $rc
