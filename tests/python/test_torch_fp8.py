"""fastpath.torch.attention_with_kvcache with float8_e4m3fn q / k_cache / v_cache
and per-tensor descales (FlashAttention-3's descale_q / descale_k / descale_v)
against a float64 reference on the dequantized values (stored x descale):
dense and paged caches, ragged cache_seqlens, GQA, causal, head_dim 64 and
128, lse; the descale argument rules; torch.compile and opcheck of
fastpath::attention_kvcache with fp8 inputs. CPU always (when torch has
float8_e4m3fn), CUDA cases only with a GPU. Skipped without torch."""

import pytest

torch = pytest.importorskip("torch")

import fastpath  # noqa: E402
import fastpath.torch as fpt  # noqa: E402
from test_torch_kvcache import reference as kvcache_reference  # noqa: E402 (the float64 oracle)

FP8 = getattr(torch, "float8_e4m3fn", None)
pytestmark = [
    pytest.mark.skipif(not fastpath.attention.available(), reason="built without attention"),
    pytest.mark.skipif(FP8 is None, reason="torch without float8_e4m3fn"),
]

HAS_CUDA = torch.cuda.is_available() and fastpath.device_count() > 0
DESCALES = (0.05, 0.1, 0.02)  # q, k, v
# O is rounded once to bf16 (2^-9 relative) and the CPU accumulates in f32:
# within a few bf16 ulps of |out|, plus a little of max |V real|.
RTOL, VTOL, LSE_TOL = 8e-3, 2e-3, 1e-4


def f32(x):
    """The descale as the library holds it (a float field)."""
    return float(torch.tensor(x, dtype=torch.float32))


def fp8(*shape, seed, scale, device="cpu"):
    """Random e4m3 tensor of N(0, scale^2) values (|x| <= 448, e4m3's max)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * scale).clamp(-448, 448)
    return x.to(FP8).to(device)


def real(t, descale):
    return t.cpu().to(torch.float64) * f32(descale)


def reference(q, k_cache, v_cache, descales=DESCALES, cache_seqlens=None, block_table=None,
              softmax_scale=None, causal=False, window_size=(-1, -1)):
    """out [B, Lq, Hq, D], lse [B, Hq, Lq] in float64 on the CPU: the
    kvcache test's reference on the dequantized fp8 values."""
    dq, dk, dv = descales
    return kvcache_reference(real(q, dq), real(k_cache, dk), real(v_cache, dv),
                             None if cache_seqlens is None else cache_seqlens.cpu(),
                             None if block_table is None else block_table.cpu(), softmax_scale, causal,
                             window_size)


def check(out, lse, ref_out, ref_lse, v_cache, dv=DESCALES[2], vtol=VTOL, rtol=RTOL):
    assert out.dtype == torch.bfloat16
    vmax = float(real(v_cache, dv).abs().max())
    torch.testing.assert_close(out.cpu().double(), ref_out, atol=vtol * vmax, rtol=rtol)
    if lse is not None:
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=LSE_TOL, rtol=0)


def make_paged(B, page_size, max_blocks, Hkv, D, seed, device="cpu", extra_pages=3):
    """Shuffled pages: (k_pool, v_pool, block_table)."""
    num_pages = B * max_blocks + extra_pages
    g = torch.Generator().manual_seed(seed)
    bt = torch.randperm(num_pages, generator=g)[:B * max_blocks].view(B, max_blocks)
    k = fp8(num_pages, page_size, Hkv, D, seed=seed + 1, scale=8.0, device=device)
    v = fp8(num_pages, page_size, Hkv, D, seed=seed + 2, scale=40.0, device=device)
    return k, v, bt.to(torch.int32).to(device)


