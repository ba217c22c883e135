"""fastpath.graph on a CPU context: there a graph records the callable and a
replay calls it (graph.h), so capture, replay, recapture, the graph cache's
bucket rounding, statistics and histogram files are all tested for real."""
import numpy as np
import pytest

import fastpath
import fastpath.graph as fg

pytestmark = pytest.mark.skipif(not fg.available(), reason="libfastpath built without the graph module")


@pytest.fixture(scope="module")
def ctx():
    with fastpath.Context("cpu") as c:
        yield c


def vllm_buckets(max_size):
    """graph.h's default list, written out independently."""
    out = [b for b in (1, 2, 4) if b <= max_size] + list(range(8, max_size + 1, 8))
    if out[-1] != max_size:
        out.append(max_size)
    return out


# ---- Graph ------------------------------------------------------------------------------

def test_replay_calls_the_captured_callable(ctx):
    calls = []
    arr = np.zeros(16, dtype=np.float32)

    def step(stream):
        calls.append(stream)
        arr[:] += 1.0

    with fg.Graph(ctx, step, warmup=2) as g:
        before = len(calls)  # the warm-up calls and the capture (implementation's count)
        for _ in range(10):
            g.replay()
        assert len(calls) == before + 10
        assert np.all(arr == float(len(calls)))
        info = g.info()
        assert info["cpu"] is True
        assert info["replays"] == 10
    # every call got the same kind of handle the library ops take
    assert all(s is None or isinstance(s, int) for s in calls)


def test_recapture_swaps_the_callable(ctx):
    seen = []
    g = fg.Graph(ctx, lambda s: seen.append("a"))
    g.replay()
    how = g.recapture(lambda s: seen.append("b"))
    assert how in ("in_place", "reinstantiated")
    seen.clear()
    g.replay()
    g.replay()
    assert seen == ["b", "b"]
    info = g.info()
    assert info["updates_in_place"] + info["reinstantiations"] == 1
    g.close()
    g.close()  # closing twice is fine
    with pytest.raises(ValueError, match="closed"):
        g.replay()


def test_callable_exception_is_the_cause(ctx):
    state = {"fail": False}

    def step(stream):
        if state["fail"]:
            raise KeyError("boom")

    with fg.Graph(ctx, step) as g:
        state["fail"] = True
        with pytest.raises(fastpath.FastpathError, match="KeyError") as e:
            g.replay()
        assert isinstance(e.value.__cause__, KeyError)
        state["fail"] = False
        g.replay()  # the error is not sticky
    with pytest.raises(fastpath.FastpathError, match="ZeroDivisionError"):
        fg.Graph(ctx, lambda s: 1 / 0)


def test_capture_bad_arguments(ctx):
    with pytest.raises(fastpath.FastpathError) as e:
        fg.Graph(ctx, lambda s: None, warmup=101)  # 0..100
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT
    assert "warmup" in str(e.value)
    with pytest.raises(ValueError, match="capture_mode"):
        fg.Graph(ctx, lambda s: None, capture_mode="sometimes")
    with pytest.raises(ValueError, match="warmup"):
        fg.Graph(ctx, lambda s: None, warmup=2**40)  # does not fit a C int


def test_pool_buffers_and_graphs(ctx):
    with fg.Pool(ctx) as pool:
        p = pool.alloc(4096)
        assert p
        g = fg.Graph(ctx, lambda s: None, pool=pool)
        with pytest.raises(fastpath.FastpathError):
            pool.close()  # a graph still uses it: kept
        g.close()
        pool.free(p)
        assert pool.reserved() >= 0
        with pytest.raises(fastpath.FastpathError):
            pool.alloc(0)


def test_torch_stream_handle():
    class FakeStream:
        cuda_stream = 1234

    assert fg.torch_stream_handle(FakeStream()) == 1234
    assert fg.torch_stream_handle(77) == 77
    with pytest.raises(TypeError):
        fg.torch_stream_handle("stream")


# ---- bucket lists ---------------------------------------------------------------------

