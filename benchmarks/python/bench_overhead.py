"""Per-call overhead of the fastpath.torch drop-ins on tiny CPU tensors,
against the torch eager op doing the same work.

  FASTPATH_LIB=build/libfastpath.so PYTHONPATH=bindings/python \
      python benchmarks/python/bench_overhead.py [--calls 200] [--blocks 60] [--threads 1]
      [--clock wall|thread] [--fp-threads N] [--only layer_norm,sdpa] [--smoke]
      [--device cpu|cuda]

--clock thread times the calling thread's CPU time (robust on a loaded
machine); --fp-threads 1 runs fastpath's CPU context with one worker, which
leaves the pool's wake-up out: together they isolate the bindings' own cost.
Exits 1 when a drop-in fell back to torch (the row would measure torch).

Each row times blocks of --calls calls of one op (interleaved with its torch
counterpart, block by block, so load from other processes hits both alike)
and prints the median over --blocks blocks in microseconds per call, with the
spread (p10 - p90) as the noise figure. The tensors are tiny (a few hundred
bytes), so the time is the Python / ctypes / dispatcher path, not the math:
  layer_norm     [4, 64] f32, weight + bias        vs F.layer_norm
  rms_norm       [4, 64] f32, weight               vs F.rms_norm
  add_layer_norm [4, 64] f32 + residual, w + b     vs s = x + r; F.layer_norm(s)
  *_fwd_bwd      the same with x, weight, bias requiring grad: forward and
                 torch.autograd.grad of (out * g).sum() (add_layer_norm: of
                 out and s, both in the loss)
  sdpa           q [1, 2, 1, 64], k / v [1, 2, 16, 64] f32 (decode-sized)
                 vs F.scaled_dot_product_attention
  kvcache        attention_with_kvcache with the same shapes in its
                 (batch, seq, heads, dim) layout (no torch counterpart: the
                 sdpa row's torch time is printed beside it)
  c_call         fp_norm_forward through ctypes with a ready params struct:
                 the floor the bindings add to

--device cuda runs the same rows on CUDA tensors (bfloat16; each block starts
after a synchronization, no synchronization inside it): the host cost of a
call (the Python path, the launch) against torch eager's, which is what a
small op costs on a GPU when the host, not the kernel, is the bound. c_call
then launches on the CUDA context's own stream.
"""
import argparse
import ctypes
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.stderr.write("bench_overhead.py: torch is not installed; nothing to measure\n")
    sys.exit(0)

import fastpath
import fastpath.torch as fpt
from fastpath import _lib, norm

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
CLOCK = CLOCKS["wall"]


def per_call_us(fn, calls):
    clock = CLOCK
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls * 1e6