CASES = ["dense", "causal_gqa", "ragged", "paged", "paged_causal_ragged", "window"]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("case", CASES)
def test_fp8_matches_reference(case, D):
    B, Lq = 3, (1 if case.startswith("paged") else 4)
    Hq, Hkv = (8, 2) if case in ("causal_gqa", "paged_causal_ragged", "window") else (4, 4)
    causal = "causal" in case
    window = (5, -1) if case == "window" else (-1, -1)
    q = fp8(B, Lq, Hq, D, seed=1, scale=16.0)
    lens, bt = None, None
    if case.startswith("paged"):
        k, v, bt = make_paged(B, 16 if case == "paged" else 7, 3, Hkv, D, seed=4)
        cap = bt.shape[1] * k.shape[1]
        if case == "paged_causal_ragged":
            lens = torch.tensor([0, cap, 9], dtype=torch.int32)  # empty, full, mid-page
    else:
        cap = 37
        k = fp8(B, cap, Hkv, D, seed=2, scale=8.0)
        v = fp8(B, cap, Hkv, D, seed=3, scale=40.0)
        if case in ("ragged", "window"):
            lens = torch.tensor([cap, 0, 3], dtype=torch.int32)  # full, empty, < seqlen_q
    dq, dk, dv = DESCALES
    fpt.reset_stats()
    out, lse = fpt.attention_with_kvcache(q, k, v, lens, bt, causal=causal, window_size=window,
                                          return_lse=True, descale_q=dq, descale_k=dk, descale_v=dv)
    assert fpt.last_path == "fastpath"
    assert out.shape == (B, Lq, Hq, D) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert lse.shape == (B, Hq, Lq)
    ref_out, ref_lse = reference(q, k, v, cache_seqlens=lens, block_table=bt, causal=causal,
                                 window_size=window)
    check(out, lse, ref_out, ref_lse, v)
    if lens is not None:
        empty = int((lens == 0).nonzero()[0])
        assert torch.all(out[empty] == 0) and torch.all(torch.isneginf(lse[empty]))
    # without lse: the same output
    out2 = fpt.attention_with_kvcache(q, k, v, lens, bt, causal=causal, window_size=window,
                                      descale_q=dq, descale_k=dk, descale_v=dv)
    assert torch.equal(out2, out)


def test_fp8_descale_forms_and_strided_views():
    """None = 1.0; a 1-element CPU tensor = its float; softmax_scale
    composes with the descales; a strided q (slice of a fused QKV) and a
    (batch, heads, seq, dim) transpose pass without copies."""
    B, Lq, Hq, Hkv, D = 2, 3, 4, 2, 32
    fused = fp8(B, Lq, Hq + 2 * Hkv, D, seed=20, scale=2.0)
    q = fused[:, :, :Hq]
    assert not q.is_contiguous()
    k = fp8(B, 11, Hkv, D, seed=21, scale=2.0)
    v = fp8(B, 11, Hkv, D, seed=22, scale=8.0).transpose(1, 2).contiguous().transpose(1, 2)
    assert not v.is_contiguous()
    out, lse = fpt.attention_with_kvcache(q, k, v, causal=True, return_lse=True)
    check(out, lse, *reference(q, k, v, (1.0, 1.0, 1.0), causal=True), v, dv=1.0)
    a = fpt.attention_with_kvcache(q, k, v, 7, softmax_scale=0.3, descale_q=0.5,
                                   descale_k=torch.tensor(0.25), descale_v=torch.tensor([2.0]))
    b = fpt.attention_with_kvcache(q, k, v, 7, softmax_scale=0.3, descale_q=0.5, descale_k=0.25,
                                   descale_v=2)
    assert torch.equal(a, b)
    lens = torch.tensor([7, 7], dtype=torch.int32)
    check(a, None, *reference(q, k, v, (0.5, 0.25, 2.0), lens, softmax_scale=0.3), v, dv=2.0)
    # descale 1 with the other dtypes is accepted (and changes nothing)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    plain = fpt.attention_with_kvcache(qb, kb, vb, causal=True)
    ones = fpt.attention_with_kvcache(qb, kb, vb, causal=True, descale_q=1, descale_k=1.0,
                                      descale_v=torch.tensor(1.0))
    assert torch.equal(plain, ones) and plain.dtype == torch.bfloat16


def _small():
    q = fp8(2, 1, 4, 16, seed=30, scale=4.0)
    k = fp8(2, 8, 2, 16, seed=31, scale=4.0)
    v = fp8(2, 8, 2, 16, seed=32, scale=4.0)
    return q, k, v


