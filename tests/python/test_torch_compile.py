"""fastpath.torch under torch.compile: the drop-ins trace as the custom
operators fastpath::norm_fwd / norm_bwd / sdpa (no graph break, so
fullgraph=True compiles), their fake implementations and autograd pass
torch.library.opcheck, and compiled results (forward and gradients) agree
with torch.nn.functional. CPU always (when torch is installed), CUDA too when
a GPU is visible. Skipped without torch or without torch.library.custom_op."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fastpath  # noqa: E402
import fastpath.torch as fpt  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not fpt._COMPILE_OPS, reason="torch without torch.library.custom_op"),
    pytest.mark.skipif(not (fastpath.norm.available() and fastpath.attention.available()),
                       reason="built without norm or attention"),
]

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and fastpath.device_count() > 0 else [])
H = 96  # hidden size of the small blocks below


def block(x, residual, w, b, w2, q, k, v):
    """A pre-norm transformer step's fused pieces: add + LayerNorm + GELU,
    attention, RMSNorm."""
    y, s = fpt.add_layer_norm(x, residual, w, b, 1e-5, activation="gelu")
    a = fpt.scaled_dot_product_attention(q, k, v, is_causal=True)
    z = fpt.rms_norm(y, (H,), w2, eps=1e-6)
    n = fpt.layer_norm(s, (H,), w, b, eps=1e-5)
    return z, s, a, n


def reference(x, residual, w, b, w2, q, k, v):
    s = x + residual
    y = F.gelu(F.layer_norm(s, (H,), w, b, 1e-5))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ms = y.float().pow(2).mean(-1, keepdim=True)
    z = (y.float() * torch.rsqrt(ms + 1e-6)).to(y.dtype) * w2
    n = F.layer_norm(s, (H,), w, b, 1e-5)
    return z, s, a, n


def inputs(device, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0, offset=0.0):
        t = (torch.randn(*shape, generator=g) * scale + offset).to(device=device, dtype=dtype)
        return t.requires_grad_(grad)

    x, residual = r(3, 5, H), r(3, 5, H, scale=0.5)
    w, b, w2 = r(H, scale=0.3, offset=1.0), r(H, scale=0.2), r(H, scale=0.3, offset=1.0)
    q, k, v = (r(2, 4, 33, 64).detach() for _ in range(3))  # attention: inference only
    return x, residual, w, b, w2, q, k, v


def close(got, ref, tol=2e-5):
    for gt, rt in zip(got, ref):
        torch.testing.assert_close(gt.float(), rt.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_fullgraph_forward_runs_the_library(device):
    """fullgraph=True: a graph break would raise. The operators ran (counted)
    and agree with torch."""
    torch._dynamo.reset()
    args = inputs(device)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    fpt.reset_stats()
    with torch.no_grad():
        got = compiled(*args)
        ref = reference(*args)
    close(got, ref)
    assert fpt.fastpath_count == 4 and fpt.fallback_count == 0, dict(fpt.fallback_reasons)


@pytest.mark.parametrize("device", DEVICES)
def test_graph_holds_the_custom_operators(device):
    """What Dynamo traced: the fastpath operators, not torch's norm / attention."""
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    with torch.no_grad():
        torch.compile(block, backend=backend, fullgraph=True)(*inputs(device))
    assert sum("fastpath.norm_fwd" in t for t in seen) == 3, seen
    assert sum("fastpath.sdpa" in t for t in seen) == 1, seen
    assert not any("layer_norm" in t or "scaled_dot_product" in t for t in seen), seen


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_training_gradients(device):
    """Forward and backward compiled (AOTAutograd traces fastpath::norm_bwd):
    gradients of x, residual and the parameters agree with torch's."""
    torch._dynamo.reset()

    def loss_fast(x, residual, w, b, w2):
        y, s = fpt.add_layer_norm(x, residual, w, b, 1e-5, activation="silu")
        z = fpt.rms_norm(y, (H,), w2, eps=1e-6)
        return (z * z).sum() + (s * 0.5).sum() + fpt.layer_norm(x, (H,), w, b).sum()

    def loss_ref(x, residual, w, b, w2):
        s = x + residual
        y = F.silu(F.layer_norm(s, (H,), w, b, 1e-5))
        z = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * w2
        return (z * z).sum() + (s * 0.5).sum() + F.layer_norm(x, (H,), w, b).sum()

    a = inputs(device, grad=True)[:5]
    r = [t.detach().clone().requires_grad_(True) for t in a]
    compiled = torch.compile(loss_fast, backend="aot_eager", fullgraph=True)
    fpt.reset_stats()
    compiled(*a).backward()
    loss_ref(*r).backward()
    assert fpt.fastpath_count == 3 and fpt.fallback_count == 0, dict(fpt.fallback_reasons)
    for got, ref in zip(a, r):
        torch.testing.assert_close(got.grad, ref.grad, atol=1e-4, rtol=1e-4)


def test_inductor_compiles_around_the_operators():
    """The default backend (inductor) on CPU: the operators stay opaque calls
    and the generated code around them agrees with eager."""
    torch._dynamo.reset()
    args = inputs("cpu", seed=3)
    try:
        compiled = torch.compile(block, fullgraph=True)
        with torch.no_grad():
            got = compiled(*args)
    except Exception as e:  # no C++ toolchain for inductor's CPU code
        if "InvalidCxxCompiler" in type(e).__name__ or "CppCompileError" in type(e).__name__:
            pytest.skip(f"inductor cannot build CPU code here: {type(e).__name__}")
        raise
    with torch.no_grad():
        close(got, reference(*args), tol=1e-4)


