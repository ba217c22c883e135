#!/usr/bin/env python3
"""Static checks of the GPU code that CI can run without a GPU.

CI has the CUDA toolkit but no device, so a change can keep every test green
while the kernels lose what makes them fast: an edit that makes ptxas spill
to local memory, turns the 16-byte loads of the norm kernels into 4-byte
ones, drops the tensor-core instructions from flash attention, or makes
ptxas serialize the Hopper wgmma pipeline. This script reads the compiled
library with cuobjdump (SASS and resource usage) and checks, per kernel and
per architecture, the properties listed in RULES below.

  check_sass.py --lib libfastpath.so --archs "80;90" [--sm90a 1]
                [--cuda-bin DIR] [--cuobjdump PATH] [--report FILE]

Every kernel in the library must match exactly one rule (a new kernel needs
a rule here), and every rule must match at least one kernel on each
architecture it applies to (a renamed kernel does not slip out of the
checks). cuobjdump and nvdisasm are looked for next to nvcc, on PATH, and in
the PyPI wheels nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm (which
scripts/install-deps.sh installs when the toolkit lacks them); without them
the test skips (exit 77).
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys

SKIP = 77

# A rule: (name, capability module, kernel regex on the demangled name,
# architectures it applies to ("sm_80", "sm_90", "sm_90a"), {opcode regex:
# minimum count}, extra checks).
# Opcode regexes are matched against the mnemonic with its modifiers
# ("LDG.E.128", "HMMA.16816.F32.BF16"); counts are static instruction counts.
# Extra checks: "hgmma_batched" (the k-steps of each wgmma group are issued
# back to back: fewer than one group end per 4 HGMMA), "hgmma_overlap" (some
# wait leaves one wgmma group in flight: softmax overlapped with the next
# Q K^T, what the pipelined kernels are for), "ex2_ftz" (the softmax's 2^x is
# MUFU.EX2 alone: no FSETP against -126, the denormal fix-up exp2f wraps it in,
# three extra instructions per score), "no_narrow_lds" (the staged row is read
# back as 16-byte vectors: no LDS.U16 / LDS.U8, as ptxas emits when a vector
# is unpacked straight from shared memory), "no_static_smem" (no static
# __shared__ bytes, res-usage SHARED 0: a kernel sized to the 48 KiB a
# launch gets without the opt-in, or to the opt-in limit, fails to launch
# with any static bytes beside its dynamic ones; the CPU emulation does not
# count static shared memory, so only this check sees it), "pdl" (a kernel
# that kernels/common/pdl.cuh may launch with programmatic dependent launch:
# on sm_90 and later its SASS has the wait, ACQBULK; and for every kernel
# that has one, no global memory instruction comes before the first: a read
# there could see the previous kernel's output before it is written).
# "act_fast_fwd" / "act_fast_bwd" (the norm kernels' GELU (tanh) and SiLU,
# and their derivatives, in the fast form of session 28: the activation's
# switch taken once per 16-byte vector, so each case is one straight block
# over the vector's elements, the sigmoid by ex2.approx.ftz of -|z| log2(e)
# (FMUL of an |operand| by -1.4427: only the fast form has it) and
# rcp.approx): at least two such blocks (GELU and SiLU), each with a
# MUFU.EX2 and a MUFU.RCP per element, no exp2f fix-up, and at most
# ACT_BLOCKS' instructions per element (session 28, sm_80 / sm_90: forward
# 11.25 GELU, 7-15.75 SiLU; backward 19.5-20 GELU, 10-16.75 SiLU (a block
# may take in the code after the switch); the tanhf / expf
# forms with the per-element switch took 33 and 42 for GELU). "prefetch" (norm
# forward v4: the next row's x / residual are loaded during this row's
# reduction): every streaming 16-byte load (LDG.E.EF.128, ld.global.cs) comes
# before the first block barrier (BAR.SYNC): ptxas sinking the next row's
# loads below the reduction puts some after it. "params_in_regs" (v4 keeping
# gamma / beta / bias in registers): no other 16-byte load comes after the
# first barrier (the parameters reloaded per row).
ACT_BLOCKS = {"act_fast_fwd": 18, "act_fast_bwd": 24}
BASE = ("sm_80+",)  # every architecture from sm_80 on (sm_80, sm_90, sm_90a, sm_100, ...)
VEC_LOAD = {r"^LDG\.E\.128": 1}
VEC_LOAD_STORE = {r"^LDG\.E\.128": 1, r"^STG\.E\.128": 1}
TMA_STORE = {r"^STSM\.16\.M88\.4$": 4, r"^UTMASTG\.5D$": 1}
RULES = [
    # flash attention, sm_80 path (mma.sync m16n8k16, ldmatrix, cp.async 16 B)
    # (v1, v7, v2 at head_dim 64, v2n: v2's earlier 128 x 32 tile at 128)
    ("flash fwd bf16 (mma.sync)", "attention",
     r"attention_flash_fwd_v(?:[17]|2n|2(?=<[^,]+, 64>))<__nv_bfloat16,(?!.*__nv_fp8)", BASE,
     {r"^HMMA\.16816\.F32\.BF16$": 16, r"^LDSM": 8, r"^LDGSTS\.E\.BYPASS\.128": 2, r"^MUFU\.EX2$": 8}, ("ex2_ftz", "no_static_smem", "pdl")),
    ("flash fwd f16 (mma.sync)", "attention", r"attention_flash_fwd_v(?:[17]|2n|2(?=<[^,]+, 64>))<__half,(?!.*__nv_fp8)",
     BASE,
     {r"^HMMA\.16816\.F32$": 16, r"^LDSM": 8, r"^LDGSTS\.E\.BYPASS\.128": 2, r"^MUFU\.EX2$": 8}, ("ex2_ftz", "no_static_smem", "pdl")),
    # v2 at head_dim 128: FlashAttention-2's 128 x 64 tile, O and S of two
    # row blocks in registers (traits_v2<128>::kTightRegs). Its P V fully
    # unrolled (4 k-steps x 8 d-pairs x 2 row blocks x 2 = 128 HMMA, 32
    # ldmatrix.trans) plus Q K^T unrolled by 2 k-steps (32 HMMA): 160 with
    # nvcc 13 on sm_80 / sm_90 (a 32-key tile has 80). The no-spill check
    # above is this kernel's real guard: at 252-255 registers any growth
    # spills.
    ("flash fwd v2 head_dim 128 (mma.sync, 128 x 64)", "attention", r"attention_flash_fwd_v2<[^,]+, 128>", BASE,
     {r"^HMMA\.16816\.F32": 160, r"^LDSM\.16\.MT88": 32, r"^LDSM": 44, r"^LDGSTS\.E\.BYPASS\.128": 2,
      r"^MUFU\.EX2$": 64}, ("ex2_ftz", "no_static_smem", "pdl")),
    # v1 over an fp8 KV cache: the same math, its K / V tiles copied as e4m3
    # (16-byte cp.async) and widened in shared memory (16-byte reads, two
    # 16-byte stores per chunk; F2FP.F16.E4M3 on sm_90, integer ops on sm_80)
    ("flash fwd v1 fp8 KV cache (mma.sync)", "attention", r"attention_flash_fwd_v1<[^,]+, \d+, __nv_fp8_e4m3>", BASE,
     {r"^HMMA\.16816\.F32": 16, r"^LDSM": 8, r"^LDGSTS\.E\.BYPASS\.128": 2, r"^MUFU\.EX2$": 8, r"^LDS\.128": 2,
      r"^STS\.128": 4}, ("ex2_ftz", "no_static_smem", "pdl")),
    # the decode kernel (v6): the same instructions at head_dim 32's minimum
    # (2 k-steps of Q K^T and 2 d-blocks of P V per warp and tile, x2 n8 halves)
    ("decode fwd v6 bf16 (mma.sync)", "attention", r"attention_decode_fwd_v6<__nv_bfloat16,(?!.*__nv_fp8)", BASE,
     {r"^HMMA\.16816\.F32\.BF16$": 8, r"^LDSM": 4, r"^LDGSTS\.E\.BYPASS\.128": 2, r"^MUFU\.EX2$": 8}, ("ex2_ftz", "no_static_smem", "pdl")),
    ("decode fwd v6 f16 (mma.sync)", "attention", r"attention_decode_fwd_v6<__half,(?!.*__nv_fp8)", BASE,
     {r"^HMMA\.16816\.F32$": 8, r"^LDSM": 4, r"^LDGSTS\.E\.BYPASS\.128": 2, r"^MUFU\.EX2$": 8}, ("ex2_ftz", "no_static_smem", "pdl")),
    # v6 over an fp8 KV cache: each warp copies its keys as e4m3 and widens them (K and V)
    ("decode fwd v6 fp8 KV cache (mma.sync)", "attention", r"attention_decode_fwd_v6<[^,]+, \d+, __nv_fp8_e4m3>", BASE,
     {r"^HMMA\.16816\.F32": 8, r"^LDSM": 4, r"^LDGSTS\.E\.BYPASS\.128": 2, r"^MUFU\.EX2$": 8, r"^LDS\.128": 2,
      r"^STS\.128": 4}, ("ex2_ftz", "no_static_smem", "pdl")),
    # Hopper paths: wgmma (HGMMA) with operands in shared memory; v5 loads by TMA
    # under mbarriers (SYNCS); the pipelined v3 and v5 overlap softmax and wgmma.
    ("flash fwd v3 (wgmma)", "attention", r"attention_flash_fwd_v3<[^,]+, \d+, false>", ("sm_90a",),
     {r"^HGMMA\.": 8, r"^LDGSTS\.E\.BYPASS\.128": 2}, ("hgmma_batched", "ex2_ftz", "pdl")),
    ("flash fwd v3 pipelined (wgmma)", "attention", r"attention_flash_fwd_v3<[^,]+, \d+, true>", ("sm_90a",),
     {r"^HGMMA\.": 8, r"^LDGSTS\.E\.BYPASS\.128": 2}, ("hgmma_batched", "hgmma_overlap", "ex2_ftz", "pdl")),
    # (fp8 instantiations: QGMMA, the e4m3 wgmma). The 16-bit ones carry the
    # TMA-store epilogue (FP_ATTN_O_TMA, session 32): O into shared memory by
    # stmatrix.x4 (head_dim / 16 a thread: >= 4), then 5-D TMA stores
    # (UTMASTG.5D, one per 64 columns: >= 1)
    ("flash fwd v5 (wgmma + TMA)", "attention", r"attention_flash_fwd_v5<(?:__half|__nv_bfloat16),", ("sm_90a",),
     dict(TMA_STORE, **{r"^HGMMA\.": 8, r"^UTMALDG": 2, r"^SYNCS\.": 4}),
     ("hgmma_batched", "hgmma_overlap", "ex2_ftz", "pdl")),
    ("flash fwd v5 fp8 (wgmma + TMA)", "attention", r"attention_flash_fwd_v5<__nv_fp8_e4m3,", ("sm_90a",),
     {r"^QGMMA\.": 8, r"^UTMALDG": 2, r"^SYNCS\.": 4}, ("hgmma_batched", "hgmma_overlap", "ex2_ftz", "pdl")),
    # v5's 128 x 176 tile (head_dim 128): Q K^T is m64n176 (8 k steps), P V
    # m64n128 over the 176 keys (11 k steps of 16)
    ("flash fwd v5 128 x 176 (wgmma + TMA)", "attention", r"attention_flash_fwd_v5w<", ("sm_90a",),
     dict(TMA_STORE, **{r"^HGMMA\.64x176x16\.F32": 8, r"^HGMMA\.64x128x16\.F32": 11, r"^UTMALDG": 2,
                        r"^SYNCS\.": 4}),
     ("hgmma_batched", "hgmma_overlap", "ex2_ftz", "pdl")),
    # v8: v5 whose consumer warpgroups take turns (bar.sync on its own turn
    # barrier, bar.arrive on the other's: BAR.ARV in SASS)
    ("flash fwd v8 (wgmma + TMA, ping-pong)", "attention", r"attention_flash_fwd_v8<(?:__half|__nv_bfloat16),",
     ("sm_90a",), dict(TMA_STORE, **{r"^HGMMA\.": 8, r"^UTMALDG": 2, r"^SYNCS\.": 4, r"^BAR\.ARV": 2}),
     ("hgmma_batched", "hgmma_overlap", "ex2_ftz", "pdl")),
    ("flash fwd v8 fp8 (wgmma + TMA, ping-pong)", "attention", r"attention_flash_fwd_v8<__nv_fp8_e4m3,", ("sm_90a",),
     {r"^QGMMA\.": 8, r"^UTMALDG": 2, r"^SYNCS\.": 4, r"^BAR\.ARV": 2},
     ("hgmma_batched", "hgmma_overlap", "ex2_ftz", "pdl")),
    # v9: v8 in persistent CTAs; the producer draws the next item's ticket
    # with a global atomic add (fp_tma::producer_items)
    ("flash fwd v9 (wgmma + TMA, ping-pong, persistent)", "attention", r"attention_flash_fwd_v9<", ("sm_90a",),
     dict(TMA_STORE, **{r"^HGMMA\.": 8, r"^UTMALDG": 2, r"^SYNCS\.": 4, r"^BAR\.ARV": 2, r"^ATOMG\.E\.ADD": 1}),
     ("hgmma_batched", "hgmma_overlap", "ex2_ftz", "pdl")),
    # v10: v8 with three consumer warpgroups (head_dim 64); the register
    # split (USETMAXREG: the producer's .dec, the consumers' .inc) is what
    # the 512-thread launch's 128 registers a thread rest on
    ("flash fwd v10 (wgmma + TMA, three consumer warpgroups)", "attention", r"attention_flash_fwd_v10<",
     ("sm_90a",), dict(TMA_STORE, **{r"^HGMMA\.": 8, r"^UTMALDG": 2, r"^SYNCS\.": 4, r"^BAR\.ARV": 2,
                                     r"^USETMAXREG": 2}),
     ("hgmma_batched", "hgmma_overlap", "ex2_ftz", "pdl")),
    ("split-KV combine", "attention", r"attention_split_combine_v1<", BASE + ("sm_90a",), {}, ("pdl",)),
    # fp8's V^T pass before v5 / v8: 16-byte loads and stores
    ("fp8 V transpose", "attention", r"fp8_transpose_v\(", ("sm_90a",), {r"^LDG\.E\.128": 1, r"^STG\.E\.128": 1},
     ("pdl",)),
    # an fp8 KV cache widened for the Hopper kernels: 16-byte loads, two 16-byte stores each
    ("fp8 KV cache widen", "attention", r"attention_kv8_widen_v0<", BASE, {r"^LDG\.E\.128": 1, r"^STG\.E\.128": 2},
     ("pdl",)),
    # materialized baseline and helpers (the GEMMs are cuBLAS)
    ("attention baseline helpers", "attention",
     r"attention_(zero_rows|masked_softmax|rowwise|gather_pages)_v0<", BASE, {}, ()),
    # norm: the vector kernels move rows in 16-byte loads and stores
    ("norm fwd vector", "norm", r"fpnorm::norm_fwd_v2<", BASE, VEC_LOAD_STORE, ("pdl", "act_fast_fwd")),
    # v4: v2 in persistent CTAs; x / residual by streaming loads, the next
    # row's issued before this row's reduction (prologue and loop: >= 4)
    ("norm fwd persistent", "norm", r"fpnorm::norm_fwd_v4<[^>]*, false>", BASE,
     {r"^LDG\.E\.EF\.128$": 4, r"^STG\.E\.128": 1}, ("pdl", "act_fast_fwd", "prefetch")),
    ("norm fwd persistent, parameters in registers", "norm", r"fpnorm::norm_fwd_v4<[^>]*, true>", BASE,
     {r"^LDG\.E\.EF\.128$": 4, r"^STG\.E\.128": 1}, ("pdl", "act_fast_fwd", "prefetch", "params_in_regs")),
    ("norm fwd staged row", "norm", r"fpnorm::norm_fwd_v3<", BASE,
     dict(VEC_LOAD_STORE, **{r"^STS\.128": 1, r"^LDS\.128": 2}), ("no_narrow_lds", "pdl")),
    ("norm bwd dx vector", "norm", r"fpnorm::norm_bwd_dx_v2<", BASE, VEC_LOAD_STORE, ()),
    ("norm bwd dx staged row", "norm", r"fpnorm::norm_bwd_dx_staged<", BASE,
     dict(VEC_LOAD_STORE, **{r"^STS\.128": 2, r"^LDS\.128": 2}), ("no_narrow_lds",)),
    ("norm bwd fused vector", "norm", r"fpnorm::norm_bwd_v3<[^>]*, 0>|fpnorm::norm_bwd_v3_staged<", BASE,
     VEC_LOAD_STORE, ("fused_reduce",)),
    # v4: v3 fed by a cp.async ring (16-byte copies in, 16-byte shared reads out)
    ("norm bwd fused ring", "norm", r"fpnorm::norm_bwd_v3<[^>]*, [1-9]>", BASE,
     {r"^LDGSTS\.E\.BYPASS\.128": 2, r"^LDS\.128": 2, r"^STG\.E\.128": 1}, ("act_fast_bwd", "fused_reduce")),
    ("norm bwd dparams vector", "norm", r"fpnorm::norm_bwd_dparams<[^,]+, [248]>", BASE, VEC_LOAD, ()),
    ("norm unfused vector", "norm", r"fpnorm::norm_(bwd_)?unfused_elementwise<[^,]+, true>", BASE, VEC_LOAD_STORE, ()),
    # scalar paths (misaligned pointers, odd cols) and reductions
    ("norm fwd scalar", "norm", r"fpnorm::norm_fwd_v1<", BASE, {}, ("pdl",)),
    ("norm scalar / reduce", "norm",
     r"fpnorm::norm_(bwd_dx_v1|bwd_reduce_v[12])<|fpnorm::norm_bwd_dparams<[^,]+, 1>|"
     r"fpnorm::norm_(bwd_)?unfused_elementwise<[^,]+, false>", BASE, {}, ()),
    # bandwidth probes and the timing engine's kernels
    ("copy vector", "core", r"^copy_v1", BASE, VEC_LOAD_STORE, ()),
    ("axpby vector", "core", r"^void axpby_v2<", BASE, VEC_LOAD_STORE, ("pdl",)),
    ("axpby scalar", "core", r"^void axpby_v1<", BASE, {}, ("pdl",)),
    ("launch probes (empty kernels)", "core", r"^empty_(small|big)\(", BASE, {}, ()),
    # the kernel timer's calibration (src/trace): one thread reads the global timer
    ("trace clock read", "core", r"^clock_read\(", BASE, {}, ()),
    # communication: the buckets' gather / scatter moves 16-byte vectors
    ("bucket gather / scatter", "comm", r"^copies_kernel\(", BASE, VEC_LOAD_STORE, ()),
]


# Register ceilings (every architecture): (kernel regex, most registers, why).
# Where a kernel's occupancy is part of its measured or predicted speed, a
# compiler or code change that costs a CTA per SM fails here (an SM has
# 64K registers: 256-thread CTAs fit 6 at <= 40, 4 at <= 64).
REG_BOUNDS = [
    (r"fpnorm::norm_fwd_v2<(__nv_bfloat16|__half), 2, 2>", 40,
     "6 CTAs of 256 threads an SM: the 16384 x 4096 forward measured at 88.9% of copy (H100, session 13)"),
    (r"fpnorm::norm_fwd_v4<(__nv_bfloat16|__half), 2, false>", 64,
     "4 CTAs of 256 threads an SM, each with its next row in flight (session 31's prediction)"),
]


# Global memory instructions (loads, stores, atomics, async and bulk copies):
# none may come before a kernel's first ACQBULK (griddepcontrol.wait).
GLOBAL_MEM = re.compile(r"^(LDG|STG|LDGSTS|ATOMG|RED|LD|ST|ATOM|UTMALDG|UTMASTG|UTMAREDG|UBLKCP|UBLKRED)(\.|$)")


def arch_number(arch):
    return int(re.sub(r"\D", "", arch)) if re.fullmatch(r"sm_\d+[a-z]?", arch or "") else 0


def find_tool(name, args):
    """The tool's path: --cuobjdump, next to nvcc, PATH, then the PyPI wheels."""
    if name == "cuobjdump" and args.cuobjdump:
        return args.cuobjdump if os.access(args.cuobjdump, os.X_OK) else None
    dirs = [args.cuda_bin] if args.cuda_bin else []
    if args.cuobjdump:
        dirs.append(os.path.dirname(args.cuobjdump))
    for d in dirs:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    p = shutil.which(name)
    if p:
        return p
    try:  # nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm: nvidia/cu13/bin (cu12: nvidia/cuda_*/bin)
        import nvidia  # namespace package of NVIDIA's PyPI wheels
        for root in list(nvidia.__path__):
            for sub in sorted(os.listdir(root)):
                p = os.path.join(root, sub, "bin", name)
                if os.access(p, os.X_OK):
                    return p
    except ImportError:
        pass
    return None


