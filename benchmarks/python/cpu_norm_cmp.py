"""fastpath.torch norm drop-ins against PyTorch eager on CPU tensors.

  FASTPATH_LIB=build/libfastpath.so PYTHONPATH=bindings/python \
      python benchmarks/python/cpu_norm_cmp.py [--threads 2] [--reps 7] [--quick]

Rows (each A/B pair is timed interleaved, best of --reps rounds, so load
from other processes hits both sides alike; the ratio is the figure to read):
  fwd   add + LayerNorm + GELU(erf): F.gelu(F.layer_norm(x + r)) vs
        fastpath.torch.add_layer_norm(x, r, w, b, activation="gelu")
  ln    F.layer_norm vs fastpath.torch.layer_norm
  rms   F.rms_norm vs fastpath.torch.rms_norm
  bwd   torch.autograd.grad of the eager composition vs of add_layer_norm
        (gradients of x, r, w, b; the forward graph built once)
GB/s: the bytes fastpath's fused op must move (fwd: x, r read, out and the
residual sum written; ln / rms: x read, out written; bwd: dout, s read, dx
written) over its time. Set FASTPATH_NORM_CPU=portable for the portable path.
--cpu-time: process CPU time (all threads) instead of wall time, torch on one
thread; fastpath keeps its pool (idle workers sleep, so they add nothing).
"""
import argparse
import time

import torch
import torch.nn.functional as F

import fastpath.torch as fpt


CLOCK = time.perf_counter


def best_pair(fa, fb, reps, inner):
    fa(), fb()
    ba = bb = float("inf")
    for _ in range(reps):
        t0 = CLOCK()
        for _ in range(inner):
            fa()
        ba = min(ba, (CLOCK() - t0) / inner)
        t0 = CLOCK()
        for _ in range(inner):
            fb()
        bb = min(bb, (CLOCK() - t0) / inner)
    return ba * 1e3, bb * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="fwd,ln,rms,bwd")
    ap.add_argument("--cpu-time", action="store_true",
                    help="process CPU time instead of wall time, torch on one thread (no OpenMP "
                         "spinning counted); robust on a loaded machine, where wall times of two "
                         "threads measure the scheduler")
    ap.add_argument("--no-materialize", action="store_true",
                    help="experiment: add_layer_norm's autograd Function with "
                         "ctx.set_materialize_grads(False), so an unused residual-sum output gets "
                         "no zero-filled gradient (the bindings materialize one today)")
    a = ap.parse_args()
    if a.no_materialize:
        orig = fpt._AddNormFn.forward

        def fwd(ctx, *args):
            ctx.set_materialize_grads(False)
            return orig(ctx, *args)
        fpt._AddNormFn.forward = staticmethod(fwd)
    global CLOCK
    if a.cpu_time:
        CLOCK = time.process_time
        a.threads = 1
    torch.set_num_threads(a.threads)
    shapes = [(4096, 768), (2048, 4096), (1000, 5120), (333, 1537)]
    if a.quick:
        shapes = [(256, 768), (333, 1537)]
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    only = a.only.split(",")
    print(f"{'row':4} {'dtype':9} {'shape':>10} {'torch ms':>9} {'fastpath ms':>11} {'ratio':>6} {'GB/s':>6}")
    for dt in dtypes:
        es = torch.tensor([], dtype=dt).element_size()
        for rows, cols in shapes:
            g = torch.Generator().manual_seed(rows * cols)
            x = torch.randn(rows, cols, generator=g).to(dt)
            r = torch.randn(rows, cols, generator=g).to(dt)
            w = (1 + 0.1 * torch.randn(cols, generator=g)).to(dt)
            b = (0.1 * torch.randn(cols, generator=g)).to(dt)
            n = rows * cols
            inner = max(1, int(2e7 // (n * es * 4)))
            res = []
            if "fwd" in only:
                tt, tf = best_pair(lambda: F.gelu(F.layer_norm(x + r, (cols,), w, b)),
                                   lambda: fpt.add_layer_norm(x, r, w, b, activation="gelu"), a.reps, inner)
                assert fpt.last_path == "fastpath"
                res.append(("fwd", tt, tf, 4 * n * es))
            if "ln" in only:
                tt, tf = best_pair(lambda: F.layer_norm(x, (cols,), w, b),
                                   lambda: fpt.layer_norm(x, (cols,), w, b), a.reps, inner)
                res.append(("ln", tt, tf, 2 * n * es))
            if "rms" in only:
                tt, tf = best_pair(lambda: F.rms_norm(x, (cols,), w, 1e-6),
                                   lambda: fpt.rms_norm(x, (cols,), w, 1e-6), a.reps, inner)
                res.append(("rms", tt, tf, 2 * n * es))
            if "bwd" in only:
                xs, rs, ws, bs = (t.clone().requires_grad_() for t in (x, r, w, b))
                dy = torch.randn(rows, cols, generator=g).to(dt)
                ye = F.gelu(F.layer_norm(xs + rs, (cols,), ws, bs))
                yf, _ = fpt.add_layer_norm(xs, rs, ws, bs, activation="gelu")
                assert fpt.last_path == "fastpath"
                tt, tf = best_pair(lambda: torch.autograd.grad(ye, (xs, rs, ws, bs), dy, retain_graph=True),
                                   lambda: torch.autograd.grad(yf, (xs, rs, ws, bs), dy, retain_graph=True),
                                   a.reps, inner)
                res.append(("bwd", tt, tf, 3 * n * es))
            for name, tt, tf, nbytes in res:
                print(f"{name:4} {str(dt)[6:]:9} {rows:>5}x{cols:<5}{tt:9.3f} {tf:11.3f} {tt / tf:6.2f} "
                      f"{nbytes / tf / 1e6:6.1f}", flush=True)


if __name__ == "__main__":
    main()
