"""PyTorch drop-ins backed by libfastpath (import fastpath.torch; needs torch).

    import fastpath.torch as fpt
    y = fpt.layer_norm(x, (hidden,), weight, bias, eps=1e-5)        # F.layer_norm
    y = fpt.rms_norm(x, (hidden,), weight, eps=1e-6)                # F.rms_norm
    y, h = fpt.add_layer_norm(x, residual, weight, bias, 1e-5, activation="gelu")
    o = fpt.scaled_dot_product_attention(q, k, v, is_causal=True)   # F.scaled_dot_product_attention
    o = fpt.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal=True)
                                                  # flash_attn_with_kvcache (decode, paged)
    o = fpt.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, causal=True)
                                                  # flash_attn_varlen_func (packed sequences)

CUDA tensors run on the fastpath CUDA context of their device (one cached
per device), enqueued on torch.cuda.current_stream(); CPU tensors on a cached
CPU context. Nothing is copied: tensors are passed by pointer with their
strides (attention maps PyTorch's (batch, heads, seq, dim) onto the library's
(batch, seq, heads, dim) by strides; its output is a (batch, heads, seq, dim)
view of a (batch, seq, heads, dim) buffer, as PyTorch's flash backend).

attention_with_kvcache is a new API, not a drop-in: q [batch, seqlen_q,
heads_q, head_dim] against a dense [batch, seqlen_k, heads_kv, head_dim] or
paged [num_pages, page_size, heads_kv, head_dim] (int32 block_table) KV
cache, int32 cache_seqlens, bottom-right causal mask, sliding window, lse;
float8_e4m3fn q / k_cache / v_cache with descale_q / descale_k / descale_v
(FlashAttention-3's fp8 forward; out bfloat16), or an fp8 KV cache: float16 /
bfloat16 / float32 q with float8_e4m3fn k_cache / v_cache and descale_k /
descale_v (vLLM's kv_cache_dtype "fp8"; out in q's dtype).
What it cannot run (see its docstring) raises TypeError / ValueError rather
than falling back; it counts in fastpath_count / last_path. attention_varlen
likewise: packed q [total_q, heads_q, head_dim], k / v [total_k, heads_kv,
head_dim], int32 cu_seqlens_q / cu_seqlens_k (on Hopper it runs the TMA
kernels: it passes total_k).

Cases the drop-ins do not cover fall back to the torch implementation,
silently: fallback_count, fallback_reasons (reason -> count) and
last_fallback_reason record it; fastpath_count counts the calls that ran in
libfastpath; last_path is "fastpath" or "torch" for the latest call.
Autograd: layer_norm / rms_norm / add_layer_norm / add_rms_norm are
differentiable (backward by fp_norm_backward; under create_graph by torch ops,
so double backward works); attention falls back to torch when a gradient is
needed. Under torch.autocast the SDPA drop-in casts q, k, v as torch does.
torch.compile: while Dynamo traces, the drop-ins emit the custom operators
fastpath::norm_fwd / norm_bwd / sdpa / attention_kvcache / attention_varlen (no graph break; see the section at the
end of this file).
"""
import collections
import math
import numbers
import threading

import torch
import torch.nn.functional as F

import fastpath
from fastpath import norm as _norm
from fastpath import attention as _attn
from fastpath._lib import lib as _clib

__all__ = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm",
           "scaled_dot_product_attention", "attention_with_kvcache", "attention_varlen", "context_for",
           "reset_stats",
           "fallback_count", "fastpath_count", "fallback_reasons", "last_fallback_reason",
           "last_path"]

fallback_count = 0
fastpath_count = 0
fallback_reasons = collections.Counter()
last_fallback_reason = None
last_path = None

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_DTYPE_IDS = {t: fastpath.DTYPES[name] for t, name in _DTYPES.items()}
# fp8 e4m3 (FP_FP8_E4M3): an input dtype of attention_with_kvcache only (q,
# k_cache, v_cache all fp8: output bfloat16; k_cache and v_cache only, an fp8
# KV cache: output in q's dtype); None when this torch has no float8_e4m3fn.
_FP8 = getattr(torch, "float8_e4m3fn", None)
_CUDA_STREAM_LEGACY = 0x1  # cudaStreamLegacy
# what the loaded library was built with (it never changes)
_NORM_AVAILABLE = _norm.available()
_ATTN_AVAILABLE = _attn.available()
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


# The CUDA call's fast path (_call): torch's own C queries, the current
# device's index and the current stream's raw handle, where this torch has
# them (None: every CUDA call goes through _Launch). torch.cuda.device and
# torch.cuda.current_stream() cost ~6.5 us of Python a call between them on
# a 2-core VM (benchmarks/python/launch_path_cost.py: each parses the device
# again, _get_device_index alone ~2 us; a Stream object is built per call),
# more than the library's own host cost (~4 us, launch included).
_torch_C = getattr(torch, "_C", None)
_CURRENT_DEVICE = getattr(_torch_C, "_cuda_getDevice", None)
_RAW_STREAM = getattr(_torch_C, "_cuda_getCurrentRawStream", None)
_FAST_LAUNCH = _CURRENT_DEVICE is not None and _RAW_STREAM is not None
_cuda_contexts = {}  # device index -> context_for's Context of that device (added to only)


def _call(t, fn, params):
    """fastpath.check(fn(context, stream, params)) for a tensor's device: a
    CUDA tensor on its device's cached context and torch's current stream, a
    CPU tensor on the cached CPU context directly (no device guard, no stream:
    the per-call cost of small ops). A CUDA tensor on the current device (the
    common case) needs no device guard: the library makes the context's
    device current only when it is not (fp_ctx_activate), so nothing changes;
    one on another device goes through _Launch, which restores the caller's."""
    if t.is_cuda:
        if _FAST_LAUNCH:
            idx = t.get_device()
            if idx == _CURRENT_DEVICE():
                ctx = _cuda_contexts.get(idx)
                if ctx is None:  # once per device (context_for: under the lock, one Context)
                    ctx = _cuda_contexts[idx] = context_for(t.device)
                # 0 is the legacy default stream (see _Launch)
                fastpath.check(fn(ctx.handle, _RAW_STREAM(idx) or _CUDA_STREAM_LEGACY, params))
                return
        with _Launch(t) as (ctx, stream):
            fastpath.check(fn(ctx.handle, stream, params))
    else:
        # Contexts are only ever added to _contexts: reading it without the
        # lock is safe (one dict lookup under the GIL); context_for creates
        # the CPU context once, under the lock.
        ctx = _contexts.get("cpu") or context_for("cpu")
        fastpath.check(fn(ctx.handle, None, params))


def _call_or_fallback(t, fn, params):
    """_call, with a call the library refuses (invalid argument, unsupported)
    turned into _Unsupported: the drop-in then falls back to torch."""
    try:
        _call(t, fn, params)
    except fastpath.FastpathError as e:
        if e.status in (fastpath.Status.INVALID_ARGUMENT, fastpath.Status.UNSUPPORTED):
            raise _Unsupported(f"libfastpath: {e.detail}") from None
        raise


