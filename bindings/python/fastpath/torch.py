"""PyTorch drop-ins backed by libfastpath (import fastpath.torch; needs torch).

    import fastpath.torch as fpt
    y = fpt.layer_norm(x, (hidden,), weight, bias, eps=1e-5)        # F.layer_norm
    y = fpt.rms_norm(x, (hidden,), weight, eps=1e-6)                # F.rms_norm
    y, h = fpt.add_layer_norm(x, residual, weight, bias, 1e-5, activation="gelu")
    o = fpt.scaled_dot_product_attention(q, k, v, is_causal=True)   # F.scaled_dot_product_attention

CUDA tensors run on the fastpath CUDA context of their device (one cached
per device), enqueued on torch.cuda.current_stream(); CPU tensors on a cached
CPU context. Nothing is copied: tensors are passed by pointer with their
strides (attention maps PyTorch's (batch, heads, seq, dim) onto the library's
(batch, seq, heads, dim) by strides; its output is a (batch, heads, seq, dim)
view of a (batch, seq, heads, dim) buffer, as PyTorch's flash backend).

Cases the library does not cover fall back to the torch implementation,
silently: fallback_count, fallback_reasons (reason -> count) and
last_fallback_reason record it; fastpath_count counts the calls that ran in
libfastpath; last_path is "fastpath" or "torch" for the latest call.
Autograd: layer_norm / rms_norm / add_layer_norm / add_rms_norm are
differentiable (backward by fp_norm_backward); attention falls back to torch
when a gradient is needed.
"""
import collections
import math
import threading

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

import fastpath
from fastpath import norm as _norm
from fastpath import attention as _attn

__all__ = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm",
           "scaled_dot_product_attention", "context_for", "reset_stats", "fallback_count",
           "fastpath_count", "fallback_reasons", "last_fallback_reason", "last_path"]

fallback_count = 0
fastpath_count = 0
fallback_reasons = collections.Counter()
last_fallback_reason = None
last_path = None

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_CUDA_STREAM_LEGACY = 0x1  # cudaStreamLegacy
_contexts = {}
_lock = threading.Lock()


def reset_stats():
    """Zeroes the fallback / fastpath counters."""
    global fallback_count, fastpath_count, last_fallback_reason, last_path
    fallback_count = fastpath_count = 0
    fallback_reasons.clear()
    last_fallback_reason = last_path = None


def _fallback(reason):
    global fallback_count, last_fallback_reason, last_path
    fallback_count += 1
    fallback_reasons[reason] += 1
    last_fallback_reason = reason
    last_path = "torch"


def _ran():
    global fastpath_count, last_path
    fastpath_count += 1
    last_path = "fastpath"


def _device_key(device):
    if device.type == "cpu":
        return "cpu"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index}"


def context_for(device):
    """The cached fastpath.Context for a torch.device ("cpu" or "cuda:N")."""
    key = _device_key(torch.device(device))
    with _lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = _contexts[key] = fastpath.Context(key)
        return ctx


class _Launch:
    """Context manager: (ctx, stream) for a tensor's device, with that CUDA
    device current while the call is issued."""

    def __init__(self, t):
        self.t = t
        self.guard = None

    def __enter__(self):
        dev = self.t.device
        if dev.type == "cuda":
            # The guard first: creating a fastpath context (and every
            # fastpath call) makes its device current, and the guard must
            # remember the caller's device, not that one, to restore it.
            self.guard = torch.cuda.device(dev)
            self.guard.__enter__()
        try:
            ctx = context_for(dev)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        if dev.type == "cuda":
            stream = torch.cuda.current_stream(dev).cuda_stream
            # 0 is PyTorch's default (legacy) stream, but NULL means the fastpath
            # context's own non-blocking stream: name the legacy stream by its
            # handle cudaStreamLegacy (0x1) so the work stays ordered with torch's.
            return ctx, (stream or _CUDA_STREAM_LEGACY)
        return ctx, None

    def __exit__(self, *exc):
        guard, self.guard = self.guard, None
        if guard is not None:
            guard.__exit__(*exc)
        return False


