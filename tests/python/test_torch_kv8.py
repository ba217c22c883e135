"""fastpath.torch.attention_with_kvcache with an fp8 KV cache (API 0.5,
fp_attention_params.kv_dtype = FP_FP8_E4M3; vLLM's kv_cache_dtype "fp8"):
float16 / bfloat16 (float32 on the CPU) q against float8_e4m3fn k_cache /
v_cache with descale_k / descale_v, out in q's dtype, compared with a float64
reference on the dequantized values (stored x descale): dense and paged
caches, ragged cache_seqlens, GQA, causal on / off, lse, strided views; a
16-bit cache of the same values gives the same output; the descale and dtype
rules (descale_q other than 1, mixed k / v dtypes); the raw layer's kv_dtype;
torch.compile and opcheck of fastpath::attention_kvcache with an fp8 cache.
CPU always (when torch has float8_e4m3fn), CUDA cases only with a GPU.
Skipped without torch."""

import pytest

torch = pytest.importorskip("torch")

import fastpath  # noqa: E402
import fastpath.torch as fpt  # noqa: E402
from fastpath import attention  # noqa: E402
from test_torch_kvcache import reference as kvcache_reference  # noqa: E402 (the float64 oracle)

FP8 = getattr(torch, "float8_e4m3fn", None)
pytestmark = [
    pytest.mark.skipif(not fastpath.attention.available(), reason="built without attention"),
    pytest.mark.skipif(FP8 is None, reason="torch without float8_e4m3fn"),
]

HAS_CUDA = torch.cuda.is_available() and fastpath.device_count() > 0
# (atol as a fraction of max |V real|, rtol) on O: one rounding of O to q's
# dtype (and of P on the GPU), as the 16-bit cache tests
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}
LSE_TOL = {torch.float32: 2e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}
# (descale_k, descale_v): none given, powers of two, arbitrary
DESCALES = {"none": (None, None), "pow2": (0.5, 0.25), "any": (0.3, 0.07)}


def f32(x):
    """A descale as the library holds it (a float field); None = 1."""
    return 1.0 if x is None else float(torch.tensor(x, dtype=torch.float32))


def codes(*shape, seed, device="cpu"):
    """Random e4m3 codes of N(0, 1) values clamped to [-4, 4]."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).clamp(-4, 4).to(FP8).to(device)


def gen(*shape, seed, dtype, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


def real(t, descale):
    return t.cpu().to(torch.float64) * f32(descale)


def reference(q, k_cache, v_cache, dk=None, dv=None, cache_seqlens=None, block_table=None,
              softmax_scale=None, causal=False, window_size=(-1, -1)):
    """out [B, Lq, Hq, D], lse [B, Hq, Lq] in float64 on the CPU: the
    kvcache test's reference on q and the dequantized cache."""
    return kvcache_reference(q.cpu().double(), real(k_cache, dk), real(v_cache, dv),
                             None if cache_seqlens is None else cache_seqlens.cpu(),
                             None if block_table is None else block_table.cpu(), softmax_scale,
                             causal, window_size)


def check(out, lse, ref_out, ref_lse, q, v_cache, dv=None):
    assert out.dtype == q.dtype
    atol, rtol = TOL[q.dtype]
    vmax = float(real(v_cache, dv).abs().max())
    torch.testing.assert_close(out.cpu().double(), ref_out, atol=atol * vmax, rtol=rtol)
    if lse is not None:
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=LSE_TOL[q.dtype], rtol=0)


def make_paged(B, page_size, max_blocks, Hkv, D, seed, device="cpu", extra_pages=3):
    """Shuffled fp8 pages: (k_pool, v_pool, block_table)."""
    num_pages = B * max_blocks + extra_pages
    g = torch.Generator().manual_seed(seed)
    bt = torch.randperm(num_pages, generator=g)[:B * max_blocks].view(B, max_blocks)
    k = codes(num_pages, page_size, Hkv, D, seed=seed + 1, device=device)
    v = codes(num_pages, page_size, Hkv, D, seed=seed + 2, device=device)
    return k, v, bt.to(torch.int32).to(device)