def _supported_device(t):
    return t.is_cpu or t.is_cuda


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


def _rows_ptr(t, cols, what=""):
    """(rows, row stride, data pointer) of t as [rows, cols] (no copy), or
    raises _Unsupported(what + the reason): _rows_view, with the common dense
    case first (no view made)."""
    if t.is_contiguous() and (cols == 1 or t.stride(-1) == 1):
        n = t.numel()
        if n:
            return n // cols, cols, t.data_ptr()
    v, why = _rows_view(t, cols)
    if v is None:
        raise _Unsupported(what + why)
    return v[0].shape[0], v[1], v[0].data_ptr()


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
    return tuple(map(int, normalized_shape))


def _check_norm(x, shape, weight, bias, eps, residual=None):
    """None if libfastpath can run this norm, else the reason."""
    if not _NORM_AVAILABLE:
        return "libfastpath built without norm"
    dtype = x.dtype
    if dtype not in _DTYPES:
        return f"dtype {x.dtype} not supported"
    if not _supported_device(x):
        return f"device {x.device} not supported"
    n, xshape = len(shape), x.shape
    if n == 0 or n > len(xshape) or (xshape[-1] != shape[0] if n == 1 else xshape[-n:] != shape):
        return "normalized_shape does not match the input"
    if not (eps > 0 and math.isfinite(eps)):
        return "eps must be > 0 and finite"
    dev = None
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if p.dtype != dtype:
            return f"{name} dtype {p.dtype} differs from the input's {x.dtype}"
        if dev is None:
            dev = x.device
        if p.device != dev:
            return f"{name} on another device"
        if p.shape != shape or not p.is_contiguous():
            return f"{name} is not a contiguous tensor of normalized_shape"
    if residual is not None:
        if residual.dtype != dtype or residual.device != x.device or residual.shape != x.shape:
            return "residual differs from x in dtype, device or shape"
    return None


def _ptr(t):
    """Data pointer of an optional tensor (0 = NULL), as the _params builders take it."""
    return 0 if t is None else t.data_ptr()


class _Unsupported(Exception):
    pass


def _norm_forward_cols(kind, activation, x, residual, weight, bias, eps, want_stats, cols):
    """The fused forward of x (and residual) seen as [rows, cols]. Returns out
    and the residual sum (new dense tensors of x's shape; the sum None without
    a residual) and, with want_stats, mean (LayerNorm) and rstd (f32 [rows])."""
    rows, xs, px = _rows_ptr(x, cols)
    rs = pr = 0
    if residual is not None:
        _, rs, pr = _rows_ptr(residual, cols, "residual: ")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res_out = (torch.empty_like(x, memory_format=torch.contiguous_format)
               if residual is not None else None)
    mean = rstd = None
    if want_stats:
        rstd = x.new_empty(rows, dtype=torch.float32)  # on x's device
        if kind == "layernorm":
            mean = x.new_empty(rows, dtype=torch.float32)
    p = _norm._params(_norm.KINDS[kind], _norm.ACTIVATIONS[activation], rows, cols,
                      _DTYPE_IDS[x.dtype], px, xs, pr, rs,
                      0 if weight is None else weight.data_ptr(),
                      0 if bias is None else bias.data_ptr(), out.data_ptr(),
                      0 if res_out is None else res_out.data_ptr(),
                      0 if mean is None else mean.data_ptr(), 0 if rstd is None else rstd.data_ptr(),
                      eps)
    _call_or_fallback(x, _clib.fp_norm_forward, p)
    return out, res_out, mean, rstd


def _norm_backward(kind, activation, cols, g_out, s, weight, bias, mean, rstd, g_res, need_w,
                   need_b):
    """dx (shaped like s) and dweight / dbias (or None) via fp_norm_backward;
    s is the dense normalized input."""
    g_out = g_out.contiguous()  # every tensor whose pointer is passed stays referenced here
    dres = None if g_res is None else g_res.contiguous()
    rows = s.numel() // cols  # s was saved as a dense tensor
    dx = torch.empty_like(s, memory_format=torch.contiguous_format)
    dw = torch.empty_like(weight) if (need_w and weight is not None) else None
    db = torch.empty_like(bias) if (need_b and bias is not None) else None
    p = _norm._backward_params(_norm.KINDS[kind], _norm.ACTIVATIONS[activation], rows, cols,
                               _DTYPE_IDS[s.dtype], g_out.data_ptr(), s.data_ptr(), cols,
                               _ptr(weight), _ptr(bias), _ptr(mean), _ptr(rstd), _ptr(dres),
                               dx.data_ptr(), _ptr(dw), _ptr(db))
    _call(s, _clib.fp_norm_backward, p)
    return dx, dw, db


def _norm_vjp_torch(ctx, x, residual, weight, bias, g_out, g_res):
    """The norms' backward by differentiable torch ops, for a backward with
    create_graph (double backward): recomputes act(norm(x [+ residual]) *
    weight + bias) from the saved inputs, which keep their autograd history,
    and differentiates it with create_graph. Gradients, in the order of
    (x, residual, weight, bias), None where not needed."""
    need = ctx.needs_input_grad[:4] if residual is not None else (
        ctx.needs_input_grad[0], False) + tuple(ctx.needs_input_grad[1:3])
    cols = ctx.cols
    with torch.enable_grad():
        s = x + residual if residual is not None else x
        w = weight.reshape(cols) if weight is not None else None
        b = bias.reshape(cols) if bias is not None else None
        y = _torch_norm(ctx.kind, s.reshape(-1, cols), (cols,), w, b, ctx.eps)
        out = _TORCH_ACT[ctx.activation](y).reshape(s.shape)
        outs, grads = [], []
        for o, g in ((out, g_out), (s, g_res)):
            if g is not None and o.requires_grad:
                outs.append(o)
                grads.append(g)
        wrt = [t for t, n in zip((x, residual, weight, bias), need) if n]
        if not outs or not wrt:
            return (None,) * 4
        got = iter(torch.autograd.grad(outs, wrt, grads, create_graph=True, allow_unused=True))
    return tuple(next(got) if n else None for n in need)


class _NormFn(torch.autograd.Function):
    """out = act(norm(x) * weight + bias), backward by fp_norm_backward (by
    torch ops under create_graph, so that it is differentiable again)."""

    @staticmethod
    def forward(ctx, x, weight, bias, kind, activation, eps, cols):
        out, _, mean, rstd = _norm_forward_cols(kind, activation, x, None, weight, bias, eps, True,
                                                cols)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.kind, ctx.activation, ctx.cols, ctx.eps = kind, activation, cols, eps
        return out

    @staticmethod
    def backward(ctx, g_out):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: a differentiable backward
            dx, _, dw, db = _norm_vjp_torch(ctx, x, None, weight, bias, g_out, None)
            return dx, dw, db, None, None, None, None
        need = ctx.needs_input_grad
        dx, dw, db = _norm_backward(ctx.kind, ctx.activation, ctx.cols, g_out, x.contiguous(),
                                    weight, bias, mean, rstd, None, need[1], need[2])
        return (dx if need[0] else None), dw, db, None, None, None, None


