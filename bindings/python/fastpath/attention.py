"""Flash attention (include/fastpath/attention.h).

Raw layer: pointers are ints (ctx memory), tensors laid out
Q [batch, seqlen_q, heads_q, head_dim], K / V [batch, seqlen_k, heads_kv,
head_dim], O like Q, each with (batch, seq, head) strides in elements
(0 = packed; head_dim must be contiguous). A (batch, heads, seq, dim) tensor
is passed without a copy by giving its strides.

    fastpath.attention.forward(ctx, batch=B, seqlen_q=L, seqlen_k=S, heads_q=H,
                               heads_kv=H, head_dim=D, q=pq, k=pk, v=pv, o=po,
                               dtype="bf16", causal=True)

Array layer (CPU contexts, numpy): forward_arrays takes float arrays in
"bshd" (batch, seq, heads, dim) or "bhsd" layout and returns float32 arrays.

fp8 e4m3 inputs (FlashAttention-3's fp8 forward) go through the raw layer:
dtype="fp8e4m3" (FP_FP8_E4M3; also "float8_e4m3fn" or 3), q / k / v holding
e4m3 codes (1 byte), o bf16 (2 bytes, its strides in bf16 elements), and
q_descale / k_descale / v_descale (the real value of a stored element is
stored x descale; 0 = 1). fastpath.torch.attention_with_kvcache takes
float8_e4m3fn tensors (descale_q / descale_k / descale_v); the other
fastpath.torch drop-ins and forward_arrays do not take fp8 yet.

An fp8 KV cache (API 0.5, vLLM's kv_cache_dtype "fp8") likewise: dtype "f16",
"bf16" or "f32" for q and o, kv_dtype="fp8e4m3" for k / v (e4m3 codes, their
strides in their 1-byte elements), k_descale / v_descale applying to them and
q_descale 0 or 1. kv_dtype 0 (the default) means k / v have dtype.
fastpath.torch.attention_with_kvcache takes it as a float16 / bfloat16 /
float32 q with float8_e4m3fn k_cache and v_cache.
"""
import ctypes

import fastpath as _pkg  # the package: it imports this module after defining what is used here
from . import _lib
from ._lib import lib
from .norm import to_buffer, from_buffer, _np, _check_cpu

__all__ = ["available", "make_params", "forward", "forward_baseline", "validate", "flops",
           "forward_arrays", "last_kernel"]


def available():
    """True when libfastpath was built with the attention capability."""
    return _AVAILABLE


_AVAILABLE = _lib.has("fp_attention_forward")  # the loaded library never changes


def _need():
    if not _AVAILABLE:
        raise RuntimeError("libfastpath was built without the attention capability "
                           "(FASTPATH_MODULES must include 'attention')")


def _fp():
    return _pkg


_STRIDES = [f"{t}_{d}_stride" for t in "qkvo" for d in ("batch", "seq", "head")]

# Attention's own dtype names beyond fastpath.DTYPES: fp8 e4m3 is an input
# dtype of this op only (FP_FP8_E4M3, core.h), not a dtype of the package.
_FP8_E4M3 = 3
_OWN_DTYPES = {"fp8e4m3": _FP8_E4M3, "float8_e4m3fn": _FP8_E4M3, _FP8_E4M3: _FP8_E4M3}
_STRIDE_SET = frozenset(_STRIDES)


def _dtype_value(dtype):
    """The fp_dtype value of a dtype argument: a fastpath.DTYPES name, one of
    _OWN_DTYPES (fp8 e4m3), or an id."""
    d = _pkg.DTYPES.get(dtype) if type(dtype) is str else None
    if d is None:
        d = _OWN_DTYPES.get(dtype) if isinstance(dtype, (str, int)) else None
    return _pkg.dtype_id(dtype) if d is None else d