def _supported_device(t):
    return t.device.type in ("cpu", "cuda")


def _rows_view(t, cols):
    """t as a [rows, cols] view (no copy) and its row stride, or (None, reason)."""
    if t.numel() == 0:
        return None, "empty tensor"
    if cols > 1 and t.stride(-1) != 1:
        return None, "last dimension not contiguous"
    try:
        v = t.view(-1, cols)
    except RuntimeError:
        return None, "leading dimensions cannot be flattened without a copy"
    if cols > 1 and v.stride(1) != 1:
        return None, "normalized dimensions not contiguous"
    rs = v.stride(0) if v.shape[0] > 1 else cols
    if rs < cols:
        return None, "rows overlap"
    return (v, rs), None


# ---------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------

_TORCH_ACT = {
    "none": lambda y: y,
    "gelu": F.gelu,
    "gelu_erf": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def _torch_rms_norm(x, normalized_shape, weight, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, normalized_shape, weight, eps)
    dims = tuple(range(-len(normalized_shape), 0))
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)).to(x.dtype)
    return y * weight if weight is not None else y


def _torch_norm(kind, x, shape, weight, bias, eps):
    if kind == "layernorm":
        return F.layer_norm(x, shape, weight, bias, eps)
    return _torch_rms_norm(x, shape, weight, eps)


def _norm_shape(normalized_shape):
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(n) for n in normalized_shape)


def _check_norm(x, shape, weight, bias, eps, residual=None):
    """None if libfastpath can run this norm, else the reason."""
    if not _norm.available():
        return "libfastpath built without norm"
    if x.dtype not in _DTYPES:
        return f"dtype {x.dtype} not supported"
    if not _supported_device(x):
        return f"device {x.device} not supported"
    if len(shape) == 0 or len(shape) > x.dim() or tuple(x.shape[-len(shape):]) != shape:
        return "normalized_shape does not match the input"
    if not (eps > 0 and math.isfinite(eps)):
        return "eps must be > 0 and finite"
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if p.dtype != x.dtype:
            return f"{name} dtype {p.dtype} differs from the input's {x.dtype}"
        if p.device != x.device:
            return f"{name} on another device"
        if tuple(p.shape) != shape or not p.is_contiguous():
            return f"{name} is not a contiguous tensor of normalized_shape"
    if residual is not None:
        if residual.dtype != x.dtype or residual.device != x.device or residual.shape != x.shape:
            return "residual differs from x in dtype, device or shape"
    return None


def _ptr(t):
    return None if t is None else t.data_ptr()


class _Unsupported(Exception):
    pass


def _norm_forward_cols(kind, activation, x, residual, weight, bias, eps, want_stats, cols):
    xv, why = _rows_view(x, cols)
    if xv is None:
        raise _Unsupported(why)
    (x2, xs) = xv
    rs = 0
    if residual is not None:
        rv, why = _rows_view(residual, cols)
        if rv is None:
            raise _Unsupported("residual: " + why)
        r2, rs = rv
    rows = x2.shape[0]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    res_out = (torch.empty((rows, cols), dtype=x.dtype, device=x.device)
               if residual is not None else None)
    mean = rstd = None
    if want_stats:
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        if kind == "layernorm":
            mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    with _Launch(x) as (ctx, stream):
        try:
            _norm.forward(ctx, stream=stream, rows=rows, cols=cols, dtype=_DTYPES[x.dtype],
                          kind=kind, activation=activation, eps=eps,
                          x=x2.data_ptr(), x_stride=xs,
                          residual=None if residual is None else r2.data_ptr(), residual_stride=rs,
                          gamma=_ptr(weight), beta=_ptr(bias),
                          out=out.data_ptr(), residual_out=_ptr(res_out),
                          mean=_ptr(mean), rstd=_ptr(rstd))
        except fastpath.FastpathError as e:
            if e.status in (fastpath.Status.INVALID_ARGUMENT, fastpath.Status.UNSUPPORTED):
                raise _Unsupported(f"libfastpath: {e.detail}") from None
            raise
    return out, res_out, mean, rstd


