#!/usr/bin/env python3
"""fastpath.torch drop-ins vs PyTorch eager on a CUDA GPU.

    PYTHONPATH=bindings/python FASTPATH_LIB=build/libfastpath.so \\
        python3 benchmarks/python/bench_torch.py --json results.json [--quick] [--only norm,rms,sdpa]

Cases (bf16):
  norm  residual add + LayerNorm + GELU: fastpath.torch.add_layer_norm (one
        fused kernel) vs x + r; F.layer_norm; F.gelu (three eager kernels),
        on the issue-3 shapes 4096x768, 16384x4096, 8192x8192, 2048x12288,
        1000x5120, 333x1537
  rms   RMSNorm with weight: fastpath.torch.rms_norm vs F.rms_norm (or the
        eager composition on a torch without it), same shapes
  sdpa  fastpath.torch.scaled_dot_product_attention vs
        F.scaled_dot_product_attention restricted to the flash backend,
        hidden 2048 (head_dim 64: 32 heads, 128: 16 heads), seqlen 1k..8k with
        batch * seqlen = 16k tokens, causal and not; q, k, v are
        (batch, heads, seq, dim) views of (batch, seq, heads, dim) buffers
With --compiled, norm and rms also time torch.compile (inductor) of the eager
code, the strongest PyTorch baseline (its own fused kernel), and the drop-in
inside a compiled graph (fields torch_compiled_median_ms,
fastpath_compiled_median_ms, speedup_vs_compiled).
Timing: CUDA events around each call on the current stream, after warm-up;
the median over --iters runs. Errors: max |out - ref| against a float32
reference on the same (bf16) inputs (for sdpa on the first batch entry), for
both implementations. Writes JSON (schema "fastbench-python/1") with --json
and prints a table. Exits 0 with a message when torch or CUDA is missing.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NORM_SHAPES = [(4096, 768), (16384, 4096), (8192, 8192), (2048, 12288), (1000, 5120), (333, 1537)]
SDPA_SEQLENS = [1024, 2048, 4096, 8192]
SDPA_TOKENS = 16384
HIDDEN = 2048
DEVICE = "cuda"  # "cpu" only for --smoke-cpu (a test of this script, not a benchmark)


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


def bench_norm(torch, F, fpt, args, kind):
    rows_out = []
    dt = torch.bfloat16
    dev = DEVICE
    have_rms = hasattr(F, "rms_norm")
    for R, C in args.norm_shapes:
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
        if args.compiled:
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

            ce = compiled_fn(torch, ("eager", op), on_args(eager_args))
            cf = compiled_fn(torch, ("fast", op), on_args(fast_args))
            comp, comp_fast = (lambda: ce(x, r, w, b)), (lambda: cf(x, r, w, b))
            out_comp = comp()
            comp_fast()
            t_comp = median_ms(torch, comp, args.warmup, args.iters)
            t_comp_fast = median_ms(torch, comp_fast, args.warmup, args.iters)
            extra = {"torch_compiled_median_ms": t_comp, "fastpath_compiled_median_ms": t_comp_fast,
                     "speedup_vs_compiled": t_comp / t_fast if t_fast > 0 else None,
                     "torch_compiled_max_err": max_err(out_comp, ref)}
        rows_out.append({**extra,
            "op": op, "shape": [R, C], "dtype": "bf16",
            "fastpath_median_ms": t_fast, "torch_median_ms": t_eager,
            "speedup": t_eager / t_fast if t_fast > 0 else None,
            "fastpath_gbps": nbytes / (t_fast * 1e6), "torch_gbps": nbytes / (t_eager * 1e6),
            "fastpath_max_err": max_err(out_fast, ref), "torch_max_err": max_err(out_eager, ref),
            "path": path, "fallback_reason": reason if path != "fastpath" else None,
        })
    return rows_out


_COMPILED = {}


def compiled_fn(torch, key, fn):
    """torch.compile(fn) (inductor, dynamic shapes), made once per key: the
    tensors are arguments, so one compiled graph serves every shape."""
    c = _COMPILED.get(key)
    if c is None:
        c = _COMPILED[key] = torch.compile(fn, dynamic=True)
    return c


def flash_only(torch):
    """Context manager restricting F.scaled_dot_product_attention to flash."""
    if DEVICE == "cpu":
        import contextlib
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # torch < 2.3
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                              enable_mem_efficient=False)


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


def bench_sdpa(torch, F, fpt, args):
    rows_out = []
    dt = torch.bfloat16
    for D in (64, 128):
        H = args.hidden // D
        for L in args.seqlens:
            B = max(1, args.tokens // L)
            g = torch.Generator(device=DEVICE).manual_seed(L * 7 + D)
            # (batch, seq, heads, dim) buffers as a model produces them, viewed as
            # (batch, heads, seq, dim) for SDPA
            q, k, v = (torch.randn(B, L, H, D, device=DEVICE, dtype=dt, generator=g).transpose(1, 2)
                       for _ in range(3))
            for causal in (False, True):
                def fast():
                    return fpt.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def eager():
                    with flash_only(torch):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                fpt.reset_stats()
                o_fast = fast()
                path, reason = fpt.last_path, fpt.last_fallback_reason
                o_eager = eager()
                ref = sdpa_reference(torch, q, k, v, causal)
                t_fast = median_ms(torch, fast, args.warmup, args.iters)
                t_eager = median_ms(torch, eager, args.warmup, args.iters)
                flops = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
                rows_out.append({
                    "op": "sdpa", "shape": [B, H, L, D], "causal": causal, "dtype": "bf16",
                    "fastpath_median_ms": t_fast, "torch_median_ms": t_eager,
                    "speedup": t_eager / t_fast if t_fast > 0 else None,
                    "fastpath_tflops": flops / (t_fast * 1e9), "torch_tflops": flops / (t_eager * 1e9),
                    "fastpath_max_err": max_err(o_fast[0], ref), "torch_max_err": max_err(o_eager[0], ref),
                    "fastpath_vs_torch_max_diff": max_err(o_fast, o_eager),
                    "path": path, "fallback_reason": reason if path != "fastpath" else None,
                })
                del o_fast, o_eager, ref  # free before the next case
    return rows_out


def print_table(cases):
    hdr = f"{'op':<20} {'shape':<24} {'causal':<6} {'fastpath ms':>12} {'torch ms':>10} " \
          f"{'speedup':>8} {'fp err':>9} {'torch err':>9}  path"
    print(hdr)
    print("-" * len(hdr))
    for c in cases:
        shape = "x".join(str(s) for s in c["shape"])
        causal = "" if "causal" not in c else ("yes" if c["causal"] else "no")
        path = c["path"] if c["path"] == "fastpath" else f"torch ({c['fallback_reason']})"
        print(f"{c['op']:<20} {shape:<24} {causal:<6} {c['fastpath_median_ms']:>12.4f} "
              f"{c['torch_median_ms']:>10.4f} {c['speedup']:>7.2f}x {c['fastpath_max_err']:>9.2e} "
              f"{c['torch_max_err']:>9.2e}  {path}")
        if "torch_compiled_median_ms" in c:
            print(f"{'  compiled':<20} {shape:<24} {'':<6} {c['fastpath_compiled_median_ms']:>12.4f} "
                  f"{c['torch_compiled_median_ms']:>10.4f} {c['speedup_vs_compiled']:>7.2f}x "
                  f"{'':>9} {c['torch_compiled_max_err']:>9.2e}  (torch.compile: inductor vs the drop-in)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results to this path")
    ap.add_argument("--only", default="norm,rms,sdpa", help="comma list of norm, rms, sdpa")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="fewer iterations and seqlens")
    ap.add_argument("--compiled", action="store_true",
                    help="norm / rms also against torch.compile of the eager code (inductor's fused "
                         "kernel) and with the drop-in inside a compiled graph")
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="tiny shapes on the CPU: checks this script, measures nothing useful")
    args = ap.parse_args(argv)
    args.norm_shapes, args.seqlens = NORM_SHAPES, SDPA_SEQLENS
    args.hidden, args.tokens = HIDDEN, SDPA_TOKENS
    if args.quick:
        args.warmup, args.iters = min(args.warmup, 3), min(args.iters, 20)
        args.seqlens = SDPA_SEQLENS[:2]
    global DEVICE
    if args.smoke_cpu:
        DEVICE = "cpu"
        args.warmup, args.iters = 1, 2
        args.norm_shapes, args.seqlens = [(33, 256), (7, 1537)], [64]
        args.hidden, args.tokens = 256, 128

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

    only = {s.strip() for s in args.only.split(",") if s.strip()}
    cases = []
    doc = {
        "schema": "fastbench-python/1",
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke run)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "fastpath_version": fastpath.version(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if DEVICE == "cuda" else None,
        "warmup": args.warmup, "iters": args.iters,
        "complete": False,
        "cases": cases,
    }

    def write():
        # After every group of cases (complete=false until the end), so a run
        # stopped by a time limit keeps what it measured.
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1) + "\n")
            tmp.replace(path)

    groups = [("norm", fastpath.norm.available(), lambda: bench_norm(torch, F, fpt, args, "norm")),
              ("rms", fastpath.norm.available(), lambda: bench_norm(torch, F, fpt, args, "rms")),
              ("sdpa", fastpath.attention.available(), lambda: bench_sdpa(torch, F, fpt, args))]
    for name, available, run in groups:
        if name in only and available:
            cases += run()
            write()
    print_table(cases)
    doc["complete"] = True
    write()
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
