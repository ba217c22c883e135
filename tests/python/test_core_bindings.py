"""Core and timing bindings: versions, errors with detail, contexts, stats,
time/ab with Python callables."""
import pytest

import fastpath


def test_version():
    assert fastpath.version().count(".") == 2


def test_no_device_is_a_clean_error():
    if fastpath.device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(fastpath.FastpathError) as e:
        fastpath.Context("cuda:0")
    assert e.value.status == fastpath.Status.NO_DEVICE
    assert "no CUDA device" in e.value.detail


def test_bad_device_string():
    with pytest.raises(ValueError):
        fastpath.Context("tpu")
    # typos of "cuda:N" used to open cuda:0 (or fail with NO_DEVICE)
    for bad in ("cudafoo", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", None):
        with pytest.raises(ValueError):
            fastpath.Context(bad)


def test_cpu_context_info():
    with fastpath.Context("cpu") as ctx:
        info = ctx.info()
        assert info["kind"] == 0 and info["sm_count"] >= 1 and info["name"]
        assert not ctx.is_cuda
        ctx.synchronize()


def test_context_options_by_name():
    with fastpath.Context("cpu") as ctx:
        ctx.set_option("attention_kernel", 6)  # the decode kernel (CUDA dispatch reads it)
        ctx.set_option("attention_kernel", 0)
        ctx.set_option("cpu_threads", 1)
        ctx.set_option("attention_split_combine", 1)
        for v in (1, -1, 0):  # programmatic dependent launch: accepted, nothing to launch on a CPU
            ctx.set_option("launch_pdl", v)
        with pytest.raises(fastpath.FastpathError, match="FP_CTX_LAUNCH_PDL must be -1, 0 or 1"):
            ctx.set_option("launch_pdl", 2)
        # the library's range check, with its message
        with pytest.raises(fastpath.FastpathError) as e:
            ctx.set_option("attention_kernel", 11)
        assert e.value.status == fastpath.Status.INVALID_ARGUMENT
        assert "FP_CTX_ATTENTION_KERNEL must be in [0, 10]" in e.value.detail
        with pytest.raises(ValueError, match="unknown context option 'attn_kernel'"):
            ctx.set_option("attn_kernel", 1)
        for bad in ("6", 6.0, True, None):
            with pytest.raises(TypeError):
                ctx.set_option("attention_kernel", bad)
        with pytest.raises(ValueError, match="out of range"):
            ctx.set_option("workspace_bytes", 2**63)
    with pytest.raises(ValueError, match="closed"):
        ctx.set_option("attention_kernel", 1)


def test_stats_match_numpy_convention():
    s = fastpath.stats([float(i) for i in range(1, 11)])
    assert s["median_ms"] == pytest.approx(5.5)
    assert s["p10_ms"] == pytest.approx(1.9)
    assert s["p90_ms"] == pytest.approx(9.1)
    assert s["samples"] == 10
    with pytest.raises(fastpath.FastpathError) as e:
        fastpath.stats([])
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT


def test_time_and_ab_with_python_callables():
    def work(n):
        def fn(stream):
            sum(i * i for i in range(n))
        return fn

    with fastpath.Context("cpu") as ctx:
        s = fastpath.time(ctx, work(2000), max_time_s=0.3)
        assert s["samples"] >= 1 and s["median_ms"] > 0
        r = fastpath.ab(ctx, work(40000), work(5000), max_time_s=0.3)
        assert r["verdict"] == "FASTER" and r["speedup"] > 2
        assert r["pct_of_peak"] is None  # CPU peaks are unknown


def test_ab_without_outputs_claims_no_agreement():
    # fastpath.ab compares no outputs: its agreement said passed=True (the
    # library's placeholder) with max_abs_err 0, as if outputs had matched.
    with fastpath.Context("cpu") as ctx:
        r = fastpath.ab(ctx, lambda s: None, lambda s: None, max_time_s=0.05)
    assert r["compared"] is False
    assert r["agreement"] == {k: None for k in ("passed", "max_abs_err", "max_rel_err", "atol",
                                                "rtol", "count", "mismatches")}


def test_callable_exception_becomes_status():
    def boom(stream):
        raise RuntimeError("x")

    with fastpath.Context("cpu") as ctx:
        with pytest.raises(fastpath.FastpathError) as e:
            fastpath.time(ctx, boom, max_time_s=0.1)
        assert e.value.status == fastpath.Status.INTERNAL


def test_callable_exception_is_the_detail_and_cause():
    # The library records no detail for a callable's failure: the binding must
    # report the Python exception, not whatever message an earlier call left.
    class Boom(Exception):
        pass

    def boom(stream):
        raise Boom("kaboom 42")

    def ok(stream):
        pass

    with fastpath.Context("cpu") as ctx:
        with pytest.raises(fastpath.FastpathError):
            fastpath.stats([])  # leaves a detail message about 'n'
        with pytest.raises(fastpath.FastpathError) as e:
            fastpath.time(ctx, boom, max_time_s=0.1)
        assert "kaboom 42" in e.value.detail and "Boom" in e.value.detail
        assert isinstance(e.value.__cause__, Boom)
        with pytest.raises(fastpath.FastpathError) as e:
            fastpath.ab(ctx, ok, boom, max_time_s=0.1)
        assert e.value.status == fastpath.Status.INTERNAL
        assert "kaboom 42" in e.value.detail and isinstance(e.value.__cause__, Boom)


def test_keyboard_interrupt_in_callable_propagates():
    def stop(stream):
        raise KeyboardInterrupt

    with fastpath.Context("cpu") as ctx:
        with pytest.raises(KeyboardInterrupt):
            fastpath.time(ctx, stop, max_time_s=0.1)
