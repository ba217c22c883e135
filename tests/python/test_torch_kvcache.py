"""fastpath.torch.attention_with_kvcache (flash_attn_with_kvcache style) against
a float64 reference written here: dense and paged caches, ragged
cache_seqlens, GQA, causal / window masks, lse, strided views, error cases.
CPU always (when torch is installed), CUDA when a GPU is visible. Skipped
without torch."""
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
# (atol, rtol) on O: one rounding of O (and of P on the GPU) in the dtype
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}
LSE_TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-3, 1e-3)}
# mask name -> (causal, window_size)
MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)), "window": (False, (5, 1)),
         "causal_window": (True, (6, -1))}


def gen(*shape, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def gather_cache(k_cache, v_cache, b, L, block_table):
    """(K, V) [L, heads_kv, dim] float64 of sequence b."""
    if block_table is None:
        return k_cache[b, :L].double(), v_cache[b, :L].double()
    ps = k_cache.shape[1]
    pages = [int(p) for p in block_table[b, :(L + ps - 1) // ps].tolist()]
    if not pages:
        shape = (0,) + tuple(k_cache.shape[2:])
        return (torch.zeros(shape, dtype=torch.float64),) * 2
    k = torch.cat([k_cache[p].double() for p in pages])[:L]
    v = torch.cat([v_cache[p].double() for p in pages])[:L]
    return k, v


def reference(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None,
              causal=False, window_size=(-1, -1)):
    """out [B, Lq, Hq, D] and lse [B, Hq, Lq], float64 on the CPU."""
    q, k_cache, v_cache = q.cpu(), k_cache.cpu(), v_cache.cpu()
    if block_table is not None:
        block_table = block_table.cpu()
    B, Lq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    group = Hq // Hkv
    cap = (k_cache.shape[1] if block_table is None
           else block_table.shape[1] * k_cache.shape[1])
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    wl, wr = window_size
    if causal:
        wr = 0
    out = torch.zeros(B, Lq, Hq, D, dtype=torch.float64)
    lse = torch.full((B, Hq, Lq), -math.inf, dtype=torch.float64)
    for b in range(B):
        if cache_seqlens is None:
            L = cap
        elif isinstance(cache_seqlens, int):
            L = cache_seqlens
        else:
            L = int(cache_seqlens[b])
        K, V = gather_cache(k_cache, v_cache, b, L, block_table)
        i = torch.arange(Lq).view(-1, 1)
        j = torch.arange(L).view(1, -1)
        diag = i + (L - Lq)
        keep = torch.ones(Lq, L, dtype=torch.bool)
        if wr >= 0:
            keep &= j <= diag + wr
        if wl >= 0:
            keep &= j >= diag - wl
        for h in range(Hq):
            hk = h // group
            s = (q[b, :, h].double() @ K[:, hk].T) * scale  # [Lq, L]
            s = s.masked_fill(~keep, -math.inf)
            for r in range(Lq):
                if not keep[r].any():
                    continue  # no key: out 0, lse -inf
                m = s[r].max()
                p = torch.exp(s[r] - m)
                lse[b, h, r] = m + torch.log(p.sum())
                out[b, r, h] = (p / p.sum()) @ V[:, hk]
    return out, lse


def check(out, lse, ref_out, ref_lse, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), ref_out, atol=atol, rtol=rtol)
    if lse is not None:
        assert lse.dtype == torch.float32
        atol, rtol = LSE_TOL[dtype]
        torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=atol, rtol=rtol)


def make_paged(B, page_size, max_blocks, Hkv, D, dtype, device, seed, extra_pages=3):
    """Shuffled pages: (k_pool, v_pool, block_table)."""
    num_pages = B * max_blocks + extra_pages
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g)[:B * max_blocks]
    block_table = perm.view(B, max_blocks).to(torch.int32)
    k = gen(num_pages, page_size, Hkv, D, seed=seed + 1, dtype=dtype, device=device)
    v = gen(num_pages, page_size, Hkv, D, seed=seed + 2, dtype=dtype, device=device)
    return k, v, block_table.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t).split(".")[-1])