def measure(fa, fb, calls, blocks, sync=None):
    """Median and (p10, p90) per-call microseconds of fa and fb, block-interleaved
    (sync, when given, before each timed block: the device's queue drained)."""
    for _ in range(max(3, calls // 10)):  # warm up (contexts, allocator, autograd graph)
        fa()
        if fb is not None:
            fb()
    sa, sb = [], []
    for _ in range(blocks):
        if sync is not None:
            sync()
        sa.append(per_call_us(fa, calls))
        if fb is not None:
            if sync is not None:
                sync()
            sb.append(per_call_us(fb, calls))

    def summary(s):
        if not s:
            return None
        q = statistics.quantiles(s, n=10, method="inclusive")
        return statistics.median(s), q[0], q[-1]
    return summary(sa), summary(sb)


def cases(device="cpu"):
    g = torch.Generator().manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16

    def rnd(*shape, grad=False):
        t = (torch.rand(*shape, generator=g) * 2 - 1 + 0.1).to(device=device, dtype=dtype)
        return t.requires_grad_(grad)

    x, r, w, b = rnd(4, 64), rnd(4, 64), rnd(64), rnd(64)
    xg, wg, bg = rnd(4, 64, grad=True), rnd(64, grad=True), rnd(64, grad=True)
    rg = rnd(4, 64, grad=True)
    gy = rnd(4, 64)
    q, k, v = rnd(1, 2, 1, 64), rnd(1, 2, 16, 64), rnd(1, 2, 16, 64)
    qc, kc, vc = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    grad = torch.autograd.grad

    def ln_fb_fp():
        return grad((fpt.layer_norm(xg, (64,), wg, bg) * gy).sum(), (xg, wg, bg))

    def ln_fb_t():
        return grad((F.layer_norm(xg, (64,), wg, bg) * gy).sum(), (xg, wg, bg))

    def rms_fb_fp():
        return grad((fpt.rms_norm(xg, (64,), wg, 1e-6) * gy).sum(), (xg, wg))

    def rms_fb_t():
        return grad((F.rms_norm(xg, (64,), wg, 1e-6) * gy).sum(), (xg, wg))

    def add_fb_fp():
        o, s = fpt.add_layer_norm(xg, rg, wg, bg)
        return grad((o * gy).sum() + s.sum(), (xg, rg, wg, bg))

    def add_fb_t():
        s = xg + rg
        o = F.layer_norm(s, (64,), wg, bg)
        return grad((o * gy).sum() + s.sum(), (xg, rg, wg, bg))

    def add_t():
        s = x + r
        return F.layer_norm(s, (64,), w, b), s

    return [
        ("layer_norm", lambda: fpt.layer_norm(x, (64,), w, b),
         lambda: F.layer_norm(x, (64,), w, b)),
        ("rms_norm", lambda: fpt.rms_norm(x, (64,), w, 1e-6),
         lambda: F.rms_norm(x, (64,), w, 1e-6)),
        ("add_layer_norm", lambda: fpt.add_layer_norm(x, r, w, b), add_t),
        ("layer_norm_fwd_bwd", ln_fb_fp, ln_fb_t),
        ("rms_norm_fwd_bwd", rms_fb_fp, rms_fb_t),
        ("add_layer_norm_fwd_bwd", add_fb_fp, add_fb_t),
        ("sdpa", lambda: fpt.scaled_dot_product_attention(q, k, v),
         lambda: F.scaled_dot_product_attention(q, k, v)),
        ("kvcache", lambda: fpt.attention_with_kvcache(qc, kc, vc), None),
    ], (x, w, b)


def c_call_case(x, w, b):
    """fp_norm_forward with a params struct built once: ctypes' own cost (and on
    CUDA the library's host cost, the launch included)."""
    out = torch.empty_like(x)
    ctx = fpt.context_for(x.device)
    p = norm.make_params(rows=x.shape[0], cols=x.shape[1], x=x.data_ptr(), out=out.data_ptr(),
                         gamma=w.data_ptr(), beta=b.data_ptr(),
                         dtype={torch.float32: "f32", torch.bfloat16: "bf16"}[x.dtype])
    fn, h, ref = _lib.lib.fp_norm_forward, ctx.handle, ctypes.byref(p)
    return lambda keep=out: fn(h, None, ref)  # keep: out's memory lives as long as the lambda


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200, help="calls per timed block")
    ap.add_argument("--blocks", type=int, default=60, help="timed blocks per op (median taken)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--smoke", action="store_true", help="a few calls per row (tests)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: perf_counter; thread: CPU time of the calling thread (leaves out "
                         "time descheduled on a loaded machine, and the library's worker threads)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: bfloat16 CUDA tensors (the host cost of a call on a GPU)")
    ap.add_argument("--fp-threads", type=int, default=0,
                    help="worker count of fastpath's CPU context (FP_CTX_CPU_THREADS; 0 = all "
                         "cores). 1 leaves out the pool's wake-up, which on a loaded machine "
                         "costs tens of microseconds per call once the workers sleep")
    args = ap.parse_args()
    global CLOCK
    CLOCK = CLOCKS[args.clock]
    if args.smoke:
        args.calls, args.blocks = 3, 2
    if args.fp_threads:
        fastpath.check(_lib.lib.fp_context_set_option(fpt.context_for("cpu").handle, 1,
                                                      args.fp_threads))
    torch.set_num_threads(args.threads)
    sync = None
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.stderr.write("bench_overhead.py: --device cuda: torch sees no CUDA device\n")
            sys.exit(2)
        sync = torch.cuda.synchronize
    rows, (x, w, b) = cases(args.device)
    rows.append(("c_call", c_call_case(x, w, b), None))
    only = set(filter(None, args.only.split(",")))
    print(f"fastpath {fastpath.version()}, torch {torch.__version__}, python "
          f"{sys.version.split()[0]}, torch threads {torch.get_num_threads()}, fastpath CPU "
          f"threads {args.fp_threads or 'all'}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    print(f"median us/call ({args.clock} clock) over {args.blocks} blocks of {args.calls} calls "
          "(p10-p90)")
    print(f"{'op':24s} {'fastpath':>22s} {'torch eager':>22s} {'ratio':>6s}")
    sdpa_torch = None
    with torch.inference_mode(False):
        for name, fa, fb in rows:
            if only and name not in only:
                continue
            (ma, la, ha), tb = measure(fa, fb, args.calls, args.blocks, sync)
            if name == "sdpa":
                sdpa_torch = tb
            if tb is None and name == "kvcache":
                tb = sdpa_torch
            a = f"{ma:8.1f} ({la:6.1f}-{ha:6.1f})"
            if tb is not None:
                mb, lb, hb = tb
                bcol = f"{mb:8.1f} ({lb:6.1f}-{hb:6.1f})"
                ratio = f"{ma / mb:6.2f}"
            else:
                bcol, ratio = f"{'-':>22s}", ""
            print(f"{name:24s} {a:>22s} {bcol:>22s} {ratio:>6s}")
    print(f"fastpath calls: {fpt.fastpath_count}, fallbacks: {fpt.fallback_count} "
          f"{dict(fpt.fallback_reasons)}")
    if fpt.fallback_count:  # a row that ran torch's implementation measured nothing of ours
        sys.exit(1)


if __name__ == "__main__":
    main()
