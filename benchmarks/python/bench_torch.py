#!/usr/bin/env python3
"""fastpath.torch drop-ins vs PyTorch eager on a CUDA GPU.

    PYTHONPATH=bindings/python FASTPATH_LIB=build/libfastpath.so \\
        python3 benchmarks/python/bench_torch.py --json results.json [--quick] [--compiled] \\
        [--only norm,rms,sdpa,decode] [--max-seconds N]

Cases (bf16):
  norm  residual add + LayerNorm + GELU: fastpath.torch.add_layer_norm (one
        fused kernel) vs x + r; F.layer_norm; F.gelu (three eager kernels),
        on the issue-3 shapes 4096x768, 16384x4096, 8192x8192, 2048x12288,
        1000x5120, 333x1537
  rms   RMSNorm with weight: fastpath.torch.rms_norm vs F.rms_norm (or the
        eager composition on a torch without it), same shapes
  sdpa  fastpath.torch.scaled_dot_product_attention vs
        F.scaled_dot_product_attention under each SDPA backend selected alone
        with torch.nn.attention.sdpa_kernel: flash, efficient, cudnn, and math
        up to --math-max-seqlen (default 2048; above it "skipped"), on the same
        inputs; hidden 2048 (head_dim 64: 32 heads, 128: 16 heads), seqlen
        1k..8k with batch * seqlen = 16k tokens, causal and not; q, k, v are
        (batch, heads, seq, dim) views of (batch, seq, heads, dim) buffers.
  decode one query token against a KV cache (issue 19's decode target):
        batch x keys 1 x 32768 and 8 x 4096, 32 query / 8 KV heads of 128
        (enable_gqa=True), the same backends one at a time (op "sdpa_decode",
        shape [batch, heads_q, heads_kv, keys, head_dim]; kv_gbps: the K and V
        bytes over the time).
        A backend that torch lacks or that refuses the inputs ("No available
        kernel", any exception) is recorded with its reason (the exception and
        torch's warnings) in the row's "backends", and the run goes on.
        torch_median_ms / speedup are the flash backend's (as before);
        best_torch_backend / best_torch_median_ms / speedup_vs_best the
        fastest backend that ran.
With --compiled, norm and rms also time torch.compile (inductor) of the eager
code, the strongest PyTorch baseline (its own fused kernel), and the drop-in
inside a compiled graph (fields torch_compiled_median_ms,
fastpath_compiled_median_ms, speedup_vs_compiled); sdpa also times
torch.compile of the flash-selected eager call (torch_compiled_median_ms,
speedup_vs_compiled; not a candidate for best_torch_backend).
--quick: 3 warm-up and 20 timed runs, sdpa seqlens 1024 and 4096 only.
Groups run in the order --only names them. --max-seconds N: no case starts
(and no torch.compile step starts) once N seconds have passed since the start;
the JSON then has "complete": false, "stopped_reason" and "not_run" (the case
labels), and the output says so. A case that raises is recorded as a row with
"error" and the run goes on; SIGTERM / Ctrl-C write what was done and print the
table too. Every measured row has the fastpath path that ran (path, fallback_reason).
Timing: CUDA events around each call on the current stream, after warm-up;
the median over --iters runs. Errors: max |out - ref| against a float32
reference on the same random (bf16) inputs (for sdpa on the first batch
entry), for each implementation but the drop-in inside a compiled graph.
Writes JSON (schema "fastbench-python/1"; each row's case_seconds is its wall
time) with --json after every case and prints a table (sdpa last, one line a
case, then the reasons of the backends that did not run).
Exits 0 with a message when torch or CUDA is missing. --smoke-cpu runs tiny
shapes on the CPU to test this script: the backend selection there is
torch's CPU one (flash and math run; the others usually record an error).
"""
import argparse
import datetime
import gc
import json
import math
import os
import signal
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NORM_SHAPES = [(4096, 768), (16384, 4096), (8192, 8192), (2048, 12288), (1000, 5120), (333, 1537)]
SDPA_SEQLENS = [1024, 2048, 4096, 8192]
SDPA_QUICK_SEQLENS = [1024, 4096]
SDPA_HEAD_DIMS = (64, 128)
SDPA_TOKENS = 16384
# decode: (batch, keys), heads (q, kv), head_dim
DECODE_SHAPES = [(1, 32768), (8, 4096)]
DECODE_HEADS, DECODE_HEAD_DIM = (32, 8), 128
HIDDEN = 2048
# JSON name -> torch.nn.attention.SDPBackend member, in table order
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
DEVICE = "cuda"  # "cpu" only for --smoke-cpu (a test of this script, not a benchmark)
_clock = time.monotonic  # the --max-seconds clock (a test replaces it)


