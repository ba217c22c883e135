"""fastpath.torch_alloc: libfastpath as PyTorch's CUDA allocator.

On the CPU (always): the library exports fp_torch_malloc / fp_torch_free
under exactly the names CUDAPluggableAllocator looks up, reachable the way
torch loads them (ctypes.CDLL(path) + getattr); configure() / stats() /
size-0, foreign-free and no-device behaviour through ctypes; the
use_fastpath_allocator wiring against a stand-in torch module (what it hands
to CUDAPluggableAllocator, the refusal once CUDA is initialised);
bench_alloc_torch.py --pluggable without torch. With a GPU: a real
allocation through fp_torch_malloc in a subprocess. With torch and CUDA:
tensors on the installed allocator in a subprocess (skipped here).
"""
import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import fastpath
from fastpath import torch_alloc as fta

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "python" / "bench_alloc_torch.py"
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not fta.available(), reason="libfastpath built without fp_torch_*")

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "bindings" / "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["FASTPATH_LIB"] = fta.library_path()
    return env


def _run_py(code, timeout=300):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=_env())


def test_symbols_exported_as_torch_looks_them_up():
    # torch.cuda.memory.CUDAPluggableAllocator does ctypes.CDLL(path) and
    # ctypes.cast(getattr(lib, name), c_void_p).value for both names.
    so = ctypes.CDLL(fta.library_path())
    addrs = [ctypes.cast(getattr(so, n), ctypes.c_void_p).value for n in (fta.MALLOC_SYMBOL, fta.FREE_SYMBOL)]
    assert all(addrs) and addrs[0] != addrs[1]
    assert (fta.MALLOC_SYMBOL, fta.FREE_SYMBOL) == ("fp_torch_malloc_or_throw", "fp_torch_free")
    # The same library instance as the bindings' (so stats() sees torch's instances).
    assert so._handle == fastpath._lib.lib._handle
    for extra in ("fp_torch_record_stream", "fp_torch_empty_cache", "fp_torch_allocator_configure",
                  "fp_torch_allocator_get"):
        assert ctypes.cast(getattr(so, extra), ctypes.c_void_p).value


def test_library_path_is_loadable_from_anywhere(tmp_path):
    p = fta.library_path()
    assert os.sep not in p or os.path.isabs(p)
    r = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({p!r}).fp_torch_malloc"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_configure_validates_and_accepts_before_first_use():
    fta.configure()                                   # defaults
    fta.configure({"max_split_size": 64 * MiB}, memory_cap_bytes=512 * MiB)
    fta.configure(fastpath.alloc.make_config(max_split_size=128 * MiB))
    with pytest.raises(fastpath.FastpathError) as e:
        fta.configure(memory_fraction=2.0)
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT and "memory_fraction" in e.value.detail
    with pytest.raises(fastpath.FastpathError):
        fta.configure(garbage_collection_threshold=0.5)   # needs a cap
    with pytest.raises(TypeError):
        fta.configure(fastpath.alloc.make_config(), max_split_size=1)
    fta.configure()


def test_get_and_stats_without_allocations():
    if fastpath.device_count() == 0:
        with pytest.raises(fastpath.FastpathError) as e:
            fta.stats(0)
        assert e.value.status == fastpath.Status.NO_DEVICE
    else:
        assert fta.stats(0) is None and fta.snapshot(0) is None    # nothing allocated yet
        fta.reset_peak(0)
    with pytest.raises(fastpath.FastpathError) as e:
        fta.stats(-1)
    assert e.value.status == fastpath.Status.NO_DEVICE
    with pytest.raises(ValueError):
        fta.stats("gpu0")
    dev = types.SimpleNamespace(type="cuda", index=None)             # like torch.device("cuda")
    assert fta._device_index(dev) == 0 and fta._device_index("cuda:3") == 3
    assert fta._device_index(types.SimpleNamespace(type="cuda", index=2)) == 2
    assert fta._device_index(None) == 0 and fta._device_index("cuda") == 0
    with pytest.raises(ValueError):
        fta._device_index(types.SimpleNamespace(type="cpu", index=None))


def test_c_entry_points_on_cpu():
    lib = fastpath._lib.lib
    fastpath._lib.lib.fp_clear_error()
    assert lib.fp_torch_malloc(0, 0, None) is None                   # size 0: NULL, no error
    assert lib.fp_last_error() == b""
    assert lib.fp_torch_malloc(-1, 0, None) is None
    assert b"negative" in lib.fp_last_error()
    lib.fp_torch_free(None, 0, 0, None)                               # NULL: no-op
    lib.fp_torch_free(0x1000, 4096, 0, None)                          # foreign: ignored
    assert b"ignored" in lib.fp_last_error()
    fta.record_stream(0x1000, None)                                   # unknown: ignored
    fta.empty_cache()
    if fastpath.device_count() == 0:
        assert lib.fp_torch_malloc(1024, 0, None) is None
        assert b"device" in lib.fp_last_error()


