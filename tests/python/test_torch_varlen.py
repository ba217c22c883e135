"""fastpath.torch.attention_varlen (flash_attn_varlen_func style) against a
float64 reference written here, one sequence at a time: lengths 0 to the
maxima (past them: refused on the CPU, clipped on CUDA), GQA, causal / window masks, lse, strided views (a
fused QKV tensor), error cases, torch.compile. CPU always (when torch is
installed), CUDA when a GPU is visible. Skipped without torch."""
import math

import pytest

torch = pytest.importorskip("torch")

import fastpath  # noqa: E402
import fastpath.torch as fpt  # noqa: E402

pytestmark = pytest.mark.skipif(not fastpath.attention.available(),
                                reason="built without attention")

HAS_CUDA = torch.cuda.is_available() and fastpath.device_count() > 0
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}
MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)), "window": (False, (5, 1)),
         "causal_window": (True, (6, -1))}


def offsets(lens, device="cpu"):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def reference(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False,
              window_size=(-1, -1)):
    """out [total_q, Hq, D] (rows outside every sequence 0) and lse [B, Hq,
    max_q] (-inf past a sequence), float64 on the CPU."""
    q, k, v = q.cpu().double(), k.cpu().double(), v.cpu().double()
    cu_q, cu_k = cu_q.cpu().tolist(), cu_k.cpu().tolist()
    B, (total_q, Hq, D), Hkv = len(cu_q) - 1, q.shape, k.shape[1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    wl, wr = window_size
    if causal:
        wr = 0
    out = torch.zeros(total_q, Hq, D, dtype=torch.float64)
    lse = torch.full((B, Hq, max_q), -math.inf, dtype=torch.float64)
    for b in range(B):
        Lq, L = min(cu_q[b + 1] - cu_q[b], max_q), min(cu_k[b + 1] - cu_k[b], max_k)
        if Lq == 0 or L == 0:  # no keys: out 0, lse -inf (the initial values)
            continue
        qb, kb, vb = q[cu_q[b]:cu_q[b] + Lq], k[cu_k[b]:cu_k[b] + L], v[cu_k[b]:cu_k[b] + L]
        i = torch.arange(Lq)[:, None] + (L - Lq)
        j = torch.arange(L)[None, :]
        keep = torch.ones(Lq, L, dtype=torch.bool)
        if wr >= 0:
            keep &= j <= i + wr
        if wl >= 0:
            keep &= j >= i - wl
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            s = (qb[:, h] @ kb[:, hk].T) * scale
            s = s.masked_fill(~keep, -math.inf)
            m = s.max(dim=1, keepdim=True).values
            has = torch.isfinite(m)
            p = torch.where(has, torch.exp(s - torch.where(has, m, torch.zeros_like(m))), torch.zeros_like(s))
            den = p.sum(dim=1, keepdim=True)
            out[cu_q[b]:cu_q[b] + Lq, h] = torch.where(den > 0, p @ vb[:, hk] / den.clamp_min(1e-300), 0.0)
            lse[b, h, :Lq] = torch.where(den[:, 0] > 0, m[:, 0] + torch.log(den[:, 0].clamp_min(1e-300)),
                                         torch.tensor(-math.inf, dtype=torch.float64))
    return out, lse


def gen(*shape, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def check(out, lse, ref_out, ref_lse, cu_q, max_q, dtype):
    atol, rtol = TOL[dtype]
    cu = cu_q.cpu().tolist()
    for b in range(len(cu) - 1):
        n = min(cu[b + 1] - cu[b], max_q)
        torch.testing.assert_close(out[cu[b]:cu[b] + n].cpu().double(), ref_out[cu[b]:cu[b] + n],
                                   atol=atol, rtol=rtol)
        if lse is not None:
            torch.testing.assert_close(lse[b, :, :n].cpu().double(), ref_lse[b, :, :n], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", list(MASKS))
def test_matches_reference(device, dtype, mask):
    causal, window = MASKS[mask]
    lq, lk = [9, 0, 5, 17, 1], [12, 3, 0, 17, 30]  # a sequence without keys, one without queries
    cu_q, cu_k = offsets(lq, device), offsets(lk, device)
    Hq, Hkv, D, spare = 4, 2, 32, 3
    q = gen(sum(lq), Hq, D, seed=1, dtype=dtype, device=device)
    k = gen(sum(lk) + spare, Hkv, D, seed=2, dtype=dtype, device=device)  # spare rows: a capacity
    v = gen(sum(lk) + spare, Hkv, D, seed=3, dtype=dtype, device=device)
    k[sum(lk):] = float("nan")
    v[sum(lk):] = float("nan")
    fpt.reset_stats()
    out, lse = fpt.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                    window_size=window, return_lse=True)
    assert fpt.fastpath_count == 1
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (5, Hq, max(lq))
    ro, rl = reference(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, window_size=window)
    check(out, lse, ro, rl, cu_q, max(lq), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_qkv_views(device):
    # q, k, v slices of one [total, 3, heads, dim] tensor (no copy), a scale
    lens = [20, 7, 33]
    cu = offsets(lens, device)
    H, D = 2, 64
    qkv = gen(sum(lens), 3, H, D, seed=4, dtype=torch.float16, device=device)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not q.is_contiguous()
    out = fpt.attention_varlen(q, k, v, cu, cu, 33, 33, softmax_scale=0.3, causal=True)
    ro, rl = reference(q, k, v, cu, cu, 33, 33, softmax_scale=0.3, causal=True)
    check(out, None, ro, rl, cu, 33, torch.float16)


@pytest.mark.skipif(not HAS_CUDA, reason="no GPU (a CPU context refuses such offsets: test_bad_input)")
def test_longer_sequences_clipped_on_cuda():
    # the offsets stay on the device: a sequence longer than the maxima is
    # clipped to them (max_seqlen_q queries, max_seqlen_k keys)
    lens = [20, 7, 33]
    cu = offsets(lens, "cuda")
    q, k, v = (gen(sum(lens), 2, 64, seed=s, dtype=torch.bfloat16, device="cuda") for s in (20, 21, 22))
    out = fpt.attention_varlen(q, k, v, cu, cu, 24, 30, causal=True)
    ro, rl = reference(q, k, v, cu, cu, 24, 30, causal=True)
    check(out, None, ro, rl, cu, 24, torch.bfloat16)


def test_no_keys_at_all():
    # every sequence without keys (an empty k has no data pointer): out 0, lse -inf
    cu_q, cu_k = offsets([3, 2]), offsets([0, 0])
    q, k = gen(5, 2, 16, seed=16), torch.empty(0, 2, 16)
    out, lse = fpt.attention_varlen(q, k, k, cu_q, cu_k, 3, 1, return_lse=True)
    assert (out == 0).all() and (lse == -math.inf).all()


def test_bad_input():
    lens = [4, 6]
    cu = offsets(lens)
    q, k, v = gen(10, 2, 16, seed=5), gen(10, 2, 16, seed=6), gen(10, 2, 16, seed=7)

    def call(**kw):
        args = dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6, max_seqlen_k=6)
        args.update(kw)
        return fpt.attention_varlen(**args)

    with pytest.raises(TypeError, match="int32"):
        call(cu_seqlens_q=cu.to(torch.int64))
    with pytest.raises(TypeError, match="dtypes differ"):
        call(k=k.double())
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        call(cu_seqlens_k=torch.tensor([0, 4, 11], dtype=torch.int32))  # past total_k
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        call(cu_seqlens_q=torch.tensor([0, 6, 4], dtype=torch.int32))  # decreasing
    with pytest.raises(ValueError, match="batch"):
        call(cu_seqlens_k=torch.tensor([0, 10], dtype=torch.int32))
    with pytest.raises(ValueError, match="max_seqlen_q"):
        call(max_seqlen_q=0)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        call(max_seqlen_q=5)  # a sequence of 6 queries: the library refuses (CPU offsets)
    with pytest.raises(ValueError, match="3-d"):
        call(q=q[None])
    with pytest.raises(ValueError, match="grad"):
        call(q=q.clone().requires_grad_())
    with pytest.raises(ValueError, match="heads_q"):
        call(k=gen(10, 3, 16, seed=8), v=gen(10, 3, 16, seed=9))


@pytest.mark.skipif(not fpt._COMPILE_OPS, reason="torch without custom operators")
def test_compiled_matches_eager():
    torch._dynamo.reset()
    lens = [9, 0, 17]
    cu = offsets(lens)
    q, k, v = gen(26, 4, 32, seed=10), gen(26, 2, 32, seed=11), gen(26, 2, 32, seed=12)

    def f(q, k, v, cu):
        return fpt.attention_varlen(q, k, v, cu, cu, 17, 17, causal=True, return_lse=True)

    fpt.reset_stats()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v, cu)
    assert fpt.fastpath_count == 1, dict(fpt.fallback_reasons)
    ref = f(q, k, v, cu)
    torch.testing.assert_close(got[0], ref[0], atol=0, rtol=0)
    n = [min(x, 17) for x in lens]
    for b in range(3):
        torch.testing.assert_close(got[1][b, :, :n[b]], ref[1][b, :, :n[b]], atol=0, rtol=0)


@pytest.mark.skipif(not fpt._COMPILE_OPS, reason="torch without custom operators")
def test_opcheck_varlen():
    cu = offsets([3, 0, 5])
    q, k, v = gen(8, 4, 32, seed=13), gen(8, 2, 32, seed=14), gen(8, 2, 32, seed=15)
    op = torch.ops.fastpath.attention_varlen.default
    torch.library.opcheck(op, (q, k, v, cu, cu, 5, 5, None, True, -1, -1, False))
