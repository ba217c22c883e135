"""Fused LayerNorm / RMSNorm (include/fastpath/norm.h).

Raw layer: pointers are ints (addresses of ctx memory: device memory for a
CUDA context, host memory for a CPU context), None for an optional tensor.
Shapes are rows x cols, row strides in elements (0 = dense), dtypes
"f32" / "f16" / "bf16".

    fastpath.norm.forward(ctx, rows=R, cols=C, x=px, out=po, gamma=pg, beta=pb,
                          dtype="bf16", kind="layernorm", activation="gelu_erf")

Array layer (CPU contexts, numpy): layer_norm / rms_norm / forward_arrays /
backward_arrays take float arrays, run in the requested dtype ("bf16" is
stored as uint16 and converted by the library) and return float32 arrays.

Errors raise fastpath.FastpathError (status INVALID_ARGUMENT with the argument
named for bad input).
"""
import ctypes

import fastpath as _pkg  # the package: it imports this module after defining what is used here
from . import _lib
from ._lib import lib

__all__ = ["KINDS", "ACTIVATIONS", "available", "forward", "backward", "validate",
           "backward_validate", "forward_bytes", "forward_arrays", "backward_arrays",
           "layer_norm", "rms_norm"]

KINDS = {"layernorm": 0, "rmsnorm": 1}
ACTIVATIONS = {"none": 0, "gelu_erf": 1, "gelu": 1, "gelu_tanh": 2, "relu": 3, "silu": 4}


def available():
    """True when libfastpath was built with the norm capability."""
    return _AVAILABLE


_AVAILABLE = _lib.has("fp_norm_forward")  # the loaded library never changes


def _need():
    if not _AVAILABLE:
        raise RuntimeError("libfastpath was built without the norm capability "
                           "(FASTPATH_MODULES must include 'norm')")


def _enum(table, value, what):
    if isinstance(value, int):
        return value  # passed through: the library rejects unknown values
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what} must be one of {sorted(table)}, got {value!r}") from None


def _fp():
    return _pkg


def _dtype_id(dtype):
    """fastpath.dtype_id, with the common case (a name of DTYPES) first."""
    d = _pkg.DTYPES.get(dtype) if type(dtype) is str else None
    return _pkg.dtype_id(dtype) if d is None else d


def make_params(*, rows, cols, x, out, dtype="f32", kind="layernorm", activation="none",
                residual=None, gamma=None, beta=None, bias=None, residual_out=None, mean=None,
                rstd=None, eps=1e-5, x_stride=0, residual_stride=0, residual_out_stride=0,
                out_stride=0):
    """An fp_norm_params filled from keyword arguments (see forward)."""
    _need()
    opt_ptr = _pkg._opt_ptr
    p = _lib.init_struct(_lib.NormParams, "fp_norm_params_default")
    _lib.set_ints(p, kind=_enum(KINDS, kind, "kind"),
                  activation=_enum(ACTIVATIONS, activation, "activation"),
                  rows=rows, cols=cols, x_stride=x_stride, residual_stride=residual_stride,
                  residual_out_stride=residual_out_stride, out_stride=out_stride)
    d = _dtype_id(dtype)
    p.x_dtype = p.residual_dtype = p.out_dtype = p.param_dtype = d
    p.x, p.residual, p.out, p.residual_out = (opt_ptr(x), opt_ptr(residual), opt_ptr(out),
                                              opt_ptr(residual_out))
    p.gamma, p.beta, p.bias = opt_ptr(gamma), opt_ptr(beta), opt_ptr(bias)
    p.mean, p.rstd = opt_ptr(mean), opt_ptr(rstd)
    p.eps = float(eps)
    return p