def _norm_backward(kind, activation, cols, g_out, s, weight, bias, mean, rstd, g_res, need_w,
                   need_b):
    """dx (shaped like s) and dweight / dbias (or None) via fp_norm_backward;
    s is the dense normalized input."""
    g_out = g_out.contiguous()
    s2 = s.reshape(-1, cols)  # s was saved as a dense tensor: a view
    rows = s2.shape[0]
    dres = None
    if g_res is not None:
        dres = g_res.contiguous().view(rows, cols)
    dx = torch.empty((rows, cols), dtype=s.dtype, device=s.device)
    dw = torch.empty_like(weight) if (need_w and weight is not None) else None
    db = torch.empty_like(bias) if (need_b and bias is not None) else None
    with _Launch(s) as (ctx, stream):
        _norm.backward(ctx, stream=stream, rows=rows, cols=cols, dtype=_DTYPES[s.dtype], kind=kind,
                       activation=activation, dout=g_out.data_ptr(), x=s2.data_ptr(),
                       x_stride=cols, gamma=_ptr(weight), beta=_ptr(bias), mean=_ptr(mean),
                       rstd=_ptr(rstd), dresidual_out=_ptr(dres), dx=dx.data_ptr(),
                       dgamma=_ptr(dw), dbeta=_ptr(db))
    return dx.view(s.shape), dw, db


class _NormFn(torch.autograd.Function):
    """out = act(norm(x) * weight + bias), backward by fp_norm_backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, kind, activation, eps, cols):
        out, _, mean, rstd = _norm_forward_cols(kind, activation, x, None, weight, bias, eps, True,
                                                cols)
        xs = x if x.is_contiguous() else x.contiguous()
        ctx.save_for_backward(xs, weight, bias, mean, rstd)
        ctx.kind, ctx.activation, ctx.cols = kind, activation, cols
        return out.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out):
        xs, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = _norm_backward(ctx.kind, ctx.activation, ctx.cols, g_out, xs, weight, bias,
                                    mean, rstd, None, ctx.needs_input_grad[1],
                                    ctx.needs_input_grad[2])
        return (dx if ctx.needs_input_grad[0] else None), dw, db, None, None, None, None


class _AddNormFn(torch.autograd.Function):
    """(act(norm(x + residual) * weight + bias), x + residual)."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, kind, activation, eps, cols):
        out, s, mean, rstd = _norm_forward_cols(kind, activation, x, residual, weight, bias, eps,
                                                True, cols)
        s = s.view(x.shape)
        ctx.save_for_backward(s, weight, bias, mean, rstd)
        ctx.kind, ctx.activation, ctx.cols = kind, activation, cols
        return out.view(x.shape), s

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out, g_res):
        s, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = _norm_backward(ctx.kind, ctx.activation, ctx.cols, g_out, s, weight, bias,
                                    mean, rstd, g_res, ctx.needs_input_grad[2],
                                    ctx.needs_input_grad[3])
        dxx = dx if ctx.needs_input_grad[0] else None
        dxr = dx if ctx.needs_input_grad[1] else None
        return dxx, dxr, dw, db, None, None, None, None


def _needs_grad(*ts):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _run_norm(kind, x, shape, weight, bias, eps):
    why = _check_norm(x, shape, weight, bias, eps)
    if why is None:
        cols = math.prod(shape)
        try:
            if _needs_grad(x, weight, bias):
                y = _NormFn.apply(x, weight, bias, kind, "none", float(eps), cols)
            else:
                out, _, _, _ = _norm_forward_cols(kind, "none", x, None, weight, bias, float(eps),
                                                  False, cols)
                y = out.view(x.shape)
            _ran()
            return y
        except _Unsupported as e:
            why = str(e)
    _fallback(why)
    return _torch_norm(kind, x, shape, weight, bias, eps)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm, fused in libfastpath (differentiable)."""
    return _run_norm("layernorm", input, _norm_shape(normalized_shape), weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm (eps None: torch.finfo(input.dtype).eps)."""
    if eps is None:
        eps = torch.finfo(input.dtype).eps if input.is_floating_point() else 1e-6
    return _run_norm("rmsnorm", input, _norm_shape(normalized_shape), weight, None, eps)