def test_unsupported_cases_trace_torch_ops():
    """What the library does not take (attn_mask, f64, non-contiguous x) is
    traced as torch's own op: still one graph, same results, nothing counted
    as a fastpath call."""
    torch._dynamo.reset()

    def f(x, w, b, q, k, v, m):
        return (fpt.layer_norm(x, (H,), w, b), fpt.layer_norm(x.transpose(0, 1), (H,), w, b),
                fpt.scaled_dot_product_attention(q, k, v, attn_mask=m))

    g = torch.Generator().manual_seed(5)
    x, w, b = (torch.randn(4, 4, H, generator=g, dtype=torch.float64),
               torch.randn(H, generator=g, dtype=torch.float64), torch.randn(H, generator=g, dtype=torch.float64))
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
    m = torch.ones(8, 8, dtype=torch.bool).tril()
    fpt.reset_stats()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w, b, q, k, v, m)
    ref = (F.layer_norm(x, (H,), w, b), F.layer_norm(x.transpose(0, 1), (H,), w, b),
           F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    close(got, ref, tol=1e-6)
    assert fpt.fastpath_count == 0


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    """torch.library.opcheck: schema, fake tensors (shapes and strides of the
    real outputs), autograd registration and AOT dispatch of each operator."""
    g = torch.Generator().manual_seed(7)

    def r(*shape, grad=False):
        return torch.randn(*shape, generator=g).to(device).requires_grad_(grad)

    x, res, w, b = r(6, H, grad=True), r(6, H, grad=True), r(H, grad=True), r(H, grad=True)
    ops = torch.ops.fastpath
    torch.library.opcheck(ops.norm_fwd.default, (x, res, w, b, "layernorm", "gelu_tanh", 1e-5, H, True))
    torch.library.opcheck(ops.norm_fwd.default, (x, None, w, None, "rmsnorm", "none", 1e-6, H, True))
    torch.library.opcheck(ops.norm_fwd.default, (x.detach(), None, None, None, "layernorm", "relu", 1e-5, H, False))
    s = (x + res).detach()
    mean, rstd = s.mean(-1), torch.rsqrt(s.var(-1, unbiased=False) + 1e-5)
    torch.library.opcheck(ops.norm_bwd.default, (r(6, H), s, w.detach(), b.detach(), mean, rstd, r(6, H),
                                                 "layernorm", "silu", H, True, True))
    q, k, v = r(2, 4, 9, 32), r(2, 2, 12, 32), r(2, 2, 12, 32)
    torch.library.opcheck(ops.sdpa.default, (q, k, v, False, None, True))
    torch.library.opcheck(ops.sdpa.default, (q[:, 0], k[:, 0], v[:, 0], True, 0.3, False))


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_decode_step_kvcache(device):
    """A decode step (paged and dense caches, tensor and int cache_seqlens,
    LSE) compiled with fullgraph: one fastpath::attention_kvcache per call,
    results bit-identical to the eager call (the same library call)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(11)
    B, Hq, Hkv, D, ps, blocks = 3, 8, 2, 64, 16, 4
    q = torch.randn(B, 1, Hq, D, generator=g).to(device)
    kp, vp = (torch.randn(B * blocks + 2, ps, Hkv, D, generator=g).to(device) for _ in range(2))
    bt = torch.randperm(B * blocks + 2, generator=g)[:B * blocks].view(B, blocks).to(torch.int32).to(device)
    kd, vd = (torch.randn(B, 50, Hkv, D, generator=g).to(device) for _ in range(2))
    lens = torch.tensor([5, 64, 33], dtype=torch.int32, device=device)

    def step(q, kp, vp, bt, kd, vd, lens):
        o1, lse = fpt.attention_with_kvcache(q, kp, vp, lens, bt, causal=True, return_lse=True)
        o2 = fpt.attention_with_kvcache(q, kd, vd, 40, softmax_scale=0.2, window_size=(16, -1))
        return o1, lse, o2

    fpt.reset_stats()
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, kp, vp, bt, kd, vd, lens)
    assert fpt.fastpath_count == 2, dict(fpt.fallback_reasons)
    ref = step(q, kp, vp, bt, kd, vd, lens)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # the eager body's checks still run inside the graph: a bad length raises then
    with pytest.raises(ValueError, match="cache_seqlens"):
        bad = torch.tensor([5, 65, 33], dtype=torch.int32)  # > 4 pages x 16 (CPU: checked)
        torch.compile(step, backend="aot_eager", fullgraph=True)(q.cpu(), kp.cpu(), vp.cpu(), bt.cpu(), kd.cpu(),
                                                                 vd.cpu(), bad)


def test_opcheck_kvcache():
    g = torch.Generator().manual_seed(13)
    q = torch.randn(2, 3, 4, 32, generator=g)
    k, v = torch.randn(2, 20, 2, 32, generator=g), torch.randn(2, 20, 2, 32, generator=g)
    lens = torch.tensor([7, 20], dtype=torch.int32)
    op = torch.ops.fastpath.attention_kvcache.default
    torch.library.opcheck(op, (q, k, v, lens, -1, None, None, True, -1, -1, True))
    torch.library.opcheck(op, (q, k, v, None, 11, None, 0.5, False, 4, 2, False))
