"""The params builders of the PyTorch drop-ins' hot path (norm._params,
norm._backward_params, attention._params: one struct.pack_into, no
per-field checks) write byte for byte the struct the checked raw-API
builders (make_params, make_backward_params) write for the same arguments,
and the attention one still names an out-of-range argument."""
import ctypes
import random

import pytest

from fastpath import _lib, attention, norm

I64 = (-(1 << 63), (1 << 63) - 1)


def _ints(rng, n, lo=-(1 << 63), hi=(1 << 63) - 1):
    return [rng.choice([lo, hi, 0, 1, rng.randrange(lo, hi)]) for _ in range(n)]


def _ptrs(rng, n):
    return [rng.choice([0, 8, (1 << 64) - 8, rng.randrange(1 << 48) * 16]) for _ in range(n)]


EPS = [1e-5, 1e-12, 0.1, 1e39, 1e-50, -1.0, float("inf")]


@pytest.mark.skipif(not norm.available(), reason="built without the norm capability")
@pytest.mark.parametrize("seed", range(20))
def test_norm_params_match_make_params(seed):
    rng = random.Random(seed)
    kind, act = rng.choice(list(norm.KINDS.values())), rng.choice(list(norm.ACTIVATIONS.values()))
    dtype = rng.choice([0, 1, 2])
    rows, cols, xs, rs = _ints(rng, 4)
    x, res, g, b, out, ro, mean, rstd = _ptrs(rng, 8)
    eps = rng.choice(EPS)
    fast = norm._params(kind, act, rows, cols, dtype, x, xs, res, rs, g, b, out, ro, mean, rstd,
                        eps)
    ref = norm.make_params(kind=kind, activation=act, rows=rows, cols=cols, dtype=dtype, x=x,
                           x_stride=xs, residual=res, residual_stride=rs, gamma=g, beta=b, out=out,
                           residual_out=ro, mean=mean, rstd=rstd, eps=eps)
    assert bytes(fast) == bytes(ref)

    dout, dres, dx, dg, db = _ptrs(rng, 5)
    fast = norm._backward_params(kind, act, rows, cols, dtype, dout, x, xs, g, b, mean, rstd, dres,
                                 dx, dg, db)
    ref = norm.make_backward_params(kind=kind, activation=act, rows=rows, cols=cols, dtype=dtype,
                                    dout=dout, x=x, x_stride=xs, gamma=g, beta=b, mean=mean,
                                    rstd=rstd, dresidual_out=dres, dx=dx, dgamma=dg, dbeta=db)
    assert bytes(fast) == bytes(ref)


@pytest.mark.skipif(not attention.available(), reason="built without the attention capability")
@pytest.mark.parametrize("seed", range(20))
def test_attention_params_match_make_params(seed):
    rng = random.Random(seed)
    ints = _ints(rng, 11, -(1 << 31), (1 << 31) - 1)
    strides = [tuple(_ints(rng, 3)) for _ in range(4)]
    q, k, v, o, lse, sk, bt, cq, ck = _ptrs(rng, 9)
    total_k = rng.randrange(0, 1 << 40)
    descales = dict(zip(("q_descale", "k_descale", "v_descale"), rng.choice([(0.0, 0.0, 0.0), EPS[2:5]])))
    os_ = rng.choice([None, strides[3]])
    scale, causal, dtype = rng.choice(EPS + [0.0]), rng.choice([0, 1]), rng.choice([0, 1, 2, 3])
    B, Lq, Lk, Hq, Hkv, D, wl, wr, bts, ps, npg = ints
    fast = attention._params(B, Lq, Lk, Hq, Hkv, D, dtype, q, strides[0], k, strides[1], v,
                             strides[2], o, os_, scale, causal, wl, wr, lse=lse, seqlens_k=sk,
                             block_table=bt, block_table_stride=bts, page_size=ps, num_pages=npg,
                             cu_seqlens_q=cq, cu_seqlens_k=ck, total_k=total_k, **descales)
    kw = {f"{t}_{d}_stride": s[i] for t, s in zip("qkv", strides)
          for i, d in enumerate(("batch", "seq", "head"))}
    if os_ is not None:
        kw.update(o_batch_stride=os_[0], o_seq_stride=os_[1], o_head_stride=os_[2])
    ref = attention.make_params(batch=B, seqlen_q=Lq, seqlen_k=Lk, heads_q=Hq, heads_kv=Hkv,
                                head_dim=D, dtype=dtype, q=q, k=k, v=v, o=o, softmax_scale=scale,
                                causal=causal, window_left=wl, window_right=wr, lse=lse,
                                seqlens_k=sk, block_table=bt, block_table_stride=bts, page_size=ps,
                                num_pages=npg, cu_seqlens_q=cq, cu_seqlens_k=ck, total_k=total_k,
                                **descales,
                                **kw)
    assert bytes(fast) == bytes(ref)


@pytest.mark.skipif(not attention.available(), reason="built without the attention capability")
@pytest.mark.parametrize("field", ["batch", "seqlen_k", "heads_kv", "window_left", "num_pages"])
def test_attention_params_out_of_range_names_the_argument(field):
    args = dict(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1, head_dim=8, window_left=-1,
                window_right=-1, block_table_stride=0, page_size=0, num_pages=0)
    args[field] = 1 << 31
    with pytest.raises(ValueError, match=field):
        attention._params(args["batch"], args["seqlen_q"], args["seqlen_k"], args["heads_q"],
                          args["heads_kv"], args["head_dim"], 0, 8, (0, 0, 0), 8, (0, 0, 0), 8,
                          (0, 0, 0), 8, None, 0.0, 0, args["window_left"], args["window_right"],
                          block_table_stride=args["block_table_stride"],
                          page_size=args["page_size"], num_pages=args["num_pages"])


def test_struct_packer_layout():
    for cls in (_lib.NormParams, _lib.NormBackwardParams, _lib.AttentionParams,
                _lib.TimingConfig):
        assert _lib.struct_packer(cls).size == ctypes.sizeof(cls)
    with pytest.raises(TypeError, match="name"):
        _lib.struct_packer(_lib.DeviceInfo)  # a char array: not packable


def test_set_ints_still_checks_every_field():
    p = _lib.NormParams()
    _lib.set_ints(p, rows=I64[1], cols=I64[0], kind=-(1 << 31))
    assert (p.rows, p.cols, p.kind) == (I64[1], I64[0], -(1 << 31))
    for name, bad in (("rows", I64[1] + 1), ("kind", 1 << 31), ("cols", I64[0] - 1)):
        with pytest.raises(ValueError, match=f"{name} = {bad} is out of range"):
            _lib.set_ints(p, **{name: bad})
    cfg = _lib.TimingConfig()
    with pytest.raises(ValueError, match="struct_size"):
        _lib.set_ints(cfg, struct_size=-1)
