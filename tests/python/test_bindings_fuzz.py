"""The Python bindings under bad input: integers that do not fit their C type
raise ValueError naming the argument (ctypes kept their low bits: 2**32 + 1
became 1, -1 became SIZE_MAX, so bad input ran as different valid input), and
a seeded random mix of valid and broken calls to the array layers and the
allocator raises only the bindings' clean exceptions (never a crash, never
another exception type)."""
import random

import pytest

np = pytest.importorskip("numpy")

import fastpath  # noqa: E402
from fastpath import alloc, attention, norm  # noqa: E402

CLEAN = (ValueError, TypeError, OverflowError, fastpath.FastpathError)


@pytest.fixture(scope="module")
def ctx():
    with fastpath.Context("cpu") as c:
        yield c


def _qkv(shape=(1, 3, 2, 8)):
    g = np.random.default_rng(5)
    return [g.uniform(-1, 1, size=shape).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize("call,name", [
    (lambda c: fastpath.Context("cuda:4294967296"), "device index"),
    (lambda c: fastpath.convert(0, "f32", 0, "f32", 2 ** 64 + 1), "n"),
    (lambda c: attention.forward_arrays(c, *_qkv(), window_left=2 ** 32), "window_left"),
    (lambda c: attention.forward_arrays(c, *_qkv(), window_right=-(2 ** 32) - 1), "window_right"),
    (lambda c: attention.make_params(batch=2 ** 32 + 1, seqlen_q=1, seqlen_k=1, heads_q=1, head_dim=8,
                                     q=8, k=8, v=8, o=8), "batch"),
    (lambda c: attention.make_params(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, head_dim=8, q=8, k=8,
                                     v=8, o=8, q_seq_stride=2 ** 64), "q_seq_stride"),
    (lambda c: norm.make_params(rows=2 ** 64 + 3, cols=4, x=8, out=8), "rows"),
    (lambda c: norm.forward_arrays(c, np.ones((2, 4), np.float32), kind=2 ** 32), "kind"),
    (lambda c: norm.make_backward_params(rows=1, cols=4, dout=8, x=8, dx=8, rstd=8, dx_stride=-(2 ** 63) - 1),
     "dx_stride"),
] + ([
    (lambda c: alloc.Allocator(c).alloc(2 ** 64 + 4096), "size"),
    (lambda c: alloc.Allocator(c).trim(-1), "target_reserved"),
    (lambda c: alloc.Allocator(c).round_size(-4096), "size"),
    (lambda c: alloc.Allocator(c, memory_cap_bytes=-1), "memory_cap_bytes"),
    (lambda c: alloc.Allocator(c, divisions=[(0, 1 << 20, 2 ** 32 + 4)]), "divisions"),
    (lambda c: alloc.generate_trace(layers=2 ** 32 + 1), "layers"),
] if alloc.available() else []))
def test_out_of_range_integers_raise(ctx, call, name):
    with pytest.raises(ValueError, match=name):
        call(ctx)


def test_range_limits_still_pass(ctx):
    q, k, v = _qkv()
    # INT_MAX is a valid (unbounded) window: the same as -1
    o1 = attention.forward_arrays(ctx, q, k, v, window_left=2 ** 31 - 1, window_right=2 ** 31 - 1)
    o2 = attention.forward_arrays(ctx, q, k, v)
    assert np.array_equal(o1, o2)
    if alloc.available():
        with alloc.Allocator(ctx, memory_cap_bytes=2 ** 64 - 1) as a:
            p = a.alloc(1000)
            assert a.usable_size(p) >= 1000
            a.free(p)
            a.trim(2 ** 64 - 1)


def _garbage(rng):
    return rng.choice([None, 0, -1, 2 ** 70, 1.5, float("nan"), "x", [], [1, 2], np.zeros(0),
                       np.zeros((2, 3)), np.zeros((2, 3), np.int64), np.ones((4, 8), np.float16),
                       object()])


def _arr(rng, shape, dt):
    return np.random.default_rng(rng.randrange(1 << 30)).uniform(-2, 2, size=shape).astype(dt)


def _norm_call(ctx, rng):
    r, c = rng.randrange(0, 5), rng.randrange(0, 40)
    x = _arr(rng, (r, c), rng.choice([np.float32, np.float16, np.float64, np.uint16]))
    kw = {}
    for name in ("residual", "gamma", "beta", "bias"):
        if rng.random() < 0.3:
            good = _arr(rng, (r, c) if name == "residual" else (c,), np.float32)
            kw[name] = good if rng.random() < 0.7 else _garbage(rng)
    if rng.random() < 0.2:
        kw["eps"] = rng.choice([1e-5, 0.0, -1.0, float("nan"), float("inf")])
    if rng.random() < 0.2:
        kw["kind"] = rng.choice(["layernorm", "rmsnorm", "bad", 7, -1, 2 ** 40])
    if rng.random() < 0.2:
        kw["activation"] = rng.choice(["none", "silu", "nope", 99])
    if rng.random() < 0.2:
        kw["dtype"] = rng.choice(["f32", "f16", "bf16", "fp8e4m3", 5, "float64"])
    res = norm.forward_arrays(ctx, x if rng.random() < 0.9 else _garbage(rng),
                              want_residual_out=rng.random() < 0.5, want_stats=rng.random() < 0.5, **kw)
    assert res["out"].shape == x.shape


def _attention_call(ctx, rng):
    B, L, H = rng.randrange(0, 3), rng.randrange(0, 6), rng.randrange(0, 3)
    D = rng.choice([0, 4, 8, 16, 12, 264])
    Lk, Hk = rng.randrange(0, 8), rng.choice([1, H or 1, 2])
    lay = rng.choice(["bshd", "bhsd", "bad"])
    shape = (lambda b, s, h, d: (b, h, s, d) if lay == "bhsd" else (b, s, h, d))
    dt = rng.choice([np.float32, np.float16, np.uint16, np.float64])
    q, k, v = (_arr(rng, shape(B, n, h, D), dt) for n, h in ((L, H), (Lk, Hk), (Lk, Hk)))
    if rng.random() < 0.2:
        q = q[..., ::-1]
    if rng.random() < 0.1:
        k = _garbage(rng)
    kw = {}
    if rng.random() < 0.3:
        kw["seqlens_k"] = rng.choice([[1] * B, [-5] * B, [2 ** 40] * B, [1] * (B + 1), _garbage(rng)])
    if rng.random() < 0.3:
        kw["scale"] = rng.choice([0.5, -1.0, float("nan"), float("inf")])
    if rng.random() < 0.3:
        kw["window_left"] = rng.choice([-2, 0, 3, 2 ** 31, 2 ** 40])
    if rng.random() < 0.3:
        kw["dtype"] = rng.choice(["f32", "f16", "bf16"])
    attention.forward_arrays(ctx, q, k, v, layout=lay, causal=rng.random() < 0.3,
                             want_lse=rng.random() < 0.5, **kw)


def _alloc_call(ctx, rng):
    cfg = {} if rng.random() < 0.7 else {"memory_cap_bytes": rng.choice([1 << 20, -1, 2 ** 70]),
                                         "memory_fraction": rng.choice([0.5, -1.0, float("nan")])}
    with alloc.Allocator(ctx, **cfg) as a:
        live = []
        for _ in range(20):
            op = rng.randrange(6)
            if op == 0:
                p = a.alloc(rng.choice([0, 1, 4096, -1, 2 ** 64 - 1, 2 ** 70, 1 << 22]))
                if p:
                    live.append(p)
            elif op == 1 and live:
                a.free(live.pop())
            elif op == 2:
                try:
                    a.free(rng.choice([12345, 2 ** 64 - 1, 256]))
                except fastpath.FastpathError as e:
                    assert e.status == fastpath.Status.NOT_FOUND
            elif op == 3:
                a.usable_size(rng.choice(live + [77]))
            elif op == 4:
                a.round_size(rng.choice([0, 1, -5, 2 ** 70, 1000]))
            else:
                assert a.stats()["allocation_count"]["current"] == len(live)
                a.snapshot()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_calls_fail_cleanly(ctx, seed):
    rng = random.Random(seed)
    calls = [_norm_call, _attention_call] + ([_alloc_call] if alloc.available() else [])
    for _ in range(300):
        try:
            rng.choice(calls)(ctx, rng)
        except CLEAN:
            pass