@pytest.mark.parametrize("layout", ["dense", "paged16", "paged7"])
@pytest.mark.parametrize("seqlen_q", [1, 3])
@pytest.mark.parametrize("mask", list(MASKS))
def test_kvcache_matches_reference(device, dtype, layout, seqlen_q, mask):
    B, Hq, Hkv, D = 4, 8, 2, 64  # GQA 4:1
    causal, window = MASKS[mask]
    q = gen(B, seqlen_q, Hq, D, seed=1, dtype=dtype, device=device)
    if layout == "dense":
        cap = 40
        k = gen(B, cap, Hkv, D, seed=2, dtype=dtype, device=device)
        v = gen(B, cap, Hkv, D, seed=3, dtype=dtype, device=device)
        bt = None
    else:
        ps = 16 if layout == "paged16" else 7
        max_blocks = 3 if ps == 16 else 6
        cap = ps * max_blocks
        k, v, bt = make_paged(B, ps, max_blocks, Hkv, D, dtype, device, seed=4)
    # ragged: empty, full, mid-page, shorter than seqlen_q
    lens = torch.tensor([0, cap, 17, 2], dtype=torch.int32)
    if bt is not None:
        # entries past a sequence's used pages may hold anything
        bt = bt.cpu().clone()
        for b in range(B):
            used = (int(lens[b]) + k.shape[1] - 1) // k.shape[1]
            bt[b, used:] = 10 ** 6
        bt = bt.to(device)
    fpt.reset_stats()
    out, lse = fpt.attention_with_kvcache(q, k, v, cache_seqlens=lens.to(device),
                                          block_table=bt, causal=causal, window_size=window,
                                          return_lse=True)
    assert fpt.last_path == "fastpath"
    assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
    assert lse.shape == (B, Hq, seqlen_q)
    ref_out, ref_lse = reference(q, k, v, lens, bt, causal=causal, window_size=window)
    check(out, lse, ref_out, ref_lse, dtype)
    # the empty sequence: zeros and -inf
    assert torch.all(out[0] == 0) and torch.all(torch.isneginf(lse[0]))


@pytest.mark.parametrize("device", DEVICES)
def test_no_seqlens_int_seqlens_and_scale(device):
    B, Lq, Hq, Hkv, D = 2, 2, 4, 4, 32
    q = gen(B, Lq, Hq, D, seed=10, device=device)
    k = gen(B, 24, Hkv, D, seed=11, device=device)
    v = gen(B, 24, Hkv, D, seed=12, device=device)
    out = fpt.attention_with_kvcache(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor)
    check(out, None, *reference(q, k, v, causal=True), torch.float32)
    out, lse = fpt.attention_with_kvcache(q, k, v, cache_seqlens=9, softmax_scale=0.3,
                                          return_lse=True)
    check(out, lse, *reference(q, k, v, 9, softmax_scale=0.3), torch.float32)
    out, lse = fpt.attention_with_kvcache(q, k, v, cache_seqlens=0, return_lse=True)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
    out = fpt.attention_with_kvcache(q, k, v, cache_seqlens=24, causal=True)  # == capacity
    check(out, None, *reference(q, k, v, causal=True), torch.float32)
    # paged without cache_seqlens: every block of the table is used
    kp, vp, bt = make_paged(B, 8, 3, Hkv, D, torch.float32, device, seed=13)
    out, lse = fpt.attention_with_kvcache(q, kp, vp, block_table=bt, window_size=(4, 0),
                                          return_lse=True)
    check(out, lse, *reference(q, kp, vp, None, bt, window_size=(4, 0)), torch.float32)
    out = fpt.attention_with_kvcache(q, kp, vp, 13, bt, causal=True)
    check(out, None, *reference(q, kp, vp, 13, bt, causal=True), torch.float32)
    empty = fpt.attention_with_kvcache(q[:0], k[:0], v[:0], return_lse=True)
    assert empty[0].shape == (0, Lq, Hq, D) and empty[1].shape == (0, Hq, Lq)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_strided_views(device, dtype):
    """q a slice of a fused QKV tensor, caches slices of fused KV tensors, a
    block table with a row stride wider than its columns: no copies."""
    B, Lq, Hq, Hkv, D = 3, 3, 8, 2, 64
    fused = gen(B, Lq, Hq + 2 * Hkv, D, seed=20, dtype=dtype, device=device)
    q = fused[:, :, :Hq]
    assert not q.is_contiguous()
    kv = gen(B, 30, 2, Hkv, D, seed=21, dtype=dtype, device=device)
    k, v = kv[:, :, 0], kv[:, :, 1]
    lens = torch.tensor([30, 11, 3], dtype=torch.int32, device=device)
    out, lse = fpt.attention_with_kvcache(q, k, v, lens, causal=True, return_lse=True)
    check(out, lse, *reference(q, k, v, lens.cpu(), causal=True), dtype)
    # q given as a (batch, heads, seq, dim) tensor transposed to (batch, seq, heads, dim)
    qt = gen(B, Hq, Lq, D, seed=22, dtype=dtype, device=device).transpose(1, 2)
    out = fpt.attention_with_kvcache(qt, k, v, lens, window_size=(7, -1))
    check(out, None, *reference(qt, k, v, lens.cpu(), window_size=(7, -1)), dtype)
    # paged pools fused as [num_pages, page_size, 2, heads_kv, dim], wide table
    pool = gen(14, 7, 2, Hkv, D, seed=23, dtype=dtype, device=device)
    kp, vp = pool[:, :, 0], pool[:, :, 1]
    g = torch.Generator().manual_seed(24)
    wide = torch.randperm(14, generator=g)[:12].view(B, 4).to(torch.int32)
    wide = torch.cat([wide, torch.full((B, 2), -5, dtype=torch.int32)], dim=1).to(device)
    bt = wide[:, :4]  # row stride 6
    lens = torch.tensor([28, 0, 15], dtype=torch.int32, device=device)
    out, lse = fpt.attention_with_kvcache(q, kp, vp, lens, bt, causal=True, return_lse=True)
    check(out, lse, *reference(q, kp, vp, lens.cpu(), bt, causal=True), dtype)


