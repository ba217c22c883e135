"""benchmarks/python/bench_torch.py: exits cleanly without torch; with torch,
a tiny CPU smoke run writes the fastbench-python/1 JSON."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "python" / "bench_torch.py"


def test_without_torch_exits_cleanly():
    if importlib.util.find_spec("torch") is not None:
        import pytest
        pytest.skip("torch is installed")
    r = subprocess.run([sys.executable, str(SCRIPT), "--json", "unused.json"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "torch is not installed" in r.stderr
    assert not Path("unused.json").exists()


def test_smoke_cpu_writes_json(tmp_path):
    import pytest
    pytest.importorskip("torch")
    import fastpath
    if not (fastpath.norm.available() and fastpath.attention.available()):
        pytest.skip("built without norm or attention")
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--smoke-cpu", "--compiled", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "fastbench-python/1" and doc["git_commit"] and doc["date"]
    ops = {c["op"] for c in doc["cases"]}
    assert ops == {"add_layer_norm_gelu", "rms_norm", "sdpa"}
    for c in doc["cases"]:
        assert c["path"] == "fastpath", c
        assert c["fastpath_median_ms"] > 0 and c["speedup"] > 0
        assert c["fastpath_max_err"] < 0.05
        if c["op"] != "sdpa":  # --compiled: inductor's kernel and the drop-in in a compiled graph
            assert c["torch_compiled_median_ms"] > 0 and c["fastpath_compiled_median_ms"] > 0
            assert c["torch_compiled_max_err"] < 0.05


def test_bench_overhead_smoke():
    import pytest
    pytest.importorskip("torch")
    import fastpath
    if not (fastpath.norm.available() and fastpath.attention.available()):
        pytest.skip("built without norm or attention")
    script = SCRIPT.parent / "bench_overhead.py"
    r = subprocess.run([sys.executable, str(script), "--smoke"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0] for line in r.stdout.splitlines()[3:] if line.strip()}
    for op in ("layer_norm", "rms_norm", "add_layer_norm", "layer_norm_fwd_bwd",
               "add_layer_norm_fwd_bwd", "sdpa", "kvcache", "c_call"):
        assert op in rows, r.stdout
    assert "fallbacks: 0 " in r.stdout