def demangle(names):
    if not names:
        return []
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    dem = out.stdout.splitlines()
    # kernels in anonymous namespaces: drop the prefix so rules read like the source
    return [d.replace("(anonymous namespace)::", "") for d in dem]


def parse_sass(text):
    """{(arch, mangled name): [mnemonic with modifiers, ...]} from cuobjdump -sass."""
    funcs = collections.OrderedDict()
    arch, key = None, None
    insn = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)(.*?);")
    for line in text.splitlines():
        m = re.match(r"\s*code for (sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            key = (arch, m.group(1))
            funcs[key] = []
            continue
        if key is None:
            continue
        m = insn.search(line)
        if m:
            funcs[key].append((m.group(1), m.group(2).strip()))
    return funcs


def parse_res_usage(text):
    """{mangled name: {REG, STACK, LOCAL, ...}} per architecture section, as a list of (name, dict)."""
    out = []
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m:
            name = m.group(1)
            continue
        if name and "REG:" in line:
            out.append((name, {k: int(v) for k, v in re.findall(r"([A-Z]+)(?:\[\d+\])?:(\d+)", line)}))
            name = None
    return out


def parse_archs(spec, sm90a):
    """(the project's architectures, those plus sm_90a when the Hopper-only objects are built)."""
    archs = set()
    for a in re.split(r"[;, ]+", spec.strip()):
        m = re.match(r"^(\d+)([a-z]?)", a)
        if m:
            archs.add("sm_" + m.group(1) + m.group(2))
    extra = {"sm_90a"} if str(sm90a).lower() in ("1", "on", "true", "yes") else set()
    return archs, archs | extra


def expand(rarchs, archs):
    """The architectures among archs that a rule's list names ("sm_80+": sm_80 and newer,
    arch-specific ones such as sm_90a included: a build for 90a compiles every kernel for it)."""
    out = set()
    for r in rarchs:
        if r.endswith("+"):
            least = int(r[3:-1])
            out |= {a for a in archs if re.fullmatch(r"sm_\d+[a-z]?", a) and int(re.sub(r"\D", "", a)) >= least}
        elif r in archs:
            out.add(r)
    return out


def check(lib, archs, modules, rules, tools, report=None, reg_bounds=REG_BOUNDS):
    """The failures (strings) of the library against the rules; fills report (a dict) if given.
    archs: (the project's architectures, every one built) as parse_archs gives them; every
    kernel is compiled for the first, only the *_sm90.cu ones for sm_90a beside them."""
    project_archs, archs = archs
    cuobjdump, nvdisasm = tools
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm),
               PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))

    def run(*a):
        return subprocess.run([cuobjdump, *a, lib], capture_output=True, text=True, env=env, check=True).stdout

    failures = []
    # 1. what the fatbin holds: SASS for every built architecture, and PTX of the
    #    newest one so that a newer GPU can JIT the kernels.
    elf_archs = set(re.findall(r"\.(sm_\w+)\.cubin", run("-lelf")))
    ptx_archs = set(re.findall(r"\.(sm_\w+)\.ptx", run("-lptx")))
    for a in sorted(archs - elf_archs):
        failures.append(f"no SASS for {a} in the library (cubins for: {sorted(elf_archs)})")
    plain = sorted((a for a in archs if re.fullmatch(r"sm_\d+", a)), key=lambda a: int(a[3:]))
    if plain and plain[-1] not in ptx_archs:
        failures.append(f"no PTX for {plain[-1]}: GPUs newer than it could not JIT the kernels "
                        f"(PTX for: {sorted(ptx_archs)})")

    # 2. resource usage: no stack, no local memory (spills) in any kernel.
    res = parse_res_usage(run("-res-usage"))
    res_names = demangle([n for n, _ in res])
    # demangled name: the fewest static shared bytes over the archs (sm_90 reports 1024 for the
    # mma.sync flash kernels that sm_80 reports 0 for, a reservation launches do not count; a
    # __shared__ variable shows on every arch)
    static_smem = {}
    for (_, r), name in zip(res, res_names):
        static_smem[name] = min(static_smem.get(name, 1 << 30), r.get("SHARED", 0))
    for (_, r), name in zip(res, res_names):
        if r.get("STACK", 0) or r.get("LOCAL", 0):
            failures.append(f"{name}: STACK {r.get('STACK')} LOCAL {r.get('LOCAL')} bytes "
                            f"(spills or a local array: the kernel goes through local memory)")

    for (_, r), name in zip(res, res_names):
        for pat, most, why in reg_bounds:
            if re.search(pat, name) and r.get("REG", 0) > most:
                failures.append(f"{name}: {r['REG']} registers, at most {most}: {why}")

    # 3. SASS per kernel against the rules.
    funcs = parse_sass(run("-sass"))
    names = demangle([m for _, m in funcs])
    matched = collections.Counter()
    kernels = []
    for ((arch, _), insns), name in zip(funcs.items(), names):
        ops = collections.Counter(op for op, _ in insns)
        hits = [r for r in rules if re.search(r[2], name)]
        entry = {"arch": arch, "kernel": name, "instructions": len(insns),
                 "counts": {k: v for k, v in sorted(ops.items())
                            if re.match(r"^(HMMA|HGMMA|QGMMA|LDSM|LDGSTS|UTMALDG|UTMASTG|LDG|STG|LDS|STS|LDL|STL|MUFU)", k)}}
        kernels.append(entry)
        if len(hits) != 1:
            failures.append(f"[{arch}] {name}: matches {len(hits)} rules ({[h[0] for h in hits]}); "
                            f"every kernel needs exactly one rule in {os.path.basename(__file__)}")
            continue
        rname, _, _, rarchs, needs, extra = hits[0]
        entry["rule"] = rname
        if arch not in expand(rarchs, {arch}):
            failures.append(f"[{arch}] {name}: rule '{rname}' does not expect it on {arch}")
            continue
        matched[(rname, arch)] += 1
        local = sorted(op for op in ops if re.match(r"^(LDL|STL)", op))
        if local:
            failures.append(f"[{arch}] {name}: local-memory instructions {local}")
        for pat, least in needs.items():
            n = sum(c for op, c in ops.items() if re.search(pat, op))
            if n < least:
                failures.append(f"[{arch}] {name} ({rname}): {n} instructions matching {pat}, needs >= {least}")
        if "ex2_ftz" in extra:
            fixups = sum(1 for op, rest in insns if op.startswith("FSETP") and re.search(r"-126\b", rest))
            if fixups:
                failures.append(f"[{arch}] {name}: {fixups} FSETP against -126: exp2f's denormal fix-up "
                                f"around MUFU.EX2 (ex2.approx.ftz.f32 needs none)")
        if "no_static_smem" in extra and static_smem.get(name, 0):
            failures.append(f"[{arch}] {name}: {static_smem[name]} bytes of static shared memory "
                            f"(they add to the dynamic bytes the launcher sized: keep flags in the dynamic arena)")
        if "no_narrow_lds" in extra:
            narrow = sorted({op for op in ops if re.match(r"^LDS\.(U|S)(8|16)", op)})
            if narrow:
                failures.append(f"[{arch}] {name}: narrow shared-memory loads {narrow} "
                                f"({sum(ops[o] for o in narrow)}): the staged vectors are read piecewise")
        if "prefetch" in extra:
            bars = [i for i, (op, _) in enumerate(insns) if op.startswith("BAR.SYNC")]
            ef = [i for i, (op, _) in enumerate(insns) if op == "LDG.E.EF.128"]
            late = [i for i in ef if bars and i > bars[0]]
            if late:
                failures.append(f"[{arch}] {name}: {len(late)} of {len(ef)} streaming loads (LDG.E.EF.128) after "
                                f"the first barrier: the next row is no longer in flight during the reduction")
        if "params_in_regs" in extra:
            bars = [i for i, (op, _) in enumerate(insns) if op.startswith("BAR.SYNC")]
            if bars:
                reload = [op for op, _ in insns[bars[0]:] if re.match(r"^LDG\.E\.128", op)]
                if reload:
                    failures.append(f"[{arch}] {name}: {len(reload)} 16-byte loads {sorted(set(reload))} after "
                                    f"the first barrier: the parameters are reloaded per row, not kept in registers")
        # v3 / v4's fused reduce (kernels/norm/norm_bwd.cu, fused_reduce): the
        # arrival (atom.acq_rel.gpu), the wait's back-off (nanosleep) and the
        # partial rows read through L2 (ld.global.cg); not compiled into the
        # f32 kernels of 4 vectors a thread with register sums
        # (fused_reduce_compiled)
        if "fused_reduce" in extra and not re.search(r"norm_bwd_v3<float, 4, false", name):
            for pat, least, what in ((r"^ATOMG\.E\.ADD\.S32\.STRONG\.GPU$", 1, "the arrival"),
                                     (r"^NANOSLEEP", 1, "the wait's back-off"),
                                     (r"^LDG\.E\.STRONG\.GPU$", 2, "the partial rows' L2 loads")):
                n = sum(c for op, c in ops.items() if re.search(pat, op))
                if n < least:
                    failures.append(f"[{arch}] {name}: {n} instructions matching {pat} ({what} of the fused "
                                    f"reduce), needs >= {least}")
        waits = [i for i, (op, _) in enumerate(insns) if op == "ACQBULK"]
        if "pdl" in extra and arch_number(arch) >= 90 and not waits:
            failures.append(f"[{arch}] {name}: launched with programmatic dependent launch "
                            f"(kernels/common/pdl.cuh) but no griddepcontrol.wait (ACQBULK) in its SASS")
        if waits:
            early = [op for op, _ in insns[:waits[0]] if GLOBAL_MEM.match(op)]
            if early:
                failures.append(f"[{arch}] {name}: {len(early)} global memory instructions {sorted(set(early))} "
                                f"before the first griddepcontrol.wait (ACQBULK): they may see the previous "
                                f"kernel's output before it is written")
        for check, per_elem in ACT_BLOCKS.items():
            if check not in extra:
                continue
            blocks = set()
            for k, (op, rest) in enumerate(insns):
                if op == "FMUL" and re.search(r"\|R\d+\|(\.reuse)?, -1\.44269502", rest):
                    lo = hi = k
                    while lo > 0 and insns[lo - 1][0] not in ("BRA", "BRX"):
                        lo -= 1
                    while hi < len(insns) - 1 and insns[hi][0] != "BRA":
                        hi += 1
                    blocks.add((lo, hi))
            elems = 4 if re.search(r"<float,", name) else 8  # a 16-byte vector's elements
            if len(blocks) < 2:
                failures.append(f"[{arch}] {name}: {len(blocks)} fast sigmoid blocks ({check}: FMUL |R|, "
                                f"-1.4427 before a MUFU.EX2), needs GELU (tanh) and SiLU: the tanhf / expf forms?")
            for lo, hi in sorted(blocks):
                block = insns[lo:hi + 1]
                ex2 = sum(1 for op, _ in block if op == "MUFU.EX2")
                rcp = sum(1 for op, _ in block if op == "MUFU.RCP")
                fix = sum(1 for op, rest in block if op.startswith("FSETP") and re.search(r"-126\b", rest))
                if len(block) > per_elem * elems or ex2 < elems or rcp < elems or fix:
                    failures.append(f"[{arch}] {name}: {check} block of {len(block)} instructions for {elems} "
                                    f"elements (at most {per_elem * elems}), {ex2} MUFU.EX2, {rcp} MUFU.RCP "
                                    f"(>= {elems} each), {fix} exp2f fix-ups (0): the activation's switch per "
                                    f"element, or slower math")
        hgmma = [rest for op, rest in insns if op.startswith(("HGMMA", "QGMMA"))]  # QGMMA: fp8 (e4m3)
        if "hgmma_batched" in extra:
            ends = sum(1 for rest in hgmma if "gsb0" in rest)
            if not hgmma or ends * 4 > len(hgmma):
                failures.append(f"[{arch}] {name}: {ends} wgmma group ends for {len(hgmma)} HGMMA: "
                                f"ptxas serialized the wgmma k-steps (look for C7510-C7520 in the build)")
        if "hgmma_overlap" in extra:
            waits = [rest for op, rest in insns if op == "WARPGROUP.DEPBAR.LE"]
            if not any(re.search(r"gsb0,\s*0x[1-9]", w) for w in waits):
                failures.append(f"[{arch}] {name}: every wgmma wait drains the pipeline "
                                f"(waits: {sorted(set(waits))}); softmax no longer overlaps the next Q K^T")
    for rname, module, _, rarchs, _, _ in rules:
        # "sm_80+" asks for the kernel on each project architecture; a named one
        # (the Hopper-only "sm_90a") wherever it was built.
        need = expand([r for r in rarchs if r.endswith("+")], project_archs & elf_archs)
        need |= expand([r for r in rarchs if not r.endswith("+")], archs & elf_archs)
        for a in sorted(need):
            if module in modules and matched[(rname, a)] == 0:
                failures.append(f"rule '{rname}' matched no kernel on {a}: renamed or removed? "
                                f"(update {os.path.basename(__file__)})")
    if report is not None:
        report.update(lib=lib, archs=sorted(archs), kernels=kernels,
                      resources=[dict(kernel=n, **r) for (_, r), n in zip(res, res_names)])
        report["summary"] = {a: n for a, n in sorted(collections.Counter(a for a, _ in funcs).items())}
    return failures