class _AddNormFn(torch.autograd.Function):
    """(act(norm(x + residual) * weight + bias), x + residual)."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, kind, activation, eps, cols):
        out, s, mean, rstd = _norm_forward_cols(kind, activation, x, residual, weight, bias, eps,
                                                True, cols)
        # x and residual (inputs, no copies) for a differentiable backward
        ctx.save_for_backward(s, weight, bias, mean, rstd, x, residual)
        ctx.kind, ctx.activation, ctx.cols, ctx.eps = kind, activation, cols, eps
        # An unused output's gradient arrives as None, not as a zero tensor
        # the size of x (the residual sum is often not used by the loss).
        ctx.set_materialize_grads(False)
        return out, s

    @staticmethod
    def backward(ctx, g_out, g_res):
        s, weight, bias, mean, rstd, x, residual = ctx.saved_tensors
        if g_out is None and g_res is None:
            return None, None, None, None, None, None, None, None
        if torch.is_grad_enabled():  # create_graph: a differentiable backward
            return _norm_vjp_torch(ctx, x, residual, weight, bias, g_out, g_res) + (None,) * 4
        if g_out is None:  # only the residual sum reaches the loss
            g_out = torch.zeros_like(s)
        need = ctx.needs_input_grad
        dx, dw, db = _norm_backward(ctx.kind, ctx.activation, ctx.cols, g_out, s, weight, bias,
                                    mean, rstd, g_res, need[2], need[3])
        dxx = dx if need[0] else None
        dxr = dx if need[1] else None
        return dxx, dxr, dw, db, None, None, None, None


def _needs_grad(*ts):
    if not torch.is_grad_enabled():
        return False
    for t in ts:
        if t is not None and t.requires_grad:
            return True
    return False


def _run_norm(kind, x, shape, weight, bias, eps):
    if _compiling():
        return _compiled_norm(kind, x, None, weight, bias, eps, "none", shape)[0]
    why = _check_norm(x, shape, weight, bias, eps)
    if why is None:
        cols = math.prod(shape)
        try:
            if _needs_grad(x, weight, bias):
                y = _NormFn.apply(x, weight, bias, kind, "none", float(eps), cols)
            else:
                y = _norm_forward_cols(kind, "none", x, None, weight, bias, float(eps), False,
                                       cols)[0]
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
    """torch.nn.functional.rms_norm (eps None: as torch, the epsilon of the
    type the op computes in: float64's for float64 input, float32's for
    float32, float16 and bfloat16)."""
    if eps is None:
        eps = torch.finfo(torch.float64 if input.dtype == torch.float64 else torch.float32).eps
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
    if _compiling():
        return _compiled_norm(kind, x, residual, weight, bias, eps, act, shape)
    why = _check_norm(x, shape, weight, bias, eps, residual)
    if why is None:
        try:
            if residual is None:
                if _needs_grad(x, weight, bias):
                    out = _NormFn.apply(x, weight, bias, kind, act, float(eps), cols)
                else:
                    out = _norm_forward_cols(kind, act, x, None, weight, bias, float(eps), False,
                                             cols)[0]
                _ran()
                return out, x
            if _needs_grad(x, residual, weight, bias):
                out, s = _AddNormFn.apply(x, residual, weight, bias, kind, act, float(eps), cols)
            else:
                out, s, _, _ = _norm_forward_cols(kind, act, x, residual, weight, bias,
                                                  float(eps), False, cols)
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


def _bhsd_strides(t, n, h, s, d, cuda, what):
    """(batch, seq, head) strides of t seen as [n, h, s, d] (a 3-d t is [n, s,
    d]: one head) for the library (0 for extent-1 dimensions), or raises
    _Unsupported."""
    st = t.stride()
    if len(st) == 4:
        sb, sh, ss, sd = st
    else:
        sb, ss, sd = st
        sh = 0
    if sd != 1 and d > 1:
        raise _Unsupported(f"{what}: head_dim not contiguous")
    if (sb == 0 and n != 1) or (ss == 0 and s != 1) or (sh == 0 and h != 1):
        raise _Unsupported(f"{what}: broadcast (stride 0) dimension")
    # an extent-1 dimension: any stride (0 lets the library use the packed one)
    out = (0 if n == 1 else sb, 0 if s == 1 else ss, 0 if h == 1 else sh)
    if cuda:
        elt = t.element_size()
        if t.data_ptr() % 16 or (out[0] * elt) % 16 or (out[1] * elt) % 16 or (out[2] * elt) % 16:
            raise _Unsupported(f"{what}: not 16-byte aligned (pointer or strides)")
    return out


def _sdpa_fast(query, key, value, is_causal, scale, enable_gqa):
    """The library call for what it takes, else raises _Unsupported. Each
    tensor's shape and strides are read once, and 3-d inputs are taken as one
    head without unsqueezed views (the per-call cost: decode-sized calls are
    host-bound)."""
    if not _ATTN_AVAILABLE:
        raise _Unsupported("libfastpath built without attention")
    dt = query.dtype
    if dt not in _DTYPE_IDS:
        raise _Unsupported(f"dtype {dt} not supported")
    if key.dtype != dt or value.dtype != dt:
        raise _Unsupported("q, k, v dtypes differ")
    dev = query.device
    if not (query.is_cuda or query.is_cpu) or key.device != dev or value.device != dev:
        raise _Unsupported("device not supported or q, k, v on different devices")
    qshape, kshape = query.shape, key.shape
    nd = len(qshape)
    if nd not in (3, 4) or len(kshape) != nd or value.dim() != nd:
        raise _Unsupported("only 3-d or 4-d (batch, heads, seq, dim) inputs")
    if nd == 4:
        B, Hq, Lq, D = qshape
        Bk, Hkv, Lk, Dk = kshape
    else:  # (batch, seq, dim): one head
        B, Lq, D = qshape
        Bk, Lk, Dk = kshape
        Hq = Hkv = 1
    if value.shape != kshape or Bk != B or Dk != D:
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
    cuda = query.is_cuda
    qs = _bhsd_strides(query, B, Hq, Lq, D, cuda, "query")
    ks = _bhsd_strides(key, B, Hkv, Lk, D, cuda, "key")
    vs = _bhsd_strides(value, B, Hkv, Lk, D, cuda, "value")
    # The output in the library's packed (batch, seq, heads, dim) layout, seen
    # as (batch, heads, seq, dim), as PyTorch's flash backend returns it (the
    # strides of a transposed view, allocated so: no view made per call);
    # query's dtype and device.
    if nd == 4:
        o = query.new_empty_strided((B, Hq, Lq, D), (Lq * Hq * D, D, Hq * D, 1))
    else:
        o = query.new_empty((B, Lq, D))
    if cuda and o.data_ptr() % 16:
        raise _Unsupported("output not 16-byte aligned")
    p = _attn._params(B, Lq, Lk, Hq, Hkv, D, _DTYPE_IDS[dt], query.data_ptr(), qs,
                      key.data_ptr(), ks, value.data_ptr(), vs, o.data_ptr(), None, sm_scale,
                      causal, -1, window_right)
    _call_or_fallback(query, _clib.fp_attention_forward, p)
    return o


def _autocast_cast(query, key, value):
    """q, k, v as torch's autocast casts them for scaled_dot_product_attention
    (a lower-precision op on CPU and CUDA): floating tensors other than
    float64 to the autocast dtype of their device type, when it is enabled."""
    dev = query.device.type
    try:
        if not torch.is_autocast_enabled(dev):
            return query, key, value
        dt = torch.get_autocast_dtype(dev)
    except (TypeError, RuntimeError, AttributeError):  # a torch without per-device autocast queries
        return query, key, value
    return tuple(t.to(dt) if t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in (query, key, value))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention by libfastpath's flash
    attention for (batch, heads, seq, dim) (or (batch, seq, dim)) f16 / bf16 /
    f32 inputs with head_dim a multiple of 8 up to 256. attn_mask, dropout,
    gradients and other cases run torch's implementation (see the module
    counters). The result is a (batch, heads, seq, dim) view of a
    (batch, seq, heads, dim) buffer."""
    if _compiling():
        return _compiled_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    query, key, value = _autocast_cast(query, key, value)
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


