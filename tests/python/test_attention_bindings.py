"""fastpath.attention on a CPU context with numpy arrays, against a float64
numpy reference (bottom-right aligned masks, GQA, windows, seqlens_k), in f32
and converted f16 / bf16, with (batch, heads, seq, dim) views passed by strides."""
import ctypes
import math

import pytest

np = pytest.importorskip("numpy")

import fastpath  # noqa: E402
from fastpath import _lib, attention, norm  # noqa: E402

pytestmark = pytest.mark.skipif(not attention.available(),
                                reason="built without the attention capability")

TOL = {"f32": 1e-5, "f16": 3e-3, "bf16": 2.5e-2}  # absolute, for |V| ~ 1


@pytest.fixture(scope="module")
def ctx():
    with fastpath.Context("cpu") as c:
        yield c


def quant(a, dtype):
    return norm.from_buffer(norm.to_buffer(a, dtype), dtype).astype(np.float64)


def ref_attention(q, k, v, causal=False, scale=None, window_left=-1, window_right=-1, seqlens_k=None):
    """q [B, Lq, Hq, D], k / v [B, Lk, Hkv, D] (float64); returns O, lse."""
    B, Lq, Hq, D = q.shape
    Lk, Hkv = k.shape[1], k.shape[2]
    scale = scale or 1 / math.sqrt(D)
    if causal:
        window_right = 0
    o = np.zeros((B, Lq, Hq, D))
    lse = np.full((B, Hq, Lq), -np.inf)
    for b in range(B):
        L = Lk if seqlens_k is None else min(max(int(seqlens_k[b]), 0), Lk)
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            s = scale * q[b, :, h, :] @ k[b, :L, hk, :].T  # [Lq, L]
            i = np.arange(Lq)[:, None] + (L - Lq)
            j = np.arange(L)[None, :]
            keep = np.ones_like(s, dtype=bool)
            if window_right >= 0:
                keep &= j <= i + window_right
            if window_left >= 0:
                keep &= j >= i - window_left
            s = np.where(keep, s, -np.inf)
            for r in range(Lq):
                if not keep[r].any():
                    continue
                m = s[r].max()
                p = np.exp(s[r] - m)
                lse[b, h, r] = m + math.log(p.sum())
                o[b, r, h] = (p / p.sum()) @ v[b, :L, hk, :]
    return o, lse


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_struct_layout_matches_the_library():
    # the exported fp_attention_params_default is the 0.1 entry point: it
    # writes the 0.1 layout (ending at cu_seqlens_k) and nothing past it
    raw = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(("fp_attention_params_default", _lib.lib))
    assert _lib.c_struct_size(raw) == _lib.AttentionParams.block_table.offset
    v1 = _lib.AttentionParams.block_table.offset
    buf = ctypes.create_string_buffer(b"\x7b" * 512, 512)
    raw(ctypes.cast(buf, ctypes.c_void_p))
    assert buf.raw[v1:] == b"\x7b" * (512 - v1)
    p = _lib.AttentionParams()
    assert _lib.lib.fp_attention_params_init(ctypes.byref(p), ctypes.sizeof(p) + 8) != 0
    assert _lib.lib.fp_attention_params_init(ctypes.byref(p), ctypes.sizeof(p)) == 0
    assert p.struct_size == ctypes.sizeof(_lib.AttentionParams)
    p = attention.make_params(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, head_dim=8,
                              q=None, k=None, v=None, o=None)
    assert p.window_left == -1 and p.window_right == -1 and p.causal == 0


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_reference(ctx, dtype, causal):
    rng = np.random.default_rng(10)
    q, k, v = rand(rng, 2, 37, 4, 32), rand(rng, 2, 45, 2, 32), rand(rng, 2, 45, 2, 32)  # GQA 4:2
    o, lse = attention.forward_arrays(ctx, q, k, v, dtype=dtype, causal=causal, want_lse=True)
    ro, rl = ref_attention(quant(q, dtype), quant(k, dtype), quant(v, dtype), causal=causal)
    assert o.shape == q.shape
    assert np.abs(o - ro).max() <= TOL[dtype]
    assert np.abs(lse - rl).max() <= max(TOL[dtype], 1e-4)


