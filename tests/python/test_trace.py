"""fastpath.trace and fastpath.profile(): spans from the library's ops on a CPU
context, user ranges and spans, the exports, the verdict judged on workloads
built to be memory-, launch-, transfer- and sync-bound (compute: a span
declaring FLOPs at half the measured FMA roof; the library's attention is
judged compute-bound in tests/trace and tests/fastbench), the profile over contexts made inside the block
(as the torch drop-ins make theirs), and bad input."""
import importlib.util
import json
import sqlite3
import time

import numpy as np
import pytest

import fastpath
from fastpath import trace

pytestmark = pytest.mark.skipif(not trace.available(), reason="built without the trace capability")


def busy_wait(s):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < s:
        pass


@pytest.fixture
def ctx():
    c = fastpath.Context("cpu")
    yield c
    c.close()


def test_spans_ranges_and_exports(ctx, tmp_path):
    trace.enable(ctx, 256)
    x = np.random.default_rng(0).random((64, 256), dtype=np.float32)
    with trace.user_range(ctx, "model", "fwd"):
        fastpath.norm.layer_norm(ctx, x)
        with trace.span(ctx, "my_kernel", bytes=1e6, flops=2e6):
            busy_wait(1e-3)
    assert trace.step(ctx) == 1
    spans = {s["name"]: s for s in trace.read(ctx)}
    assert {"norm_fwd", "my_kernel", "model/fwd"} <= set(spans)
    k = spans["my_kernel"]
    assert k["module"] == "model" and k["stage"] == "fwd" and k["bytes"] == 1e6 and k["duration_s"] >= 1e-3
    assert spans["norm_fwd"]["module"] == "model" and spans["norm_fwd"]["bytes"] > 0
    st = trace.stats(ctx)
    assert st["enabled"] == 1 and st["dropped"] == 0 and st["step"] == 1
    trace.export_chrome(ctx, tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert "my_kernel" in {e["name"] for e in events}
    trace.export_sqlite(ctx, tmp_path / "t.sqlite")
    db = sqlite3.connect(":memory:")
    db.execute(f"ATTACH '{tmp_path / 't.sqlite'}' AS python")
    (share,) = db.execute("""SELECT SUM(duration) / (SELECT SUM(duration) FROM python.torch_trace
                                                     WHERE category != 'range')
                             FROM python.torch_trace WHERE name = 'my_kernel'""").fetchone()
    assert 0 < share <= 1


def test_verdict_on_built_workloads(ctx):
    r = trace.roofs(ctx)
    assert r["fma_tflops"] > 0 and r["copy_gbps"] > 0 and r["compute_tflops"] == 0
    trace.enable(ctx, 4096)
    big = np.random.default_rng(1).random((4096, 1024), dtype=np.float32)
    tiny = np.ones((1, 64), np.float32)
    host = np.ones(16 << 20, np.uint8)
    with trace.user_range(ctx, "memory"):
        for _ in range(3):
            with trace.span(ctx, "stream_kernel", bytes=2 * big.nbytes):
                np.copyto(np.empty_like(big), big)
    with trace.user_range(ctx, "launch"):
        for _ in range(10):
            busy_wait(300e-6)
            with trace.span(ctx, "tiny", bytes=tiny.nbytes * 2):
                pass
    with trace.user_range(ctx, "transfer"):
        for _ in range(3):
            with trace.span(ctx, "h2d", "transfer", bytes=host.nbytes):
                host.copy()
            with trace.span(ctx, "tiny", bytes=128):
                pass
    with trace.user_range(ctx, "sync"):
        for _ in range(10):
            with trace.span(ctx, "tiny", bytes=128):
                pass
            with trace.span(ctx, "wait", "sync"):
                busy_wait(300e-6)
    with trace.user_range(ctx, "compute"):
        with trace.span(ctx, "matmul", bytes=1e5, flops=r["fma_tflops"] * 1e12 * 0.5 * 2e-3):
            busy_wait(2e-3)
    for module in ("memory", "launch", "transfer", "sync", "compute"):
        v = trace.verdict(ctx, by="module", key=module, roofs=r)
        assert v["bound"] == module, (module, v)
        assert v["remedy"] and v["reason"]
    # the FLOP rate over the span's recorded time, against the FMA roof (no tensor roof on a CPU)
    v = trace.verdict(ctx, by="module", key="compute", roofs=r)
    mm = next(s for s in trace.read(ctx) if s["name"] == "matmul")
    assert v["compute_pct"] == pytest.approx(100 * mm["flops"] / mm["duration_s"] / (r["fma_tflops"] * 1e12))
    names = [g["group"] for g in trace.groups(ctx, by="name", roofs=r)]
    assert set(names) == {"stream_kernel", "tiny", "h2d", "wait", "matmul"}
    # no roofs: compute and memory shares unknown
    assert trace.verdict(ctx, by="name", key="matmul")["compute_pct"] is None


def test_profile_traces_contexts_made_inside(tmp_path):
    x = np.random.default_rng(2).random((2048, 1024), dtype=np.float32)
    with fastpath.profile(out_dir=tmp_path / "prof") as p:
        c = fastpath.Context("cpu")  # as fastpath.torch makes its contexts on first use
        for _ in range(4):
            fastpath.norm.layer_norm(c, x)
    assert p.verdict["bound"] in trace.BOUNDS and p.verdict["spans"] >= 4
    assert p.groups[0]["group"] == "norm_fwd"
    db = sqlite3.connect(p.sqlite_path)
    assert db.execute("SELECT COUNT(*) FROM torch_trace WHERE name = 'norm_fwd'").fetchone()[0] == 4
    assert json.loads(open(p.chrome_path).read())["traceEvents"]
    text = p.summary()
    assert "cpu:" in text and "remedy:" in text and "norm_fwd" in text
    assert not trace.is_enabled(c)  # turned off again
    # a context made after the block is not traced
    c2 = fastpath.Context("cpu")
    assert not trace.is_enabled(c2)
    c.close()
    c2.close()


def test_profile_keeps_user_tracing_and_given_contexts(ctx, tmp_path):
    trace.enable(ctx, 128)
    other = fastpath.Context("cpu")
    with fastpath.profile(contexts=[ctx], out_dir=tmp_path, roofs=False) as p:
        fastpath.norm.rms_norm(ctx, np.ones((8, 64), np.float32))
        fastpath.norm.rms_norm(other, np.ones((8, 64), np.float32))
    assert trace.is_enabled(ctx)  # it was on before: left on
    assert not trace.is_enabled(other) and len(p.results) == 1
    assert p.verdict["compute_pct"] is None and p.verdict["memory_pct"] is None  # roofs=False
    other.close()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_profile_sees_the_torch_dropins(tmp_path):
    import torch
    import fastpath.torch as ft
    x = torch.randn(512, 256)
    w, b = torch.ones(256), torch.zeros(256)
    with fastpath.profile(out_dir=tmp_path, roofs=False) as p:
        for _ in range(3):
            ft.layer_norm(x, (256,), w, b)
    names = {g["group"] for res in p.results for g in res["groups"]}
    assert "norm_fwd" in names, p.summary()


def test_profile_export_failure_turns_every_context_off(tmp_path):
    (tmp_path / "file").write_text("x")
    a, b = fastpath.Context("cpu"), fastpath.Context("cpu")
    with pytest.raises((fastpath.FastpathError, OSError)):
        with fastpath.profile(contexts=[a, b], out_dir=tmp_path / "file" / "sub", roofs=False):
            fastpath.norm.layer_norm(a, np.ones((4, 32), np.float32))
    assert not trace.is_enabled(a) and not trace.is_enabled(b)
    a.close()
    b.close()


def test_bad_input(ctx, tmp_path):
    with pytest.raises(fastpath.FastpathError) as e:
        trace.enable(ctx, 0)
    assert "capacity" in str(e.value)
    trace.enable(ctx, 16)
    with pytest.raises(fastpath.FastpathError) as e:
        trace.pop(ctx)
    assert "unbalanced" in str(e.value)
    (tmp_path / "f").write_text("x")
    with pytest.raises(fastpath.FastpathError) as e:
        trace.export_chrome(ctx, tmp_path / "f" / "t.json")
    assert e.value.status == fastpath.Status.IO
    with pytest.raises(fastpath.FastpathError):
        trace.export_sqlite(ctx, tmp_path / "f" / "t.sqlite")
    with pytest.raises(fastpath.FastpathError) as e:
        trace.verdict(ctx, by="name", key="nothing_by_that_name")
    assert e.value.status == fastpath.Status.NOT_FOUND
    with pytest.raises(ValueError):
        trace.verdict(ctx, by="colour")
    with pytest.raises(ValueError):
        fastpath.profile(capacity=0)
    # the context keeps recording
    fastpath.norm.layer_norm(ctx, np.ones((4, 32), np.float32))
    assert any(s["name"] == "norm_fwd" for s in trace.read(ctx))


def test_timer_choice(ctx):
    # a CPU context accepts either timer and keeps the clock
    assert trace.get_timer(ctx) == "events"
    trace.set_timer(ctx, "cupti")
    assert trace.get_timer(ctx) == "cupti"
    trace.enable(ctx, 16)
    with trace.span(ctx, "timed"):
        pass
    assert trace.stats(ctx)["timer"] == "cupti"
    spans = trace.read(ctx)
    assert [s["name"] for s in spans] == ["timed"] and spans[0]["end_s"] >= spans[0]["start_s"]
    trace.set_timer(ctx, "kernel")
    assert trace.get_timer(ctx) == "kernel"
    fastpath.norm.layer_norm(ctx, np.ones((4, 32), np.float32))
    st = trace.stats(ctx)
    # the clock: nothing to calibrate, no span of the kernel timer's on the host clock for want of a stamp
    assert st["timer"] == "kernel" and st["clock_error_s"] == 0 and st["host_timed"] == 0
    assert [s["name"] for s in trace.read(ctx)] == ["timed", "norm_fwd"]
    trace.set_timer(ctx, "events")
    assert trace.stats(ctx)["timer"] == "events"
    with pytest.raises(ValueError):
        trace.set_timer(ctx, "stopwatch")