def git_commit():
    """HEAD's commit read from .git without running git (FASTPATH_GIT_COMMIT overrides)."""
    env = os.environ.get("FASTPATH_GIT_COMMIT")
    if env:
        return env
    try:
        git = ROOT / ".git"
        if git.is_file():  # worktree: "gitdir: <path>"
            git = Path(git.read_text().split(":", 1)[1].strip())
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(None, 1)[1]
        common = git
        if (git / "commondir").exists():
            common = (git / (git / "commondir").read_text().strip()).resolve()
        for base in (git, common):
            if (base / ref).exists():
                return (base / ref).read_text().strip()
        for base in (git, common):
            packed = base / "packed-refs"
            if packed.exists():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
    except OSError:
        pass
    return "unknown"


def median_ms(torch, fn, warmup, iters):
    """Median time of fn() in ms by CUDA events on the current stream
    (wall clock for the CPU smoke run)."""
    for _ in range(warmup):
        fn()
    if DEVICE == "cpu":
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for start, end in ev:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def max_err(got, ref):
    return float((got.float() - ref.float()).abs().max().item())


def _oneline(msg, limit=300):
    """msg on one line, without torch's "(Triggered internally at ...)" tail."""
    msg = str(msg).split("(Triggered internally", 1)[0]
    msg = " ".join(msg.split())
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."


def _reason(e, caught=()):
    """An exception (and the warnings torch gave with it: its reasons for
    refusing a backend) as one line for the JSON."""
    parts = [_oneline(f"{type(e).__name__}: {e}")]
    for w in caught:
        m = _oneline(w.message)
        if m and m not in parts:
            parts.append(m)
    return _oneline("; ".join(parts), 800)


def _free(torch):
    """After a failed step: drop what its frames held (a CUDA OOM leaves the
    caching allocator full otherwise)."""
    gc.collect()
    if DEVICE == "cuda":
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # a sticky CUDA error: the next cases will say so
            pass


def over_time(args):
    return args.max_seconds is not None and _clock() - args.start >= args.max_seconds


def time_skip(args):
    return f"--max-seconds {args.max_seconds:g} reached ({_clock() - args.start:.1f} s)"


_COMPILED = {}
_COMPILE_FAILED = {}


def compiled_fn(torch, key, fn):
    """torch.compile(fn) (inductor, dynamic shapes), made once per key: the
    tensors are arguments, so one compiled graph serves every shape."""
    c = _COMPILED.get(key)
    if c is None:
        c = _COMPILED[key] = torch.compile(fn, dynamic=True)
    return c


def time_compiled(torch, args, key, fn, call_args, err_of=None):
    """Compiles fn once per key (see compiled_fn), runs it on call_args and
    times it: (median ms, err_of(its output) or None) or raises. A key whose
    compilation failed before is not tried again (the same error, without the
    minutes)."""
    if key in _COMPILE_FAILED:
        raise RuntimeError(f"{_COMPILE_FAILED[key]} (failed on an earlier case; not retried)")
    c = compiled_fn(torch, key, fn)
    try:
        out = c(*call_args)
    except Exception as e:
        _COMPILE_FAILED[key] = _reason(e)
        raise
    err = err_of(out) if err_of is not None else None
    del out
    return median_ms(torch, lambda: c(*call_args), args.warmup, args.iters), err