# The self-test: a small library of kernels with known defects, checked with
# rules of its own; each defect must be reported (the checks can fail).
SELFTEST_RULES = [
    ("vector copy", "core", r"^selftest_vec_copy", ("sm_80",), VEC_LOAD_STORE, ()),
    ("scalar copy claimed vector", "core", r"^selftest_scalar_copy", ("sm_80",), VEC_LOAD_STORE, ()),
    ("spilling kernel", "core", r"^selftest_local_array", ("sm_80",), {}, ()),
    ("mma kernel", "core", r"^selftest_mma", ("sm_80",), {r"^HMMA\.16816\.F32\.BF16$": 1}, ()),
    ("a rule without kernel", "core", r"^selftest_missing", ("sm_80",), {}, ()),
    ("exp2 without fix-up", "core", r"^selftest_exp2f", ("sm_80",), {r"^MUFU\.EX2$": 1}, ("ex2_ftz",)),
    ("static shared flag", "core", r"^selftest_static_smem", ("sm_80",), {}, ("no_static_smem",)),
    ("slow activation", "core", r"^selftest_act_slow", ("sm_80",), {}, ("act_fast_fwd",)),
    ("late prefetch", "core", r"^selftest_late_prefetch", ("sm_80",), {}, ("prefetch",)),
    ("parameters reloaded", "core", r"^selftest_param_reload", ("sm_80",), {}, ("params_in_regs",)),
]
SELFTEST_EXPECTED = [  # substrings, each in some failure (selftest_kernels.cu, sm_80)
    "selftest_scalar_copy", "LDG\\.E\\.128", "STG\\.E\\.128",  # 4-byte accesses where 16-byte ones are required
    "selftest_local_array: STACK", "selftest_local_array: local-memory",  # res-usage and LDL/STL
    "selftest_mma", "HMMA",  # f16 mma where bf16 is required
    "matched no kernel",  # the rule without a kernel
    "matches 0 rules",  # selftest_unruled
    "no PTX for sm_80",  # built as code=sm_80 only
    "selftest_exp2f: ",  # exp2f's denormal fix-up where ex2.approx.ftz is required
    "selftest_static_smem: 4 bytes of static shared memory",  # a static __shared__ flag
    "selftest_act_slow: 0 fast sigmoid blocks",  # GELU by tanhf where the fast form is required
    "selftest_late_prefetch: 1 of 1 streaming loads",  # a row's loads after its barrier
    "selftest_param_reload: 1 16-byte loads",  # a parameter vector loaded again after the barrier
    "registers, at most 4: a ceiling",  # selftest_mma above its register ceiling (SELFTEST_REG_BOUNDS)
]
SELFTEST_REG_BOUNDS = [(r"^selftest_mma", 4, "a ceiling below any mma kernel's registers")]


