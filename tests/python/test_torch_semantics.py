"""fastpath.torch drop-ins follow torch's semantics at the edges: non-finite
scores in attention, rms_norm's default eps, SDPA under autocast, double
backward through the norms. CPU; skipped without torch."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fastpath  # noqa: E402
import fastpath.torch as fpt  # noqa: E402

needs_norm = pytest.mark.skipif(not fastpath.norm.available(), reason="built without norm")
needs_attn = pytest.mark.skipif(not fastpath.attention.available(), reason="built without attention")


def gen(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def assert_fast():
    assert fpt.last_path == "fastpath", fpt.last_fallback_reason


def _cuda_ok():
    try:
        return torch.cuda.is_available() and fastpath.device_count() > 0
    except Exception:  # noqa: BLE001 - a broken CUDA setup is "no CUDA" here
        return False


# "cuda" cases (gpu-check.sh runs `pytest -k cuda`) put the same data through
# the CUDA kernels: the Hopper versions have no CPU emulation of this.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _cuda_ok(), reason="needs a CUDA device"))]


# ---------------------------------------------------------------------------
# attention: NaN / inf scores propagate as in torch
# ---------------------------------------------------------------------------

def poisoned_qkv(dtype, lk=150):
    """q [1, 4, 8, 64], k / v [1, 4, lk, 64]; key 3 has k[0] = +inf (a +inf
    score for rows with q[0] > 0, -inf for q[0] < 0), key 120 a NaN in head 1
    only. lk > 128 keys: several CPU tiles."""
    q, k, v = gen(1, 4, 8, 64, seed=1), gen(1, 4, lk, 64, seed=2), gen(1, 4, lk, 64, seed=3)
    k[0, :, 3, 0] = float("inf")
    k[0, 1, 120, 5] = float("nan")
    return q.to(dtype), k.to(dtype), v.to(dtype)


def assert_same_nonfinite(got, ref):
    got, ref = got.float(), ref.float()
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), (torch.isnan(got).sum(), torch.isnan(ref).sum())
    fin = ~torch.isnan(ref)
    torch.testing.assert_close(got[fin], ref[fin], atol=3e-2, rtol=2e-2)


@needs_attn
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_nan_and_inf_scores_propagate(dtype, device):
    q, k, v = poisoned_qkv(dtype)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    # both kinds of rows occur: NaN ones (+inf and NaN scores) and finite ones
    assert torch.isnan(ref).any() and not torch.isnan(ref).all()
    fpt.reset_stats()
    got = fpt.scaled_dot_product_attention(q.to(device), k.to(device), v.to(device))
    assert_fast()
    assert_same_nonfinite(got.cpu(), ref)


@needs_attn
@pytest.mark.skipif(not _cuda_ok(), reason="needs a CUDA device")
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_nan_and_inf_scores_propagate_cuda_prefill(causal):
    """A prefill shape the Hopper default (v5 / v3 at head_dim 128) takes: 320 query rows per
    head, bf16, head_dim 128; keys 0..69 +inf in channel 0, key 300 NaN in head
    1. seqlen_q == seqlen_k: torch's is_causal with fewer queries than keys is
    the top-left mask, which the drop-in leaves to torch."""
    q, k, v = gen(2, 4, 320, 128, seed=7), gen(2, 4, 320, 128, seed=8), gen(2, 4, 320, 128, seed=9)
    k[:, :, :70, 0] = float("inf")
    k[0, 1, 300, 5] = float("nan")
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert torch.isnan(ref).any() and not torch.isnan(ref).all()
    fpt.reset_stats()
    got = fpt.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(), is_causal=causal)
    assert_fast()
    assert_same_nonfinite(got.cpu(), ref)


@needs_attn
def test_sdpa_all_scores_minus_inf_is_a_zero_row():
    q, k, v = gen(1, 1, 4, 64, seed=4), gen(1, 1, 70, 64, seed=5), gen(1, 1, 70, 64, seed=6)
    q[..., 0] = -1.0
    k[..., 0] = float("inf")  # every score -inf
    ref = F.scaled_dot_product_attention(q, k, v)
    fpt.reset_stats()
    got = fpt.scaled_dot_product_attention(q, k, v)
    assert_fast()
    assert torch.equal(got, torch.zeros_like(got)) and torch.equal(ref, torch.zeros_like(ref))


@needs_attn
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kvcache_nan_and_inf_scores_propagate(dtype, device):
    q, k, v = poisoned_qkv(dtype)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    ref_lse = torch.logsumexp((q.float() @ k.float().transpose(-1, -2)) / 8.0, dim=-1)  # [1, 4, 8]
    out, lse = fpt.attention_with_kvcache(q.transpose(1, 2).to(device), k.transpose(1, 2).to(device),
                                          v.transpose(1, 2).to(device), return_lse=True)
    out, lse = out.cpu(), lse.cpu()
    assert_same_nonfinite(out.transpose(1, 2), ref)
    # lse NaN exactly on the NaN rows (a +inf score gives NaN, not -inf)
    assert torch.equal(torch.isnan(lse), torch.isnan(ref[..., 0]))
    fin = ~torch.isnan(lse)
    torch.testing.assert_close(lse[fin], ref_lse[fin], atol=1e-3, rtol=1e-3)


# ---------------------------------------------------------------------------
# rms_norm(eps=None): torch's default
# ---------------------------------------------------------------------------

@needs_norm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_rms_norm_default_eps_matches_torch(dtype):
    if not hasattr(F, "rms_norm"):
        pytest.skip("torch without F.rms_norm")
    x = (gen(8, 64, seed=7) * 1e-3).to(dtype)  # small rows: eps dominates the mean square
    got = fpt.rms_norm(x, (64,))
    ref = F.rms_norm(x, (64,))
    torch.testing.assert_close(got.float(), ref.float(), atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------------------
# SDPA under autocast: torch's output dtype
# ---------------------------------------------------------------------------

@needs_attn
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float16])
def test_sdpa_follows_cpu_autocast(in_dtype):
    q, k, v = (gen(2, 4, 16, 64, seed=s).to(in_dtype) for s in (8, 9, 10))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        fpt.reset_stats()
        got = fpt.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert_fast()
    assert ref.dtype == torch.bfloat16
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got.float(), ref.float(), atol=3e-2, rtol=2e-2)


@needs_attn
def test_sdpa_autocast_leaves_float64_alone():
    q = gen(1, 2, 8, 64, seed=11, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fpt.scaled_dot_product_attention(q, q, q).dtype == torch.float64


# ---------------------------------------------------------------------------
# double backward through the norms
# ---------------------------------------------------------------------------

def _double_grads(fn, x, w, b, res=None):
    """d/d(x, w, b) of sum(grad_x(sum(out * u))^2), u fixed: a second-order
    quantity that needs the backward to be differentiable."""
    u = gen(*x.shape, seed=12, dtype=x.dtype)
    ins = [t for t in (x, res, w, b) if t is not None]
    out = fn(x, res, w, b)
    out = out[0] if isinstance(out, tuple) else out
    gx = torch.autograd.grad((out * u).sum(), x, create_graph=True)[0]
    return torch.autograd.grad((gx * gx).sum(), ins, allow_unused=True)


NORMS = {
    "layer_norm": (lambda x, r, w, b, m: m.layer_norm(x, (32,), w, b, eps=1e-5), True),
    "rms_norm": (lambda x, r, w, b, m: m.rms_norm(x, (32,), w, eps=1e-5), False),
    "add_layer_norm_gelu": (lambda x, r, w, b, m: fpt.add_layer_norm(x, r, w, b, eps=1e-5, activation="gelu")
                            if m is fpt else F.gelu(F.layer_norm(x + r, (32,), w, b, eps=1e-5)), True),
    "add_rms_norm_silu": (lambda x, r, w, b, m: fpt.add_rms_norm(x, r, w, eps=1e-5, activation="silu")
                          if m is fpt else F.silu(F.rms_norm(x + r, (32,), w, eps=1e-5)), False),
}


@needs_norm
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_double_backward_matches_torch(name):
    """The library's f32 path (counted as fastpath) against torch's f64
    double backward of the same function."""
    if name.startswith(("rms", "add_rms")) and not hasattr(F, "rms_norm"):
        pytest.skip("torch without F.rms_norm")
    fn, has_bias = NORMS[name]
    residual = name.startswith("add")

    def leaves(dtype):
        x = gen(6, 32, seed=13).to(dtype).requires_grad_()
        w = (gen(32, seed=14) + 1).to(dtype).requires_grad_()
        b = gen(32, seed=15).to(dtype).requires_grad_() if has_bias else None
        r = gen(6, 32, seed=16).to(dtype).requires_grad_() if residual else None
        return x, w, b, r

    x, w, b, r = leaves(torch.float32)
    fpt.reset_stats()
    got = _double_grads(lambda x_, r_, w_, b_: fn(x_, r_, w_, b_, fpt), x, w, b, r)
    assert fpt.fallback_count == 0 and fpt.fastpath_count >= 1, dict(fpt.fallback_reasons)
    x, w, b, r = leaves(torch.float64)
    ref = _double_grads(lambda x_, r_, w_, b_: fn(x_, r_, w_, b_, F), x, w, b, r)
    assert len(got) == len(ref)
    for g, e in zip(got, ref):
        if e is None:  # no second-order dependence (the bias)
            assert g is None or not g.any()
            continue
        assert g is not None
        torch.testing.assert_close(g.double(), e, atol=2e-3, rtol=2e-3)


@needs_norm
@pytest.mark.parametrize("name", ["layer_norm", "add_rms_norm_silu"])
def test_norm_gradgradcheck_float64(name):
    """gradgradcheck in float64: the library has no f64 norm, so this runs
    the drop-in's torch fallback end to end (it must stay twice
    differentiable); the f32 test above covers the library's own path."""
    fn, has_bias = NORMS[name]
    if name.startswith("add_rms") and not hasattr(F, "rms_norm"):
        pytest.skip("torch without F.rms_norm")
    x = gen(3, 32, seed=17, dtype=torch.float64).requires_grad_()
    w = (gen(32, seed=18, dtype=torch.float64) + 1).requires_grad_()
    b = gen(32, seed=19, dtype=torch.float64).requires_grad_() if has_bias else None
    r = gen(3, 32, seed=20, dtype=torch.float64).requires_grad_() if name.startswith("add") else None

    def f(*ins):
        it = iter(ins)
        x_ = next(it)
        r_ = next(it) if r is not None else None
        w_ = next(it)
        b_ = next(it) if b is not None else None
        out = fn(x_, r_, w_, b_, fpt)
        return out[0] if isinstance(out, tuple) else out

    assert torch.autograd.gradgradcheck(f, tuple(t for t in (x, r, w, b) if t is not None))