def make_backward_params(*, rows, cols, dout, x, dx, rstd, mean=None, dtype="f32",
                         kind="layernorm", activation="none", gamma=None, beta=None, bias=None,
                         dresidual_out=None, dgamma=None, dbeta=None, dbias=None, dout_stride=0,
                         x_stride=0, dresidual_out_stride=0, dx_stride=0):
    """An fp_norm_backward_params filled from keyword arguments (see backward)."""
    _need()
    opt_ptr = _pkg._opt_ptr
    p = _lib.init_struct(_lib.NormBackwardParams, "fp_norm_backward_params_default")
    _lib.set_ints(p, kind=_enum(KINDS, kind, "kind"),
                  activation=_enum(ACTIVATIONS, activation, "activation"),
                  rows=rows, cols=cols, dout_stride=dout_stride, x_stride=x_stride,
                  dresidual_out_stride=dresidual_out_stride, dx_stride=dx_stride)
    p.dtype = p.param_dtype = _dtype_id(dtype)
    p.dout, p.x, p.dx = opt_ptr(dout), opt_ptr(x), opt_ptr(dx)
    p.gamma, p.beta, p.bias = opt_ptr(gamma), opt_ptr(beta), opt_ptr(bias)
    p.mean, p.rstd = opt_ptr(mean), opt_ptr(rstd)
    p.dresidual_out = opt_ptr(dresidual_out)
    p.dgamma, p.dbeta, p.dbias = opt_ptr(dgamma), opt_ptr(dbeta), opt_ptr(dbias)
    return p


def _packer(cls, default_name):
    """(struct_size, struct_packer(cls)) after init_struct's check that the
    ctypes mirror has the size the library expects (once per class)."""
    r = _packers.get(cls)
    if r is None:
        _need()
        r = _packers[cls] = (_lib.init_struct(cls, default_name).struct_size,
                             _lib.struct_packer(cls))
    return r


_packers = {}
_FWD_PACKER = None  # _packer(NormParams) once made: _params' per-call lookup


def _fwd_packer():
    global _FWD_PACKER
    _FWD_PACKER = _packer(_lib.NormParams, "fp_norm_params_default")
    return _FWD_PACKER


def _params(kind, activation, rows, cols, dtype, x, x_stride, residual, residual_stride, gamma,
            beta, out, residual_out, mean, rstd, eps):
    """make_params for callers whose arguments are known good (fastpath.torch,
    on every call): kind, activation, dtype as ids of the tables, rows, cols,
    strides as ints of an int64 (tensor sizes), pointers as ints (0 = NULL),
    eps a float. The same struct as make_params, filled in one pack_into
    without its per-field checks, which cost more than the library call
    on small tensors."""
    size, packer = _FWD_PACKER or _fwd_packer()
    p = _lib.NormParams()
    packer.pack_into(p, 0, size, kind, activation, rows, cols, dtype, dtype, dtype, dtype,
                     x_stride, residual_stride, 0, 0, x, residual, gamma, beta, 0, out,
                     residual_out, mean, rstd, ctypes.c_float(eps).value)
    return p


def _backward_params(kind, activation, rows, cols, dtype, dout, x, x_stride, gamma, beta, mean,
                     rstd, dresidual_out, dx, dgamma, dbeta):
    """make_backward_params for known-good arguments (as _params), with the
    other strides 0 (dense) and no bias."""
    size, packer = _packer(_lib.NormBackwardParams, "fp_norm_backward_params_default")
    p = _lib.NormBackwardParams()
    packer.pack_into(p, 0, size, kind, activation, rows, cols, dtype, dtype, 0, x_stride, 0, 0,
                     dout, x, gamma, beta, 0, mean, rstd, dresidual_out, dx, dgamma, dbeta, 0)
    return p


def forward(ctx, *, stream=None, **kw):
    """fp_norm_forward. Keywords: rows, cols, x, out (required pointers),
    dtype, kind ("layernorm"/"rmsnorm"), activation ("none", "gelu_erf" (alias
    "gelu"), "gelu_tanh", "relu", "silu"), residual, gamma, beta, bias,
    residual_out, mean, rstd (f32 [rows]) pointers, eps, x_stride,
    residual_stride, residual_out_stride, out_stride. stream: a CUDA stream
    handle (int) or None for the context's default stream. Asynchronous on a
    CUDA context."""
    p = make_params(**kw)
    _pkg.check(lib.fp_norm_forward(ctx.handle, stream, p))


def backward(ctx, *, stream=None, **kw):
    """fp_norm_backward. Keywords: rows, cols, dout, x (the normalized input:
    the forward's residual_out when it fused a residual), dx, rstd (required;
    mean too for LayerNorm), dtype, kind, activation, gamma, beta, bias,
    dresidual_out, dgamma, dbeta, dbias, dout_stride, x_stride,
    dresidual_out_stride, dx_stride."""
    p = make_backward_params(**kw)
    _pkg.check(lib.fp_norm_backward(ctx.handle, stream, p))