# ---------------------------------------------------------------------------
# KV-cache attention (flash_attn_with_kvcache style)
# ---------------------------------------------------------------------------

def _kv_strides(t, what):
    """(dim0, seq, head) strides in elements of a 4-d [n, seq, heads, dim]
    tensor (0 for extent-1 dimensions: the library's packed value), or raises
    ValueError."""
    shape, stride = t.shape, t.stride()  # one call each (stride(dim) per dim cost more)
    if stride[3] != 1 and shape[3] > 1:
        raise ValueError(f"{what}: head_dim must be contiguous (stride(-1) == 1, got "
                         f"{stride[3]})")
    out = [0 if shape[0] == 1 else stride[0], 0 if shape[1] == 1 else stride[1],
           0 if shape[2] == 1 else stride[2]]
    for dim in (0, 1, 2):
        if out[dim] == 0 and shape[dim] != 1:
            raise ValueError(f"{what}: broadcast (stride 0) dimension {dim} is not supported")
    return out


def _int32_table(t, name, device, dims):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-d, got shape {tuple(t.shape)}")
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: last dimension must be contiguous")


def _check_attn_tensors(fn, names, q, k, v, fp8=False):
    """The checks attention_with_kvcache and attention_varlen share: tensors,
    one supported dtype (fp8: float8_e4m3fn too, or float8_e4m3fn k and v
    under a float16 / bfloat16 / float32 q, an fp8 KV cache) and device, no
    gradient. Returns q's device."""
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not _attn.available():
        raise RuntimeError("libfastpath was built without the attention capability")
    fp8 = fp8 and _FP8 is not None
    if q.dtype not in _DTYPES and not (fp8 and q.dtype == _FP8):
        raise TypeError(f"q dtype {q.dtype} not supported (float16, bfloat16, float32"
                        f"{', float8_e4m3fn' if fp8 else ''})")
    if (k.dtype != q.dtype or v.dtype != q.dtype) and not (
            fp8 and k.dtype == _FP8 and v.dtype == _FP8):  # q in _DTYPES: an fp8 KV cache
        raise TypeError(f"{', '.join(names)} dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}): "
                        + ("one dtype for all three, or float8_e4m3fn "
                           f"{names[1]} and {names[2]} (an fp8 KV cache) under a float16 / "
                           "bfloat16 / float32 q" if fp8 else "one dtype for all three"))
    dev = q.device
    if not _supported_device(q):
        raise ValueError(f"device {dev} not supported (cpu or cuda)")
    if k.device != dev or v.device != dev:
        raise ValueError(f"{', '.join(names)} on different devices ({dev}, {k.device}, {v.device})")
    if _needs_grad(q, k, v):
        raise ValueError(f"{fn} has no backward: inputs require grad "
                         "(use torch.no_grad() or detach them)")
    return dev


def _check_head_dims(D, Dk, Hq, Hkv, what):
    if Dk != D:
        raise ValueError(f"head_dim of q ({D}) and of {what} ({Dk}) differ")
    if D % 8 or not 8 <= D <= 256:
        raise ValueError(f"head_dim {D} not supported (a multiple of 8 in [8, 256])")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"heads_q ({Hq}) must be a multiple of heads_kv ({Hkv})")


def _mask_scale(window_size, causal, softmax_scale):
    """(window_left, window_right, scale for the library: 0 = default) from
    the FlashAttention-style arguments, or raises TypeError / ValueError."""
    if type(window_size) is tuple and len(window_size) == 2 and type(window_size[0]) is int \
            and type(window_size[1]) is int:  # the common call ((-1, -1) by default)
        wl, wr = window_size
    else:
        try:
            wl, wr = (int(w) for w in window_size)
        except (TypeError, ValueError):
            raise TypeError(f"window_size must be a pair of ints, got {window_size!r}") from None
    if wl < -1 or wr < -1:
        raise ValueError(f"window_size entries must be >= -1, got {window_size!r}")
    if causal:
        wr = 0
    sm_scale = 0.0
    if softmax_scale is not None:
        sm_scale = float(softmax_scale)
        if not (sm_scale > 0 and math.isfinite(sm_scale)):
            raise ValueError(f"softmax_scale must be > 0 and finite, got {softmax_scale!r}")
    return wl, wr, sm_scale


def _descale(x, name, fp8):
    """A descale argument as a float (None: 1.0): a Python real or a
    1-element CPU tensor (a CUDA tensor would need a synchronization to read).
    Other than 1 without fp8 inputs: ValueError. Its range (finite, > 0; 0
    means 1) is the library's check."""
    if x is None:
        return 1.0
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise TypeError(f"{name} is a tensor on {x.device}: reading it would synchronize; "
                            "pass a Python float (or a 1-element CPU tensor)")
        if x.numel() != 1:
            raise ValueError(f"{name} must hold one element, got shape {tuple(x.shape)}")
        x = float(x.item())
    elif isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}")
    else:
        x = float(x)
    if not fp8 and x != 1.0:
        raise ValueError(f"{name} = {x!r}: descales apply to float8_e4m3fn inputs only "
                         "(other dtypes take None or 1)")
    return x