def test_fp8_refusals():
    q, k, v = _small()
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    # a descale with another dtype
    for kw in (dict(descale_q=0.5), dict(descale_k=2.0), dict(descale_v=torch.tensor(0.1))):
        with pytest.raises(ValueError, match="descale"):
            fpt.attention_with_kvcache(qb, kb, vb, **kw)
    with pytest.raises(ValueError, match="descale_q"):
        fpt.attention_with_kvcache(qb.float(), kb.float(), vb.float(), descale_q=0.0)
    # mixed dtypes
    with pytest.raises(TypeError, match="dtypes differ"):
        fpt.attention_with_kvcache(q, kb, v)
    with pytest.raises(TypeError, match="dtypes differ"):  # (bf16 q over fp8 k and v: an fp8 KV cache)
        fpt.attention_with_kvcache(qb, k, vb, descale_k=0.1)
    e5 = getattr(torch, "float8_e5m2", None)
    if e5 is not None:  # e5m2: no op takes it
        with pytest.raises(TypeError, match="not supported"):
            fpt.attention_with_kvcache(q.to(e5), k.to(e5), v.to(e5), descale_q=0.5)
    # out-of-range values: the library's refusal, naming the descale
    for kw, name in ((dict(descale_q=-1.0), "q_descale"), (dict(descale_k=float("nan")), "k_descale"),
                     (dict(descale_v=float("inf")), "v_descale"), (dict(descale_v=-0.5), "v_descale")):
        with pytest.raises(ValueError, match=name):
            fpt.attention_with_kvcache(q, k, v, **kw)
    # argument types
    with pytest.raises(TypeError, match="descale_q"):
        fpt.attention_with_kvcache(q, k, v, descale_q="0.5")
    with pytest.raises(TypeError, match="descale_k"):
        fpt.attention_with_kvcache(q, k, v, descale_k=True)
    with pytest.raises(ValueError, match="one element"):
        fpt.attention_with_kvcache(q, k, v, descale_v=torch.tensor([0.1, 0.2]))
    # keyword-only
    with pytest.raises(TypeError):
        fpt.attention_with_kvcache(q, k, v, None, None, None, False, (-1, -1), False, 0.5)
    # attention_varlen does not take fp8
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(TypeError, match="not supported"):
        fpt.attention_varlen(q[:, 0], k[:, 0], v[:, 0], cu, cu, 1, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch)")
def test_fp8_cuda_descale_tensor_refused():
    q, k, v = _small()
    with pytest.raises(TypeError, match="float"):
        fpt.attention_with_kvcache(q, k, v, descale_q=torch.tensor(0.5, device="cuda"))
    with pytest.raises(TypeError, match="float"):
        fpt.attention_with_kvcache(q.to(torch.bfloat16), k.to(torch.bfloat16),
                                   v.to(torch.bfloat16), descale_v=torch.ones(1, device="cuda"))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("D", [64, 128])
def test_fp8_cuda(D):
    """Hopper at head_dim 128 (dense cache) runs fp8; every other case is the
    library's refusal, a ValueError."""
    B, Lq, Hq, Hkv = 2, 5, 8, 2
    q = fp8(B, Lq, Hq, D, seed=50, scale=16.0, device="cuda")
    k = fp8(B, 300, Hkv, D, seed=51, scale=8.0, device="cuda")
    v = fp8(B, 300, Hkv, D, seed=52, scale=40.0, device="cuda")
    lens = torch.tensor([300, 129], dtype=torch.int32, device="cuda")
    dq, dk, dv = DESCALES
    hopper = torch.cuda.get_device_capability() == (9, 0)
    if not (hopper and D == 128):
        with pytest.raises(ValueError, match="attention_with_kvcache"):
            fpt.attention_with_kvcache(q, k, v, lens, causal=True, descale_q=dq, descale_k=dk,
                                       descale_v=dv)
        return
    out, lse = fpt.attention_with_kvcache(q, k, v, lens, causal=True, return_lse=True,
                                          descale_q=dq, descale_k=dk, descale_v=dv)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, cache_seqlens=lens.cpu(), causal=True)
    # the GPU rounds P to e4m3 before P V (FlashAttention-3): the C GPU test's bound
    check(out, None, ref_out, ref_lse, v, vtol=0.0625, rtol=1.6e-2)
    torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=1e-3, rtol=0)
    # paged fp8 on CUDA: refused
    kp, vp, bt = make_paged(B, 16, 4, Hkv, D, seed=53, device="cuda")
    with pytest.raises(ValueError, match="attention_with_kvcache"):
        fpt.attention_with_kvcache(q, kp, vp, None, bt, descale_q=dq)


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------