# ---------------------------------------------------------------------------
# use_fastpath_allocator against a stand-in torch
# ---------------------------------------------------------------------------

def _fake_torch(initialized=False, available=True, refuse=False):
    calls = {}

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_fn_name, free_fn_name):
            calls["pluggable"] = (path, alloc_fn_name, free_fn_name)

    def change_current_allocator(a):
        if refuse:
            raise RuntimeError("Can't swap an already initialized allocator")
        calls["changed"] = a

    memory = types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                   change_current_allocator=change_current_allocator)
    cuda = types.SimpleNamespace(is_available=lambda: available, is_initialized=lambda: initialized,
                                 memory=memory)
    return types.SimpleNamespace(cuda=cuda), calls


def test_use_fastpath_allocator_wiring(monkeypatch):
    fake, calls = _fake_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(fta, "_installed", None)
    a = fta.use_fastpath_allocator({"max_split_size": 64 * MiB})
    assert calls["pluggable"] == (fta.library_path(), "fp_torch_malloc_or_throw", "fp_torch_free")
    assert calls["changed"] is a and fta.is_installed()
    assert fta.use_fastpath_allocator() is a                          # idempotent
    with pytest.raises(RuntimeError, match="already installed"):
        fta.use_fastpath_allocator({"max_split_size": 128 * MiB})
    monkeypatch.setattr(fta, "_installed", None)
    fta.configure()


