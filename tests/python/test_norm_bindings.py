"""fastpath.norm on a CPU context with numpy arrays, against a float64 numpy
reference of the header's math (random data, f32 and converted f16 / bf16)."""
import ctypes
import math

import pytest

np = pytest.importorskip("numpy")

import fastpath  # noqa: E402
from fastpath import _lib, norm  # noqa: E402

pytestmark = pytest.mark.skipif(not norm.available(), reason="built without the norm capability")

TOL = {"f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}  # relative to max(1, |ref|)


@pytest.fixture(scope="module")
def ctx():
    with fastpath.Context("cpu") as c:
        yield c


def quant(a, dtype):
    """a rounded to dtype (as the library sees its inputs), as float64."""
    return norm.from_buffer(norm.to_buffer(a, dtype), dtype).astype(np.float64)


_erf = np.vectorize(math.erf)


def act(y, name):
    if name == "none":
        return y
    if name == "gelu_erf":
        return 0.5 * y * (1 + _erf(y / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    if name == "relu":
        return np.maximum(y, 0)
    if name == "silu":
        return y / (1 + np.exp(-y))
    raise ValueError(name)


def act_grad(y, name):
    if name == "none":
        return np.ones_like(y)
    if name == "relu":
        return (y > 0).astype(np.float64)
    if name == "silu":
        s = 1 / (1 + np.exp(-y))
        return s * (1 + y * (1 - s))
    h = 1e-6  # the GELUs: central difference in float64 is plenty accurate here
    return (act(y + h, name) - act(y - h, name)) / (2 * h)


def ref_forward(x, residual, gamma, beta, bias, kind, activation, eps, dtype):
    s = x if residual is None else quant(x + residual, dtype)
    if kind == "layernorm":
        mean = s.mean(1, keepdims=True)
        rstd = 1 / np.sqrt(((s - mean) ** 2).mean(1, keepdims=True) + eps)
        n = (s - mean) * rstd
    else:
        mean = None
        rstd = 1 / np.sqrt((s ** 2).mean(1, keepdims=True) + eps)
        n = s * rstd
    y = n * (1 if gamma is None else gamma) + (0 if beta is None else beta) + (0 if bias is None else bias)
    return act(y, activation), s, mean, rstd, n, y


def rand(rng, *shape, scale=1.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


def assert_close(got, ref, tol, what):
    err = np.abs(got.astype(np.float64) - ref) / np.maximum(1.0, np.abs(ref))
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    assert err.max() <= tol, f"{what}: max rel err {err.max():.3g} > {tol}"


def test_struct_layouts_match_the_library():
    for cls, fn in ((_lib.NormParams, "fp_norm_params_default"),
                    (_lib.NormBackwardParams, "fp_norm_backward_params_default")):
        raw = ctypes.CFUNCTYPE(None, ctypes.c_void_p)((fn, _lib.lib))
        assert _lib.c_struct_size(raw) == ctypes.sizeof(cls), cls.__name__
    p = norm.make_params(rows=1, cols=1, x=None, out=None)
    assert p.eps == pytest.approx(1e-5) and p.kind == 0 and p.activation == 0


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_forward_plain(ctx, dtype, kind):
    rng = np.random.default_rng(1)
    x = rand(rng, 7, 300, offset=0.5)
    gamma, beta = rand(rng, 300, offset=1.0), rand(rng, 300)
    r = norm.forward_arrays(ctx, x, gamma=gamma, beta=beta, kind=kind, eps=1e-5, dtype=dtype,
                            want_stats=True)
    xq, gq, bq = quant(x, dtype), quant(gamma, dtype), quant(beta, dtype)
    out, _, mean, rstd, _, _ = ref_forward(xq, None, gq, bq, None, kind, "none", 1e-5, dtype)
    assert r["out"].shape == x.shape
    assert_close(r["out"], out, TOL[dtype], "out")
    assert_close(r["rstd"], rstd[:, 0], 1e-4, "rstd")
    if kind == "layernorm":
        assert_close(r["mean"], mean[:, 0], 1e-5, "mean")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("activation", ["gelu_erf", "gelu_tanh", "relu", "silu"])
def test_forward_fused_residual_bias_activation(ctx, dtype, activation):
    rng = np.random.default_rng(2)
    x, res = rand(rng, 5, 3, 96), rand(rng, 5, 3, 96, scale=0.5)
    gamma, beta, bias = rand(rng, 96, offset=1.0), rand(rng, 96), rand(rng, 96, scale=0.1)
    r = norm.forward_arrays(ctx, x, residual=res, gamma=gamma, beta=beta, bias=bias,
                            activation=activation, dtype=dtype, want_residual_out=True)
    q = lambda a: quant(a, dtype)  # noqa: E731
    out, s, _, _, _, _ = ref_forward(q(x).reshape(15, 96), q(res).reshape(15, 96), q(gamma), q(beta),
                                     q(bias), "layernorm", activation, 1e-5, dtype)
    assert_close(r["out"].reshape(15, 96), out, TOL[dtype], "out")
    assert_close(r["residual_out"].reshape(15, 96), s, 0.0, "residual_out")


def test_large_mean_small_spread_keeps_digits(ctx):
    rng = np.random.default_rng(3)
    x = rand(rng, 4, 512, scale=1e-2, offset=1e3)
    r = norm.forward_arrays(ctx, x)["out"]
    ref = ref_forward(x.astype(np.float64), None, None, None, None, "layernorm", "none", 1e-5, "f32")[0]
    assert np.abs(r - ref).max() < 2e-2  # fp32 inputs at 1e3 carry ~6e-5 absolute noise / 1e-2 spread


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind,activation", [("layernorm", "none"), ("layernorm", "gelu_tanh"),
                                             ("rmsnorm", "silu")])
def test_backward(ctx, dtype, kind, activation):
    rng = np.random.default_rng(4)
    rows, cols = 6, 200
    x, dout, dres = rand(rng, rows, cols, offset=0.3), rand(rng, rows, cols), rand(rng, rows, cols)
    gamma, beta, bias = rand(rng, cols, offset=1.0), rand(rng, cols), rand(rng, cols, scale=0.1)
    if kind == "rmsnorm":
        beta = None
    fwd = norm.forward_arrays(ctx, x, gamma=gamma, beta=beta, bias=bias, kind=kind,
                              activation=activation, dtype=dtype, want_stats=True)
    g = norm.backward_arrays(ctx, dout, x, fwd["rstd"], mean=fwd["mean"] if kind == "layernorm" else None,
                             gamma=gamma, beta=beta, bias=bias, dresidual_out=dres, kind=kind,
                             activation=activation, dtype=dtype)
    q = lambda a: None if a is None else quant(a, dtype)  # noqa: E731
    xq, gq, bq, biq, doq = q(x), q(gamma), q(beta), q(bias), q(dout)
    _, _, _, rstd, n, y = ref_forward(xq, None, gq, bq, biq, kind, activation, 1e-5, dtype)
    gr = doq * act_grad(y, activation)
    dn = gr * gq
    if kind == "layernorm":
        dx = rstd * (dn - dn.mean(1, keepdims=True) - n * (dn * n).mean(1, keepdims=True))
    else:
        dx = rstd * (dn - n * (dn * n).mean(1, keepdims=True))
    dx += q(dres)
    tol = {"f32": 1e-4, "bf16": 4e-2}[dtype]
    assert_close(g["dx"], dx, tol, "dx")
    # dgamma / dbeta sum over rows: scale the tolerance with the sum's size
    assert_close(g["dgamma"], (gr * n).sum(0), tol * 4, "dgamma")
    assert_close(g["dbias"], gr.sum(0), tol * 4, "dbias")
    if beta is not None:
        assert_close(g["dbeta"], gr.sum(0), tol * 4, "dbeta")
    else:
        assert "dbeta" not in g


def test_raw_pointer_api_with_strides(ctx):
    rng = np.random.default_rng(5)
    big = rand(rng, 4, 80)
    x = big[:, 8:72]  # row stride 80, 64 columns: no copy
    out = np.full((4, 100), np.nan, np.float32)
    norm.forward(ctx, rows=4, cols=64, x=x.ctypes.data, x_stride=80, out=out.ctypes.data,
                 out_stride=100, kind="rmsnorm", eps=1e-6)
    ref = ref_forward(x.astype(np.float64), None, None, None, None, "rmsnorm", "none", 1e-6, "f32")[0]
    assert_close(out[:, :64], ref, 2e-5, "out")
    assert np.isnan(out[:, 64:]).all()  # past cols: untouched


def test_validate_returns_a_report(ctx):
    rng = np.random.default_rng(6)
    x, g, b = rand(rng, 64, 256), rand(rng, 256), rand(rng, 256)
    rep = norm.validate(ctx, rows=64, cols=256, x=x.ctypes.data, gamma=g.ctypes.data,
                        beta=b.ctypes.data, activation="gelu", max_time_s=0.2)
    assert rep["agreement"]["passed"] and rep["compared"]
    assert rep["speedup"] > 0 and rep["verdict"] in ("SAME", "FASTER", "SLOWER")
    assert rep["baseline"]["samples"] >= 1 and rep["optimized"]["samples"] >= 1
    assert norm.forward_bytes(rows=64, cols=256, x=x.ctypes.data, out=x.ctypes.data) >= 2 * x.nbytes


def test_backward_validate_returns_a_report(ctx):
    rng = np.random.default_rng(7)
    x, do = rand(rng, 32, 128), rand(rng, 32, 128)
    fwd = norm.forward_arrays(ctx, x, want_stats=True)
    rep = norm.backward_validate(ctx, rows=32, cols=128, dout=do.ctypes.data, x=x.ctypes.data,
                                 mean=fwd["mean"].ctypes.data, rstd=fwd["rstd"].ctypes.data,
                                 max_time_s=0.2)
    assert rep["agreement"]["passed"]


def bad(fn, *args, **kw):
    with pytest.raises(fastpath.FastpathError) as e:
        fn(*args, **kw)
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT
    return e.value.detail


def test_bad_input_is_invalid_argument(ctx):
    x = np.ones((2, 8), np.float32) + np.arange(8, dtype=np.float32)
    out = np.full_like(x, 7.0)
    base = dict(rows=2, cols=8, x=x.ctypes.data, out=out.ctypes.data)
    assert bad(norm.forward, ctx, **{**base, "rows": 0})
    bad(norm.forward, ctx, **{**base, "eps": 0.0})
    bad(norm.forward, ctx, **{**base, "eps": float("nan")})
    bad(norm.forward, ctx, **{**base, "x": None})
    bad(norm.forward, ctx, **{**base, "x_stride": 4})  # non-zero stride < cols
    bad(norm.forward, ctx, **{**base, "x": x.ctypes.data + 1})  # misaligned
    bad(norm.forward, ctx, **{**base, "kind": 7})
    assert (out == 7.0).all()  # outputs untouched on error
    p = norm.make_params(**base)
    p.struct_size = 8
    with pytest.raises(fastpath.FastpathError) as e:
        fastpath.check(_lib.lib.fp_norm_forward(ctx.handle, None, ctypes.byref(p)))
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT and "struct_size" in e.value.detail
    with pytest.raises(ValueError):
        norm.forward(ctx, **base, activation="swish")
    bad(norm.backward, ctx, rows=2, cols=8, dout=x.ctypes.data, x=x.ctypes.data, dx=out.ctypes.data,
        rstd=None)


def test_array_layer_needs_a_cpu_context():
    if fastpath.device_count() == 0:
        pytest.skip("no GPU")
    with fastpath.Context("cuda:0") as c:
        with pytest.raises(ValueError):
            norm.layer_norm(c, np.ones((2, 8), np.float32))


def test_array_layer_rejects_mismatched_shapes(ctx):
    # The library reads [rows, cols] and [cols] through raw pointers: a short
    # gamma / residual / rstd used to be read past its end (garbage or a
    # crash) instead of raising.
    rng = np.random.default_rng(3)
    x = rand(rng, 8, 64)
    with pytest.raises(ValueError, match="gamma"):
        norm.forward_arrays(ctx, x, gamma=rand(rng, 32))
    with pytest.raises(ValueError, match="residual"):
        norm.forward_arrays(ctx, x, residual=rand(rng, 4, 64))
    with pytest.raises(ValueError, match="bias"):
        norm.forward_arrays(ctx, x, bias=rand(rng, 65))
    fwd = norm.forward_arrays(ctx, x, want_stats=True)
    with pytest.raises(ValueError, match="rstd"):
        norm.backward_arrays(ctx, rand(rng, 8, 64), x, fwd["rstd"][:4], mean=fwd["mean"])
    with pytest.raises(ValueError, match="dout"):
        norm.backward_arrays(ctx, rand(rng, 8, 32), x, fwd["rstd"], mean=fwd["mean"])
    with pytest.raises(ValueError, match="mean"):
        norm.backward_arrays(ctx, rand(rng, 8, 64), x, fwd["rstd"], mean=fwd["mean"][:1])
    # matching shapes still work
    g = norm.backward_arrays(ctx, rand(rng, 8, 64), x, fwd["rstd"], mean=fwd["mean"])
    assert g["dx"].shape == x.shape
