"""Run by test_wheel.sh with the virtual environment's Python, from outside
the source tree: the installed wheel imports, loads the libfastpath bundled in
it, says the version CMakeLists.txt does, and computes a CPU LayerNorm and a
CPU attention that agree with numpy references.
usage: wheel_smoke.py VERSION"""
import importlib.metadata
import os
import sys

import numpy as np

import fastpath
from fastpath import _lib

want = sys.argv[1]
pkg = os.path.dirname(os.path.abspath(fastpath.__file__))
assert pkg.startswith(os.path.abspath(sys.prefix)), f"fastpath imported from {pkg}, not the venv"
assert _lib.lib._name == os.path.join(pkg, "libfastpath.so"), f"loaded {_lib.lib._name}"
got = (importlib.metadata.version("fastpath"), fastpath.version())
assert got == (want, want), f"(package, library) versions {got}, CMakeLists.txt says {want}"

rng = np.random.default_rng(1)
with fastpath.Context("cpu") as ctx:
    x = rng.standard_normal((8, 96)).astype(np.float32)
    gamma = rng.standard_normal(96).astype(np.float32)
    beta = rng.standard_normal(96).astype(np.float32)
    out = fastpath.norm.forward_arrays(ctx, x, gamma=gamma, beta=beta, eps=1e-5)["out"]
    xd = x.astype(np.float64)
    ref = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * gamma + beta
    err = np.abs(out - ref).max()
    assert err < 1e-4, f"layernorm max abs err {err}"

    q, k, v = (rng.standard_normal((2, n, 4, 64)).astype(np.float32) for n in (5, 7, 7))  # bshd
    o = fastpath.attention.forward_arrays(ctx, q, k, v)
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k) / np.sqrt(64)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)
    err = np.abs(o - ref).max()
    assert err < 1e-4, f"attention max abs err {err}"
print(f"wheel OK: fastpath {want} from {pkg}")
