"""fastpath.torch drop-ins against torch.nn.functional: CPU always (when torch
is installed), CUDA in bf16 / f16 when a GPU is visible. Skipped without torch."""
import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fastpath  # noqa: E402
import fastpath.torch as fpt  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and fastpath.device_count() > 0 else [])
# (device, dtype) pairs: CPU f32 and bf16; CUDA bf16, f16, f32
CASES = [("cpu", torch.float32), ("cpu", torch.bfloat16)]
if "cuda" in DEVICES:
    CASES += [("cuda", torch.bfloat16), ("cuda", torch.float16), ("cuda", torch.float32)]
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 2e-2)}
IDS = [f"{d}-{str(t).split('.')[-1]}" for d, t in CASES]

needs_norm = pytest.mark.skipif(not fastpath.norm.available(), reason="built without norm")
needs_attn = pytest.mark.skipif(not fastpath.attention.available(), reason="built without attention")


def close(got, ref, dtype, scale=1.0):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float(), ref.float(), atol=atol * scale, rtol=rtol * scale)


def fresh():
    fpt.reset_stats()


def assert_fast():
    assert fpt.last_path == "fastpath", fpt.last_fallback_reason
    assert fpt.fallback_count == 0, dict(fpt.fallback_reasons)


def gen(*shape, device, dtype, seed=0, offset=0.0):
    g = torch.Generator().manual_seed(seed + len(shape) * 7 + shape[-1])
    return (torch.randn(*shape, generator=g) + offset).to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------
# norms
# ---------------------------------------------------------------------------

@needs_norm
@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_layer_norm_forward(device, dtype):
    x = gen(3, 17, 384, device=device, dtype=dtype, offset=0.5)
    w = gen(384, device=device, dtype=dtype, seed=1, offset=1.0)
    b = gen(384, device=device, dtype=dtype, seed=2)
    fresh()
    y = fpt.layer_norm(x, (384,), w, b, eps=1e-5)
    assert_fast()
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
    close(y, F.layer_norm(x.float(), (384,), w.float(), b.float(), 1e-5), dtype)
    fresh()
    y = fpt.layer_norm(x, 384)  # no affine, int normalized_shape
    assert_fast()
    close(y, F.layer_norm(x.float(), (384,), eps=1e-5), dtype)


@needs_norm
@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_multi_dim_and_strided_rows(device):
    x = gen(5, 4, 32, device=device, dtype=torch.float32)
    w = gen(4, 32, device=device, dtype=torch.float32, seed=3)
    fresh()
    close(fpt.layer_norm(x, (4, 32), w), F.layer_norm(x, (4, 32), w), torch.float32)
    assert_fast()
    big = gen(6, 200, device=device, dtype=torch.float32)
    xs = big[:, 8:136]  # row stride 200: passed without a copy
    fresh()
    close(fpt.layer_norm(xs, (128,)), F.layer_norm(xs, (128,)), torch.float32)
    assert_fast()


@needs_norm
def test_norm_fallbacks_are_counted():
    x = torch.randn(64, 32)
    fresh()
    y = fpt.layer_norm(x.t(), (64,))  # last dim not contiguous
    assert fpt.last_path == "torch" and fpt.fallback_count == 1
    assert "contiguous" in fpt.last_fallback_reason
    close(y, F.layer_norm(x.t(), (64,)), torch.float32)
    fresh()
    y = fpt.layer_norm(x.double(), (32,))
    assert fpt.fallback_count == 1 and "dtype" in fpt.last_fallback_reason
    with pytest.raises(RuntimeError):  # torch's own error for a wrong shape
        fpt.layer_norm(x, (31,))


@needs_norm
@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_layer_norm_backward_matches_autograd(device, dtype):
    x0 = gen(2, 9, 256, device=device, dtype=dtype, offset=0.3)
    w0 = gen(256, device=device, dtype=dtype, seed=4, offset=1.0)
    b0 = gen(256, device=device, dtype=dtype, seed=5)
    dy = gen(2, 9, 256, device=device, dtype=dtype, seed=6)

    def grads(fn, dt):
        x, w, b = (t.detach().to(dt).requires_grad_() for t in (x0, w0, b0))
        y = fn(x, (256,), w, b, 1e-5)
        y.backward(dy.to(dt))
        return y.detach(), x.grad, w.grad, b.grad

    fresh()
    got = grads(fpt.layer_norm, dtype)
    assert_fast()
    ref = grads(F.layer_norm, torch.float32)  # f32 reference on the same inputs
    for g, r, scale in zip(got, ref, (1, 1, 4, 4)):  # dgamma / dbeta sum over 18 rows
        assert g.dtype == dtype
        close(g, r, dtype, scale)