def _activation_name(activation):
    if activation is None:
        return "none"
    if activation not in _TORCH_ACT:
        raise ValueError(f"activation must be one of {sorted(_TORCH_ACT)}, got {activation!r}")
    return "gelu_erf" if activation == "gelu" else activation


def _run_add_norm(kind, x, residual, weight, bias, eps, activation):
    act = _activation_name(activation)
    cols = x.shape[-1]
    shape = (cols,)
    why = _check_norm(x, shape, weight, bias, eps, residual)
    if why is None:
        try:
            if residual is None:
                if _needs_grad(x, weight, bias):
                    out = _NormFn.apply(x, weight, bias, kind, act, float(eps), cols)
                else:
                    o, _, _, _ = _norm_forward_cols(kind, act, x, None, weight, bias, float(eps),
                                                    False, cols)
                    out = o.view(x.shape)
                _ran()
                return out, x
            if _needs_grad(x, residual, weight, bias):
                out, s = _AddNormFn.apply(x, residual, weight, bias, kind, act, float(eps), cols)
            else:
                o, s, _, _ = _norm_forward_cols(kind, act, x, residual, weight, bias, float(eps),
                                                False, cols)
                out, s = o.view(x.shape), s.view(x.shape)
            _ran()
            return out, s
        except _Unsupported as e:
            why = str(e)
    _fallback(why)
    s = x if residual is None else x + residual
    y = _torch_norm(kind, s, shape, weight, bias, eps)
    return _TORCH_ACT[act](y), s


def add_layer_norm(x, residual=None, weight=None, bias=None, eps=1e-5, activation="none"):
    """Fused s = x + residual; out = act(layer_norm(s) over the last dim).
    Returns (out, s): s is the residual stream for the next layer (x itself
    when residual is None). activation: "none", "gelu" (erf), "gelu_tanh",
    "relu", "silu". Differentiable."""
    return _run_add_norm("layernorm", x, residual, weight, bias, eps, activation)


def add_rms_norm(x, residual=None, weight=None, eps=1e-6, activation="none"):
    """As add_layer_norm with RMSNorm (no bias)."""
    return _run_add_norm("rmsnorm", x, residual, weight, None, eps, activation)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------

def _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    kw = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
    if enable_gqa:
        kw["enable_gqa"] = True
    return F.scaled_dot_product_attention(query, key, value, **kw)


def _bhsd_strides(t, cuda, what):
    """(batch, seq, head) strides of a [B, H, S, D] tensor for the library
    (0 for extent-1 dimensions), or raises _Unsupported."""
    B, H, S, D = t.shape
    sb, sh, ss, sd = t.stride()
    if sd != 1 and D > 1:
        raise _Unsupported(f"{what}: head_dim not contiguous")
    out = []
    for n, st in ((B, sb), (S, ss), (H, sh)):
        if n == 1:
            out.append(0)  # any stride: let the library use the packed one
        elif st == 0:
            raise _Unsupported(f"{what}: broadcast (stride 0) dimension")
        else:
            out.append(st)
    if cuda:
        elt = t.element_size()
        if t.data_ptr() % 16 or any((st * elt) % 16 for st in out):
            raise _Unsupported(f"{what}: not 16-byte aligned (pointer or strides)")
    return out