def _forward_or_value_error(fn, q, p):
    """fp_attention_forward(p) on q's context; the library's argument errors
    as ValueError naming fn."""
    try:
        _call(q, _clib.fp_attention_forward, p)
    except fastpath.FastpathError as e:
        if e.status in (fastpath.Status.INVALID_ARGUMENT, fastpath.Status.UNSUPPORTED):
            raise ValueError(f"{fn}: {e.detail}") from None
        raise
    _ran()


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None,
                           softmax_scale=None, causal=False, window_size=(-1, -1),
                           return_lse=False, *, descale_q=None, descale_k=None, descale_v=None):
    """Decode / chunked-prefill attention of q against a KV cache, in the style
    of FlashAttention's flash_attn_with_kvcache (without appending new keys:
    write them into the cache first), by libfastpath's fp_attention_forward;
    fp8 inputs with per-tensor descales as FlashAttention-3's
    flash_attn_func(..., descale_q, descale_k, descale_v).

    q        [batch, seqlen_q, heads_q, head_dim]
    k_cache, v_cache
             dense [batch, seqlen_k, heads_kv, head_dim], or with block_table
             paged pools [num_pages, page_size, heads_kv, head_dim]
    cache_seqlens
             int32 [batch] (or a Python int for every sequence): keys of each
             sequence (clipped to the cache capacity); None = the whole cache
             (seqlen_k, or max_blocks * page_size when paged)
    block_table
             int32 [batch, max_blocks]: key j of sequence b is row j % page_size
             of page block_table[b, j // page_size]; pages in any order, shared
             pages allowed
    softmax_scale   None: 1 / sqrt(head_dim)
    causal   bottom-right aligned (query i sees keys j <= i + L - seqlen_q for
             a sequence of L keys), as flash_attn_with_kvcache; forces
             window_size[1] to 0
    window_size     (left, right) sliding window around that diagonal, -1 =
             unbounded
    descale_q, descale_k, descale_v   (keyword-only)
             with float8_e4m3fn q / k_cache / v_cache: the real value of a
             stored element is stored x descale (one per tensor); Python
             numbers or 1-element CPU tensors (a CUDA tensor is a TypeError:
             reading it would synchronize, pass a float; under torch.compile
             a tensor of any device is, as its value cannot become the
             operator's float argument), None = 1.0; finite and > 0 (the
             library's check: ValueError; 0 is taken as 1, as it does). With
             an fp8 KV cache (float8_e4m3fn k_cache / v_cache only)
             descale_k / descale_v likewise, descale_q None or 1 only (q is
             not fp8; else ValueError). With the other dtypes None or 1 only
             (else ValueError).
    Returns out [batch, seqlen_q, heads_q, head_dim] in q's dtype (an fp8 KV
    cache included), bfloat16 for float8_e4m3fn q / k_cache / v_cache (and
    with return_lse, lse [batch, heads_q, seqlen_q] float32, natural log, of
    the scores softmax_scale x descale_q x descale_k x q k^T). A query row
    that keeps no key (e.g. cache_seqlens 0) gets out = 0 and lse = -inf.

    Supported: CPU or CUDA tensors, all on one device; head_dim a multiple
    of 8 in [8, 256]; heads_q a multiple of heads_kv (GQA / MQA); dtypes:
      - q, k_cache, v_cache of one dtype among float16 / bfloat16 / float32;
      - all three float8_e4m3fn (when torch has it; FlashAttention-3's fp8
        forward, out bfloat16);
      - an fp8 KV cache (vLLM's kv_cache_dtype "fp8"): q float16 / bfloat16
        / float32 with k_cache and v_cache both float8_e4m3fn (e4m3 codes,
        real value stored x descale_k / descale_v), out in q's dtype, dense
        or paged;
      anything else (e.g. k_cache float8_e4m3fn with v_cache bfloat16) is a
      TypeError.
    Any strides with head_dim contiguous are passed without copies (e.g. q a
    slice of a fused QKV tensor); on CUDA pointers and strides must be
    16-byte aligned (16 elements of a float8_e4m3fn tensor). float8_e4m3fn
    q / k_cache / v_cache run every shape and option on the CPU; on CUDA
    only on Hopper (sm_90) at head_dim 128 with a dense cache (no
    block_table). An fp8 KV cache runs every shape and option on the CPU; on
    CUDA with a float16 / bfloat16 q at head_dim 64, 128 or 256 (compute
    capability 8.0 and up), dense or paged. Elsewhere the library refuses
    them, which raises ValueError as its other refusals do (no fallback).
    cache_seqlens and block_table are checked on the CPU; on CUDA they are
    not read back (no synchronization): an out-of-range value there gives an
    unspecified result for that sequence (never an access outside the
    cache). No
    autograd (inputs requiring grad are refused). Anything else raises
    TypeError (types, dtypes) or ValueError (shapes, strides, devices,
    values); there is no fallback to torch."""
    if _compiling():
        return _compiled_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal,
                                 window_size, return_lse, descale_q, descale_k, descale_v)
    dev = _check_attn_tensors("attention_with_kvcache", ("q", "k_cache", "v_cache"), q, k_cache, v_cache,
                              fp8=True)
    fp8 = q.dtype == _FP8  # all three (checked): descales, bf16 out
    kv8 = not fp8 and k_cache.dtype == _FP8  # k_cache and v_cache (checked): an fp8 KV cache
    if fp8 or kv8 or descale_q is not None or descale_k is not None or descale_v is not None:
        if kv8 and _descale(descale_q, "descale_q", True) != 1.0:
            raise ValueError(f"descale_q = {descale_q!r}: with an fp8 KV cache (float8_e4m3fn "
                             f"k_cache / v_cache, {q.dtype} q) q is not fp8: descale_q must be "
                             "None or 1 (descale_k / descale_v apply to the cache)")
        dq = 1.0 if kv8 else _descale(descale_q, "descale_q", fp8)
        dk = _descale(descale_k, "descale_k", fp8 or kv8)
        dv = _descale(descale_v, "descale_v", fp8 or kv8)
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError("q, k_cache, v_cache must be 4-d")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} "
                         "shapes differ")
    B, Lq, Hq, D = q.shape
    n0, n1, Hkv, Dk = k_cache.shape
    _check_head_dims(D, Dk, Hq, Hkv, "the cache")
    if n1 < 1 or (n0 < 1 and (block_table is not None or B > 0)):
        raise ValueError(f"empty KV cache {tuple(k_cache.shape)}")
    wl, wr, sm_scale = _mask_scale(window_size, causal, softmax_scale)

    paged = block_table is not None
    bt_kw = {}
    if paged:
        _int32_table(block_table, "block_table", dev, 2)
        if block_table.shape[0] != B:
            raise ValueError(f"block_table has {block_table.shape[0]} rows, batch is {B}")
        max_blocks = block_table.shape[1]
        if max_blocks < 1:
            raise ValueError("block_table has no columns")
        num_pages, page_size = n0, n1
        Lk = max_blocks * page_size
        bt_stride = block_table.stride(0) if B > 1 else max_blocks
        if bt_stride < max_blocks:
            raise ValueError("block_table rows overlap (row stride < columns)")
        bt_kw = dict(block_table=block_table.data_ptr(), block_table_stride=bt_stride,
                     page_size=page_size, num_pages=num_pages)
    else:
        if n0 != B:
            raise ValueError(f"dense cache batch ({n0}) differs from q's ({B})")
        Lk = n1

    seqlens = None
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, bool):
            raise TypeError("cache_seqlens must be an int or an int32 tensor")
        if isinstance(cache_seqlens, numbers.Integral):
            cache_seqlens = int(cache_seqlens)
            if not 0 <= cache_seqlens <= Lk:
                raise ValueError(f"cache_seqlens {cache_seqlens} outside [0, {Lk}]")
            if cache_seqlens > 0:
                # every sequence's keys [0, L): the library's seqlen_k (the
                # strides stay the cache's), no per-call tensor (and on CUDA
                # no fill kernel) as an int32 [batch] of L would need
                Lk = cache_seqlens
            else:  # no key (seqlen_k must be >= 1): every row gets 0 and lse -inf
                seqlens = torch.zeros((B,), dtype=torch.int32, device=dev)
        else:
            _int32_table(cache_seqlens, "cache_seqlens", dev, 1)
            if cache_seqlens.shape[0] != B:
                raise ValueError(f"cache_seqlens has {cache_seqlens.shape[0]} entries, batch is "
                                 f"{B}")
            if dev.type == "cpu" and B > 0:  # host memory: check it (no sync needed)
                lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
                if lo < 0 or hi > Lk:
                    raise ValueError(f"cache_seqlens values must lie in [0, {Lk}] (got "
                                     f"[{lo}, {hi}])")
            seqlens = cache_seqlens

    # q's dtype (fp8: bfloat16, strides in its elements; an fp8 KV cache: q's) and device
    out = q.new_empty((B, Lq, Hq, D), dtype=torch.bfloat16) if fp8 else q.new_empty((B, Lq, Hq, D))
    lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=dev) if return_lse else None
    if B == 0 or Lq == 0 or Hq == 0:
        return (out, lse) if return_lse else out
    qs, ks = _kv_strides(q, "q"), _kv_strides(k_cache, "k_cache")
    vs = _kv_strides(v_cache, "v_cache")
    # out is dense (batch, seq, heads, dim): the library's packed layout (os_ None)
    # strides are in each tensor's own elements (1 byte for float8_e4m3fn k_cache / v_cache)
    fp8_kw = (dict(q_descale=dq, k_descale=dk, v_descale=dv) if fp8 else
              dict(k_descale=dk, v_descale=dv, kv_dtype=_attn._FP8_E4M3) if kv8 else {})
    p = _attn._params(B, Lq, Lk, Hq, Hkv, D, _attn._FP8_E4M3 if fp8 else _DTYPE_IDS[q.dtype],
                      q.data_ptr(), qs, k_cache.data_ptr(), ks, v_cache.data_ptr(), vs,
                      out.data_ptr(), None, sm_scale, int(bool(causal)), wl, wr, lse=_ptr(lse),
                      seqlens_k=_ptr(seqlens), **bt_kw, **fp8_kw)
    _forward_or_value_error("attention_with_kvcache", q, p)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------