def validate(ctx, *, stream=None, max_time_s=None, min_samples=None, flush_l2=False, **kw):
    """fp_norm_validate: the fused forward against the unfused passes on the
    same inputs (params' outputs are not written; out may be None), timed A/B.
    Returns the report as a dict (speedup, verdict, agreement{passed, ...},
    baseline/optimized statistics, roofline)."""
    kw.setdefault("out", None)
    p = make_params(**kw)
    fp = _fp()
    cfg = fp._config(max_time_s, min_samples, flush_l2)
    rep = _lib.ABReport()
    fp.check(lib.fp_norm_validate(ctx.handle, stream, ctypes.byref(p), ctypes.byref(cfg),
                                  ctypes.byref(rep)))
    return fp._ab_report_dict(rep)


def backward_validate(ctx, *, stream=None, max_time_s=None, min_samples=None, flush_l2=False, **kw):
    """fp_norm_backward_validate, like validate (dx may be None)."""
    kw.setdefault("dx", None)
    p = make_backward_params(**kw)
    fp = _fp()
    cfg = fp._config(max_time_s, min_samples, flush_l2)
    rep = _lib.ABReport()
    fp.check(lib.fp_norm_backward_validate(ctx.handle, stream, ctypes.byref(p), ctypes.byref(cfg),
                                           ctypes.byref(rep)))
    return fp._ab_report_dict(rep)


def forward_bytes(**kw):
    """Bytes the fused forward moves at least (its roofline figure)."""
    kw.setdefault("x", None)
    kw.setdefault("out", None)
    return lib.fp_norm_forward_bytes(ctypes.byref(make_params(**kw)))


# ---------------------------------------------------------------------------
# numpy layer (CPU contexts)
# ---------------------------------------------------------------------------

def _np():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is a test dependency
        raise ImportError("the fastpath array layer needs numpy") from e
    return numpy


def to_buffer(a, dtype):
    """A C-contiguous numpy buffer holding array a in dtype: float32 / float16
    arrays for f32 / f16, uint16 bit patterns for bf16 (converted by the
    library, round to nearest even). A uint16 array is taken as bf16 bits."""
    np = _np()
    a = np.asarray(a)
    d = _fp().dtype_id(dtype)
    store = {0: np.float32, 1: np.float16, 2: np.uint16}[d]
    if a.dtype == store:
        return np.ascontiguousarray(a)
    src = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(src.shape, dtype=store)
    _fp().convert(src.ctypes.data, 0, out.ctypes.data, d, src.size)
    return out


def from_buffer(b, dtype):
    """float32 copy of a buffer made by to_buffer (or written by the library)."""
    np = _np()
    d = _fp().dtype_id(dtype)
    b = np.ascontiguousarray(b)
    out = np.empty(b.shape, dtype=np.float32)
    _fp().convert(b.ctypes.data, d, out.ctypes.data, 0, b.size)
    return out


def _check_shape(name, a, shape, flat=False):
    """ValueError unless array a (None: absent) has `shape` (with flat, only
    its number of elements counts)."""
    if a is None:
        return
    np = _np()
    got = tuple(np.shape(a))
    ok = int(np.prod(got)) == int(np.prod(shape)) if flat else got == tuple(shape)
    if not ok:
        raise ValueError(f"{name} has shape {got}, expected {tuple(shape)}")


def _check_cpu(ctx):
    if ctx.is_cuda:
        raise ValueError("the numpy layer needs a CPU context (host memory); use the raw "
                         "pointer API or fastpath.torch for CUDA")