def make_case(layout, D, qdtype, device, seed=1):
    """(q, k_cache, v_cache, cache_seqlens, block_table): GQA 8:2, ragged lengths
    (an empty sequence, a full one, one shorter than seqlen_q / mid-page)."""
    B, Hq, Hkv = 3, 8, 2
    if layout == "paged":
        Lq = 3
        k, v, bt = make_paged(B, 7, 3, Hkv, D, seed=seed + 3, device=device)
        cap = bt.shape[1] * k.shape[1]
        lens = torch.tensor([0, cap, 9], dtype=torch.int32, device=device)
    else:
        Lq, cap, bt = 4, 37, None
        k = codes(B, cap, Hkv, D, seed=seed + 1, device=device)
        v = codes(B, cap, Hkv, D, seed=seed + 2, device=device)
        lens = torch.tensor([cap, 0, 3], dtype=torch.int32, device=device)
    q = gen(B, Lq, Hq, D, seed=seed, dtype=qdtype, device=device)
    return q, k, v, lens, bt


def run_and_check(q, k, v, lens, bt, causal, dk, dv):
    fpt.reset_stats()
    out, lse = fpt.attention_with_kvcache(q, k, v, lens, bt, causal=causal, return_lse=True,
                                          descale_k=dk, descale_v=dv)
    assert fpt.last_path == "fastpath"
    B, Lq, Hq, D = q.shape
    assert out.shape == (B, Lq, Hq, D) and out.dtype == q.dtype and out.is_contiguous()
    assert out.device == q.device and lse.shape == (B, Hq, Lq)
    if q.is_cuda:
        torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, dk, dv, cache_seqlens=lens, block_table=bt,
                                 causal=causal)
    check(out, lse, ref_out, ref_lse, q, v, dv)
    empty = int((lens == 0).nonzero()[0])
    assert torch.all(out[empty] == 0) and torch.all(torch.isneginf(lse[empty]))
    # without lse: the same output
    out2 = fpt.attention_with_kvcache(q, k, v, lens, bt, causal=causal, descale_k=dk, descale_v=dv)
    assert torch.equal(out2, out)
    return out


# ---------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("descales", list(DESCALES))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kv8_matches_reference_cpu(qdtype, layout, causal, descales):
    q, k, v, lens, bt = make_case(layout, 64, qdtype, "cpu")
    run_and_check(q, k, v, lens, bt, causal, *DESCALES[descales])


@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kv8_equals_16bit_cache_of_the_same_values_cpu(qdtype, layout):
    """e4m3 values are exact in f16 / bf16 / f32: without descales the fp8
    cache gives what a cache of q's dtype holding the same values gives, and
    with descales what the dequantized cache gives, within one rounding."""
    q, k, v, lens, bt = make_case(layout, 32, qdtype, "cpu", seed=5)
    for causal in (False, True):
        a = fpt.attention_with_kvcache(q, k, v, lens, bt, causal=causal)
        b = fpt.attention_with_kvcache(q, k.to(qdtype), v.to(qdtype), lens, bt, causal=causal)
        assert a.dtype == b.dtype == qdtype
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    dk, dv = 0.5, 0.25  # powers of two: the dequantized values are exact in qdtype too
    a = fpt.attention_with_kvcache(q, k, v, lens, bt, causal=True, descale_k=dk, descale_v=dv)
    b = fpt.attention_with_kvcache(q, (k.float() * dk).to(qdtype), (v.float() * dv).to(qdtype),
                                   lens, bt, causal=True)
    atol, rtol = TOL[qdtype]
    torch.testing.assert_close(a.double(), b.double(), atol=atol * 4 * dv, rtol=rtol)


def test_kv8_strided_views_scale_window_and_descale_forms():
    """A q slice of a fused QKV tensor and (batch, heads, seq, dim)
    transposes of the fp8 cache pass without copies (strides in 1-byte
    elements); softmax_scale and window compose with the descales; a
    1-element CPU tensor descale = its float; descale_q None / 1 / 1.0 /
    tensor(1.0) are the same call."""
    B, Lq, Hq, Hkv, D, S = 2, 3, 4, 2, 32, 11
    fused = gen(B, Lq, Hq + 2 * Hkv, D, seed=20, dtype=torch.bfloat16)
    q = fused[:, :, :Hq]
    assert not q.is_contiguous()
    k = codes(B, Hkv, S, D, seed=21).transpose(1, 2)
    v = codes(B, Hkv, S, D, seed=22).transpose(1, 2)
    assert not k.is_contiguous() and not v.is_contiguous()
    assert k.stride() == (Hkv * S * D, D, S * D, 1)
    out, lse = fpt.attention_with_kvcache(q, k, v, causal=True, return_lse=True, descale_k=0.3,
                                          descale_v=0.7)
    check(out, lse, *reference(q, k, v, 0.3, 0.7, causal=True), q, v, 0.7)
    lens = torch.tensor([7, 7], dtype=torch.int32)
    a = fpt.attention_with_kvcache(q, k, v, 7, softmax_scale=0.3, window_size=(3, 1),
                                   descale_k=torch.tensor(0.25), descale_v=torch.tensor([2.0]))
    check(a, None, *reference(q, k, v, 0.25, 2.0, lens, softmax_scale=0.3, window_size=(3, 1)),
          q, v, 2.0)
    for dq in (None, 1, 1.0, torch.tensor(1.0), torch.tensor([1.0])):
        b = fpt.attention_with_kvcache(q, k, v, lens, softmax_scale=0.3, window_size=(3, 1),
                                       descale_q=dq, descale_k=0.25, descale_v=2)
        assert torch.equal(a, b)