@pytest.mark.parametrize("max_size", [1, 3, 8, 100, 256])
def test_default_buckets(max_size):
    assert fg.default_buckets(max_size) == vllm_buckets(max_size)


def test_default_buckets_longer_than_one_buffer():
    b = fg.default_buckets(1 << 20)
    assert len(b) > fg.MAX_BUCKETS and b[-1] == 1 << 20


@pytest.mark.parametrize("bad", [0, -1, (1 << 20) + 1])
def test_default_buckets_bad_size(bad):
    with pytest.raises(fastpath.FastpathError) as e:
        fg.default_buckets(bad)
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT


def test_buckets_choose():
    sizes, counts = [8, 1, 3], [10, 10, 10]
    buckets, objective = fg.buckets_choose(sizes, counts, graph_cost=0.0)
    assert buckets == [1, 3, 8] and objective == 0.0  # a graph per size: no padding, graphs free
    buckets, _ = fg.buckets_choose(sizes, counts, graph_cost=1e9)
    assert buckets == [8]  # graphs dear: one, and the largest size is always a bucket
    buckets, _ = fg.buckets_choose(sizes, counts, graph_cost=0.0, max_buckets=2)
    assert len(buckets) == 2 and buckets[-1] == 8
    assert fg.buckets_choose([2, 2], [1, 1])[0] == [2]  # a size listed twice counts once per entry
    assert fg.GraphCache.choose_buckets is fg.buckets_choose


def test_buckets_choose_bad_input():
    with pytest.raises(ValueError, match="length"):
        fg.buckets_choose([1, 2], [1])
    for sizes, counts in (([], []), ([0], [1]), ([1], [0])):
        with pytest.raises(fastpath.FastpathError) as e:
            fg.buckets_choose(sizes, counts)
        assert e.value.status == fastpath.Status.INVALID_ARGUMENT, (sizes, counts)
    with pytest.raises(fastpath.FastpathError):
        fg.buckets_choose([1, 2], [1, 1], row_cost=-1.0)


# ---- GraphCache -----------------------------------------------------------------------

def test_cache_runs_sizes_1_to_300(ctx, tmp_path):
    seen = []
    with fg.GraphCache(ctx, lambda stream, size: seen.append(size)) as cache:
        buckets = vllm_buckets(256)
        assert cache.buckets == buckets
        hows = {}
        for n in range(1, 301):
            size, how = cache.run(n)
            want = next((b for b in buckets if b >= n), None)
            if want is None:
                assert (size, how) == (n, "eager"), n
                assert cache.bucket(n) is None
            else:
                assert size == want and cache.bucket(n) == want, n
                assert how == ("captured" if want not in hows else "replayed"), n
                hows.setdefault(want, how)
        # the step only ever ran at a bucket, or eagerly at its own size above them
        assert set(seen) <= set(buckets) | set(range(257, 301))
        s = cache.stats()
        assert s["runs"] == 300
        assert s["captures"] == len(buckets) == s["graphs"]
        assert s["eager_above"] == 44 and s["eager_uncapturable"] == 0
        assert s["replays"] == 300 - 44 - len(buckets)
        assert s["rows"] == sum(range(1, 301))
        assert s["padded_rows"] == sum(next(b for b in buckets if b >= n) - n for n in range(1, 257))
        assert s["lookup_ns"] >= 0
        assert cache.capture_error() == ""
        hist = cache.histogram()
        assert hist == {n: 1 for n in range(1, 301)}

        # save / load round trip: into a fresh cache, twice (counts add up)
        path = tmp_path / "hist.txt"
        cache.save_histogram(path)
        assert path.read_text().splitlines()[0] == "fastpath-graph-histogram 1"
        with fg.GraphCache(ctx, lambda stream, size: None, buckets=[1, 64]) as other:
            other.load_histogram(path)
            assert other.histogram() == hist
            other.load_histogram(str(path))
            assert other.histogram() == {n: 2 for n in range(1, 301)}
            assert other.stats()["runs"] == 0  # loading runs nothing

        # rebucket over the histogram: sizes above every bucket now covered
        new = cache.rebucket(graph_cost=4.0, max_buckets=8)
        assert new == cache.buckets and 1 <= len(new) <= 8 and new[-1] == 300
        assert new == sorted(set(new))
        assert cache.run(300) == (300, "captured")