def norm_case(torch, F, fpt, args, kind, R, C):
    dt = torch.bfloat16
    dev = DEVICE
    have_rms = hasattr(F, "rms_norm")
    g = torch.Generator(device=dev).manual_seed(R * 131 + C)
    x = torch.randn(R, C, device=dev, dtype=dt, generator=g)
    r = torch.randn(R, C, device=dev, dtype=dt, generator=g)
    w = (torch.randn(C, device=dev, dtype=dt, generator=g) * 0.1 + 1)
    b = torch.randn(C, device=dev, dtype=dt, generator=g) * 0.1
    if kind == "norm":
        op = "add_layer_norm_gelu"

        def fast():
            return fpt.add_layer_norm(x, r, w, b, 1e-5, activation="gelu")[0]

        def eager():
            return F.gelu(F.layer_norm(x + r, (C,), w, b, 1e-5))

        ref = F.gelu(F.layer_norm((x + r).float(), (C,), w.float(), b.float(), 1e-5))
        nbytes = (4 * R * C + 2 * C) * 2  # x, r read; out, residual_out written
    else:
        op = "rms_norm"

        def fast():
            return fpt.rms_norm(x, (C,), w, 1e-6)

        if have_rms:
            def eager():
                return F.rms_norm(x, (C,), w, 1e-6)
        else:
            def eager():
                xf = x.float()
                return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt) * w

        xf = x.float()
        ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        nbytes = (2 * R * C + C) * 2
    fpt.reset_stats()
    out_fast = fast()
    path = fpt.last_path
    reason = fpt.last_fallback_reason
    out_eager = eager()
    t_fast = median_ms(torch, fast, args.warmup, args.iters)
    t_eager = median_ms(torch, eager, args.warmup, args.iters)
    extra = {}
    if args.compiled and over_time(args):
        extra = {"torch_compiled_skipped": time_skip(args)}
    elif args.compiled:
        # torch.compile of the same eager code (inductor: its own fused kernel),
        # compiled once per op with dynamic shapes; and the drop-in compiled
        # (the fastpath operator inside a compiled graph).
        def on_args(kind_fn):
            if kind == "norm":
                return lambda x, r, w, b: kind_fn(x, r, w, b)
            return lambda x, r, w, b: kind_fn(x, None, w, None)

        def eager_args(x, r, w, b):
            if r is None:
                return F.rms_norm(x, (x.shape[-1],), w, 1e-6) if have_rms else None
            return F.gelu(F.layer_norm(x + r, (x.shape[-1],), w, b, 1e-5))

        def fast_args(x, r, w, b):
            if r is None:
                return fpt.rms_norm(x, (x.shape[-1],), w, 1e-6)
            return fpt.add_layer_norm(x, r, w, b, 1e-5, activation="gelu")[0]

        try:
            t_comp, comp_err = time_compiled(torch, args, ("eager", op), on_args(eager_args),
                                             (x, r, w, b), lambda out: max_err(out, ref))
            t_comp_fast, _ = time_compiled(torch, args, ("fast", op), on_args(fast_args),
                                           (x, r, w, b))
            extra = {"torch_compiled_median_ms": t_comp, "fastpath_compiled_median_ms": t_comp_fast,
                     "speedup_vs_compiled": t_comp / t_fast if t_fast > 0 else None,
                     "torch_compiled_max_err": comp_err}
        except Exception as e:
            extra = {"torch_compiled_error": _reason(e)}
            _free(torch)
    return {**extra,
        "op": op, "shape": [R, C], "dtype": "bf16",
        "fastpath_median_ms": t_fast, "torch_median_ms": t_eager,
        "speedup": t_eager / t_fast if t_fast > 0 else None,
        "fastpath_gbps": nbytes / (t_fast * 1e6), "torch_gbps": nbytes / (t_eager * 1e6),
        "fastpath_max_err": max_err(out_fast, ref), "torch_max_err": max_err(out_eager, ref),
        "path": path, "fallback_reason": reason if path != "fastpath" else None,
    }


def cudnn_version(torch):
    """torch's cuDNN version, or the reason it has none: a cuDNN other than
    the one torch was built against raises at its first use (the GPU
    machine's image, session 41), and then only the cuDNN SDPA column is
    lost, not the run."""
    try:
        return torch.backends.cudnn.version()
    except RuntimeError as e:
        return f"unusable: {str(e).splitlines()[0][:200]}"