def _small(qdtype=torch.bfloat16, device="cpu"):
    q = gen(2, 1, 4, 16, seed=30, dtype=qdtype, device=device)
    k = codes(2, 8, 2, 16, seed=31, device=device)
    v = codes(2, 8, 2, 16, seed=32, device=device)
    return q, k, v


@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kv8_refusals(qdtype):
    q, k, v = _small(qdtype)
    # descale_q: q is not fp8
    for dq in (0.5, 2, 0.0, torch.tensor(0.5)):
        with pytest.raises(ValueError, match="descale_q.*fp8 KV cache"):
            fpt.attention_with_kvcache(q, k, v, descale_q=dq, descale_k=0.5)
    with pytest.raises(TypeError, match="descale_q"):
        fpt.attention_with_kvcache(q, k, v, descale_q="1")
    # mixed K / V dtypes: a TypeError naming the rule
    for kk, vv in ((k, v.to(qdtype)), (k.to(qdtype), v), (k, v.to(torch.float16 if qdtype != torch.float16
                                                                   else torch.bfloat16))):
        with pytest.raises(TypeError, match="dtypes differ.*fp8 KV cache"):
            fpt.attention_with_kvcache(q, kk, vv, descale_k=0.5)
    # fp8 q with a 16-bit cache is not a mode
    with pytest.raises(TypeError, match="dtypes differ"):
        fpt.attention_with_kvcache(q.to(FP8), k.to(qdtype), v.to(qdtype))
    e5 = getattr(torch, "float8_e5m2", None)
    if e5 is not None:  # an e5m2 cache: not a mode either
        with pytest.raises(TypeError, match="dtypes differ"):
            fpt.attention_with_kvcache(q, k.to(e5), v.to(e5))
    # out-of-range descales: the library's refusal, naming the descale
    for kw, name in ((dict(descale_k=-1.0), "k_descale"), (dict(descale_k=float("nan")), "k_descale"),
                     (dict(descale_v=float("inf")), "v_descale"), (dict(descale_v=-0.5), "v_descale")):
        with pytest.raises(ValueError, match=name):
            fpt.attention_with_kvcache(q, k, v, **kw)
    with pytest.raises(ValueError, match="one element"):
        fpt.attention_with_kvcache(q, k, v, descale_v=torch.tensor([0.1, 0.2]))
    # the other checks still apply: head_dim mismatch, shapes
    with pytest.raises(ValueError, match="head_dim"):
        fpt.attention_with_kvcache(q, k[..., :8], v[..., :8])
    with pytest.raises(ValueError, match="shapes differ"):
        fpt.attention_with_kvcache(q, k, v[:, :4])
    # attention_varlen and the SDPA drop-in do not take an fp8 cache
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(TypeError, match="dtypes differ"):
        fpt.attention_varlen(q[:, 0], k[:, 0], v[:, 0], cu, cu, 1, 1)


# ---------------------------------------------------------------------------
# The raw layer: kv_dtype in fp_attention_params
# ---------------------------------------------------------------------------