def test_cache_set_buckets_and_capture(ctx):
    seen = []
    with fg.GraphCache(ctx, lambda stream, size: seen.append(size), buckets=[2, 5, 9]) as cache:
        assert cache.run(4) == (5, "captured")
        cache.buckets = [5, 16]
        assert cache.buckets == [5, 16]
        assert cache.run(3) == (5, "replayed")  # kept across set_buckets
        assert cache.run(12) == (16, "captured")
        assert cache.run(17) == (17, "eager")
        cache.capture(all_buckets=True)
        assert cache.stats()["graphs"] == 2


def test_cache_eager_capture(ctx):
    with fg.GraphCache(ctx, lambda stream, size: None, buckets=[1, 2, 4], lazy=False) as cache:
        assert cache.stats()["captures"] == 3  # every bucket captured at create
        assert cache.run(3) == (4, "replayed")


def test_cache_step_exception(ctx):
    state = {"fail": True}

    def step(stream, size):
        if state["fail"]:
            raise RuntimeError(f"step at {size}")

    with fg.GraphCache(ctx, step, buckets=[4]) as cache:
        with pytest.raises(fastpath.FastpathError, match="step at 4") as e:
            cache.run(3)
        assert isinstance(e.value.__cause__, RuntimeError)
        state["fail"] = False
        assert cache.run(3) == (4, "captured")  # a failed step captured nothing


@pytest.mark.parametrize("buckets", [[], [4, 2], [0, 1], [3, 3], list(range(1, fg.MAX_BUCKETS + 2))])
def test_cache_bad_bucket_lists(ctx, buckets):
    with pytest.raises(fastpath.FastpathError) as e:
        fg.GraphCache(ctx, lambda stream, size: None, buckets=buckets)
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT
    assert e.value.detail  # the library says what is wrong
    with fg.GraphCache(ctx, lambda stream, size: None, buckets=[1, 2]) as cache:
        with pytest.raises(fastpath.FastpathError) as e:
            cache.set_buckets(buckets)
        assert e.value.status == fastpath.Status.INVALID_ARGUMENT
        assert cache.buckets == [1, 2]  # unchanged


def test_cache_bad_inputs(ctx, tmp_path):
    with fg.GraphCache(ctx, lambda stream, size: None, buckets=[1, 8]) as cache:
        for n in (0, -5):
            with pytest.raises(fastpath.FastpathError) as e:
                cache.run(n)
            assert e.value.status == fastpath.Status.INVALID_ARGUMENT
        with pytest.raises(ValueError, match="out of range"):
            cache.run(2**70)
        cache.run(3)
        before = cache.histogram()
        with pytest.raises(fastpath.FastpathError) as e:
            cache.load_histogram(tmp_path / "missing.txt")
        assert e.value.status == fastpath.Status.IO
        for text in ("not a histogram\n", "fastpath-graph-histogram 1\n5 x\n",
                     "fastpath-graph-histogram 1\n0 3\n", "fastpath-graph-histogram 2\n"):
            bad = tmp_path / "bad.txt"
            bad.write_text(text)
            with pytest.raises(fastpath.FastpathError) as e:
                cache.load_histogram(bad)
            assert e.value.status == fastpath.Status.INVALID_ARGUMENT, text
            assert cache.histogram() == before, text  # unchanged on any error
        with pytest.raises(fastpath.FastpathError) as e:
            cache.save_histogram(tmp_path / "no-such-dir" / "h.txt")
        assert e.value.status == fastpath.Status.IO
        with pytest.raises(ValueError, match="capture_mode"):
            fg.GraphCache(ctx, lambda stream, size: None, capture_mode=None)
    with pytest.raises(ValueError, match="closed"):
        cache.run(1)
