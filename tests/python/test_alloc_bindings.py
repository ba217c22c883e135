"""fastpath.alloc on CPU contexts: the ctypes mirrors against the C header,
the allocator and its per-pool statistics, trace generation / events, replay
through the caching allocator and the direct baseline, and the torch
allocator bench script (without torch: a clean exit; --allow-cpu: fastpath's
half on the CPU)."""
import ctypes
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastpath
from fastpath import alloc as fa

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "python" / "bench_alloc_torch.py"
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not fa.available(), reason="libfastpath built without the allocator")

STRUCTS = [("fp_alloc_config", fa.Config), ("fp_alloc_stat", fa.Stat),
           ("fp_alloc_pool_stats", fa.PoolStats), ("fp_alloc_stats", fa.Stats),
           ("fp_alloc_upstream", fa.Upstream), ("fp_alloc_trace_op", fa.TraceOp),
           ("fp_alloc_trace", fa.TraceStruct), ("fp_alloc_trace_config", fa.TraceConfig),
           ("fp_alloc_replay_result", fa.ReplayResult)]


@pytest.fixture(scope="module")
def ctx():
    c = fastpath.Context("cpu")
    yield c
    c.close()


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("alloc_layout")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "fastpath/alloc.h"',
             "int main(void) {"]
    for name, cls in STRUCTS:
        lines.append(f'    printf("{name} sizeof %zu\\n", sizeof({name}));')
        for field, _ in cls._fields_:
            lines.append(f'    printf("{name} {field} %zu\\n", offsetof({name}, {field}));')
    lines.append('    printf("v1 size %zu\\n", (size_t)FP_ALLOC_STATS_SIZE_V1);')
    lines += ["    return 0;", "}"]
    src = d / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = d / "layout"
    inc = [f"-I{ROOT / 'include'}"]
    cuda_inc = Path("/usr/local/cuda/include")
    if cuda_inc.exists():
        inc.append(f"-I{cuda_inc}")
    r = subprocess.run([cc, "-std=c11", *inc, str(src), "-o", str(exe)], capture_output=True, text=True)
    if r.returncode != 0 and "No such file" in r.stderr:
        pytest.skip(f"headers not compilable here: {r.stderr[:200]}")
    assert r.returncode == 0, f"a ctypes field is missing from the C struct?\n{r.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {tuple(line.split()[:2]): int(line.split()[2]) for line in out.splitlines()}


@pytest.mark.parametrize("name,cls", STRUCTS, ids=[s[0] for s in STRUCTS])
def test_layout_matches_header(c_layout, name, cls):
    assert c_layout[(name, "sizeof")] == ctypes.sizeof(cls), "size differs (a field missing?)"
    for field, _ in cls._fields_:
        assert c_layout[(name, field)] == getattr(cls, field).offset, field


def test_stats_v1_prefix(c_layout):
    assert c_layout[("v1", "size")] == fa.Stats.pools.offset


def check_pools_add_up(st):
    pools = st["pools"]
    for f in fa.STAT_FIELDS:
        lg, sm, g = pools["large"][f], pools["small"][f], st[f]
        for k in ("current", "total", "freed"):
            assert lg[k] + sm[k] == g[k], (f, k)
        assert max(lg["peak"], sm["peak"]) <= g["peak"] <= lg["peak"] + sm["peak"], f
    for c in ("upstream_allocs", "upstream_frees", "cache_hits", "cache_misses"):
        assert pools["large"][c] + pools["small"][c] == st[c], c


def test_allocator_basics_and_pool_stats(ctx):
    with fa.Allocator(ctx) as a:
        p = a.alloc(1000)
        q = a.alloc(3 * MiB)
        assert p and q and p % 256 == 0 and q % 256 == 0
        assert a.usable_size(p) >= 1024 and a.round_size(1000) == 1024
        st = a.stats()
        assert st["pools"]["small"]["allocated_bytes"]["current"] == 1024
        assert st["pools"]["small"]["requested_bytes"]["current"] == 1000
        assert st["pools"]["large"]["allocated_bytes"]["current"] == 3 * MiB
        assert st["pools"]["small"]["reserved_bytes"]["current"] == 2 * MiB
        assert st["pools"]["large"]["reserved_bytes"]["current"] == 20 * MiB
        check_pools_add_up(st)
        snap = a.snapshot()
        assert snap["stats"]["pools"]["small"]["allocated_bytes"]["current"] == 1024
        assert len(snap["segments"]) == 2
        a.free(p)
        with pytest.raises(fastpath.FastpathError) as e:
            a.free(p)
        assert e.value.status == fastpath.Status.NOT_FOUND and "double free" in str(e.value)
        with pytest.raises(fastpath.FastpathError):
            a.alloc(1 << 63)
        assert a.alloc(0) == 0
        a.free(q)
        a.empty_cache()
        st = a.stats()
        assert st["reserved_bytes"]["current"] == 0 and st["upstream_frees"] == 2
        check_pools_add_up(st)


