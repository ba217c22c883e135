"""fastpath.torch's per-call hot path (dense inputs without a view, outputs
allocated in x's shape, the cached CPU context used without _Launch, params
packed in one call): what the shortcuts must keep. CPU only; skipped without
torch."""
import threading

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fastpath  # noqa: E402
import fastpath.torch as fpt  # noqa: E402

pytestmark = pytest.mark.skipif(not fastpath.norm.available(), reason="built without norm")


def rnd(*shape, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 - 1 + 0.05).requires_grad_(grad)


def close(a, b):
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("layout", ["dense", "strided_rows", "transposed_leading"])
def test_outputs_are_dense_tensors_of_x_shape(layout):
    base = rnd(3, 5, 96, seed=1)
    x = {"dense": base[..., :64].contiguous(), "strided_rows": base[..., :64],
         "transposed_leading": base[..., :64].transpose(0, 1)}[layout]
    r, w, b = rnd(*x.shape, seed=2), rnd(64, seed=3), rnd(64, seed=4)
    fpt.reset_stats()
    outs = [(fpt.layer_norm(x, (64,), w, b), F.layer_norm(x, (64,), w, b)),
            (fpt.rms_norm(x, (64,), w, 1e-6), F.rms_norm(x, (64,), w, 1e-6))]
    o, s = fpt.add_layer_norm(x, r, w, b)
    outs += [(o, F.layer_norm(x + r, (64,), w, b)), (s, x + r)]
    if layout == "transposed_leading":  # leading dims cannot be flattened without a copy
        assert fpt.fallback_count == 3
    else:
        assert fpt.fallback_count == 0 and fpt.fastpath_count == 3
    for got, ref in outs:
        close(got, ref)
        if layout != "transposed_leading":
            assert got.shape == x.shape and got.is_contiguous() and not got._is_view()
            assert got.stride() == ref.contiguous().stride()


def test_contiguous_with_odd_stride_on_a_size_one_dim_falls_back_as_before():
    # is_contiguous() ignores the stride of a size-1 dimension; the library
    # path needs stride(-1) == 1 when several columns are normalized
    x = rnd(4, 64, 1, seed=5).as_strided((4, 64, 1), (64, 1, 7))
    assert x.is_contiguous()
    fpt.reset_stats()
    close(fpt.layer_norm(x, (64, 1)), F.layer_norm(x, (64, 1)))
    assert fpt.last_fallback_reason == "last dimension not contiguous"
    close(fpt.layer_norm(x, (1,)), F.layer_norm(x, (1,)))  # one column: runs in libfastpath
    assert fpt.last_path == "fastpath"


def test_backward_with_non_contiguous_gradients():
    # the dense copies of the incoming gradients must live through the call
    x, r = rnd(6, 64, seed=6, grad=True), rnd(6, 64, seed=7, grad=True)
    w, b = rnd(64, seed=8, grad=True), rnd(64, seed=9, grad=True)
    g_out, g_res = rnd(64, 6, seed=10).t(), rnd(64, 6, seed=11).t()
    assert not g_out.is_contiguous()
    o, s = fpt.add_layer_norm(x, r, w, b, activation="gelu")
    got = torch.autograd.grad((o, s), (x, r, w, b), (g_out, g_res))
    s_ref = x + r
    o_ref = F.gelu(F.layer_norm(s_ref, (64,), w, b))
    ref = torch.autograd.grad((o_ref, s_ref), (x, r, w, b), (g_out, g_res))
    for a, e in zip(got, ref):
        close(a, e)
    y = fpt.rms_norm(x, (64,), w, 1e-6)
    got = torch.autograd.grad(y, (x, w), g_out)
    ref = torch.autograd.grad(F.rms_norm(x, (64,), w, 1e-6), (x, w), g_out)
    for a, e in zip(got, ref):
        close(a, e)