def test_use_fastpath_allocator_refuses_after_cuda_init(monkeypatch):
    fake, calls = _fake_torch(initialized=True)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(fta, "_installed", None)
    with pytest.raises(RuntimeError, match="before PyTorch initialises CUDA"):
        fta.use_fastpath_allocator()
    assert "pluggable" not in calls and not fta.is_installed()

    fake, calls = _fake_torch(refuse=True)                            # torch itself refuses
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(RuntimeError, match="refused"):
        fta.use_fastpath_allocator()
    assert not fta.is_installed()

    fake, calls = _fake_torch(available=False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(RuntimeError, match="no usable CUDA"):
        fta.use_fastpath_allocator()
    with pytest.raises(fastpath.FastpathError):                        # a bad config is not installed
        monkeypatch.setitem(sys.modules, "torch", _fake_torch()[0])
        fta.use_fastpath_allocator({"memory_fraction": 3.0})
    assert not fta.is_installed()


# ---------------------------------------------------------------------------
# bench --pluggable
# ---------------------------------------------------------------------------

def test_bench_pluggable_without_torch_or_cuda(tmp_path):
    out = tmp_path / "alloc.json"
    r = subprocess.run([sys.executable, str(BENCH), "--quick", "--allow-cpu", "--pluggable", "--no-direct",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    if doc["device"] == "cpu":
        assert doc["torch_fastpath"] is None and doc["pluggable_note"].startswith("skipped")
    else:  # torch with CUDA present: the child ran
        tf = doc["torch_fastpath"]
        assert "error" not in tf, tf
        assert tf["steady"]["peak_reserved"] >= tf["steady"]["peak_allocated"] > 0


# ---------------------------------------------------------------------------
# GPU (skipped without a device)
# ---------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(fastpath.device_count() == 0, reason="no CUDA device")


@needs_gpu
def test_real_device_allocation_in_subprocess():
    r = _run_py("""
        import ctypes, fastpath, fastpath.torch_alloc as fta
        lib = fastpath._lib.lib
        fta.configure(max_split_size=64 << 20)
        p = lib.fp_torch_malloc(3 << 20, 0, None)
        q = lib.fp_torch_malloc(1000, 0, None)
        assert p and q and p % 256 == 0, lib.fp_last_error()
        try:
            fta.configure()
            raise SystemExit("configure after first use was accepted")
        except fastpath.FastpathError:
            pass
        st = fta.stats(0)
        assert st["allocation_count"]["current"] == 2 and st["requested_bytes"]["current"] == (3 << 20) + 1000
        fta.record_stream(p, None)
        lib.fp_torch_free(p, 3 << 20, 0, None)
        lib.fp_torch_free(q, 1000, 0, None)
        lib.fp_torch_free(q, 1000, 0, None)  # double free: ignored
        st = fta.stats(0)
        assert st["allocation_count"]["current"] == 0 and st["reserved_bytes"]["current"] > 0
        fta.empty_cache()
        assert fta.stats(0)["reserved_bytes"]["current"] == 0
        assert fta.snapshot(0)["segments"] == []
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr + r.stdout


def _torch_cuda():
    if not HAVE_TORCH:
        return False
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                       capture_output=True, text=True, timeout=120)
    return r.stdout.strip() == "True"


needs_torch_cuda = pytest.mark.skipif(not HAVE_TORCH or fastpath.device_count() == 0,
                                      reason="needs torch and a CUDA device")


@needs_torch_cuda
def test_torch_tensors_on_fastpath_cuda():
    if not _torch_cuda():
        pytest.skip("torch without CUDA")
    r = _run_py("""
        import fastpath.torch_alloc as fta
        fta.use_fastpath_allocator({"max_split_size": 256 << 20})
        import torch
        x = torch.randn(1 << 20, device="cuda")
        y = (x * 2).sum()
        assert abs(y.item() - 2 * x.sum().item()) < 1e-2 * max(1.0, abs(y.item()))
        st = fta.stats(0)
        assert st["allocation_count"]["current"] >= 1 and st["upstream_allocs"] >= 1
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            z = x + 1
        fta.record_stream(x, s)
        del x, z
        torch.cuda.synchronize()
        n0 = fta.stats(0)["upstream_allocs"]
        for _ in range(100):
            t = torch.empty(4 << 20, device="cuda"); del t
        assert fta.stats(0)["upstream_allocs"] <= n0 + 1       # cache hits after the first
        z0 = torch.empty(0, device="cuda")
        assert z0.numel() == 0
        # out of memory: fp_torch_malloc_or_throw's exception is a RuntimeError
        # at the allocating call (not a tensor with a NULL data pointer), and
        # the allocator stays usable
        try:
            torch.empty(1 << 47, dtype=torch.uint8, device="cuda")  # 128 TiB
        except RuntimeError as e:
            assert "fp_torch_malloc" in str(e), str(e)
            print("oom:", str(e)[:300])
        else:
            raise AssertionError("a 128 TiB tensor was allocated")
        w = torch.ones(1000, device="cuda")
        assert w.sum().item() == 1000.0
        fta.empty_cache()
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr + r.stdout


@needs_torch_cuda
def test_torch_refuses_after_cuda_init():
    if not _torch_cuda():
        pytest.skip("torch without CUDA")
    r = _run_py("""
        import torch, fastpath.torch_alloc as fta
        torch.zeros(1, device="cuda")
        try:
            fta.use_fastpath_allocator()
        except RuntimeError as e:
            assert "before PyTorch initialises CUDA" in str(e)
            print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr + r.stdout


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_alloc_torch", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_pluggable_loop_on_a_stand_in(monkeypatch):
    """The child's loop (torch_pass / run_torch with FastpathTorchMemory) on a
    stand-in torch whose tensors come from a CPU fastpath allocator and whose
    record_stream goes through fta.record_stream's pointer path: the
    statistics mapping and the pass bookkeeping work end to end."""
    bench = _load_bench()
    ctx = fastpath.Context("cpu")
    a = fastpath.alloc.Allocator(ctx)
    recorded = []

    class Tensor:
        def __init__(self, n):
            self.p = a.alloc(n, 1)

        def __del__(self):
            if self.p:
                a.free(self.p)

    cuda = types.SimpleNamespace(synchronize=lambda: None, set_stream=lambda s: None,
                                 default_stream=lambda: None)
    fake = types.SimpleNamespace(cuda=cuda, uint8="uint8", __version__="stand-in",
                                 empty=lambda n, dtype=None, device=None: Tensor(n))
    stand_in_fta = types.SimpleNamespace(
        stats=lambda dev: a.stats(), reset_peak=lambda dev: a.reset_peak(),
        empty_cache=lambda: a.empty_cache(),
        record_stream=lambda x, s: recorded.append((x.p, s)))
    trace = fastpath.alloc.generate_trace(layers=2, steps=2)
    events = trace.events()
    res = bench.run_torch(fake, events, [None] * max(trace.n_streams, 1), 2, "cuda:0",
                          bench.FastpathTorchMemory(stand_in_fta, 0))
    steady = res["steady"]
    assert res["first"]["upstream_allocs"] > 0 and steady["upstream_allocs"] == 0
    assert steady["peak_reserved"] >= steady["peak_allocated"] >= steady["peak_requested"] > 0
    assert steady["num_ooms"] == 0 and steady["alloc_median_ns"] > 0
    assert len(recorded) == 2 * sum(1 for e in events if e[0] == "record_stream")
    assert a.stats()["allocation_count"]["current"] == 0
    assert bench.FastpathTorchMemory(types.SimpleNamespace(stats=lambda d: None), 0).stats() == {}
    a.close()
    ctx.close()
    trace.close()