def sdpa_backend_ctx(torch, name):
    """Context manager letting F.scaled_dot_product_attention use the backend
    name (a key of SDPA_BACKENDS) alone; raises RuntimeError when this torch
    cannot select it."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3
        if name == "cudnn":
            raise RuntimeError(f"torch {torch.__version__} has no cuDNN SDPA backend selection")
        return torch.backends.cuda.sdp_kernel(enable_flash=name == "flash", enable_math=name == "math",
                                              enable_mem_efficient=name == "efficient")
    member = getattr(SDPBackend, SDPA_BACKENDS[name], None)
    if member is None:
        raise RuntimeError(f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[name]}")
    return sdpa_kernel(member)


def sdpa_reference(torch, q, k, v, causal, heads_chunk=4):
    """float32 math reference for batch entry 0, a few heads at a time."""
    q, k, v = q[0].float(), k[0].float(), v[0].float()  # [H, L, D]
    H, L, D = q.shape
    out = torch.empty_like(q)
    mask = None
    if causal:
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril().logical_not()
    for h in range(0, H, heads_chunk):
        s = (q[h:h + heads_chunk] @ k[h:h + heads_chunk].transpose(-1, -2)) / math.sqrt(D)
        if mask is not None:
            s.masked_fill_(mask, float("-inf"))
        out[h:h + heads_chunk] = torch.softmax(s, -1) @ v[h:h + heads_chunk]
        del s
    return out


def sdpa_backend(torch, F, name, q, k, v, causal, ref, flops, args, gqa=False):
    """F.scaled_dot_product_attention with backend name alone: ({"median_ms",
    "tflops", "max_err"}, output) or ({"error": reason}, None); never raises
    (except on SIGTERM / Ctrl-C). gqa: fewer KV heads than query heads
    (enable_gqa=True)."""
    kw = {"enable_gqa": True} if gqa else {}

    def call():
        with sdpa_backend_ctx(torch, name):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)

    failed = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = call()
            err = max_err(out[0], ref)
            t = median_ms(torch, call, args.warmup, args.iters)
        except Exception as e:
            failed = {"error": _reason(e, caught)}
    if failed:
        _free(torch)  # outside the except block: its traceback no longer holds the frames
        return failed, None
    return {"median_ms": t, "tflops": flops / (t * 1e9) if t > 0 else None, "max_err": err}, out


def _sdpa_flash_source(F):
    """The flash-selected eager SDPA call as a function of its tensors, for torch.compile."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa_flash(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return sdpa_flash


def attention_row(torch, F, fpt, args, q, k, v, causal, ref, flops, gqa=False, math_skip=None):
    """The drop-in and each SDPA backend alone on the same q, k, v: the row
    fields an sdpa and a decode case share (times, errors against ref, the
    fastest backend, which libfastpath kernel ran). math_skip: why the math
    backend is not run (None: run it)."""
    kw = {"enable_gqa": True} if gqa else {}

    def fast():
        return fpt.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)

    fpt.reset_stats()
    o_fast = fast()
    path, reason = fpt.last_path, fpt.last_fallback_reason
    kernel = None  # which libfastpath kernel ran (fp_attention_last_kernel), this thread's last call
    if path == "fastpath":
        try:
            import fastpath.attention as fpa
            kernel = fpa.last_kernel()
        except (ImportError, RuntimeError):
            pass
    fast_err = max_err(o_fast[0], ref)
    t_fast = median_ms(torch, fast, args.warmup, args.iters)
    backends, diff = {}, None
    for name in SDPA_BACKENDS:
        if name == "math" and math_skip:
            backends[name] = {"skipped": math_skip}
            continue
        backends[name], out = sdpa_backend(torch, F, name, q, k, v, causal, ref, flops, args, gqa)
        if name == "flash" and out is not None:
            diff = max_err(o_fast, out)
        del out
    del o_fast
    ran = {n: b for n, b in backends.items() if "median_ms" in b}
    best = min(ran, key=lambda n: ran[n]["median_ms"]) if ran else None
    flash = backends["flash"]
    t_flash = flash.get("median_ms")
    t_best = ran[best]["median_ms"] if best else None
    return {
        "fastpath_median_ms": t_fast, "torch_median_ms": t_flash,
        "speedup": t_flash / t_fast if t_flash and t_fast > 0 else None,
        "fastpath_tflops": flops / (t_fast * 1e9) if t_fast > 0 else None,
        "torch_tflops": flash.get("tflops"),
        "fastpath_max_err": fast_err, "torch_max_err": flash.get("max_err"),
        "fastpath_vs_torch_max_diff": diff,
        "backends": backends, "best_torch_backend": best, "best_torch_median_ms": t_best,
        "speedup_vs_best": t_best / t_fast if t_best and t_fast > 0 else None,
        "path": path, "fallback_reason": reason if path != "fastpath" else None,
        "kernel": kernel,
    }