def _template():
    """A fresh fp_attention_params holding fp_attention_params_init's
    defaults (run once, then copied: this runs on every call of the PyTorch
    drop-ins)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        # fp_attention_params_default is a macro over fp_attention_params_init
        # (the exported symbol of that name writes the 0.1 layout): pass the
        # mirror's size, which the library refuses unless it knows it.
        p = _lib.AttentionParams()
        if lib.fp_attention_params_init(ctypes.byref(p), ctypes.sizeof(p)) != 0:
            raise RuntimeError(f"AttentionParams: ctypes size {ctypes.sizeof(p)} is not a size "
                               "this libfastpath accepts: bindings and libfastpath are out of "
                               "sync")
        _TEMPLATE = bytes(p)
    return _lib.AttentionParams.from_buffer_copy(_TEMPLATE)


_TEMPLATE = None


def make_params(*, batch, seqlen_q, seqlen_k, heads_q, head_dim, q, k, v, o, heads_kv=None,
                dtype="bf16", softmax_scale=0.0, causal=False, window_left=-1, window_right=-1,
                lse=None, seqlens_k=None, cu_seqlens_q=None, cu_seqlens_k=None, total_k=0,
                block_table=None, block_table_stride=0, page_size=0, num_pages=0, q_descale=0.0,
                k_descale=0.0, v_descale=0.0, kv_dtype=0, **strides):
    """An fp_attention_params from keyword arguments: the shape, the q, k, v, o
    pointers, dtype, softmax_scale (0 or None: 1/sqrt(head_dim)), causal,
    window_left / window_right (-1: unbounded), lse (f32 [batch, heads_q,
    seqlen_q]), seqlens_k (int32 [batch]), cu_seqlens_q / cu_seqlens_k (int32
    [batch+1]) pointers, total_k (with them: the rows of the packed k / v,
    k.shape[0] of a [total_k, heads_kv, head_dim] tensor; on Hopper the TMA
    kernels need it for varlen calls), a paged KV cache (block_table: int32 [batch,
    block_table_stride] pointer, page_size, num_pages; k and v are then pools
    [num_pages, page_size, heads_kv, head_dim]), q_descale / k_descale /
    v_descale (fp8 inputs, dtype "fp8e4m3": see the module's docstring; 0 =
    1, other dtypes 0 or 1), kv_dtype (k's and v's dtype: 0 or None, the
    default, = dtype; "fp8e4m3" with dtype f16 / bf16 / f32 = an fp8 KV cache,
    k_descale / v_descale then apply and q_descale is 0 or 1), and any of
    q_batch_stride, q_seq_stride, q_head_stride (likewise k_, v_, o_) in
    elements (k_ and v_ in kv_dtype's)."""
    _need()
    fp = _pkg
    if not _STRIDE_SET.issuperset(strides):
        raise TypeError(f"unknown argument(s) {sorted(set(strides) - _STRIDE_SET)}")
    p = _template()
    _lib.set_ints(p, batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q,
                  heads_kv=heads_q if heads_kv is None else heads_kv, head_dim=head_dim,
                  window_left=window_left, window_right=window_right,
                  block_table_stride=block_table_stride, page_size=page_size, num_pages=num_pages,
                  total_k=total_k or 0, **strides)
    p.dtype = _dtype_value(dtype)
    if kv_dtype is None or (type(kv_dtype) is int and kv_dtype == 0):
        p.kv_dtype = 0
    else:
        kvd = _dtype_value(kv_dtype)
        if kvd == 0 and p.dtype != 0:
            # FP_F32 is 0, which the library reads as "dtype itself"
            raise ValueError(f"kv_dtype {kv_dtype!r} with dtype {dtype!r}: K / V in f32 under "
                             "16-bit Q is not a mode of the library (kv_dtype: 0, dtype or "
                             "fp8e4m3)")
        p.kv_dtype = kvd
    p.q_descale, p.k_descale, p.v_descale = float(q_descale), float(k_descale), float(v_descale)
    opt_ptr = fp._opt_ptr
    p.q, p.k, p.v, p.o = opt_ptr(q), opt_ptr(k), opt_ptr(v), opt_ptr(o)
    p.softmax_scale = float(softmax_scale or 0.0)
    p.causal = int(bool(causal))
    p.lse = opt_ptr(lse)
    p.seqlens_k = opt_ptr(seqlens_k)
    p.cu_seqlens_q, p.cu_seqlens_k = opt_ptr(cu_seqlens_q), opt_ptr(cu_seqlens_k)
    p.block_table = opt_ptr(block_table)
    return p


_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


def _params(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, q, qs, k, ks, v, vs, o,
            os_, softmax_scale, causal, window_left, window_right, lse=0, seqlens_k=0,
            block_table=0, block_table_stride=0, page_size=0, num_pages=0, cu_seqlens_q=0,
            cu_seqlens_k=0, total_k=0, q_descale=0.0, k_descale=0.0, v_descale=0.0,
            kv_dtype=0):
    """make_params for callers whose arguments are known good (fastpath.torch,
    on every call): dtype an id, pointers ints (0 = NULL), strides (batch,
    seq, head) triples of int64 ints (os_ None: packed), softmax_scale a
    float, causal 0 / 1, descales floats, kv_dtype an id (0: dtype). The
    same struct as make_params, filled in one pack_into (reserved_0_4 packed
    as 0). The int fields are range-checked in one go; one out of range goes
    through make_params for its error naming the argument (total_k: an int64
    the caller keeps in range)."""
    if not (_INT_MIN <= min(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, window_left,
                            window_right, block_table_stride, page_size, num_pages)
            and max(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, window_left,
                    window_right, block_table_stride, page_size, num_pages) <= _INT_MAX):
        strides = dict(zip(_STRIDES, (*qs, *ks, *vs, *(os_ or (0, 0, 0)))))
        return make_params(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q,
                           heads_kv=heads_kv, head_dim=head_dim, dtype=dtype, q=q, k=k, v=v, o=o,
                           softmax_scale=softmax_scale, causal=causal, window_left=window_left,
                           window_right=window_right, lse=lse, seqlens_k=seqlens_k,
                           block_table=block_table, block_table_stride=block_table_stride,
                           page_size=page_size, num_pages=num_pages, cu_seqlens_q=cu_seqlens_q,
                           cu_seqlens_k=cu_seqlens_k, total_k=total_k, q_descale=q_descale,
                           k_descale=k_descale, v_descale=v_descale, kv_dtype=kv_dtype,
                           **strides)
    global _PACKER
    if _PACKER is None:
        _PACKER = (_template().struct_size, _lib.struct_packer(_lib.AttentionParams))
    size, packer = _PACKER
    p = _lib.AttentionParams()
    packer.pack_into(p, 0, size, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype,
                     q, *qs, k, *ks, v, *vs, o, *(os_ or (0, 0, 0)), _f32(softmax_scale), causal,
                     window_left, window_right, lse, seqlens_k, cu_seqlens_q, cu_seqlens_k,
                     block_table, block_table_stride, page_size, num_pages, total_k,
                     _f32(q_descale), _f32(k_descale), _f32(v_descale), 0, kv_dtype)
    return p


def _f32(v):
    """A float field's value as ctypes.c_float(v).value gives it (which
    pack_into would refuse where ctypes stores inf); 0 and 1, the defaults,
    as they are (exact in float32)."""
    return v if v == 0.0 or v == 1.0 else ctypes.c_float(v).value


_PACKER = None


def forward(ctx, *, stream=None, **kw):
    """fp_attention_forward (flash attention on CUDA, tiled on CPU).
    Asynchronous on a CUDA context (stream: a CUDA stream handle as an int, or
    None for the context's default stream). Keywords: see make_params."""
    p = make_params(**kw)
    _pkg.check(lib.fp_attention_forward(ctx.handle, stream, p))


def forward_baseline(ctx, *, stream=None, **kw):
    """fp_attention_forward_baseline: the materialized-scores version."""
    p = make_params(**kw)
    _fp().check(lib.fp_attention_forward_baseline(ctx.handle, stream, ctypes.byref(p)))


def validate(ctx, *, stream=None, max_time_s=None, min_samples=None, flush_l2=False, **kw):
    """fp_attention_validate: baseline vs flash on kw's inputs (o and lse are
    not written, but o must be given), timed A/B. Returns the report as a dict."""
    p = make_params(**kw)
    fp = _fp()
    cfg = fp._config(max_time_s, min_samples, flush_l2)
    rep = _lib.ABReport()
    fp.check(lib.fp_attention_validate(ctx.handle, stream, ctypes.byref(p), ctypes.byref(cfg),
                                       ctypes.byref(rep)))
    return fp._ab_report_dict(rep)


def flops(**kw):
    """FLOPs counted for the shape (4 B Hq Lq Lk D, halved with causal)."""
    for t in "qkvo":
        kw.setdefault(t, None)
    return lib.fp_attention_flops(ctypes.byref(make_params(**kw)))


def last_kernel():
    """What the calling thread's last attention call ran (fp_attention_last_kernel):
    a dict with "kernel" ("flash_v1".."flash_v10", "rowwise", "cpu" or "none"),
    "version", "num_splits" (> 1: split-KV + combine), "paged", "preferred" (the
    context's FP_CTX_ATTENTION_KERNEL) and "fallback" (why the preferred version
    did not run, "" if it did). The drop-ins in fastpath.torch call from the
    caller's thread, so this describes the latest drop-in call too."""
    _need()
    if not _lib.has("fp_attention_last_kernel"):
        raise RuntimeError("this libfastpath predates fp_attention_last_kernel")
    info = _lib.AttentionKernelInfo()
    _pkg.check(lib.fp_attention_last_kernel(ctypes.byref(info)))
    return {"kernel": (info.kernel or b"none").decode(), "version": info.version,
            "num_splits": info.num_splits, "paged": bool(info.paged), "preferred": info.preferred,
            "fallback": info.fallback.decode(errors="replace")}


# ---------------------------------------------------------------------------
# numpy layer (CPU contexts)
# ---------------------------------------------------------------------------

def _view_strides(a, layout):
    """(batch, seq, head) strides in elements of a 4-d array in layout, and
    its (batch, seq, heads, dim) sizes."""
    es = a.itemsize
    if any(s % es for s in a.strides):
        raise ValueError("array strides must be multiples of the element size")
    st = [s // es for s in a.strides]
    if layout == "bshd":
        b, s, h, d = a.shape
        bs, ss, hs, ds = st
    elif layout == "bhsd":
        b, h, s, d = a.shape
        bs, hs, ss, ds = st
    else:
        raise ValueError(f"layout must be 'bshd' or 'bhsd', got {layout!r}")
    if ds != 1 and d > 1:
        raise ValueError("head_dim must be contiguous (last stride == element size)")
    # An extent-1 dimension's stride does not matter: 0 lets the library use
    # the packed value (which also meets its alignment rules).
    bs, ss, hs = (0 if n == 1 else x for n, x in ((b, bs), (s, ss), (h, hs)))
    if 0 in [x for n, x in ((b, bs), (s, ss), (h, hs)) if n > 1]:
        raise ValueError("broadcast (stride 0) dimensions are not supported")
    return (b, s, h, d), (bs, ss, hs)


def forward_arrays(ctx, q, k, v, *, layout="bshd", dtype="f32", causal=False, scale=None,
                   window_left=-1, window_right=-1, seqlens_k=None, want_lse=False):
    """Attention on numpy arrays (CPU context). q: [B, Lq, Hq, D] ("bshd") or
    [B, Hq, Lq, D] ("bhsd"), k / v likewise with Hkv heads. Arrays already in
    the storage type of dtype (float32 for f32, float16 for f16, uint16 bits
    for bf16) are passed with their own strides, without copies; others are
    converted (C-contiguous in the same layout). Returns float32 O in the
    layout of q (and lse [B, Hq, Lq] with want_lse)."""
    np = _np()
    _check_cpu(ctx)
    store = {0: np.float32, 1: np.float16, 2: np.uint16}[_fp().dtype_id(dtype)]

    def prep(a):
        a = np.asarray(a)
        if a.ndim != 4:
            raise ValueError("q, k, v must be 4-d")
        if a.dtype == store and a.strides[-1] == a.itemsize:
            return a
        return to_buffer(a, dtype)

    qb, kb, vb = prep(q), prep(k), prep(v)
    (B, Lq, Hq, D), qs = _view_strides(qb, layout)
    (Bk, Lk, Hkv, Dk), ks = _view_strides(kb, layout)
    vshape, vs = _view_strides(vb, layout)
    if Bk != B or Dk != D or vshape != (Bk, Lk, Hkv, Dk):
        raise ValueError("q, k, v shapes disagree")
    ob = np.empty((B, Lq, Hq, D) if layout == "bshd" else (B, Hq, Lq, D), dtype=store)
    _, os_ = _view_strides(ob, layout)
    lse = np.empty((B, Hq, Lq), np.float32) if want_lse else None
    sk = None
    if seqlens_k is not None:
        sk = np.ascontiguousarray(seqlens_k, dtype=np.int32)
        if sk.shape != (B,):  # read as int32 [batch] through a raw pointer
            raise ValueError(f"seqlens_k has shape {sk.shape}, expected ({B},)")
    strides = {}
    for t, s in (("q", qs), ("k", ks), ("v", vs), ("o", os_)):
        strides[f"{t}_batch_stride"], strides[f"{t}_seq_stride"], strides[f"{t}_head_stride"] = s
    forward(ctx, batch=B, seqlen_q=Lq, seqlen_k=Lk, heads_q=Hq, heads_kv=Hkv, head_dim=D,
            q=qb.ctypes.data, k=kb.ctypes.data, v=vb.ctypes.data, o=ob.ctypes.data, dtype=dtype,
            softmax_scale=scale or 0.0, causal=causal, window_left=window_left,
            window_right=window_right, lse=None if lse is None else lse.ctypes.data,
            seqlens_k=None if sk is None else sk.ctypes.data, **strides)
    o = from_buffer(ob, dtype)
    return (o, lse) if want_lse else o