def test_raw_params_kv_dtype():
    base = dict(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, head_dim=8, q=None, k=None, v=None,
                o=None)
    assert attention.make_params(**base).kv_dtype == 0
    assert attention.make_params(**base, kv_dtype=None).kv_dtype == 0
    for name in ("fp8e4m3", "float8_e4m3fn", 3):
        p = attention.make_params(**base, dtype="f16", kv_dtype=name, k_descale=0.5)
        assert p.kv_dtype == 3 and p.dtype == 1 and p.k_descale == 0.5
    assert attention.make_params(**base, dtype="bf16", kv_dtype="bf16").kv_dtype == 2
    assert attention.make_params(**base, dtype="f32", kv_dtype="f32").kv_dtype == 0
    with pytest.raises(ValueError, match="kv_dtype"):  # FP_F32 is 0, read as "dtype itself"
        attention.make_params(**base, dtype="bf16", kv_dtype="f32")
    with pytest.raises(ValueError):
        attention.make_params(**base, kv_dtype="int8")
    # the fast builder fills the same struct
    st = (0, 0, 0)
    fast = attention._params(2, 3, 40, 8, 2, 64, 2, 64, st, 128, st, 256, st, 512, None, 0.25, 1, -1,
                             0, seqlens_k=1024, k_descale=0.5, v_descale=0.125, kv_dtype=3)
    ref = attention.make_params(batch=2, seqlen_q=3, seqlen_k=40, heads_q=8, heads_kv=2, head_dim=64,
                                dtype=2, q=64, k=128, v=256, o=512, softmax_scale=0.25, causal=1,
                                window_left=-1, window_right=0, seqlens_k=1024, k_descale=0.5,
                                v_descale=0.125, kv_dtype=3)
    assert bytes(fast) == bytes(ref) and fast.kv_dtype == 3


@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_raw_forward_kv8_cpu(layout):
    """fastpath.attention.forward on torch CPU buffers: dtype bf16, kv_dtype
    fp8e4m3, K / V strides in their 1-byte elements."""
    ctx = fpt.context_for(torch.device("cpu"))
    q, k, v, lens, bt = make_case(layout, 32, torch.bfloat16, "cpu", seed=40)
    B, Lq, Hq, D = q.shape
    Hkv = k.shape[2]
    o = torch.empty_like(q)
    kw = {}
    if bt is not None:
        kw = dict(block_table=bt.data_ptr(), block_table_stride=bt.shape[1], page_size=k.shape[1],
                  num_pages=k.shape[0])
        Lk = bt.shape[1] * k.shape[1]
    else:
        Lk = k.shape[1]
    kb, ks, kh = k.stride()[:3]
    attention.forward(ctx, batch=B, seqlen_q=Lq, seqlen_k=Lk, heads_q=Hq, heads_kv=Hkv, head_dim=D,
                      q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), dtype="bf16",
                      kv_dtype="fp8e4m3", k_descale=0.5, v_descale=0.25, causal=True,
                      seqlens_k=lens.data_ptr(), k_batch_stride=kb, k_seq_stride=ks,
                      k_head_stride=kh, v_batch_stride=kb, v_seq_stride=ks, v_head_stride=kh, **kw)
    ref_out, _ = reference(q, k, v, 0.5, 0.25, cache_seqlens=lens, block_table=bt, causal=True)
    check(o, None, ref_out, None, q, v, 0.25)
    assert torch.equal(o, fpt.attention_with_kvcache(q, k, v, lens, bt, causal=True, descale_k=0.5,
                                                     descale_v=0.25))


# ---------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.parametrize("descales", ["none", "any"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float16])
def test_kv8_cuda(qdtype, D, layout, causal, descales):
    """f16 / bf16 q at head_dim 64 / 128 / 256 on compute capability 8.0 and
    up, dense and paged; below 8.0 the library's refusal (ValueError)."""
    q, k, v, lens, bt = make_case(layout, D, qdtype, "cuda", seed=50)
    dk, dv = DESCALES[descales]
    if torch.cuda.get_device_capability() < (8, 0):
        with pytest.raises(ValueError, match="attention_with_kvcache"):
            fpt.attention_with_kvcache(q, k, v, lens, bt, causal=causal, descale_k=dk, descale_v=dv)
        return
    out = run_and_check(q, k, v, lens, bt, causal, dk, dv)
    if dk is None:  # a 16-bit cache of the same values: the same answer
        ref16 = fpt.attention_with_kvcache(q, k.to(qdtype), v.to(qdtype), lens, bt, causal=causal)
        atol, rtol = TOL[qdtype]
        torch.testing.assert_close(out.double(), ref16.double(), atol=atol * 4, rtol=rtol)


