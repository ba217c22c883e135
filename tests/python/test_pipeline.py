"""fastpath.pipeline: copy_bandwidth on a CPU context (every kind and
direction, bad arguments), and the Prefetcher: fully on the CPU (order,
read-ahead depth, nested structures, exceptions at the item where the source
raised them, stats, len, empty sources, passes); its CUDA path against a
stand-in torch module that records what it is asked to do (side-stream
copies from pinned memory, the consumer's stream waiting on each item's
event, record_stream), so CI checks that path too; and for real when torch
sees a GPU."""
import collections
import ctypes
import types

import numpy as np
import pytest

import fastpath
import fastpath.pipeline as fpp

needs_lib = pytest.mark.skipif(not fpp.available(), reason="libfastpath built without the pipeline module")


@pytest.fixture(scope="module")
def ctx():
    with fastpath.Context("cpu") as c:
        yield c


# ---- copy_bandwidth --------------------------------------------------------------------

@needs_lib
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("kind", ["pageable", "pinned", "registered", "write_combined"])
def test_copy_bandwidth_every_kind(ctx, kind, direction):
    gbps = fpp.copy_bandwidth(ctx, kind, direction, mib=2, max_time_s=0.05)
    assert gbps > 0
    gbps, st = fpp.copy_bandwidth(ctx, kind, direction, mib=1, max_time_s=0.05, stats=True)
    assert st["samples"] >= 1 and st["median_ms"] > 0
    assert gbps == pytest.approx((1 << 20) / (st["median_ms"] * 1e-3) / 1e9)


@needs_lib
@pytest.mark.parametrize("kwargs", [{"kind": "paged"}, {"kind": 1}, {"direction": "up"}, {"mib": 0},
                                    {"mib": -1}, {"mib": 1.5}, {"mib": True}, {"mib": 2**44}])
def test_copy_bandwidth_bad_arguments(ctx, kwargs):
    with pytest.raises(ValueError):
        fpp.copy_bandwidth(ctx, **kwargs)


@needs_lib
def test_copy_bandwidth_out_of_memory(ctx):
    with pytest.raises(fastpath.FastpathError) as e:
        fpp.copy_bandwidth(ctx, "pageable", "h2d", mib=2**40)
    assert e.value.status == fastpath.Status.OUT_OF_MEMORY


# ---- Prefetcher on the CPU -------------------------------------------------------------

class Source:
    """An iterator that counts how often it was read and raises at chosen
    positions (and goes on after them, as a class-based iterator may)."""

    def __init__(self, n, fail_at=(), make=lambda i: i):
        self.n, self.fail_at, self.make = n, set(fail_at), make
        self.reads = 0

    def __iter__(self):
        return self

    def __next__(self):
        i = self.reads
        if i >= self.n:
            raise StopIteration
        self.reads += 1
        if i in self.fail_at:
            raise KeyError(f"item {i}")
        return self.make(i)


def test_order_and_read_ahead():
    src = Source(10)
    p = fpp.Prefetcher(src, device="cpu", depth=3)
    assert src.reads == 0  # nothing read before iteration starts
    it = iter(p)
    assert it is p and src.reads == 3
    got = []
    for k in range(10):
        got.append(next(p))
        assert src.reads == min(10, k + 1 + 3)  # never more than depth ahead
    assert got == list(range(10))
    with pytest.raises(StopIteration):
        next(p)
    with pytest.raises(StopIteration):  # and stays so
        next(p)


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_exception_at_its_item(depth):
    src = Source(8, fail_at={3, 5})
    p = fpp.Prefetcher(src, device="cpu", depth=depth)
    got = []
    for _ in range(3):
        got.append(next(p))
    # the source raised at its 4th read: nothing past it was read yet
    assert src.reads == 4
    with pytest.raises(KeyError, match="item 3"):
        next(p)
    assert src.reads == 4
    got.append(next(p))
    with pytest.raises(KeyError, match="item 5"):
        next(p)
    got += list(p)
    assert got == [0, 1, 2, 4, 6, 7]
    assert p.stats()["items"] == 6


def test_generator_exception_ends_the_pass():
    def gen():
        yield 1
        yield 2
        raise RuntimeError("boom")

    p = fpp.Prefetcher(gen(), device="cpu", depth=4)
    assert next(p) == 1 and next(p) == 2
    with pytest.raises(RuntimeError, match="boom"):
        next(p)
    with pytest.raises(StopIteration):
        next(p)