def sdpa_case(torch, F, fpt, args, D, L, causal):
    dt = torch.bfloat16
    H = args.hidden // D
    B = max(1, args.tokens // L)
    g = torch.Generator(device=DEVICE).manual_seed(L * 7 + D)  # same inputs for causal and not
    # (batch, seq, heads, dim) buffers as a model produces them, viewed as
    # (batch, heads, seq, dim) for SDPA
    q, k, v = (torch.randn(B, L, H, D, device=DEVICE, dtype=dt, generator=g).transpose(1, 2)
               for _ in range(3))
    flops = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
    ref = sdpa_reference(torch, q, k, v, causal)
    math_skip = f"seqlen {L} > --math-max-seqlen {args.math_max_seqlen}" if L > args.math_max_seqlen else None
    row = {"op": "sdpa", "shape": [B, H, L, D], "causal": causal, "dtype": "bf16",
           **attention_row(torch, F, fpt, args, q, k, v, causal, ref, flops, math_skip=math_skip)}
    t_fast = row["fastpath_median_ms"]
    if args.compiled and over_time(args):
        row["torch_compiled_skipped"] = time_skip(args)
    elif args.compiled:
        # torch.compile (default backend, inductor) of the flash-selected eager call
        try:
            t_comp, comp_err = time_compiled(torch, args, ("eager", "sdpa"), _sdpa_flash_source(F),
                                             (q, k, v, causal), lambda out: max_err(out[0], ref))
            row.update(torch_compiled_median_ms=t_comp, torch_compiled_max_err=comp_err,
                       speedup_vs_compiled=t_comp / t_fast if t_fast > 0 else None)
        except Exception as e:
            row["torch_compiled_error"] = _reason(e)
            _free(torch)
    return row


def decode_reference(torch, q, k, v, heads_chunk=4):
    """float32 reference for batch entry 0 of a decode call: q [B, Hq, 1, D],
    k / v [B, Hkv, L, D], query head h reading KV head h // (Hq / Hkv)."""
    q, k, v = q[0].float(), k[0].float(), v[0].float()
    Hq, D, group = q.shape[0], q.shape[-1], q.shape[0] // k.shape[0]
    out = torch.empty_like(q)
    for h in range(0, Hq, heads_chunk):
        kv = [h2 // group for h2 in range(h, min(h + heads_chunk, Hq))]
        s = (q[h:h + heads_chunk] @ k[kv].transpose(-1, -2)) / math.sqrt(D)
        out[h:h + heads_chunk] = torch.softmax(s, -1) @ v[kv]
        del s
    return out


def decode_case(torch, F, fpt, args, B, L):
    """One query token per sequence against L cached keys (GQA), the drop-in
    against each SDPA backend alone: an sdpa case's fields plus kv_gbps (K
    and V bytes over the median time; per backend too)."""
    dt = torch.bfloat16
    (Hq, Hkv), D = args.decode_heads, args.decode_head_dim
    g = torch.Generator(device=DEVICE).manual_seed(L * 3 + B)
    q = torch.randn(B, 1, Hq, D, device=DEVICE, dtype=dt, generator=g).transpose(1, 2)
    # the cache as (batch, keys, heads, dim), viewed as (batch, heads, keys, dim)
    k, v = (torch.randn(B, L, Hkv, D, device=DEVICE, dtype=dt, generator=g).transpose(1, 2)
            for _ in range(2))
    kv_bytes = 2.0 * B * L * Hkv * D * k.element_size()
    row = {"op": "sdpa_decode", "shape": [B, Hq, Hkv, L, D], "dtype": "bf16",
           **attention_row(torch, F, fpt, args, q, k, v, False, decode_reference(torch, q, k, v),
                           4.0 * B * Hq * L * D, gqa=True)}
    for b in [row, *row["backends"].values()]:
        t = b.get("fastpath_median_ms", b.get("median_ms"))
        if t:
            b["kv_gbps"] = kv_bytes / (t * 1e6)
    return row


def plan_cases(torch, F, fpt, fastpath, args, order):
    """[(base row, thunk returning the full row)] for the groups in order; a
    group the library was built without is left out (as before)."""
    plan = []
    for name in order:
        if name in ("norm", "rms") and fastpath.norm.available():
            op = "add_layer_norm_gelu" if name == "norm" else "rms_norm"
            for R, C in args.norm_shapes:
                plan.append(({"op": op, "shape": [R, C], "dtype": "bf16"},
                             lambda kind=name, R=R, C=C: norm_case(torch, F, fpt, args, kind, R, C)))
        elif name == "sdpa" and fastpath.attention.available():
            for D in args.head_dims:
                for L in args.seqlens:
                    for causal in (False, True):
                        shape = [max(1, args.tokens // L), args.hidden // D, L, D]
                        plan.append(({"op": "sdpa", "shape": shape, "causal": causal, "dtype": "bf16"},
                                     lambda D=D, L=L, causal=causal:
                                     sdpa_case(torch, F, fpt, args, D, L, causal)))
        elif name == "decode" and fastpath.attention.available():
            for B, L in args.decode_shapes:
                shape = [B, *args.decode_heads, L, args.decode_head_dim]
                plan.append(({"op": "sdpa_decode", "shape": shape, "dtype": "bf16"},
                             lambda B=B, L=L: decode_case(torch, F, fpt, args, B, L)))
    return plan


def case_label(c):
    label = f"{c['op']} {'x'.join(str(s) for s in c['shape'])}"
    if "causal" in c:
        label += " causal" if c["causal"] else " full"
    return label


def _f(v, fmt, width):
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}"


def _note(reason, limit=200):
    """A backend's reason for the table: torch's own reasons (its warnings)
    rather than the generic "No available kernel. Aborting execution."."""
    parts = reason.split("; ")
    if len(parts) > 1 and "No available kernel" in parts[0]:
        reason = "no kernel: " + "; ".join(parts[1:])
    return _oneline(reason, limit)


def print_table(cases):
    norms = [c for c in cases if not c["op"].startswith("sdpa")]
    if norms:
        hdr = f"{'op':<20} {'shape':<12} {'fastpath ms':>12} {'torch ms':>10} " \
              f"{'speedup':>8} {'fp err':>9} {'torch err':>9}  path"
        print(hdr)
        print("-" * len(hdr))
    for c in norms:
        shape = "x".join(str(s) for s in c["shape"])
        if "error" in c:
            print(f"{c['op']:<20} {shape:<12} ERROR {_oneline(c['error'], 100)}")
            continue
        path = c["path"] if c["path"] == "fastpath" else f"torch ({c['fallback_reason']})"
        print(f"{c['op']:<20} {shape:<12} {c['fastpath_median_ms']:>12.4f} "
              f"{c['torch_median_ms']:>10.4f} {_f(c['speedup'], '.2f', 7)}x {c['fastpath_max_err']:>9.2e} "
              f"{c['torch_max_err']:>9.2e}  {path}")
        if "torch_compiled_median_ms" in c:
            print(f"{'  compiled':<20} {shape:<12} {c['fastpath_compiled_median_ms']:>12.4f} "
                  f"{c['torch_compiled_median_ms']:>10.4f} {_f(c['speedup_vs_compiled'], '.2f', 7)}x "
                  f"{'':>9} {_f(c['torch_compiled_max_err'], '.2e', 9)}  "
                  "(torch.compile: inductor vs the drop-in)")
        elif "torch_compiled_error" in c or "torch_compiled_skipped" in c:
            why = c.get("torch_compiled_error") or c.get("torch_compiled_skipped")
            print(f"{'  compiled':<20} {shape:<12} not timed: {_oneline(why, 90)}")
    _print_attention([c for c in cases if c["op"] == "sdpa"], "sdpa BxHxLxD", True)
    _print_attention([c for c in cases if c["op"] == "sdpa_decode"], "decode BxHqxHkvxLxD", False)


def _print_attention(rows, title, causal_col):
    """One line a case: each backend's ms (err: refused, skip: not run), the
    compiled flash call (sdpa), the fastest backend and fastpath's speedup
    over it, then the reasons of the backends that did not run."""
    if not rows:
        return
    cols = [("flash", "flash"), ("efficient", "effic"), ("cudnn", "cudnn"), ("math", "math")]
    w = max(15, len(title))
    hdr = (f"{title:<{w}} " + (f"{'causal':<6} " if causal_col else "") + f"{'fastpath':>8} "
           + " ".join(f"{h:>7}" for _, h in cols)
           + (f" {'compile':>7}" if causal_col else f" {'GB/s':>7}")
           + f" {'best':>9} {'vs best':>7} {'vs flash':>8} {'fp err':>8}  path")
    print(hdr)
    print("-" * len(hdr))
    notes = {}
    for c in rows:
        shape = "x".join(str(s) for s in c["shape"])
        causal = f"{'yes' if c['causal'] else 'no':<6} " if causal_col else ""
        if "error" in c:
            print(f"{shape:<{w}} {causal}ERROR {_oneline(c['error'], 100)}")
            continue
        cells = []
        for name, _ in cols:
            b = c["backends"].get(name, {})
            if "median_ms" in b:
                cells.append(f"{b['median_ms']:>7.3f}")
            else:
                tag = "err" if "error" in b else "skip"
                cells.append(f"{tag:>7}")
                notes.setdefault(f"{name} {tag}: {_note(b.get('error') or b.get('skipped'))}",
                                 []).append(shape)
        if not causal_col:
            comp = _f(c.get("kv_gbps"), ".0f", 7)
        elif "torch_compiled_median_ms" in c:
            comp = f"{c['torch_compiled_median_ms']:>7.3f}"
        else:
            tag = "err" if "torch_compiled_error" in c else ("skip" if "torch_compiled_skipped" in c else "-")
            comp = f"{tag:>7}"
            if tag != "-":
                why = c.get("torch_compiled_error") or c.get("torch_compiled_skipped")
                notes.setdefault(f"compile {tag}: {_note(why)}", []).append(shape)
        path = c["path"] if c["path"] == "fastpath" else f"torch ({_oneline(c['fallback_reason'], 40)})"
        if c.get("kernel"):
            k = c["kernel"]
            path += f" {k['kernel']}" + (f" x{k['num_splits']}" if k["num_splits"] > 1 else "")
        print(f"{shape:<{w}} {causal}{c['fastpath_median_ms']:>8.3f} " + " ".join(cells)
              + f" {comp} {c['best_torch_backend'] or '-':>9} {_f(c['speedup_vs_best'], '.2f', 6)}x"
              f" {_f(c['speedup'], '.2f', 7)}x {c['fastpath_max_err']:>8.1e}  {path}")
    for note, where in list(notes.items())[:6]:
        print(f"  {note} [{len(where)} case(s)]")
    if len(notes) > 6:
        print(f"  ... {len(notes) - 6} more reasons in the JSON")


class _Stop(BaseException):
    """SIGTERM (e.g. from timeout(1)): stop, write what was done."""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results to this path")
    ap.add_argument("--only", default="norm,rms,sdpa,decode",
                    help="comma list of norm, rms, sdpa, decode, run in this order")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--quick", action="store_true",
                    help="3 warm-up / 20 timed runs, sdpa seqlens 1024 and 4096")
    ap.add_argument("--compiled", action="store_true",
                    help="also torch.compile of the eager code: norm / rms against inductor's fused "
                         "kernel and with the drop-in inside a compiled graph; sdpa the flash call")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no case after this many seconds (from the start); the JSON says "
                         "what was not run")
    ap.add_argument("--math-max-seqlen", type=int, default=2048,
                    help="run the sdpa math backend up to this seqlen (default 2048)")
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="tiny shapes on the CPU: checks this script, measures nothing useful")
    args = ap.parse_args(argv)
    args.start = _clock()
    args.norm_shapes, args.seqlens, args.head_dims = NORM_SHAPES, SDPA_SEQLENS, SDPA_HEAD_DIMS
    args.hidden, args.tokens = HIDDEN, SDPA_TOKENS
    args.decode_shapes, args.decode_heads, args.decode_head_dim = DECODE_SHAPES, DECODE_HEADS, DECODE_HEAD_DIM
    if args.quick:
        args.warmup, args.iters = min(args.warmup, 3), min(args.iters, 20)
        args.seqlens = SDPA_QUICK_SEQLENS
    global DEVICE
    DEVICE = "cuda"
    if args.smoke_cpu:
        DEVICE = "cpu"
        args.warmup, args.iters = 1, 2
        args.norm_shapes, args.seqlens = [(33, 256), (7, 1537)], [64]
        args.hidden, args.tokens = 256, 128
        args.decode_shapes, args.decode_heads, args.decode_head_dim = [(2, 96)], (4, 2), 64

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("bench_torch: torch is not installed: nothing to benchmark", file=sys.stderr)
        return 0
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_torch: no CUDA device visible to torch: nothing to benchmark", file=sys.stderr)
        return 0
    sys.path.insert(0, str(ROOT / "bindings" / "python"))
    try:
        import fastpath
        import fastpath.torch as fpt
    except OSError as e:
        print(f"bench_torch: cannot load libfastpath ({e})", file=sys.stderr)
        return 1
    if DEVICE == "cuda" and fastpath.device_count() == 0:
        print("bench_torch: libfastpath sees no CUDA device: nothing to benchmark", file=sys.stderr)
        return 0

    order = [s.strip() for s in args.only.split(",") if s.strip()]
    order = [s for i, s in enumerate(order) if s not in order[:i]]
    cases = []
    doc = {
        "schema": "fastbench-python/1",
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke run)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "fastpath_version": fastpath.version(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if DEVICE == "cuda" else None,
        "cudnn_version": cudnn_version(torch) if DEVICE == "cuda" else None,
        "warmup": args.warmup, "iters": args.iters, "max_seconds": args.max_seconds,
        "complete": False, "stopped_reason": None, "not_run": [],
        "cases": cases,
    }

    def write():
        # After every case (complete=false until the end), so a run stopped by
        # a time limit keeps what it measured.
        doc["elapsed_s"] = round(_clock() - args.start, 2)
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1) + "\n")
            tmp.replace(path)

    def on_sigterm(signum, frame):
        raise _Stop("SIGTERM")

    try:
        old_handler = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        old_handler = None
    rc = 0
    plan = plan_cases(torch, F, fpt, fastpath, args, order)
    i = 0
    try:
        for i, (base, run) in enumerate(plan):
            if over_time(args):
                doc["stopped_reason"] = f"{time_skip(args)}: {len(plan) - i} of {len(plan)} cases not run"
                break
            t0 = _clock()
            try:
                row = run()
            except Exception as e:
                print(f"bench_torch: {case_label(base)} failed:", file=sys.stderr)
                traceback.print_exc(limit=-4)
                row = {**base, "error": _reason(e)}
            if "error" in row:
                _free(torch)  # outside the except block: its traceback no longer holds the case's tensors
            row["case_seconds"] = round(_clock() - t0, 2)
            cases.append(row)
            write()
        else:
            i = len(plan)
    except (_Stop, KeyboardInterrupt) as e:
        what = "SIGTERM" if isinstance(e, _Stop) else "interrupted (Ctrl-C)"
        doc["stopped_reason"] = f"{what} after {_clock() - args.start:.1f} s during {case_label(plan[i][0])}"
        rc = 143 if isinstance(e, _Stop) else 130
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
    doc["not_run"] = [case_label(base) for base, _ in plan[i:]]
    doc["complete"] = doc["stopped_reason"] is None
    write()
    print_table(cases)
    failed = [case_label(c) for c in cases if "error" in c]
    if failed:
        print(f"FAILED ({len(failed)}, see \"error\" in the JSON): {', '.join(failed)}")
    if doc["not_run"]:
        names = ", ".join(doc["not_run"])
        print(f"NOT RUN ({doc['stopped_reason']}): {_oneline(names, 400)}")
    print(f"{len(cases)} of {len(plan)} cases in {_clock() - args.start:.1f} s"
          + ("" if doc["complete"] else " (incomplete)"))
    if args.json:
        print(f"wrote {args.json}")
    return rc


if __name__ == "__main__":
    code = main()
    if code in (130, 143):
        # stopped by SIGTERM / Ctrl-C, the JSON and the table out: leave
        # without the interpreter's exit handlers (e.g. inductor's compile
        # workers), which must not keep a timed-out run alive
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