# Varlen attention (flash_attn_varlen_func style)
# ---------------------------------------------------------------------------

def _packed_strides(t, what):
    """(batch 0, seq, head) strides in elements of a 3-d [total, heads, dim]
    tensor (0 for an extent-1 dimension: the library's packed value), or
    raises ValueError."""
    shape, stride = t.shape, t.stride()
    if stride[2] != 1 and shape[2] > 1:
        raise ValueError(f"{what}: head_dim must be contiguous (stride(-1) == 1, got {stride[2]})")
    out = [0, 0 if shape[0] == 1 else stride[0], 0 if shape[1] == 1 else stride[1]]
    for dim in (0, 1):
        if out[dim + 1] == 0 and shape[dim] != 1:
            raise ValueError(f"{what}: broadcast (stride 0) dimension {dim} is not supported")
    return out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale=None, causal=False, window_size=(-1, -1), return_lse=False):
    """Attention over a batch of packed sequences of different lengths, in the
    style of FlashAttention's flash_attn_varlen_func (forward only), by
    libfastpath's fp_attention_forward.

    q        [total_q, heads_q, head_dim]: sequence b's queries are rows
             cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1
    k, v     [total_k, heads_kv, head_dim]: its keys rows cu_seqlens_k[b] ..
             cu_seqlens_k[b + 1] - 1 (total_k, k.shape[0], is passed to the
             library: on Hopper the TMA kernels need it)
    cu_seqlens_q, cu_seqlens_k
             int32 [batch + 1], non-decreasing, on q's device
    max_seqlen_q, max_seqlen_k
             ints >= 1: the longest sequence's queries / keys (a longer
             sequence is clipped to them)
    softmax_scale   None: 1 / sqrt(head_dim)
    causal   bottom-right aligned within each sequence (query i of a sequence
             of Lq queries and Lk keys sees keys j <= i + Lk - Lq), as
             flash_attn_varlen_func; forces window_size[1] to 0
    window_size     (left, right) sliding window around that diagonal, -1 =
             unbounded
    Returns out [total_q, heads_q, head_dim] in q's dtype (rows outside
    every sequence are left as torch.empty leaves them), and with
    return_lse lse [batch, heads_q, max_seqlen_q] float32 (natural log;
    positions past a sequence's queries unspecified). A query row that keeps
    no key gets out = 0 and lse = -inf.

    Supported: CPU or CUDA tensors on one device; q, k, v of one dtype among
    float16 / bfloat16 / float32; head_dim a multiple of 8 in [8, 256];
    heads_q a multiple of heads_kv; any strides with head_dim contiguous
    (e.g. slices of a fused QKV tensor), 16-byte aligned on CUDA; on CUDA the
    sequence stride of q must be its outermost. The offsets are checked on
    the CPU (within [0, total], non-decreasing, each length at most its
    maximum); on CUDA they are not read back (no synchronization) and must
    be right: an offset past the tensors is undefined behaviour there. No
    autograd (inputs requiring grad are refused). Anything else raises
    TypeError (types, dtypes) or ValueError (shapes, strides, devices,
    values); there is no fallback to torch."""
    if _compiling():
        return _compiled_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                softmax_scale, causal, window_size, return_lse)
    dev = _check_attn_tensors("attention_varlen", ("q", "k", "v"), q, k, v)
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("q, k, v must be 3-d [total, heads, head_dim]")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} shapes differ")
    total_q, Hq, D = q.shape
    total_k, Hkv, Dk = k.shape
    _check_head_dims(D, Dk, Hq, Hkv, "k")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or not 1 <= m <= _attn._INT_MAX:
            raise ValueError(f"{name} must be an int in [1, 2^31 - 1], got {m!r}")
    _int32_table(cu_seqlens_q, "cu_seqlens_q", dev, 1)
    _int32_table(cu_seqlens_k, "cu_seqlens_k", dev, 1)
    B = cu_seqlens_q.shape[0] - 1
    if B < 1 or cu_seqlens_k.shape[0] != B + 1:
        raise ValueError(f"cu_seqlens_q ({cu_seqlens_q.shape[0]}) and cu_seqlens_k "
                         f"({cu_seqlens_k.shape[0]}) must both hold batch + 1 >= 2 offsets")
    if dev.type == "cpu":  # host memory: check what the library cannot (the totals)
        for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, total_q),
                                ("cu_seqlens_k", cu_seqlens_k, total_k)):
            lo, hi = int(cu[0]), int(cu[-1])
            if lo < 0 or hi > total or bool((cu[1:] < cu[:-1]).any()):
                raise ValueError(f"{name} must be non-decreasing offsets within [0, {total}] "
                                 f"(got {lo} .. {hi})")
    wl, wr, sm_scale = _mask_scale(window_size, causal, softmax_scale)
    out = q.new_empty(total_q, Hq, D)
    lse = torch.empty((B, Hq, max_seqlen_q), dtype=torch.float32, device=dev) if return_lse else None
    if total_q == 0 or Hq == 0:
        return (out, lse) if return_lse else out
    if total_k == 0:  # no key anywhere (an empty k has no data pointer): every row keeps none
        out.zero_()
        if return_lse:
            lse.fill_(-math.inf)
        _ran()
        return (out, lse) if return_lse else out
    qs, ks = _packed_strides(q, "q"), _packed_strides(k, "k")
    vs, os_ = _packed_strides(v, "v"), _packed_strides(out, "out")
    p = _attn._params(B, int(max_seqlen_q), int(max_seqlen_k), Hq, Hkv, D, _DTYPE_IDS[q.dtype],
                      q.data_ptr(), qs, k.data_ptr(), ks, v.data_ptr(), vs, out.data_ptr(), os_,
                      sm_scale, int(bool(causal)), wl, wr, lse=_ptr(lse),
                      cu_seqlens_q=cu_seqlens_q.data_ptr(), cu_seqlens_k=cu_seqlens_k.data_ptr(),
                      total_k=total_k)
    _forward_or_value_error("attention_varlen", q, p)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------