def _small(dtype=torch.float32, device="cpu"):
    q = gen(2, 1, 4, 16, seed=30, dtype=dtype, device=device)
    k = gen(2, 8, 2, 16, seed=31, dtype=dtype, device=device)
    v = gen(2, 8, 2, 16, seed=32, dtype=dtype, device=device)
    return q, k, v


def test_errors_types():
    q, k, v = _small()
    with pytest.raises(TypeError, match="dtypes differ"):
        fpt.attention_with_kvcache(q, k.half(), v)
    with pytest.raises(TypeError, match="not supported"):
        fpt.attention_with_kvcache(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="torch.Tensor"):
        fpt.attention_with_kvcache(q.numpy(), k, v)
    with pytest.raises(TypeError, match="int32"):
        fpt.attention_with_kvcache(q, k, v, cache_seqlens=torch.tensor([3, 4]))
    kp = gen(4, 4, 2, 16, seed=33)
    with pytest.raises(TypeError, match="int32"):
        fpt.attention_with_kvcache(q, kp, kp, block_table=torch.tensor([[0, 1], [2, 3]]))


def test_errors_values():
    q, k, v = _small()
    wide = gen(2, 1, 4, 32, seed=34)
    with pytest.raises(ValueError, match="head_dim must be contiguous"):
        fpt.attention_with_kvcache(wide[..., ::2], k, v)
    with pytest.raises(ValueError, match="head_dim must be contiguous"):
        kk = gen(2, 8, 2, 32, seed=35)[..., ::2]
        fpt.attention_with_kvcache(q, kk, kk)
    with pytest.raises(ValueError, match="head_dim 12"):
        fpt.attention_with_kvcache(gen(2, 1, 4, 12, seed=1), gen(2, 8, 2, 12, seed=2),
                                   gen(2, 8, 2, 12, seed=3))
    with pytest.raises(ValueError, match="multiple of heads_kv"):
        fpt.attention_with_kvcache(gen(2, 1, 3, 16, seed=1), k, v)
    with pytest.raises(ValueError, match="shapes differ"):
        fpt.attention_with_kvcache(q, k, v[:, :4])
    with pytest.raises(ValueError, match="batch"):
        fpt.attention_with_kvcache(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="cache_seqlens"):
        fpt.attention_with_kvcache(q, k, v, cache_seqlens=torch.tensor([3, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_seqlens"):
        fpt.attention_with_kvcache(q, k, v, cache_seqlens=-1)
    with pytest.raises(ValueError, match="window_size"):
        fpt.attention_with_kvcache(q, k, v, window_size=(-2, 0))
    with pytest.raises(ValueError, match="softmax_scale"):
        fpt.attention_with_kvcache(q, k, v, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="broadcast"):
        fpt.attention_with_kvcache(q, k[:1].expand(2, -1, -1, -1), v)
    # paged: a used block table entry outside the pool (checked on the CPU)
    kp = gen(4, 4, 2, 16, seed=36)
    bt = torch.tensor([[0, 1], [2, 4]], dtype=torch.int32)
    with pytest.raises(ValueError, match="block_table"):
        fpt.attention_with_kvcache(q, kp, kp, block_table=bt)
    with pytest.raises(ValueError, match="block_table"):
        fpt.attention_with_kvcache(q, kp, kp, block_table=bt[:1])


def test_errors_devices_and_grad():
    q, k, v = _small()
    meta = torch.empty(k.shape, device="meta")
    with pytest.raises(ValueError, match="different devices"):
        fpt.attention_with_kvcache(q, meta, v)
    with pytest.raises(ValueError, match="not supported"):
        fpt.attention_with_kvcache(q.to("meta"), meta, meta)
    with pytest.raises(ValueError, match="cache_seqlens"):
        fpt.attention_with_kvcache(q, k, v, cache_seqlens=torch.tensor([1, 2], dtype=torch.int32,
                                                                       device="meta"))
    qg = q.clone().requires_grad_()
    with pytest.raises(ValueError, match="backward"):
        fpt.attention_with_kvcache(qg, k, v)
    with torch.no_grad():  # no gradient needed: runs
        out = fpt.attention_with_kvcache(qg, k, v)
    check(out, None, *reference(q, k, v), torch.float32)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_cpu_tensors_mixed():
    q, k, v = _small(torch.bfloat16)
    with pytest.raises(ValueError, match="different devices"):
        fpt.attention_with_kvcache(q.cuda(), k, v.cuda())
    with pytest.raises(ValueError, match="cache_seqlens"):
        fpt.attention_with_kvcache(q.cuda(), k.cuda(), v.cuda(),
                                   cache_seqlens=torch.tensor([1, 2], dtype=torch.int32))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_side_stream_decode():
    """A long decode on a side stream (split-KV path), bf16, paged."""
    B, Hq, Hkv, D = 2, 8, 1, 128
    q = gen(B, 1, Hq, D, seed=40, dtype=torch.bfloat16, device="cuda")
    kp, vp, bt = make_paged(B, 16, 64, Hkv, D, torch.bfloat16, "cuda", seed=41)
    lens = torch.tensor([1000, 517], dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out, lse = fpt.attention_with_kvcache(q, kp, vp, lens, bt, causal=True, return_lse=True)
    torch.cuda.current_stream().wait_stream(s)
    check(out, lse, *reference(q, kp, vp, lens.cpu(), bt, causal=True), torch.bfloat16)


FACTORIES = ("full", "zeros", "empty", "tensor")


def count_factories(monkeypatch, made):
    """torch's tensor factories, each call's name appended to made."""
    for name in FACTORIES:
        real = getattr(torch, name)

        def counted(*a, _real=real, _name=name, **kw):
            made.append(_name)
            return _real(*a, **kw)
        monkeypatch.setattr(torch, name, counted)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("mask", ["none", "causal", "causal_window"])
def test_int_seqlens_make_no_tensor(device, paged, mask, monkeypatch):
    # an int cache_seqlens L > 0 is passed as the library's seqlen_k (every
    # sequence's keys [0, L), the cache's strides kept): no int32 [batch]
    # tensor is made per call (on CUDA a fill kernel); L = 0 still makes one.
    # The result is the same as with the tensor of L.
    causal, window = MASKS[mask]
    B, Lq, Hq, Hkv, D = 3, 3, 4, 2, 32
    q = gen(B, Lq, Hq, D, seed=40, device=device)
    if paged:
        k, v, bt = make_paged(B, 8, 4, Hkv, D, torch.float32, device, seed=41)
    else:
        k, v = gen(B, 30, Hkv, D, seed=41, device=device), gen(B, 30, Hkv, D, seed=42, device=device)
        bt = None
    made = []
    for L in (1, 2, 13, 29):
        count_factories(monkeypatch, made)
        made.clear()
        out, lse = fpt.attention_with_kvcache(q, k, v, L, bt, causal=causal, window_size=window,
                                              return_lse=True)
        assert made == ["empty"], made  # lse's buffer only
        monkeypatch.undo()
        lens = torch.full((B,), L, dtype=torch.int32, device=device)
        ref = fpt.attention_with_kvcache(q, k, v, lens, bt, causal=causal, window_size=window,
                                         return_lse=True)
        torch.testing.assert_close(out, ref[0], atol=2e-6, rtol=2e-6)
        torch.testing.assert_close(lse, ref[1], atol=2e-6, rtol=2e-6)
        check(out, lse, *reference(q, k, v, lens, bt, causal=causal, window_size=window),
              torch.float32)
    count_factories(monkeypatch, made)
    made.clear()
    out, lse = fpt.attention_with_kvcache(q, k, v, 0, bt, causal=causal, return_lse=True)
    assert "zeros" in made
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