def test_nested_structures_and_arrays_pass_through():
    Pair = collections.namedtuple("Pair", "x y")
    items = [np.arange(4.0), (np.ones(2), "label", 3), [np.zeros(1), {"a": np.arange(3)}],
             Pair(np.ones(1), {"b": [np.arange(2)]}), collections.OrderedDict(z=np.ones(3)), None]
    got = list(fpp.Prefetcher(items, device="cpu"))
    assert len(got) == len(items)
    for g, want in zip(got, items):
        assert g is want  # passed along as they are: numpy stays numpy, nothing copied


def test_stats_len_and_empty():
    p = fpp.Prefetcher([np.ones(4)] * 5, device="cpu")
    assert len(p) == 5
    assert list(p) and p.stats()["items"] == 5
    s = p.stats()
    assert s["bytes_copied"] == 0 and s["consumer_wait_ms"] >= 0 and s["depth"] == 2 and s["device"] == "cpu"
    assert "not_ready" not in s

    g = fpp.Prefetcher((i for i in range(3)), device="cpu")
    with pytest.raises(TypeError):
        len(g)
    assert bool(g)  # not len(): a generator source has none
    assert list(g) == [0, 1, 2]

    for empty in ([], iter(()), (i for i in ())):
        e = fpp.Prefetcher(empty, device="cpu")
        assert list(e) == [] and e.stats()["items"] == 0
        with pytest.raises(StopIteration):
            next(e)


def test_consumer_wait_is_the_time_in_next():
    import time

    def slow():
        for i in range(4):
            time.sleep(0.01)
            yield i

    p = fpp.Prefetcher(slow(), device="cpu", depth=1)
    assert list(p) == [0, 1, 2, 3]
    # iter() read the first item (outside next()); the other three: 30 ms
    assert 25 <= p.stats()["consumer_wait_ms"] < 2000


def test_passes_over_a_reiterable_source():
    data = [1, 2, 3]
    p = fpp.Prefetcher(data, device="cpu")
    assert list(p) == data
    assert list(p) == data  # a new pass (epoch) once the previous one ended
    it = iter(p)
    assert next(it) == 1
    assert list(p) == [2, 3]  # iter() mid-pass continues it
    assert p.stats()["items"] == 9


@pytest.mark.parametrize("depth", [0, -1, 1.5, True, "2"])
def test_bad_depth(depth):
    with pytest.raises(ValueError):
        fpp.Prefetcher([], device="cpu", depth=depth)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:", "cuda:-1", 3])
def test_bad_device(device):
    with pytest.raises(ValueError):
        fpp.Prefetcher([], device=device)


def test_device_choice_without_cuda(ctx):
    assert fpp.Prefetcher([], device=ctx).device == "cpu"
    torch = fpp._torch_module()
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    # the same code runs where there is no GPU: items handed over as they come
    for device in (None, "cuda", "cuda:1"):
        p = fpp.Prefetcher([np.ones(2)], device=device)
        assert p.device == "cpu"
        (x,) = list(p)
        assert isinstance(x, np.ndarray)


def test_as_torch_on_the_cpu():
    torch = pytest.importorskip("torch")
    a = np.arange(6, dtype=np.float32)
    t = torch.ones(2)
    (got,) = list(fpp.Prefetcher([{"a": a, "t": t, "n": 5}], device="cpu", as_torch=True))
    assert isinstance(got["a"], torch.Tensor) and got["a"].data_ptr() == a.ctypes.data  # no copy
    assert got["t"] is t and got["n"] == 5
    (plain,) = list(fpp.Prefetcher([a], device="cpu"))
    assert plain is a


# ---- the CUDA path against a stand-in torch --------------------------------------------