def _sdpa_fast(query, key, value, is_causal, scale, enable_gqa):
    if not _attn.available():
        raise _Unsupported("libfastpath built without attention")
    if query.dtype not in _DTYPES:
        raise _Unsupported(f"dtype {query.dtype} not supported")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise _Unsupported("q, k, v dtypes differ")
    if not _supported_device(query) or key.device != query.device or value.device != query.device:
        raise _Unsupported("device not supported or q, k, v on different devices")
    if not (query.dim() == key.dim() == value.dim()) or query.dim() not in (3, 4):
        raise _Unsupported("only 3-d or 4-d (batch, heads, seq, dim) inputs")
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    B, Hq, Lq, D = query.shape
    Bk, Hkv, Lk, Dk = key.shape
    if tuple(value.shape) != (Bk, Hkv, Lk, Dk) or Bk != B or Dk != D:
        raise _Unsupported("shapes not supported (value head_dim differs, or batch mismatch)")
    if Hq != Hkv and not (enable_gqa and Hq % Hkv == 0):
        raise _Unsupported("heads_q != heads_kv without enable_gqa")
    if D % 8 or not 8 <= D <= 256:
        raise _Unsupported(f"head_dim {D} not supported (multiple of 8 in [8, 256])")
    if min(B, Hq, Lq, Lk) < 1:
        raise _Unsupported("empty tensor")
    causal, window_right = 0, -1
    if is_causal:
        # PyTorch aligns the causal mask top-left (j <= i), the library
        # bottom-right (j <= i + Lk - Lq): equal when Lq == Lk; for Lq > Lk a
        # right window of Lq - Lk gives top-left; Lq < Lk cannot be expressed.
        if Lq == Lk:
            causal = 1
        elif Lq > Lk:
            window_right = Lq - Lk
        else:
            raise _Unsupported("is_causal with seqlen_q < seqlen_k (top-left mask)")
    sm_scale = 0.0
    if scale is not None:
        sm_scale = float(scale)
        if not (sm_scale > 0 and math.isfinite(sm_scale)):
            raise _Unsupported("scale must be > 0 and finite")
    cuda = query.device.type == "cuda"
    qs = _bhsd_strides(query, cuda, "query")
    ks = _bhsd_strides(key, cuda, "key")
    vs = _bhsd_strides(value, cuda, "value")
    o = torch.empty((B, Lq, Hq, D), dtype=query.dtype, device=query.device)
    if cuda and o.data_ptr() % 16:
        raise _Unsupported("output not 16-byte aligned")
    strides = {}
    for t, s in (("q", qs), ("k", ks), ("v", vs)):
        strides[f"{t}_batch_stride"], strides[f"{t}_seq_stride"], strides[f"{t}_head_stride"] = s
    with _Launch(query) as (ctx, stream):
        try:
            _attn.forward(ctx, stream=stream, batch=B, seqlen_q=Lq, seqlen_k=Lk, heads_q=Hq,
                          heads_kv=Hkv, head_dim=D, dtype=_DTYPES[query.dtype],
                          q=query.data_ptr(), k=key.data_ptr(), v=value.data_ptr(),
                          o=o.data_ptr(), softmax_scale=sm_scale, causal=causal,
                          window_right=window_right, **strides)
        except fastpath.FastpathError as e:
            if e.status in (fastpath.Status.INVALID_ARGUMENT, fastpath.Status.UNSUPPORTED):
                raise _Unsupported(f"libfastpath: {e.detail}") from None
            raise
    out = o.transpose(1, 2)  # [B, Hq, Lq, D] view, as PyTorch's flash backend returns
    return out.squeeze(1) if squeeze else out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention by libfastpath's flash
    attention for (batch, heads, seq, dim) (or (batch, seq, dim)) f16 / bf16 /
    f32 inputs with head_dim a multiple of 8 up to 256. attn_mask, dropout,
    gradients and other cases run torch's implementation (see the module
    counters). The result is a (batch, heads, seq, dim) view of a
    (batch, seq, heads, dim) buffer."""
    why = None
    if attn_mask is not None:
        why = "attn_mask given"
    elif dropout_p > 0.0:
        why = "dropout_p > 0"
    elif _needs_grad(query, key, value):
        why = "gradient required (attention backward not in libfastpath)"
    else:
        try:
            out = _sdpa_fast(query, key, value, is_causal, scale, enable_gqa)
            _ran()
            return out
        except _Unsupported as e:
            why = str(e)
    _fallback(why)
    return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