SELFTEST_PDL_RULES = [
    ("pdl clean", "core", r"^selftest_pdl_ok", ("sm_90",), {}, ("pdl",)),
    ("pdl load before the wait", "core", r"^selftest_pdl_late", ("sm_90",), {}, ("pdl",)),
    ("pdl without the wait", "core", r"^selftest_pdl_missing", ("sm_90",), {}, ("pdl",)),
]
SELFTEST_PDL_EXPECTED = [  # regexes, each matching some failure (selftest_pdl_kernels.cu, sm_90)
    r"selftest_pdl_late: 1 global memory instructions \['LDG\.E'\] before the first",
    r"selftest_pdl_missing: launched with programmatic dependent launch .* no griddepcontrol\.wait",
]


def self_test(tools, nvcc, workdir):
    # the architecture bookkeeping: a default build (80;90 + the sm_90a objects) must not ask
    # for every kernel on sm_90a; a 90a-only build compiles every kernel for sm_90a.
    bad = []
    if parse_archs("80;90", "ON") != ({"sm_80", "sm_90"}, {"sm_80", "sm_90", "sm_90a"}):
        bad.append("parse_archs 80;90 + sm90a")
    if parse_archs("90a", "1") != ({"sm_90a"}, {"sm_90a"}) or parse_archs("native", "0") != (set(), set()):
        bad.append("parse_archs 90a / native")
    if expand(("sm_80+",), {"sm_75", "sm_80", "sm_90", "sm_90a", "sm_100a"}) != {"sm_80", "sm_90", "sm_90a", "sm_100a"}:
        bad.append("expand sm_80+")
    if expand(("sm_90a",), {"sm_80", "sm_90"}) or expand(("sm_80+", "sm_90a"), {"sm_90a"}) != {"sm_90a"}:
        bad.append("expand sm_90a")
    if bad:
        print("SELF-TEST FAILED: architecture bookkeeping:", bad)
        return 1
    reported = 0
    # (source, architecture, rules, expected regexes, the clean kernel)
    for src, arch, rules, expected, clean in (
            ("selftest_kernels.cu", "80", SELFTEST_RULES, [re.escape(e) for e in SELFTEST_EXPECTED],
             "selftest_vec_copy"),
            ("selftest_pdl_kernels.cu", "90", SELFTEST_PDL_RULES, SELFTEST_PDL_EXPECTED, "selftest_pdl_ok")):
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), src)
        lib = os.path.join(workdir, "lib" + src.replace(".cu", ".so"))
        cmd = [nvcc, "-O3", "-gencode", f"arch=compute_{arch},code=sm_{arch}", "-shared", "-Xcompiler", "-fPIC",
               "-o", lib, path]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(" ".join(cmd), "\n", r.stdout, r.stderr)
            return 1
        failures = check(lib, ({"sm_" + arch}, {"sm_" + arch}), {"core"}, rules, tools,
                         reg_bounds=SELFTEST_REG_BOUNDS)
        for f in failures:
            print("reported:", f)
        missing = [e for e in expected if not any(re.search(e, f) for f in failures)]
        wrong = [f for f in failures if clean in f]
        if missing or wrong:
            print(f"SELF-TEST FAILED ({src}): not reported:", missing, "wrongly reported:", wrong)
            return 1
        reported += len(failures)
    print(f"self-test passed: {reported} defects reported as expected, the clean kernels not")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="the library to check (libfastpath.so)")
    ap.add_argument("--archs", default="80;90", help='CMAKE_CUDA_ARCHITECTURES, e.g. "80;90"')
    ap.add_argument("--sm90a", default="0", help="1 when the sm_90a (wgmma/TMA) kernels are built")
    ap.add_argument("--modules", default="core;norm;attention;comm", help="the capabilities built")
    ap.add_argument("--cuda-bin", default="", help="the toolkit's bin directory (nvcc's)")
    ap.add_argument("--cuobjdump", default="")
    ap.add_argument("--report", default="", help="write the per-kernel figures as JSON here")
    ap.add_argument("--self-test", metavar="WORKDIR", default="",
                    help="build tests/sass/selftest_kernels.cu in WORKDIR and check that its defects are found")
    args = ap.parse_args()

    tools = find_tool("cuobjdump", args), find_tool("nvdisasm", args)
    if not all(tools):
        print("SKIP: cuobjdump and nvdisasm not found (next to nvcc, on PATH, or the PyPI wheels "
              "nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm: scripts/install-deps.sh installs them)")
        return SKIP
    if args.self_test:
        nvcc = find_tool("nvcc", args)
        if not nvcc:
            print("SKIP: nvcc not found")
            return SKIP
        return self_test(tools, nvcc, args.self_test)
    if not args.lib:
        ap.error("--lib is required")
    report = {}
    failures = check(args.lib, parse_archs(args.archs, args.sm90a), set(re.split(r"[;, ]+", args.modules)),
                     RULES, tools, report)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{len(report['kernels'])} kernels checked ({report['summary']}), {len(report['resources'])} "
          f"resource records, {len(RULES)} rules; {tools[0]}")
    for f in failures:
        print("FAIL:", f)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("all SASS checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
