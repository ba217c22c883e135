"""fastbench's CLI: list, run (table + fastbench/1 JSON), compare, info, and
its handling of bad input. Runs on the CPU (or the GPU when one is present)."""
import json
import subprocess

import pytest


def run(fastbench, *args, check=None):
    p = subprocess.run([fastbench, *args], capture_output=True, text=True, timeout=240)
    if check is not None:
        assert p.returncode == check, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def test_list_names_start_with_module(fastbench):
    out = run(fastbench, "list", check=0).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert "timing/elementwise" in names and "timing/copy" in names
    modules = {"timing", "norm", "attention", "alloc", "batcher", "pipeline", "graph", "comm"}
    for n in names:
        assert n.split("/")[0] in modules, n
    assert names == sorted(names)


@pytest.fixture(scope="module")
def report(fastbench, tmp_path_factory):
    path = tmp_path_factory.mktemp("fb") / "run.json"
    p = run(fastbench, "run", "timing/", "--quick", "--device", "cpu", "--json", str(path), check=0)
    return p, json.loads(path.read_text())


def test_run_writes_schema(report):
    _, doc = report
    assert doc["schema"] == "fastbench/1"
    for key in ("date", "git_commit", "library_version", "device", "results"):
        assert key in doc
    dev = doc["device"]
    assert dev["kind"] == "cpu"
    for key in ("name", "compute_capability", "peak_gbps", "peak_tflops_bf16"):
        assert key in dev
    names = {r["name"] for r in doc["results"]}
    assert {"timing/elementwise", "timing/copy", "timing/self_check"} <= names
    for r in doc["results"]:
        for key in ("name", "params", "baseline", "optimized", "speedup", "verdict", "max_abs_err",
                    "tolerance", "passed", "achieved_gbps", "achieved_tflops", "pct_of_peak"):
            assert key in r, (r["name"], key)
        for side in ("baseline", "optimized"):
            s = r[side]
            assert s["samples"] >= 1
            assert 0 < s["p10_ms"] <= s["median_ms"] <= s["p90_ms"]
        assert r["verdict"] in ("FASTER", "SLOWER", "SAME")
        assert r["passed"] is True
        assert r["speedup"] == pytest.approx(r["baseline"]["median_ms"] / r["optimized"]["median_ms"], rel=1e-9)


def test_run_table(report):
    p, doc = report
    assert "scenario" in p.stdout and "verdict" in p.stdout
    assert "timing/elementwise" in p.stdout
    assert "running on the CPU" in p.stderr or "cpu" in p.stdout


def test_elementwise_dtype_and_shape_options(fastbench, tmp_path):
    path = tmp_path / "e.json"
    run(fastbench, "run", "timing/elementwise", "--quick", "--device", "cpu", "--dtype", "f16",
        "--n", "4099", "--json", str(path), check=0)
    doc = json.loads(path.read_text())
    (r,) = doc["results"]
    assert r["params"] == {"n": 4099, "dtype": "f16"}
    assert r["max_abs_err"] == 0 and r["passed"]


def make_doc(entries):
    results = []
    for name, med, p10, p90 in entries:
        stats = {"median_ms": med, "p10_ms": p10, "p90_ms": p90, "samples": 50}
        results.append({"name": name, "params": {"n": 1}, "baseline": stats, "optimized": stats,
                        "speedup": 1.0, "verdict": "SAME"})
    return {"schema": "fastbench/1", "results": results}


def test_compare_verdicts(fastbench, tmp_path):
    old = tmp_path / "old.json"
    new = tmp_path / "new.json"
    old.write_text(json.dumps(make_doc([("a/x", 1.0, 0.99, 1.01), ("a/y", 1.0, 0.99, 1.01),
                                        ("a/z", 1.0, 0.9, 1.1)])))
    new.write_text(json.dumps(make_doc([("a/x", 0.5, 0.49, 0.51), ("a/y", 1.0, 0.99, 1.01),
                                        ("a/z", 1.05, 0.95, 1.15), ("a/new", 1, 1, 1)])))
    p = run(fastbench, "compare", str(old), str(new), check=0)
    lines = {l.split()[0]: l for l in p.stdout.splitlines() if l.startswith("a/")}
    assert "FASTER" in lines["a/x|n=1"]
    assert "SAME" in lines["a/y|n=1"]
    assert "SAME" in lines["a/z|n=1"]  # 5% inside a 10% spread
    assert "new" in lines["a/new|n=1"]
    # A regression makes compare exit 1 so CI scripts can gate on it.
    p = run(fastbench, "compare", str(new), str(old), check=1)
    assert "SLOWER" in p.stdout


def test_compare_own_output(fastbench, report, tmp_path):
    _, doc = report
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    p = run(fastbench, "compare", str(path), str(path), check=0)
    assert "0 slower" in p.stdout


@pytest.mark.parametrize("args", [
    [], ["bogus"], ["run", "no-such-scenario"], ["run", "--device", "tpu"], ["run", "--dtype", "int8"],
    ["run", "--rows"], ["run", "--rows", "abc"], ["compare", "only-one.json"],
])
def test_usage_errors_exit_2(fastbench, args):
    p = run(fastbench, *args)
    assert p.returncode == 2, (args, p.stdout, p.stderr)
    assert p.stderr.strip()


def test_compare_rejects_bad_files(fastbench, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/else", "results": []}))
    assert run(fastbench, "compare", str(bad), str(bad)).returncode == 2
    assert run(fastbench, "compare", str(other), str(other)).returncode == 2
    assert run(fastbench, "compare", str(tmp_path / "missing.json"), str(other)).returncode == 2


def test_cuda_device_without_gpu(fastbench):
    info = run(fastbench, "info", check=0).stdout
    if "CUDA devices: 0" not in info:
        pytest.skip("a GPU is present")
    p = run(fastbench, "run", "timing/copy", "--device", "cuda:0")
    assert p.returncode == 2
    assert "no device" in p.stderr


def test_info(fastbench, tmp_path):
    path = tmp_path / "info.json"
    p = run(fastbench, "info", "--json", str(path), check=0)
    assert "libfastpath" in p.stdout and "CUDA runtime" in p.stdout
    doc = json.loads(path.read_text())
    assert doc["devices"][-1]["kind"] == "cpu"