def test_bhsd_views_by_strides_without_copies(ctx):
    rng = np.random.default_rng(11)
    # PyTorch's (batch, heads, seq, dim) layout as a view of a packed
    # (batch, seq, heads, dim) buffer, and a slice of a fused QKV tensor.
    qkv = rand(rng, 2, 33, 3, 4, 16)  # [B, L, 3, H, D]
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # [B, H, L, D] views
    assert not q.flags.c_contiguous and np.shares_memory(q, qkv)
    o = attention.forward_arrays(ctx, q, k, v, layout="bhsd", causal=True, scale=0.3)
    ro, _ = ref_attention(*(t.transpose(0, 2, 1, 3).astype(np.float64) for t in (q, k, v)),
                          causal=True, scale=0.3)
    assert o.shape == q.shape
    assert np.abs(o.transpose(0, 2, 1, 3) - ro).max() <= TOL["f32"]


def test_bf16_bhsd_converted(ctx):
    rng = np.random.default_rng(12)
    q, k, v = rand(rng, 1, 2, 20, 64), rand(rng, 1, 2, 50, 64), rand(rng, 1, 2, 50, 64)
    o = attention.forward_arrays(ctx, q, k, v, layout="bhsd", dtype="bf16")
    ro, _ = ref_attention(*(quant(t, "bf16").transpose(0, 2, 1, 3) for t in (q, k, v)))
    assert np.abs(o.transpose(0, 2, 1, 3) - ro).max() <= TOL["bf16"]


def test_window_and_seqlens_k(ctx):
    rng = np.random.default_rng(13)
    q, k, v = rand(rng, 3, 4, 2, 16), rand(rng, 3, 30, 2, 16), rand(rng, 3, 30, 2, 16)
    sk = np.array([30, 11, 1], np.int32)
    o = attention.forward_arrays(ctx, q, k, v, seqlens_k=sk, window_left=5, window_right=0)
    ro, _ = ref_attention(*(t.astype(np.float64) for t in (q, k, v)), seqlens_k=sk,
                          window_left=5, window_right=0)
    assert np.abs(o - ro).max() <= TOL["f32"]


def test_causal_row_without_keys_is_zero(ctx):
    rng = np.random.default_rng(14)
    q, k, v = rand(rng, 1, 6, 1, 8), rand(rng, 1, 3, 1, 8), rand(rng, 1, 3, 1, 8)
    o, lse = attention.forward_arrays(ctx, q, k, v, causal=True, want_lse=True)
    assert (o[0, :3] == 0).all() and np.isneginf(lse[0, 0, :3]).all()
    ro, _ = ref_attention(*(t.astype(np.float64) for t in (q, k, v)), causal=True)
    assert np.abs(o - ro).max() <= TOL["f32"]


def test_baseline_and_validate(ctx):
    rng = np.random.default_rng(15)
    B, L, H, D = 1, 64, 2, 32
    q, k, v = rand(rng, B, L, H, D), rand(rng, B, L, H, D), rand(rng, B, L, H, D)
    o = np.full_like(q, np.nan)
    shape = dict(batch=B, seqlen_q=L, seqlen_k=L, heads_q=H, head_dim=D, dtype="f32",
                 q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data)
    attention.forward_baseline(ctx, o=o.ctypes.data, causal=True, **shape)
    ro, _ = ref_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal=True)
    assert np.abs(o - ro).max() <= TOL["f32"]
    o2 = np.full_like(q, np.nan)
    rep = attention.validate(ctx, o=o2.ctypes.data, causal=True, max_time_s=0.2, **shape)
    assert np.isnan(o2).all()  # validate writes only its scratch
    assert rep["agreement"]["passed"] and rep["speedup"] > 0
    assert attention.flops(causal=True, batch=B, seqlen_q=L, seqlen_k=L, heads_q=H,
                           head_dim=D) == pytest.approx(4 * B * H * L * L * D / 2)


def test_bad_input_is_invalid_argument(ctx):
    q = np.ones((1, 4, 2, 16), np.float32)
    o = np.full_like(q, 5.0)
    base = dict(batch=1, seqlen_q=4, seqlen_k=4, heads_q=2, heads_kv=2, head_dim=16, dtype="f32",
                q=q.ctypes.data, k=q.ctypes.data, v=q.ctypes.data, o=o.ctypes.data)

    def bad(**kw):
        with pytest.raises(fastpath.FastpathError) as e:
            attention.forward(ctx, **{**base, **kw})
        assert e.value.status == fastpath.Status.INVALID_ARGUMENT
        assert e.value.detail

    bad(head_dim=12)
    bad(heads_kv=3)
    bad(batch=0)
    bad(k=None)
    bad(softmax_scale=-1.0)
    bad(causal=True, window_right=2)
    bad(q_seq_stride=4)  # rows of 16 elements overlap
    assert (o == 5.0).all()
    with pytest.raises(TypeError):
        attention.forward(ctx, **base, q_stride=3)