def ref_rms(x, w, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


@needs_norm
@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_rms_norm(device, dtype):
    x = gen(33, 512, device=device, dtype=dtype)
    w = gen(512, device=device, dtype=dtype, seed=7, offset=1.0)
    fresh()
    y = fpt.rms_norm(x, (512,), w, eps=1e-6)
    assert_fast()
    close(y, ref_rms(x, w, 1e-6), dtype)
    if hasattr(F, "rms_norm"):
        close(fpt.rms_norm(x, [512], w), F.rms_norm(x.float(), [512], w.float()), dtype)
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()
    fpt.rms_norm(xr, (512,), wr, eps=1e-6).sum().backward()
    xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
    ref_rms(xf, wf, 1e-6).sum().backward()
    close(xr.grad, xf.grad, dtype)
    close(wr.grad, wf.grad, dtype, scale=8)


def torch_act(y, name):
    return {"none": y, "gelu": F.gelu(y), "gelu_tanh": F.gelu(y, approximate="tanh"),
            "relu": F.relu(y), "silu": F.silu(y)}[name]


@needs_norm
@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_tanh", "relu", "silu"])
def test_add_layer_norm(device, dtype, activation):
    x = gen(4, 8, 320, device=device, dtype=dtype)
    r = gen(4, 8, 320, device=device, dtype=dtype, seed=8)
    w = gen(320, device=device, dtype=dtype, seed=9, offset=1.0)
    b = gen(320, device=device, dtype=dtype, seed=10)
    fresh()
    out, s = fpt.add_layer_norm(x, r, w, b, 1e-5, activation=activation)
    assert_fast()
    s_ref = x + r  # rounded to dtype, as the library's residual_out
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    ref = torch_act(F.layer_norm(s_ref.float(), (320,), w.float(), b.float(), 1e-5), activation)
    close(out, ref, dtype)


@needs_norm
@pytest.mark.parametrize("device", DEVICES)
def test_add_layer_norm_backward(device):
    dt = torch.float32
    x0, r0 = gen(6, 128, device=device, dtype=dt), gen(6, 128, device=device, dtype=dt, seed=11)
    w0, b0 = gen(128, device=device, dtype=dt, seed=12), gen(128, device=device, dtype=dt, seed=13)
    go, gs = gen(6, 128, device=device, dtype=dt, seed=14), gen(6, 128, device=device, dtype=dt, seed=15)

    def run(fn):
        x, r, w, b = (t.detach().clone().requires_grad_() for t in (x0, r0, w0, b0))
        out, s = fn(x, r, w, b)
        torch.autograd.backward([out, s], [go, gs])
        return [out.detach(), s.detach(), x.grad, r.grad, w.grad, b.grad]

    fresh()
    got = run(lambda x, r, w, b: fpt.add_layer_norm(x, r, w, b, 1e-5, activation="gelu_tanh"))
    assert_fast()

    def ref_fn(x, r, w, b):
        s = x + r
        return F.gelu(F.layer_norm(s, (128,), w, b, 1e-5), approximate="tanh"), s

    for g, rf in zip(got, run(ref_fn)):
        close(g, rf, dt, scale=5)


@needs_norm
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("used", ["out", "sum"])
def test_add_layer_norm_backward_one_output(device, used):
    """Only one of (out, x + r) reaches the loss: the other's gradient is None
    inside the Function (no zero tensor materialized) and the result matches
    torch's."""
    dt = torch.float32
    x0, r0 = gen(5, 96, device=device, dtype=dt), gen(5, 96, device=device, dtype=dt, seed=21)
    w0, b0 = gen(96, device=device, dtype=dt, seed=22), gen(96, device=device, dtype=dt, seed=23)
    g = gen(5, 96, device=device, dtype=dt, seed=24)

    def run(fn):
        x, r, w, b = (t.detach().clone().requires_grad_() for t in (x0, r0, w0, b0))
        out, s = fn(x, r, w, b)
        (out if used == "out" else s).backward(g)
        return [x.grad, r.grad, w.grad, b.grad]

    fresh()
    got = run(lambda x, r, w, b: fpt.add_layer_norm(x, r, w, b, 1e-5, activation="gelu"))
    assert_fast()

    def ref_fn(x, r, w, b):
        s = x + r
        return F.gelu(F.layer_norm(s, (96,), w, b, 1e-5)), s

    for gg, rf in zip(got, run(ref_fn)):
        if rf is None:
            assert gg is None or torch.count_nonzero(gg) == 0
        else:
            close(gg, rf, dt, scale=5)


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------

def ref_sdpa(q, k, v, is_causal=False, scale=None):
    """float32 math reference with PyTorch's (top-left) causal mask and GQA."""
    q, k, v = q.float(), k.float(), v.float()
    if k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


@needs_attn
@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_matches(device, dtype, is_causal):
    q = gen(2, 4, 70, 64, device=device, dtype=dtype)
    k = gen(2, 4, 70, 64, device=device, dtype=dtype, seed=1)
    v = gen(2, 4, 70, 64, device=device, dtype=dtype, seed=2)
    fresh()
    o = fpt.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert_fast()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert o.shape == ref.shape and o.dtype == dtype
    close(o, ref_sdpa(q, k, v, is_causal), dtype)
    close(o, ref.float(), dtype, scale=2)


@needs_attn
@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_views_gqa_scale_and_top_left_causal(device):
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    # q, k, v as (batch, heads, seq, dim) views of one packed (batch, seq, 3, heads, dim)
    # buffer: no copies, strides passed to the library.
    qkv = gen(2, 48, 3, 4, 128, device=device, dtype=dt)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    fresh()
    o = fpt.scaled_dot_product_attention(q, k, v, scale=0.05)
    assert_fast()
    close(o, ref_sdpa(q, k, v, scale=0.05), dt)
    # GQA 8 query heads on 2 kv heads
    q8 = gen(1, 8, 40, 64, device=device, dtype=dt, seed=3)
    k2, v2 = gen(1, 2, 40, 64, device=device, dtype=dt, seed=4), gen(1, 2, 40, 64, device=device, dtype=dt, seed=5)
    fresh()
    close(fpt.scaled_dot_product_attention(q8, k2, v2, is_causal=True, enable_gqa=True),
          ref_sdpa(q8, k2, v2, True), dt)
    assert_fast()
    # seqlen_q > seqlen_k with is_causal: PyTorch's top-left mask
    qa = gen(1, 2, 50, 64, device=device, dtype=dt, seed=6)
    ka, va = gen(1, 2, 30, 64, device=device, dtype=dt, seed=7), gen(1, 2, 30, 64, device=device, dtype=dt, seed=8)
    fresh()
    close(fpt.scaled_dot_product_attention(qa, ka, va, is_causal=True), ref_sdpa(qa, ka, va, True), dt)
    assert_fast()
    # 3-d input (batch, seq, dim)
    fresh()
    q3 = gen(3, 20, 32, device=device, dtype=dt, seed=9)
    close(fpt.scaled_dot_product_attention(q3, q3, q3), ref_sdpa(q3, q3, q3), dt)
    assert_fast()


@needs_attn
def test_sdpa_fallbacks():
    q = torch.randn(1, 2, 16, 32)
    cases = [
        (dict(attn_mask=torch.zeros(16, 16)), "attn_mask"),
        (dict(dropout_p=0.5), "dropout"),
        (dict(is_causal=True, _k=torch.randn(1, 2, 20, 32)), "seqlen_q < seqlen_k"),
        (dict(_q=torch.randn(1, 2, 16, 12)), "head_dim"),
        (dict(_q=torch.randn(1, 2, 16, 32, dtype=torch.float64)), "dtype"),
        (dict(_q=torch.randn(1, 2, 32, 16).transpose(-1, -2)), "contiguous"),
    ]
    for kw, why in cases:
        qq = kw.pop("_q", q)
        kk = kw.pop("_k", qq)
        fresh()
        if "dropout_p" in kw:
            fpt.scaled_dot_product_attention(qq, kk, kk, **kw)
        else:
            ref = F.scaled_dot_product_attention(qq, kk, kk, **kw)
            torch.testing.assert_close(fpt.scaled_dot_product_attention(qq, kk, kk, **kw), ref)
        assert fpt.last_path == "torch" and fpt.fallback_count == 1
        assert why in fpt.last_fallback_reason, fpt.last_fallback_reason
    qg = q.clone().requires_grad_()
    fresh()
    fpt.scaled_dot_product_attention(qg, qg, qg).sum().backward()
    assert "gradient" in fpt.last_fallback_reason and qg.grad is not None


@pytest.mark.skipif("cuda" not in DEVICES, reason="no CUDA")
@needs_attn
@needs_norm
def test_cuda_side_stream_and_default_stream_ordering():
    x = gen(4096, 1024, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = fpt.layer_norm(x * 2, (1024,))  # x * 2 and the norm both on s
        q = gen(1, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
        o = fpt.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.current_stream().wait_stream(s)
    close(y, F.layer_norm((x * 2).float(), (1024,)), torch.bfloat16)
    close(o, ref_sdpa(q, q, q, True), torch.bfloat16)
    # default stream: a producer kernel right before the call must be ordered
    for _ in range(3):
        z = x.float().mul_(3).to(torch.bfloat16)
        close(fpt.layer_norm(z, (1024,)), F.layer_norm(z.float(), (1024,)), torch.bfloat16)