# torch.compile: the drop-ins as custom operators
# ---------------------------------------------------------------------------
# Eager calls take the plain Python path above (the dispatcher of a custom
# operator costs more than the library call on small tensors). While Dynamo
# traces (torch.compile), the drop-ins emit the operators below instead: the
# ctypes call (data pointers) cannot be traced, so it would break the graph
# (fullgraph=True would refuse it) and keep the CUDA-graph modes out. The
# choice between libfastpath and torch is made at trace time from what the
# graph's guards fix (dtype, device, shapes, strides, requires_grad); a call
# the library still refuses at run time (CUDA alignment) runs torch's
# implementation inside the operator, laid out as the fake one says.
# attention_with_kvcache becomes fastpath::attention_kvcache, whose eager body
# makes every check when the graph runs (its errors surface then).

_COMPILE_OPS = hasattr(torch, "library") and hasattr(torch.library, "custom_op") and \
    hasattr(torch.library, "register_autograd") and hasattr(torch, "compiler") and \
    hasattr(torch.compiler, "is_compiling")


def _compiling():
    return _COMPILE_OPS and torch.compiler.is_compiling()


def _no_tensor(like, dtype=None):
    """The stand-in for an absent output (custom operators return tensors)."""
    return like.new_empty(0, dtype=dtype)


if _COMPILE_OPS:
    from typing import Optional, Tuple

    @torch.library.custom_op("fastpath::norm_fwd", mutates_args=())
    def _op_norm_fwd(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                     bias: Optional[torch.Tensor], kind: str, activation: str, eps: float, cols: int,
                     want_stats: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(out, x + residual or empty, mean or empty, rstd or empty) of the fused norm of a dense x."""
        out, s, mean, rstd = _norm_forward_cols(kind, activation, x, residual, weight, bias, eps,
                                                want_stats, cols)
        _ran()
        f32 = torch.float32
        return (out, s if s is not None else _no_tensor(x), mean if mean is not None else _no_tensor(x, f32),
                rstd if rstd is not None else _no_tensor(x, f32))

    @_op_norm_fwd.register_fake
    def _(x, residual, weight, bias, kind, activation, eps, cols, want_stats):
        rows = x.numel() // cols
        f32 = torch.float32
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        s = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else _no_tensor(x)
        mean = x.new_empty(rows, dtype=f32) if want_stats and kind == "layernorm" else _no_tensor(x, f32)
        rstd = x.new_empty(rows, dtype=f32) if want_stats else _no_tensor(x, f32)
        return out, s, mean, rstd

    @torch.library.custom_op("fastpath::norm_bwd", mutates_args=())
    def _op_norm_bwd(g_out: torch.Tensor, s: torch.Tensor, weight: Optional[torch.Tensor],
                     bias: Optional[torch.Tensor], mean: torch.Tensor, rstd: torch.Tensor,
                     g_res: Optional[torch.Tensor], kind: str, activation: str, cols: int, need_w: bool,
                     need_b: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dx, dweight or empty, dbias or empty) by fp_norm_backward; s is the dense normalized input."""
        dx, dw, db = _norm_backward(kind, activation, cols, g_out, s, weight, bias,
                                    mean if mean.numel() else None, rstd, g_res, need_w, need_b)
        return dx, dw if dw is not None else _no_tensor(s), db if db is not None else _no_tensor(s)

    @_op_norm_bwd.register_fake
    def _(g_out, s, weight, bias, mean, rstd, g_res, kind, activation, cols, need_w, need_b):
        dx = torch.empty_like(s, memory_format=torch.contiguous_format)
        dw = torch.empty_like(weight) if (need_w and weight is not None) else _no_tensor(s)
        db = torch.empty_like(bias) if (need_b and bias is not None) else _no_tensor(s)
        return dx, dw, db

    def _norm_fwd_setup(ctx, inputs, output):
        x, residual, weight, bias, kind, activation, eps, cols, want_stats = inputs
        out, s, mean, rstd = output
        ctx.mark_non_differentiable(mean, rstd)
        # the dense normalized input: the sum with a residual, else x (dense: see _compiled_norm)
        ctx.save_for_backward(s if residual is not None else x, weight, bias, mean, rstd)
        ctx.kind, ctx.activation, ctx.cols, ctx.residual = kind, activation, cols, residual is not None

    def _norm_fwd_backward(ctx, g_out, g_s, g_mean, g_rstd):
        s, weight, bias, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        if g_out is None:
            g_out = torch.zeros_like(s)
        g_res = g_s if (ctx.residual and g_s is not None and g_s.numel()) else None
        dx, dw, db = torch.ops.fastpath.norm_bwd(g_out.contiguous(), s, weight, bias, mean, rstd,
                                                 None if g_res is None else g_res.contiguous(), ctx.kind,
                                                 ctx.activation, ctx.cols, bool(need[2]), bool(need[3]))
        return (dx if need[0] else None, dx if (ctx.residual and need[1]) else None,
                dw if (need[2] and weight is not None) else None,
                db if (need[3] and bias is not None) else None, None, None, None, None, None)

    torch.library.register_autograd("fastpath::norm_fwd", _norm_fwd_backward, setup_context=_norm_fwd_setup)

    @torch.library.custom_op("fastpath::sdpa", mutates_args=())
    def _op_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool,
                 scale: Optional[float], enable_gqa: bool) -> torch.Tensor:
        """scaled_dot_product_attention (no mask, no dropout, no grad) in the fast path's layout."""
        try:
            out = _sdpa_fast(query, key, value, is_causal, scale, enable_gqa)
            _ran()
            return out
        except _Unsupported as e:
            _fallback(str(e))
        ref = _torch_sdpa(query, key, value, None, 0.0, is_causal, scale, enable_gqa)
        out = _sdpa_layout(query)
        out.copy_(ref)
        return out

    def _sdpa_layout(query):
        """An empty output as _sdpa_fast returns it: a (B, H, L, D) view of (B, L, H, D)."""
        if query.dim() == 3:
            return torch.empty_like(query, memory_format=torch.contiguous_format)
        B, H, L, D = query.shape
        return query.new_empty(B, L, H, D).transpose(1, 2)

    @_op_sdpa.register_fake
    def _(query, key, value, is_causal, scale, enable_gqa):
        return _sdpa_layout(query)


    @torch.library.custom_op("fastpath::attention_kvcache", mutates_args=())
    def _op_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cache_seqlens: Optional[torch.Tensor], cache_seqlen: int, block_table: Optional[torch.Tensor],
                    softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
                    return_lse: bool, descale_q: float = 1.0, descale_k: float = 1.0,
                    descale_v: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """attention_with_kvcache (cache_seqlen >= 0: one length for every sequence); lse empty unless asked;
        the descales of float8_e4m3fn inputs (1.0 with the other dtypes), out then bfloat16; with an fp8 KV
        cache (float8_e4m3fn k_cache / v_cache only) descale_k / descale_v, descale_q 1.0, out in q's dtype."""
        lens = cache_seqlens if cache_seqlens is not None else (cache_seqlen if cache_seqlen >= 0 else None)
        r = attention_with_kvcache(q, k_cache, v_cache, lens, block_table, softmax_scale, causal,
                                   (window_left, window_right), return_lse, descale_q=descale_q,
                                   descale_k=descale_k, descale_v=descale_v)
        return r if return_lse else (r, _no_tensor(q, torch.float32))

    @_op_kvcache.register_fake
    def _(q, k_cache, v_cache, cache_seqlens, cache_seqlen, block_table, softmax_scale, causal, window_left,
          window_right, return_lse, descale_q=1.0, descale_k=1.0, descale_v=1.0):
        B, Lq, Hq, D = q.shape
        lse = q.new_empty(B, Hq, Lq, dtype=torch.float32) if return_lse else _no_tensor(q, torch.float32)
        fp8 = _FP8 is not None and q.dtype == _FP8  # all three fp8: bf16 out; an fp8 KV cache: q's dtype
        return q.new_empty(B, Lq, Hq, D, dtype=torch.bfloat16 if fp8 else None), lse

    @torch.library.custom_op("fastpath::attention_varlen", mutates_args=())
    def _op_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                   softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
                   return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        """attention_varlen; lse empty unless asked."""
        r = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                             causal, (window_left, window_right), return_lse)
        return r if return_lse else (r, _no_tensor(q, torch.float32))

    @_op_varlen.register_fake
    def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
          window_right, return_lse):
        B, Hq = cu_seqlens_q.shape[0] - 1, q.shape[1]
        lse = q.new_empty(B, Hq, max_seqlen_q, dtype=torch.float32) if return_lse else _no_tensor(q, torch.float32)
        return q.new_empty(q.shape), lse