class FakeTorch:
    """What Prefetcher's CUDA path calls of torch, recording each call in
    self.log; tensors wrap numpy arrays."""

    def __init__(self, ready=True):
        self.log = []
        self.ready = ready
        fake = self
        self.current = None  # the stream set by torch.cuda.stream(...)

        class Device:
            def __init__(self, kind, index=None):
                if index is None and ":" in kind:
                    kind, index = kind.split(":")[0], int(kind.split(":")[1])
                self.type, self.index = kind, index

            def __eq__(self, other):
                return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

            def __str__(self):
                return self.type if self.index is None else f"{self.type}:{self.index}"

        class Stream:
            def __init__(self, device=None, name="side"):
                self.name, self.device = name, device

            def wait_event(self, ev):
                fake.log.append(("wait_event", self.name, ev))

        class Event:
            def __init__(self):
                self.stream = None

            def record(self, stream):
                self.stream = stream
                fake.log.append(("record", stream.name, self))

            def query(self):
                return fake.ready

        class Tensor:
            def __init__(self, arr, device, pinned=False):
                self.arr, self.device, self.pinned = arr, device, pinned

            def is_pinned(self):
                return self.pinned

            def pin_memory(self):
                fake.log.append(("pin", self.arr.nbytes))
                return Tensor(self.arr, self.device, pinned=True)

            def to(self, device, non_blocking=False):
                fake.log.append(("copy", self.arr.nbytes, self.pinned, non_blocking,
                                 fake.current.name if fake.current else None))
                return Tensor(self.arr.copy(), device)

            def numel(self):
                return self.arr.size

            def element_size(self):
                return self.arr.itemsize

            def record_stream(self, stream):
                fake.log.append(("record_stream", stream.name, self))

        class StreamGuard:
            def __init__(self, s):
                self.s = s

            def __enter__(self):
                fake.current = self.s

            def __exit__(self, *exc):
                fake.current = None

        self.device, self.Tensor = Device, Tensor
        self.cpu = Device("cpu")
        self.consumer = Stream(name="consumer")
        self.cuda = types.SimpleNamespace(
            is_available=lambda: True, current_device=lambda: 0, Stream=Stream, Event=Event,
            stream=StreamGuard, current_stream=lambda device=None: fake.consumer)

    def from_numpy(self, a):
        return self.Tensor(a, self.cpu)

    def tensor(self, a, pinned=False, device=None):
        return self.Tensor(np.asarray(a), device or self.cpu, pinned)


@pytest.fixture
def fake_torch(monkeypatch):
    fake = FakeTorch()
    monkeypatch.setattr(fpp, "_torch_cache", fake)
    return fake


def test_fake_cuda_copies_on_a_side_stream_from_pinned_memory(fake_torch):
    t = fake_torch
    dev = t.device("cuda", 0)
    unpinned = t.tensor(np.ones(4, dtype=np.float32))
    pinned = t.tensor(np.ones(2, dtype=np.float64), pinned=True)
    on_device = t.tensor(np.ones(3), device=dev)
    arr = np.arange(5, dtype=np.int16)
    p = fpp.Prefetcher([{"x": unpinned, "y": (pinned, arr), "z": on_device, "n": 7}], device="cuda:0")
    assert p.device == dev
    (item,) = list(p)
    # every host leaf copied to the device, non-blocking, on the side stream,
    # from pinned memory (pinned first where it was not); the device one kept
    assert item["n"] == 7 and item["z"] is on_device
    for leaf in (item["x"], item["y"][0], item["y"][1]):
        assert isinstance(leaf, t.Tensor) and leaf.device == dev
    np.testing.assert_array_equal(item["y"][1].arr, arr)
    copies = [e for e in t.log if e[0] == "copy"]
    assert sorted(c[1] for c in copies) == sorted([16, 16, 10])
    assert all(c[2] and c[3] and c[4] == "side" for c in copies)  # pinned, non_blocking, side stream
    assert [e[1] for e in t.log if e[0] == "pin"] == [16, 10]  # the unpinned tensor, the numpy array
    assert p.stats()["bytes_copied"] == 42
    # the event after the copies, on the side stream; the consumer waits on
    # it before it gets the item, then every device leaf is recorded on it
    kinds = [e[0] for e in t.log]
    rec, wait = kinds.index("record"), kinds.index("wait_event")
    assert max(i for i, k in enumerate(kinds) if k == "copy") < rec < wait
    assert t.log[rec][1] == "side" and t.log[wait][1] == "consumer" and t.log[wait][2] is t.log[rec][2]
    recorded = [e[2] for e in t.log if e[0] == "record_stream"]
    assert all(e[1] == "consumer" for e in t.log if e[0] == "record_stream")
    assert {id(x) for x in recorded} == {id(item["x"]), id(item["y"][0]), id(item["y"][1]), id(item["z"])}
    assert p.stats()["not_ready"] == 0


def test_fake_cuda_read_ahead_and_not_ready(fake_torch):
    t = fake_torch
    t.ready = False  # the copies never finish before the item is handed out
    src = Source(4, fail_at={2}, make=lambda i: t.tensor(np.full(2, i, dtype=np.float32)))
    p = fpp.Prefetcher(src, device="cuda", depth=2)
    iter(p)
    assert src.reads == 2 and sum(e[0] == "copy" for e in t.log) == 2  # depth items on their way
    a = next(p)
    assert a.arr[0] == 0 and src.reads == 3  # the failing read: queued, not raised
    assert next(p).arr[0] == 1
    with pytest.raises(KeyError):
        next(p)
    assert next(p).arr[0] == 3
    assert list(p) == []
    s = p.stats()
    assert s["items"] == 3 and s["not_ready"] == 3 and s["bytes_copied"] == 24