def test_calls_from_several_threads_share_one_cpu_context():
    ctx = fpt.context_for("cpu")
    errors, done = [], []

    def work(seed):
        try:
            x, w, b = rnd(8, 64, seed=seed), rnd(64, seed=seed + 1), rnd(64, seed=seed + 2)
            for _ in range(50):
                close(fpt.layer_norm(x, (64,), w, b), F.layer_norm(x, (64,), w, b))
                o, _ = fpt.add_layer_norm(x, w.expand(8, 64), w, b)
                close(o, F.layer_norm(x + w, (64,), w, b))
            done.append(seed)
        except Exception as e:  # reported below: an assert in a thread is not seen by pytest
            errors.append(e)

    threads = [threading.Thread(target=work, args=(100 * i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(done) == 4
    assert fpt.context_for("cpu") is ctx


@pytest.mark.skipif(not fastpath.attention.available(), reason="built without attention")
def test_attention_out_of_range_shape_raises_as_before():
    # a c_int field that does not fit is refused with the argument named
    # (a tensor that large cannot be allocated here: call the builder)
    with pytest.raises(ValueError, match="seqlen_k"):
        fastpath.attention._params(1, 1, 1 << 31, 1, 1, 8, 0, 8, (0, 0, 0), 8, (0, 0, 0), 8,
                                   (0, 0, 0), 8, None, 0.0, 0, -1, -1)


def test_output_can_be_modified_in_place_under_autograd():
    # F.layer_norm's output is no view; neither is the drop-in's (it was a
    # view made inside the autograd Function, which refused in-place use)
    x, w = rnd(4, 64, seed=12, grad=True), rnd(64, seed=13, grad=True)
    y = fpt.layer_norm(x, (64,), w)
    y.mul_(2)
    gx, gw = torch.autograd.grad(y.sum(), (x, w))
    y_ref = F.layer_norm(x, (64,), w)
    y_ref.mul_(2)
    for a, e in zip((gx, gw), torch.autograd.grad(y_ref.sum(), (x, w))):
        close(a, e)


needs_attn = pytest.mark.skipif(not fastpath.attention.available(), reason="built without attention")


def ref_sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw).float()


@needs_attn
@pytest.mark.parametrize("shape", [(2, 3, 5, 16), (1, 4, 1, 32), (2, 1, 7, 8), (3, 6, 16)])
def test_sdpa_output_is_a_bhsd_view_of_a_bshd_buffer(shape):
    # allocated with the strides of the (B, L, H, D) buffer's transposed view
    # (no view made per call), which is what the fake of fastpath::sdpa and
    # PyTorch's flash backend give; a 3-d call (one head, no unsqueezed
    # views) returns a dense (B, L, D) tensor as before
    q, k, v = rnd(*shape, seed=20), rnd(*shape, seed=21), rnd(*shape, seed=22)
    fpt.reset_stats()
    o = fpt.scaled_dot_product_attention(q, k, v)
    assert fpt.last_path == "fastpath", fpt.last_fallback_reason
    if len(shape) == 4:
        B, H, L, D = shape
        expect = torch.empty(B, L, H, D).transpose(1, 2).stride()
    else:
        expect = torch.empty(shape).stride()
    assert o.shape == q.shape and o.stride() == expect, (o.stride(), expect)
    close(o, ref_sdpa(q, k, v))


@needs_attn
def test_sdpa_3d_views_and_gqa():
    # 3-d q / k / v as strided slices of one packed (B, L, 3, D) buffer
    qkv = rnd(2, 9, 3, 24, seed=23)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    fpt.reset_stats()
    close(fpt.scaled_dot_product_attention(q, k, v, is_causal=True), ref_sdpa(q, k, v, is_causal=True))
    assert fpt.last_path == "fastpath"
    # GQA: 6 query heads on 2 KV heads, k / v of another length
    q, k, v = rnd(1, 6, 4, 16, seed=24), rnd(1, 2, 11, 16, seed=25), rnd(1, 2, 11, 16, seed=26)
    close(fpt.scaled_dot_product_attention(q, k, v, enable_gqa=True),
          ref_sdpa(q, k, v, enable_gqa=True))
    assert fpt.last_path == "fastpath" and fpt.fallback_count == 0


@needs_attn
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_sdpa_broadcast_dimension_falls_back(dim):
    # a stride-0 (expanded) batch, head or sequence dimension of k is refused
    # by the fast path (torch runs it); extent 1 there is no broadcast
    shape = [2, 3, 5, 16]
    one = list(shape)
    one[dim] = 1
    k = rnd(*one, seed=27).expand(*shape)
    q, v = rnd(*shape, seed=28), rnd(*shape, seed=29)
    fpt.reset_stats()
    close(fpt.scaled_dot_product_attention(q, k, v), ref_sdpa(q, k, v))
    assert fpt.last_path == "torch" and "broadcast" in fpt.last_fallback_reason, \
        fpt.last_fallback_reason
    k1 = rnd(*one, seed=30)  # the same extent-1 tensor, not expanded: any stride is fine there
    q1, v1 = rnd(*one[:2], shape[2], 16, seed=31), k1.clone()
    if dim != 2:
        close(fpt.scaled_dot_product_attention(q1, k1, v1), ref_sdpa(q1, k1, v1))
        assert fpt.last_path == "fastpath", fpt.last_fallback_reason


@needs_attn
@pytest.mark.parametrize("nd", [3, 4])
def test_sdpa_value_head_dim_other_than_keys_falls_back(nd):
    # torch takes a value head_dim other than q / k's; the library does not
    lead = (2, 3)[:nd - 2]
    q, k, v = rnd(*lead, 5, 16, seed=32), rnd(*lead, 7, 16, seed=33), rnd(*lead, 7, 24, seed=34)
    fpt.reset_stats()
    o = fpt.scaled_dot_product_attention(q, k, v)
    assert o.shape == (*lead, 5, 24)
    close(o, ref_sdpa(q, k, v))
    assert fpt.last_path == "torch" and "shapes" in fpt.last_fallback_reason, fpt.last_fallback_reason