def test_pool_stats_add_up_random(ctx):
    rng = random.Random(5)
    with fa.Allocator(ctx, max_split_size=64 * MiB) as a:
        live = []
        for step in range(4000):
            if live and (len(live) > 200 or rng.random() < 0.45):
                a.free(live.pop(rng.randrange(len(live))))
            else:
                n = rng.choice([rng.randint(1, 4096), rng.randint(1, MiB), rng.randint(MiB, 30 * MiB)])
                live.append(a.alloc(n, stream=rng.choice([1, 2])))
            if step % 1000 == 999:
                check_pools_add_up(a.stats())
                a.empty_cache()
                check_pools_add_up(a.stats())
        for p in live:
            a.free(p)
        st = a.stats()
        check_pools_add_up(st)
        assert st["allocated_bytes"]["current"] == 0 and st["allocation_count"]["total"] > 1000


def test_config_errors(ctx):
    with pytest.raises(fastpath.FastpathError):
        fa.make_config(divisions=[(MiB, 2 * MiB, 3)])  # not a power of two
    with pytest.raises(fastpath.FastpathError):
        fa.Allocator(ctx, garbage_collection_threshold=0.5)  # needs a cap
    cfg = fa.make_config(divisions=[(MiB, 2 * MiB - 1, 4)])
    assert cfg.roundup_power2_divisions[20] == 4 and cfg.roundup_power2_divisions[21] == 0


def test_trace_events():
    t = fa.generate_trace(layers=2, steps=2, seed=3)
    ev = t.events()
    assert len(ev) == len(t) > 100
    assert ev == fa.generate_trace(layers=2, steps=2, seed=3).events()  # deterministic
    assert ev != fa.generate_trace(layers=2, steps=2, seed=4).events()
    live = {}
    streams = set()
    for op, size, stream, slot in ev:
        assert op in fa.OPS and 0 <= slot < t.n_slots
        if op == "alloc":
            assert size > 0 and slot not in live
            live[slot] = size
            streams.add(stream)
        elif op == "free":
            assert size == 0 and slot in live
            del live[slot]
        else:
            assert slot in live and stream < t.n_streams
    assert not live, "every allocation is freed by the end"
    assert streams == set(range(t.n_streams)) and t.n_streams == 3
    with pytest.raises(fastpath.FastpathError):
        fa.generate_trace(streams=9)
    t.close()
    with pytest.raises(ValueError):
        t.events()


def test_replay_cpu(ctx):
    t = fa.generate_trace(layers=4, steps=2)
    rep = fa.replay(ctx, t, passes=2)
    first, steady = rep["first"], rep["steady"]
    want_peak = t.peak_requested()
    assert first["peak_requested"] == steady["peak_requested"] == want_peak
    assert first["upstream_allocs"] > 0
    assert steady["upstream_allocs"] == 0 and steady["upstream_frees"] == 0  # steady state
    assert steady["peak_reserved"] >= steady["peak_allocated"] >= steady["peak_requested"]
    n_alloc = sum(1 for e in t.events() if e[0] == "alloc")
    assert steady["alloc_latency"]["samples"] == n_alloc
    assert steady["free_latency"]["samples"] == n_alloc
    assert steady["alloc_latency"]["median_ms"] > 0
    assert rep["stats"]["allocated_bytes"]["current"] == 0
    check_pools_add_up(rep["stats"])
    direct = fa.replay_direct(ctx, t)
    assert direct["peak_requested"] == want_peak
    assert direct["upstream_allocs"] == n_alloc and direct["upstream_frees"] == n_alloc
    # A config is honoured: a large-pool rounding makes blocks bigger.
    rounded = fa.replay(ctx, t, passes=1, divisions=[(MiB, 1 << 40, 2)])
    assert rounded["first"]["peak_allocated"] > first["peak_allocated"]
    with fa.Allocator(ctx) as a:  # an allocator of the caller's keeps its cache
        fa.replay(ctx, t, allocator=a, passes=1)
        assert a.stats()["reserved_bytes"]["current"] > 0


def test_bench_without_torch_exits_cleanly(tmp_path):
    import importlib.util
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed")
    out = tmp_path / "unused.json"
    r = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "torch is not installed" in r.stderr, r.stderr
    assert not out.exists()


def test_bench_allow_cpu_writes_json(tmp_path):
    out = tmp_path / "alloc.json"
    r = subprocess.run([sys.executable, str(BENCH), "--quick", "--allow-cpu", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "fastbench-python-alloc/1" and doc["trace"]["ops"] > 0
    fp = doc["fastpath"]
    assert fp["steady"]["upstream_allocs"] == 0
    assert fp["steady"]["peak_reserved"] >= fp["steady"]["peak_allocated"] > 0
    assert fp["python_loop"]["alloc_median_ns"] > 0
    assert doc["torch"] is None or "peak_reserved" in doc["torch"]["steady"]