def _rows_cols(x):
    """x as an array of at least one dimension, and its [rows, cols] view."""
    x = _np().asarray(x)
    if x.ndim < 1:
        raise ValueError("x must have at least one dimension")
    cols = x.shape[-1]
    return x, (x.size // cols if cols else 0), cols


class _Keep:
    """Converts arrays to the library's buffers and keeps every buffer
    referenced until the call returns (the library reads raw pointers)."""

    def __init__(self, dtype):
        self.dtype, self.bufs = dtype, []

    def buf(self, a):
        if a is None:
            return None, None
        b = to_buffer(a, self.dtype)
        self.bufs.append(b)
        return b, b.ctypes.data

    def f32(self, a):
        if a is None:
            return None
        b = _np().ascontiguousarray(a, dtype=_np().float32)
        self.bufs.append(b)
        return b.ctypes.data


def forward_arrays(ctx, x, *, residual=None, gamma=None, beta=None, bias=None, kind="layernorm",
                   activation="none", eps=1e-5, dtype="f32", want_residual_out=False,
                   want_stats=False):
    """Runs the fused forward on numpy arrays (CPU context). x: [..., cols];
    residual like x; gamma / beta / bias: [cols]. Inputs are converted to
    dtype first. Returns a dict: out (float32, x's shape), and residual_out,
    mean, rstd ([rows] float32) when asked for."""
    np = _np()
    _check_cpu(ctx)
    x, rows, cols = _rows_cols(x)
    # The library reads [rows, cols] / [cols] through raw pointers: a shorter
    # array would be read past its end.
    _check_shape("residual", residual, x.shape)
    for name, v in (("gamma", gamma), ("beta", beta), ("bias", bias)):
        _check_shape(name, v, (cols,))
    buf = _Keep(dtype).buf

    xb, px = buf(x)
    rb, pr = buf(residual)
    _, pg = buf(gamma)
    _, pb = buf(beta)
    _, pbias = buf(bias)
    out = np.empty_like(xb)
    ro = np.empty_like(xb) if want_residual_out else None
    mean = np.empty(rows, np.float32) if want_stats else None
    rstd = np.empty(rows, np.float32) if want_stats else None
    forward(ctx, rows=rows, cols=cols, x=px, out=out.ctypes.data, dtype=dtype, kind=kind,
            activation=activation, residual=pr, gamma=pg, beta=pb, bias=pbias,
            residual_out=None if ro is None else ro.ctypes.data,
            mean=None if mean is None else mean.ctypes.data,
            rstd=None if rstd is None else rstd.ctypes.data, eps=eps)
    res = {"out": from_buffer(out, dtype)}
    if ro is not None:
        res["residual_out"] = from_buffer(ro, dtype)
    if want_stats:
        res["mean"], res["rstd"] = mean, rstd
    return res


def backward_arrays(ctx, dout, x, rstd, *, mean=None, gamma=None, beta=None, bias=None,
                    dresidual_out=None, kind="layernorm", activation="none", dtype="f32",
                    want_param_grads=True):
    """Runs the backward on numpy arrays (CPU context): dout, x [rows, cols]
    (x = the normalized input), rstd / mean float32 [rows] from
    forward_arrays(want_stats=True). Returns a dict of float32 arrays: dx and,
    with want_param_grads, dgamma / dbeta / dbias for the vectors given."""
    np = _np()
    _check_cpu(ctx)
    x, rows, cols = _rows_cols(x)
    _check_shape("dout", dout, x.shape)
    _check_shape("dresidual_out", dresidual_out, x.shape)
    for name, v in (("gamma", gamma), ("beta", beta), ("bias", bias)):
        _check_shape(name, v, (cols,))
    for name, v in (("rstd", rstd), ("mean", mean)):
        _check_shape(name, v, (rows,), flat=True)
    keep = _Keep(dtype)
    buf, f32 = keep.buf, keep.f32

    _, pdo = buf(dout)
    xb, px = buf(x)
    _, pg = buf(gamma)
    _, pb = buf(beta)
    _, pbias = buf(bias)
    _, pdr = buf(dresidual_out)
    dx = np.empty_like(xb)
    grads = {}
    if want_param_grads:
        for name, given in (("dgamma", gamma), ("dbeta", beta), ("dbias", bias)):
            if given is not None:
                grads[name] = np.empty(cols, dtype=xb.dtype)
    backward(ctx, rows=rows, cols=cols, dout=pdo, x=px, dx=dx.ctypes.data, rstd=f32(rstd),
             mean=f32(mean), dtype=dtype, kind=kind, activation=activation, gamma=pg, beta=pb,
             bias=pbias, dresidual_out=pdr,
             **{k: v.ctypes.data for k, v in grads.items()})
    res = {"dx": from_buffer(dx, dtype)}
    for k, v in grads.items():
        res[k] = from_buffer(v, dtype)
    return res


def layer_norm(ctx, x, gamma=None, beta=None, eps=1e-5, dtype="f32"):
    """LayerNorm over the last axis of a numpy array; float32 result."""
    return forward_arrays(ctx, x, gamma=gamma, beta=beta, eps=eps, dtype=dtype)["out"]


def rms_norm(ctx, x, gamma=None, eps=1e-5, dtype="f32"):
    """RMSNorm over the last axis of a numpy array; float32 result."""
    return forward_arrays(ctx, x, gamma=gamma, kind="rmsnorm", eps=eps, dtype=dtype)["out"]