compile_only = pytest.mark.skipif(not fpt._COMPILE_OPS, reason="torch without torch.library.custom_op")


@compile_only
def test_fp8_compiled_equals_eager():
    torch._dynamo.reset()
    B, Hq, Hkv, D = 2, 4, 2, 64
    q = fp8(B, 2, Hq, D, seed=60, scale=16.0)
    kp, vp, bt = make_paged(B, 8, 3, Hkv, D, seed=61)
    kd, vd = fp8(B, 20, Hkv, D, seed=62, scale=8.0), fp8(B, 20, Hkv, D, seed=63, scale=40.0)
    lens = torch.tensor([17, 24], dtype=torch.int32)

    def step(q, kp, vp, bt, kd, vd, lens, dv):
        o1, lse = fpt.attention_with_kvcache(q, kp, vp, lens, bt, causal=True, return_lse=True,
                                             descale_q=0.05, descale_k=0.1, descale_v=dv)
        o2 = fpt.attention_with_kvcache(q, kd, vd, 13, descale_q=0.05, descale_k=0.1)
        return o1, lse, o2

    fpt.reset_stats()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(q, kp, vp, bt, kd, vd, lens, 0.02)
    assert fpt.fastpath_count == 2
    ref = step(q, kp, vp, bt, kd, vd, lens, 0.02)
    assert got[0].dtype == torch.bfloat16 and got[2].dtype == torch.bfloat16
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    check(got[0], got[1], *reference(q, kp, vp, cache_seqlens=lens, block_table=bt, causal=True), vp)
    # another descale value: still the eager result
    again = compiled(q, kp, vp, bt, kd, vd, lens, 0.03)
    torch.testing.assert_close(again[0], step(q, kp, vp, bt, kd, vd, lens, 0.03)[0], atol=0, rtol=0)
    # the eager body's checks run when the graph runs: a bad descale raises then
    with pytest.raises(ValueError, match="v_descale"):
        compiled(q, kp, vp, bt, kd, vd, lens, -1.0)
    # a tensor descale under compile: TypeError (pass a float); under
    # fullgraph Dynamo may wrap it in its Unsupported ("Observed exception")
    with pytest.raises((TypeError, torch._dynamo.exc.Unsupported), match="Python float"):
        torch.compile(step, backend="aot_eager", fullgraph=True)(q, kp, vp, bt, kd, vd, lens,
                                                                 torch.tensor(0.02))


@compile_only
def test_opcheck_kvcache_fp8():
    op = torch.ops.fastpath.attention_kvcache.default
    q = fp8(2, 3, 4, 32, seed=70, scale=16.0)
    k, v = fp8(2, 20, 2, 32, seed=71, scale=8.0), fp8(2, 20, 2, 32, seed=72, scale=40.0)
    lens = torch.tensor([7, 20], dtype=torch.int32)
    # test_schema is left out: its mutation check (SchemaCheckMode) compares
    # the inputs before and after with torch.allclose, which torch does not
    # implement for float8_e4m3fn on the CPU. The fake (bf16 out), autograd
    # registration and AOT dispatch checks run.
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(op, (q, k, v, lens, -1, None, None, True, -1, -1, True, 0.05, 0.1, 0.02),
                          test_utils=utils)
    torch.library.opcheck(op, (q, k, v, None, 11, None, 0.5, False, 4, 2, False, 0.5, 2.0, 1.0),
                          test_utils=utils)
    # the descales' defaults (1.0) keep the non-fp8 calls as they were: all checks
    qf, kf, vf = q.float(), k.float(), v.float()
    torch.library.opcheck(op, (qf, kf, vf, lens, -1, None, None, True, -1, -1, True))
    out, _ = op(q, k, v, lens, -1, None, None, True, -1, -1, False, 0.05, 0.1, 0.02)
    assert out.dtype == torch.bfloat16