@needs_cuda
def test_kv8_cuda_refusals():
    """f32 q, head_dim 32 and a CUDA descale tensor are refused on CUDA."""
    q, k, v = _small(torch.float32, "cuda")
    with pytest.raises(ValueError, match="attention_with_kvcache"):
        fpt.attention_with_kvcache(q, k, v)  # f32 with an fp8 cache: CPU only
    q = gen(2, 1, 4, 32, seed=60, dtype=torch.bfloat16, device="cuda")
    k, v = codes(2, 16, 2, 32, seed=61, device="cuda"), codes(2, 16, 2, 32, seed=62, device="cuda")
    with pytest.raises(ValueError, match="attention_with_kvcache"):
        fpt.attention_with_kvcache(q, k, v)  # head_dim 32: not a kv8 kernel's
    q, k, v = _small(torch.bfloat16, "cuda")
    with pytest.raises(TypeError, match="float"):
        fpt.attention_with_kvcache(q, k, v, descale_k=torch.tensor(0.5, device="cuda"))


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------

compile_only = pytest.mark.skipif(not fpt._COMPILE_OPS, reason="torch without torch.library.custom_op")


@compile_only
@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float16])
def test_kv8_compiled_equals_eager(qdtype):
    torch._dynamo.reset()
    B, Hq, Hkv, D = 2, 4, 2, 64
    q = gen(B, 2, Hq, D, seed=70, dtype=qdtype)
    kp, vp, bt = make_paged(B, 8, 3, Hkv, D, seed=71)
    kd, vd = codes(B, 20, Hkv, D, seed=72), codes(B, 20, Hkv, D, seed=73)
    lens = torch.tensor([17, 24], dtype=torch.int32)

    def step(q, kp, vp, bt, kd, vd, lens, dv):
        o1, lse = fpt.attention_with_kvcache(q, kp, vp, lens, bt, causal=True, return_lse=True,
                                             descale_k=0.1, descale_v=dv)
        o2 = fpt.attention_with_kvcache(q, kd, vd, 13, descale_q=1.0, descale_k=0.5)
        return o1, lse, o2

    fpt.reset_stats()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(q, kp, vp, bt, kd, vd, lens, 0.02)
    assert fpt.fastpath_count == 2
    ref = step(q, kp, vp, bt, kd, vd, lens, 0.02)
    assert got[0].dtype == qdtype and got[2].dtype == qdtype
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    check(got[0], got[1], *reference(q, kp, vp, 0.1, 0.02, cache_seqlens=lens, block_table=bt,
                                     causal=True), q, vp, 0.02)
    # another descale value: still the eager result
    again = compiled(q, kp, vp, bt, kd, vd, lens, 0.03)
    torch.testing.assert_close(again[0], step(q, kp, vp, bt, kd, vd, lens, 0.03)[0], atol=0, rtol=0)
    # the eager body's checks run when the graph runs: a bad descale raises then
    with pytest.raises(ValueError, match="v_descale"):
        compiled(q, kp, vp, bt, kd, vd, lens, -1.0)

    # descale_q other than 1 under compile: the eager body's ValueError when the graph runs
    def bad(q, kd, vd):
        return fpt.attention_with_kvcache(q, kd, vd, descale_q=0.5)

    with pytest.raises(ValueError, match="descale_q"):
        torch.compile(bad, backend="aot_eager", fullgraph=True)(q, kd, vd)


@compile_only
def test_opcheck_kvcache_kv8():
    op = torch.ops.fastpath.attention_kvcache.default
    q = gen(2, 3, 4, 32, seed=80, dtype=torch.bfloat16)
    k, v = codes(2, 20, 2, 32, seed=81), codes(2, 20, 2, 32, seed=82)
    lens = torch.tensor([7, 20], dtype=torch.int32)
    # test_schema is left out, as for fp8 inputs: its mutation check compares
    # the inputs with torch.allclose, which torch does not implement for
    # float8_e4m3fn on the CPU. The fake (q's dtype out), autograd
    # registration and AOT dispatch checks run.
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(op, (q, k, v, lens, -1, None, None, True, -1, -1, True, 1.0, 0.1, 0.02),
                          test_utils=utils)
    torch.library.opcheck(op, (q.half(), k, v, None, 11, None, 0.5, False, 4, 2, False, 1.0, 2.0, 1.0),
                          test_utils=utils)
    out, lse = op(q, k, v, lens, -1, None, None, True, -1, -1, True, 1.0, 0.1, 0.02)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    from torch._subclasses.fake_tensor import FakeTensorMode
    qh = q.half()
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (qh, k, v))
        fo, _ = op(fq, fk, fv, None, -1, None, None, False, -1, -1, False, 1.0, 1.0, 1.0)
        assert fo.dtype == torch.float16 and fo.shape == q.shape