def test_seqlens_k_length_must_match_batch(ctx):
    # seqlens_k is read as int32 [batch] through a raw pointer: a shorter
    # array was read past its end.
    rng = np.random.default_rng(15)
    q, k, v = rand(rng, 3, 4, 2, 16), rand(rng, 3, 30, 2, 16), rand(rng, 3, 30, 2, 16)
    with pytest.raises(ValueError, match="seqlens_k"):
        attention.forward_arrays(ctx, q, k, v, seqlens_k=np.array([30], np.int32))


def test_paged_kv_cache(ctx):
    # K/V scattered over shuffled pages of a pool through a block table: the
    # same result as the dense cache; a table entry out of range is refused.
    rng = np.random.default_rng(16)
    B, Lq, Hq, Hkv, D, Lk, page = 3, 2, 4, 2, 16, 45, 8
    q, k, v = rand(rng, B, Lq, Hq, D), rand(rng, B, Lk, Hkv, D), rand(rng, B, Lk, Hkv, D)
    sk = np.array([45, 9, 30], np.int32)
    per_seq = -(-Lk // page)
    num_pages = B * per_seq + 2
    perm = rng.permutation(num_pages).astype(np.int32)
    table = perm[:B * per_seq].reshape(B, per_seq).copy()
    k_pool = np.full((num_pages, page, Hkv, D), np.nan, np.float32)
    v_pool = np.full_like(k_pool, np.nan)
    for b in range(B):
        for j in range(sk[b]):
            k_pool[table[b, j // page], j % page] = k[b, j]
            v_pool[table[b, j // page], j % page] = v[b, j]
    o = np.full_like(q, np.nan)
    kw = dict(batch=B, seqlen_q=Lq, seqlen_k=Lk, heads_q=Hq, heads_kv=Hkv, head_dim=D, dtype="f32",
              causal=True, q=q.ctypes.data, k=k_pool.ctypes.data, v=v_pool.ctypes.data,
              o=o.ctypes.data, seqlens_k=sk.ctypes.data, block_table=table.ctypes.data,
              block_table_stride=per_seq, page_size=page, num_pages=num_pages)
    attention.forward(ctx, **kw)
    ro, _ = ref_attention(*(t.astype(np.float64) for t in (q, k, v)), causal=True, seqlens_k=sk)
    assert np.abs(o - ro).max() <= TOL["f32"]
    table[1, 0] = num_pages  # sequence 1 uses its first page
    o[:] = 7.0
    with pytest.raises(fastpath.FastpathError) as e:
        attention.forward(ctx, **kw)
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT and "block_table" in e.value.detail
    assert (o == 7.0).all()


def test_varlen_with_total_k(ctx):
    # packed sequences through cu_seqlens, total_k = the rows of the packed
    # k / v (what Hopper's TMA kernels need on a GPU): each sequence's result
    # is attention over its own rows; total_k below cu_seqlens_k[batch], or
    # without cu_seqlens, is refused before anything is written
    rng = np.random.default_rng(17)
    Hq, Hkv, D = 4, 2, 16
    lq, lk = [5, 0, 9], [7, 3, 12]
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    spare = 4  # rows past the last sequence (capacity): never read into a result
    q = rand(rng, int(cu_q[-1]), Hq, D)
    k, v = rand(rng, int(cu_k[-1]) + spare, Hkv, D), rand(rng, int(cu_k[-1]) + spare, Hkv, D)
    k[cu_k[-1]:] = np.nan
    v[cu_k[-1]:] = np.nan
    o = np.full_like(q, np.nan)
    kw = dict(batch=3, seqlen_q=max(lq), seqlen_k=max(lk), heads_q=Hq, heads_kv=Hkv, head_dim=D,
              dtype="f32", causal=True, q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data,
              o=o.ctypes.data, cu_seqlens_q=cu_q.ctypes.data, cu_seqlens_k=cu_k.ctypes.data,
              total_k=k.shape[0])
    attention.forward(ctx, **kw)
    for b in (0, 2):  # sequence 1 has no queries
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ro, _ = ref_attention(*(t[None, s].astype(np.float64) for t, s in ((q, qs), (k, ks), (v, ks))),
                              causal=True)
        assert np.abs(o[qs] - ro[0]).max() <= TOL["f32"]
    o[:] = 7.0
    for bad_kw in (dict(total_k=int(cu_k[-1]) - 1), dict(total_k=-1)):
        with pytest.raises(fastpath.FastpathError) as e:
            attention.forward(ctx, **{**kw, **bad_kw})
        assert e.value.status == fastpath.Status.INVALID_ARGUMENT and "total_k" in e.value.detail
    with pytest.raises(fastpath.FastpathError) as e:
        attention.forward(ctx, **{**kw, "cu_seqlens_q": None, "cu_seqlens_k": None})
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT and "total_k" in e.value.detail
    assert (o == 7.0).all()


def e4m3_decode(codes):
    """float64 values of fp8 e4m3 codes (uint8): this test's own decoder
    (S.EEEE.MMM, bias 7, S.1111.111 NaN)."""
    c = codes.astype(np.int64)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, np.ldexp(m / 8.0, -6), np.ldexp(1.0 + m / 8.0, e - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(c & 0x80, -v, v)


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_e4m3_with_descales(ctx, causal):
    # fp8 e4m3 Q / K / V (random codes up to |16|, both signs) with
    # per-tensor descales, O bf16: the float64 reference on the dequantized
    # values (stored x descale) to one bf16 rounding, lse to f32 accuracy
    rng = np.random.default_rng(18)
    B, Lq, Lk, Hq, Hkv, D = 2, 9, 21, 4, 2, 32
    qd, kd, vd = 0.02, 0.05, 0.1

    def codes(*shape):
        return (rng.integers(0, 0x59, shape) | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)

    q8, k8, v8 = codes(B, Lq, Hq, D), codes(B, Lk, Hkv, D), codes(B, Lk, Hkv, D)
    o = np.full((B, Lq, Hq, D), 0xFFFF, np.uint16)  # bf16 NaN
    lse = np.full((B, Hq, Lq), np.nan, np.float32)
    kw = dict(batch=B, seqlen_q=Lq, seqlen_k=Lk, heads_q=Hq, heads_kv=Hkv, head_dim=D,
              dtype="fp8e4m3", causal=causal, q=q8.ctypes.data, k=k8.ctypes.data,
              v=v8.ctypes.data, o=o.ctypes.data, lse=lse.ctypes.data, q_descale=qd,
              k_descale=kd, v_descale=vd)
    attention.forward(ctx, **kw)
    real = [e4m3_decode(t) * np.float64(np.float32(s)) for t, s in ((q8, qd), (k8, kd), (v8, vd))]
    ro, rl = ref_attention(*real, causal=causal)
    got = norm.from_buffer(o, "bf16").astype(np.float64)
    vmax = np.abs(real[2]).max()
    assert (np.abs(got - ro) <= np.abs(ro) / 256 + 1e-5 * vmax).all()
    assert np.abs(lse - rl).max() <= 1e-4
    # the same through the baseline, and refusals naming the descale, O untouched
    o2 = np.full_like(o, 0xFFFF)
    attention.forward_baseline(ctx, **{**kw, "o": o2.ctypes.data, "dtype": 3})
    assert (np.abs(norm.from_buffer(o2, "bf16") - ro) <= np.abs(ro) / 256 + 1e-5 * vmax).all()
    o[:] = 7
    for bad_kw, name in ((dict(q_descale=-1.0), "q_descale"), (dict(k_descale=float("nan")), "k_descale"),
                         (dict(dtype="bf16", q_descale=0, k_descale=1, v_descale=2.0), "v_descale")):
        with pytest.raises(fastpath.FastpathError) as e:
            attention.forward(ctx, **{**kw, **bad_kw})
        assert e.value.status == fastpath.Status.INVALID_ARGUMENT and name in e.value.detail
    assert (o == 7).all()


def test_last_kernel_reports_what_ran(ctx):
    # fastpath.attention.last_kernel: "cpu" after a CPU forward, "none" after a call
    # refused before any launch, per thread
    import threading
    rng = np.random.default_rng(3)
    q = rand(rng, 1, 8, 2, 16)
    attention.forward_arrays(ctx, q, q, q, dtype="f32")
    k = attention.last_kernel()
    assert k["kernel"] == "cpu" and k["num_splits"] == 1 and not k["paged"] and k["fallback"] == ""
    seen = {}
    t = threading.Thread(target=lambda: seen.update(attention.last_kernel()))
    t.start()
    t.join()
    assert seen["kernel"] == "none"
    o = np.zeros_like(q)
    with pytest.raises(fastpath.FastpathError):
        attention.forward(ctx, batch=1, seqlen_q=8, seqlen_k=8, heads_q=2, heads_kv=2, head_dim=12,
                          dtype="f32", q=q.ctypes.data, k=q.ctypes.data, v=q.ctypes.data, o=o.ctypes.data)
    assert attention.last_kernel()["kernel"] == "none"