def _compiled_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_size, return_lse):
    """While Dynamo traces: fastpath::attention_varlen (the argument types
    checked here, the rest by the eager body when the graph runs)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError("q, k, v must be 3-d [total, heads, head_dim]")
    try:
        wl, wr = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints, got {window_size!r}") from None
    out, lse = torch.ops.fastpath.attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
        None if softmax_scale is None else float(softmax_scale), bool(causal), wl, wr, bool(return_lse))
    return (out, lse) if return_lse else out


def _compiled_descale(x, name):
    """A descale as the operator's float argument while Dynamo traces (None:
    1.0). A tensor is refused: a CUDA one would need a synchronization, and
    a CPU one's value (.item()) would break the graph or, under
    fullgraph=True, reach the operator as a symbolic float it cannot take."""
    if x is None:
        return 1.0
    if isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: pass a Python float under torch.compile, not a tensor on "
                        f"{x.device} (its value cannot be a float argument of the graph)")
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}")
    return float(x)


def _compiled_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal, window_size,
                      return_lse, descale_q=None, descale_k=None, descale_v=None):
    """While Dynamo traces: fastpath::attention_kvcache (the argument types
    checked here, the rest, descale values included, by the eager body when
    the graph runs)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError("q, k_cache, v_cache must be 4-d")
    try:
        wl, wr = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints, got {window_size!r}") from None
    lens_t, lens_i = None, -1
    if isinstance(cache_seqlens, torch.Tensor):
        lens_t = cache_seqlens
    elif cache_seqlens is not None:
        if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, numbers.Integral):
            raise TypeError("cache_seqlens must be an int or an int32 tensor")
        if cache_seqlens < 0:
            raise ValueError(f"cache_seqlens {cache_seqlens} is negative")
        lens_i = int(cache_seqlens)
    out, lse = torch.ops.fastpath.attention_kvcache(
        q, k_cache, v_cache, lens_t, lens_i, block_table,
        None if softmax_scale is None else float(softmax_scale), bool(causal), wl, wr, bool(return_lse),
        _compiled_descale(descale_q, "descale_q"), _compiled_descale(descale_k, "descale_k"),
        _compiled_descale(descale_v, "descale_v"))
    return (out, lse) if return_lse else out


def _compiled_norm(kind, x, residual, weight, bias, eps, act, shape):
    """While Dynamo traces: (out, s) by fastpath::norm_fwd where the library
    takes the call, else torch's ops (traced into the graph)."""
    why = _check_norm(x, shape, weight, bias, eps, residual)
    if why is None and x.numel() and x.is_contiguous() and (residual is None or residual.is_contiguous()):
        want = _needs_grad(x, residual, weight, bias)
        out, s, _, _ = torch.ops.fastpath.norm_fwd(x, residual, weight, bias, kind, act, float(eps),
                                                   math.prod(shape), want)
        return out, (s if residual is not None else x)
    s = x if residual is None else x + residual
    return _TORCH_ACT[act](_torch_norm(kind, s, shape, weight, bias, eps)), s


def _compiled_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """While Dynamo traces: fastpath::sdpa for what _sdpa_fast may take (its
    checks that need no data pointer), else torch's op."""
    ok = (attn_mask is None and dropout_p == 0.0 and not _needs_grad(query, key, value)
          and _attn.available() and query.dtype in _DTYPES and key.dtype == query.dtype
          and value.dtype == query.dtype and _supported_device(query) and key.device == query.device
          and value.device == query.device and query.dim() == key.dim() == value.dim()
          and query.dim() in (3, 4) and query.numel() and key.numel()
          and query.shape[-1] % 8 == 0 and 8 <= query.shape[-1] <= 256)
    if ok:
        return torch.ops.fastpath.sdpa(query, key, value, bool(is_causal),
                                       None if scale is None else float(scale), bool(enable_gqa))
    return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