# ---- the CUDA path for real --------------------------------------------------------------

def _cuda_torch():
    torch = fpp._torch_module()
    return torch if torch is not None and torch.cuda.is_available() else None


@pytest.mark.skipif(_cuda_torch() is None, reason="needs torch with a CUDA device")
def test_cuda_prefetch():
    torch = _cuda_torch()
    batches = [{"x": torch.randn(256, 64), "y": (np.arange(32, dtype=np.float32), torch.arange(8).pin_memory())}
               for _ in range(6)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # a consumer on a non-default stream
        p = fpp.Prefetcher(batches, device="cuda", depth=2)
        sums = []
        for b in p:
            assert b["x"].is_cuda and b["y"][0].is_cuda and b["y"][1].is_cuda
            sums.append((b["x"].sum() + b["y"][0].sum() + b["y"][1].sum()).item())
    want = [(b["x"].sum() + float(b["y"][0].sum()) + b["y"][1].sum()).item() for b in batches]
    assert sums == pytest.approx(want, rel=1e-5)
    s = p.stats()
    assert s["items"] == 6 and s["bytes_copied"] == 6 * (256 * 64 * 4 + 32 * 4 + 8 * 8)


@pytest.mark.skipif(_cuda_torch() is None, reason="needs torch with a CUDA device")
def test_cuda_exception_at_its_item():
    torch = _cuda_torch()
    src = Source(5, fail_at={2}, make=lambda i: torch.full((4,), float(i)))
    p = fpp.Prefetcher(src, device="cuda", depth=3)
    assert next(p)[0].item() == 0 and next(p)[0].item() == 1
    with pytest.raises(KeyError):
        next(p)
    assert [x[0].item() for x in p] == [3, 4]


# ---- Pipeline --------------------------------------------------------------------------

def _doubler(n):
    """compute(stream, chunk) for a CPU context: out = 2 * in, in place in
    the chunk's "device" buffers (host memory there)."""
    def compute(stream, chunk):
        assert stream is None
        count = chunk.in_bytes // 4
        src = np.ctypeslib.as_array((ctypes.c_float * count).from_address(chunk.d_in))
        dst = np.ctypeslib.as_array((ctypes.c_float * count).from_address(chunk.d_out))
        dst[:] = 2 * src
    return compute


@needs_lib
def test_pipeline_outputs_order_and_stats(ctx):
    done = []
    chunks = [np.arange(i, i + 1000 + 7 * i, dtype=np.float32) for i in range(12)]
    outs = [np.full_like(c, np.nan) for c in chunks]
    with fpp.Pipeline(ctx, _doubler(0), max_in_bytes=8192, max_out_bytes=8192, depth=2,
                      on_complete=lambda seq, st, msg, tag: done.append((seq, st, tag))) as p:
        assert p.compute_stream is None
        seqs = [p.submit(c, o, tag=f"t{i}") for i, (c, o) in enumerate(zip(chunks, outs))]
        p.flush()
        s = p.stats(reset=True)
        assert p.stats()["submitted"] == 0
    assert seqs == list(range(12))
    assert done == [(i, fastpath.Status.OK, f"t{i}") for i in range(12)]
    for c, o in zip(chunks, outs):
        np.testing.assert_array_equal(o, 2 * c)
    assert s["completed"] == 12 and s["failed"] == 0
    assert s["bytes_h2d"] == sum(c.nbytes for c in chunks) == s["bytes_d2h"]
    assert s["wall_ms"] > 0 and s["overlap_efficiency"] > 0


@needs_lib
def test_pipeline_compute_exception_fails_its_chunk_only(ctx):
    done = []

    def compute(stream, chunk):
        if chunk.seq == 2:
            raise KeyError("chunk two")
        _doubler(0)(stream, chunk)
    x = np.ones(256, dtype=np.float32)
    outs = [np.zeros_like(x) for _ in range(5)]
    with fpp.Pipeline(ctx, compute, max_in_bytes=1024, max_out_bytes=1024,
                      on_complete=lambda seq, st, msg, tag: done.append((seq, st, msg))) as p:
        for o in outs:
            p.submit(x, o)
        with pytest.raises(fastpath.FastpathError) as e:
            p.flush()
        assert isinstance(e.value.__cause__, KeyError)
        p.flush()  # reported once
    assert [d[1] for d in done] == [fastpath.Status.OK] * 2 + [fastpath.Status.INTERNAL] + [fastpath.Status.OK] * 2
    assert "KeyError" in done[2][2]
    for i, o in enumerate(outs):
        assert (o == (0 if i == 2 else 2)).all()


@needs_lib
def test_pipeline_bad_input_and_close(ctx):
    with pytest.raises(fastpath.FastpathError) as e:
        fpp.Pipeline(ctx, _doubler(0), max_in_bytes=0)
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT
    with pytest.raises(ValueError):
        fpp.Pipeline(ctx, _doubler(0), max_in_bytes=-1)
    x = np.ones(64, dtype=np.float32)
    p = fpp.Pipeline(ctx, _doubler(0), max_in_bytes=256, max_out_bytes=256)
    with pytest.raises(fastpath.FastpathError) as e:
        p.submit(np.ones(65, dtype=np.float32))
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT
    with pytest.raises(TypeError):
        p.submit(b"bytes")
    with pytest.raises(ValueError):
        p.submit(x, np.ones((8, 8), dtype=np.float32)[:, ::2])  # not contiguous
    p.close_input()
    with pytest.raises(fastpath.FastpathError) as e:
        p.submit(x)
    assert e.value.status == fastpath.Status.SHUT_DOWN
    p.close()
    p.close()
    with pytest.raises(ValueError):
        p.flush()


@needs_lib
@pytest.mark.skipif(fastpath.device_count() == 0, reason="needs a CUDA device")
def test_pipeline_cuda_chunks_land_in_order():
    """On a GPU: each chunk's compute fills its d_out with a byte made from
    its seq (fp_mem_fill on the compute stream); every output must carry its
    own chunk's byte, pageable and pinned alike."""
    lib = fastpath._lib.lib
    lib.fp_mem_fill.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
    lib.fp_mem_fill.restype = ctypes.c_int
    with fastpath.Context("cuda:0") as c:
        def compute(stream, chunk):
            fastpath.check(lib.fp_mem_fill(c.handle, chunk.d_out, chunk.seq % 251 + 1, chunk.out_bytes, stream))
        outs = [np.zeros(1 << 16, dtype=np.uint8) for _ in range(40)]
        with fpp.Pipeline(c, compute, max_in_bytes=1 << 16, max_out_bytes=1 << 16) as p:
            assert p.compute_stream
            for o in outs:
                p.submit(np.ones(1 << 16, dtype=np.uint8), o)
            p.flush()
        for i, o in enumerate(outs):
            assert (o == i % 251 + 1).all(), i


@needs_lib
def test_pinned_pool_reserve_register_budget_and_pipeline(ctx):
    with fpp.PinnedPool(ctx, chunk_bytes=16 << 20, budget_bytes=64 << 20) as pool:
        pool.reserve(16 << 20)
        pool.reserve_wait()
        s = pool.stats()
        assert s["host_mode"] and s["bytes_pinned"] >= 16 << 20 and s["pin_calls"] >= 1
        assert s["longest_pin_call_ms"] > 0 and s["pin_gbps"] > 0
        a = np.arange(1 << 18, dtype=np.float32)
        pool.register(a)
        assert pool.stats()["registered_bytes"] == a.nbytes
        with pytest.raises(fastpath.FastpathError) as e:
            pool.register(a)  # twice
        assert e.value.status == fastpath.Status.INVALID_ARGUMENT
        pool.unregister(a)
        with pytest.raises(fastpath.FastpathError) as e:
            pool.register(np.zeros(100 << 18, dtype=np.float32))  # 100 MiB: over the budget
        assert e.value.status == fastpath.Status.OUT_OF_MEMORY and "budget" in e.value.detail
        # the pipeline stages through the pool's reserve: no new pin (its
        # buffers of 2 MiB are large-pool blocks, split from the reserve's
        # segment; 1 MiB and less would come from the small pool's own)
        pins = pool.stats()["pin_calls"]
        x = np.linspace(-3, 3, 1 << 19, dtype=np.float32)
        out = np.zeros_like(x)
        with fpp.Pipeline(ctx, _doubler(0), max_in_bytes=x.nbytes, max_out_bytes=x.nbytes, pinned=pool) as p:
            p.submit(x, out)
            p.flush()
        np.testing.assert_array_equal(out, 2 * x)
        assert pool.stats()["pin_calls"] == pins
    with pytest.raises(ValueError):
        pool.stats()
