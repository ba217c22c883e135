"""fastbench report RUN.json --out DIR: the HTML page and the two charts of a
real CPU run and of a hand-written document with roofs and profiles; every
bad input and an unusable DIR exit 2 with one line and write nothing."""
import html
import importlib.util
import json
import os
import runpy
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "report" / "fastbench_report.py"
# the charts need matplotlib (scripts/install-deps.sh installs it); the input checks do not
needs_mpl = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                               reason="matplotlib is not installed (scripts/install-deps.sh)")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
OUTPUTS = ("index.html", "roofline.png", "speedup.png")


def run(fastbench, *args, env=None, check=None):
    full_env = {**os.environ, "FASTPATH_PYTHON": sys.executable, **(env or {})}
    p = subprocess.run([fastbench, *args], capture_output=True, text=True, timeout=240, env=full_env)
    if check is not None:
        assert p.returncode == check, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def report_module():
    """The script's functions (it imports the standard library and matplotlib only: no fastpath)."""
    return types.SimpleNamespace(**runpy.run_path(str(SCRIPT), run_name="fastbench_report"))


def check_png(path):
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    image = matplotlib.image.imread(str(path))
    assert image.shape[0] > 0 and image.shape[1] > 0, path


@pytest.fixture(scope="module")
def cpu_run(fastbench, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "run.json"
    run(fastbench, "run", "timing/", "--quick", "--device", "cpu", "--json", str(path), check=0)
    return path


@needs_mpl
def test_report_of_a_cpu_run(fastbench, cpu_run, tmp_path):
    out = tmp_path / "out"
    run(fastbench, "report", str(cpu_run), "--out", str(out), check=0)
    doc = json.loads(cpu_run.read_text())
    page = (out / "index.html").read_text()
    assert page and html.escape(doc["device"]["name"]) in page
    for r in doc["results"]:
        assert html.escape(r["name"]) in page
    assert "Verdict table" in page and "not traced (fastbench trace timing/copy --out DIR)" in page
    assert "no device peaks known" not in page  # said in the chart's title, not as page text
    assert "http://" not in page and "https://" not in page and "<script" not in page
    for name in ("roofline.png", "speedup.png"):
        check_png(out / name)
    assert sorted(os.listdir(out)) == sorted(OUTPUTS)  # no temporary left behind


def verdict(group, bound, remedy, **pcts):
    v = {"group": group, "spans": 10, "window_ms": 10.0, "busy_ms": 8.0, "launch_gap_ms": 1.0,
         "transfer_ms": 0.5, "sync_ms": 0.5, "compute_pct": None, "memory_pct": None, "launch_pct": 10.0,
         "transfer_pct": 5.0, "transfer_gbps": None, "transfer_pct_of_peak": None, "sync_pct": 5.0,
         "bound": bound, "remedy": remedy, "reason": f"{group} is {bound}-bound"}
    v.update(pcts)
    return v


def stats(median):
    return {"median_ms": median, "p10_ms": median * 0.9, "p90_ms": median * 1.1, "mean_ms": median,
            "min_ms": median * 0.8, "max_ms": median * 1.2, "stdev_ms": median * 0.05, "noise": 0.01,
            "samples": 20}


def ab_result(name, params, gbps, tflops, bound, pct, speedup=2.0, verdict_="FASTER"):
    return {"name": name, "params": params, "status": "OK", "baseline": stats(2.0 * speedup),
            "optimized": stats(2.0), "speedup": speedup, "verdict": verdict_, "compared": True,
            "max_abs_err": 1e-3, "tolerance": 1e-2, "achieved_gbps": gbps, "achieved_tflops": tflops,
            "pct_of_peak": pct, "bound": bound, "passed": True, "metrics": {}}


REMEDIES = {
    "compute": "tensor cores: a bf16 GEMM tile & <wider> MMA",
    "memory": "fusion: fused norm + residual + bias + activation (fp_norm_forward)",
    "launch": "CUDA graphs: capture the step (fp_graph_capture)",
    "transfer": "pinned pipeline: overlap copies with compute (fp_pipeline)",
    "sync": "drop the host sync: events instead of cudaDeviceSynchronize",
}


def profiled_doc():
    return {
        "schema": "fastbench/1", "date": "2026-01-02T03:04:05Z", "git_commit": "abc123",
        "library_version": "0.3.0", "complete": True,
        "device": {"name": "NVIDIA H100 <SXM>", "kind": "cuda", "peak_gbps": 3350.0,
                   "peak_tflops_fp32": 67.0, "peak_tflops_bf16": 989.0},
        "roofs": {"compute_tflops": 989.4, "fma_tflops": 66.9, "copy_gbps": 2900.0, "pinned_gbps": 50.0},
        "results": [
            ab_result("attention/fwd", {"seq": 4096, "dtype": "bf16"}, 800.0, 400.0, "compute", 40.4),
            ab_result("norm/layernorm_fwd", {"rows": 4096, "cols": 768}, 2000.0, 2.0, "memory", 69.0),
            ab_result("timing/copy", {"mib": 256}, 2500.0, None, "memory", 86.2, 0.5, "SLOWER"),
            ab_result("comm/allreduce", {"mib": 64}, 1200.0, None, "memory", 41.4, 1.0, "SAME"),
            {"name": "graph/chain", "params": {}, "status": "ERR_CUDA", "detail": "launch <failed>",
             "passed": False},
        ],
        "skipped": [{"name": "pipeline/overlap", "reason": "needs pinned memory"}],
        "profiles": [
            {"scenario": "attention/fwd", "spans": 40, "dropped": 0,
             "overall": verdict("all", "compute", REMEDIES["compute"], compute_pct=80.0, memory_pct=20.0),
             "groups": [verdict("attn_fwd", "compute", REMEDIES["compute"], compute_pct=85.0),
                        verdict("attn_launch", "launch", REMEDIES["launch"], launch_pct=60.0)]},
            {"scenario": "norm/layernorm_fwd", "spans": 30, "dropped": 0,
             "overall": verdict("all", "memory", REMEDIES["memory"], memory_pct=81.0),
             "groups": [verdict("norm_fwd", "memory", REMEDIES["memory"], memory_pct=81.0),
                        verdict("h2d", "transfer", REMEDIES["transfer"], transfer_pct=55.0,
                                transfer_gbps=24.0, transfer_pct_of_peak=48.0),
                        verdict("wait", "sync", REMEDIES["sync"], sync_pct=70.0)]},
        ],
    }


@needs_mpl
def test_report_with_roofs_and_profiles(fastbench, tmp_path):
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(profiled_doc()))
    out = tmp_path / "out"
    run(fastbench, "report", str(path), "--out", str(out), check=0)
    page = (out / "index.html").read_text()
    assert "NVIDIA H100 &lt;SXM&gt;" in page and "<SXM>" not in page
    for bound, remedy in REMEDIES.items():
        assert f"<td>{bound}</td>" in page, bound
        assert html.escape(remedy) in page, remedy
    assert "<wider>" not in page and "launch &lt;failed&gt;" in page
    assert "<td>overall</td>" in page and "55.0 (24 GB/s, 48% of pinned)" in page
    # traced scenarios get their profile rows; the others one row from "bound"
    assert "not traced (fastbench trace comm/allreduce --out DIR)" in page
    assert "fastbench trace attention/fwd" not in page
    assert "pipeline/overlap: needs pinned memory" in page
    for name in ("roofline.png", "speedup.png"):
        check_png(out / name)


@needs_mpl
def test_roofline_places_points_under_the_roofs(tmp_path):
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(profiled_doc()))
    mod = report_module()
    doc = mod.load(str(path))
    points = {label.split()[0]: (x, y) for label, x, y in mod.roofline_points(doc["results"])}
    assert points == {"attention/fwd": (pytest.approx(500.0), 400.0), "norm/layernorm_fwd": (pytest.approx(1.0), 2.0)}
    bars = [label.split()[0] for label, _ in mod.bandwidth_only(doc["results"])]
    assert bars == ["timing/copy", "comm/allreduce"]
    # the measured roofs win over the datasheet peaks
    assert mod.roof_values(doc) == (2900.0, [("BF16 tensor", 989.4), ("FP32", 66.9)])
    rows = mod.speedup_rows(doc["results"])
    label, s, low, high, v = rows[0]
    assert s == 2.0 and low == pytest.approx(4.0 * 0.9 / 2.2) and high == pytest.approx(4.0 * 1.1 / 1.8)
    assert len(rows) == 4  # the failed row has no A/B
    assert "import fastpath" not in SCRIPT.read_text()  # the shared library is not loaded


@needs_mpl
def test_roofs_fall_back_to_the_device_peaks(tmp_path):
    doc = profiled_doc()
    del doc["roofs"], doc["profiles"]
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(doc))
    mod = report_module()
    assert mod.roof_values(mod.load(str(path))) == (3350.0, [("BF16 tensor", 989.0), ("FP32", 67.0)])


def write(path, content):
    path.write_text(content)
    return path


def doc_with(**fields):
    return json.dumps(dict({"schema": "fastbench/1", "results": []}, **fields))


BAD_INPUTS = {
    "missing": (lambda p: p, "cannot open"),
    "directory": (lambda p: (p.mkdir(), p)[1], "not a regular file"),
    "empty": (lambda p: write(p, ""), "is empty"),
    "truncated": (lambda p: write(p, '{"schema": "fastbench/1", "results": [{"name": "x"'), "not valid JSON"),
    "array": (lambda p: write(p, "[]"), "not a fastbench JSON report"),
    "other schema": (lambda p: write(p, '{"schema": "other/1", "results": []}'), "not a fastbench JSON report"),
    "results not an array": (lambda p: write(p, doc_with(results={})), "results is not an array"),
    "result is a string": (lambda p: write(p, doc_with(results=["timing/copy"])), "results[0] is not an object"),
    "name not a string": (lambda p: write(p, doc_with(results=[{"name": 7}])), "name is not a string"),
    "speedup not a number": (lambda p: write(p, doc_with(results=[{"name": "x", "speedup": "fast"}])),
                             "speedup is not a number"),
    # JSON has no Inf, but 1e999 overflows to it
    "speedup not finite": (lambda p: write(p, '{"schema": "fastbench/1", "results": [{"speedup": 1e999, "name": ""}]}'),
                           "speedup is not a finite number"),
    "profiles not an array": (lambda p: write(p, doc_with(profiles={"scenario": "x"})), "profiles is not an array"),
    "profile pct not a number": (lambda p: write(p, doc_with(profiles=[{"scenario": "x",
                                                                         "overall": {"compute_pct": "high"}}])),
                                 "compute_pct is not a number"),
    "device peak not a number": (lambda p: write(p, doc_with(device={"peak_gbps": [1]})), "peak_gbps is not a number"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_writes_nothing(fastbench, tmp_path, case):
    make, message = BAD_INPUTS[case]
    path = make(tmp_path / "in.json")
    fresh = tmp_path / "fresh"
    p = run(fastbench, "report", str(path), "--out", str(fresh))
    assert p.returncode == 2, p.stderr
    assert message in p.stderr and str(path) in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not fresh.exists()
    # an older report in DIR stays byte-identical
    old = tmp_path / "old"
    old.mkdir()
    for name in OUTPUTS:
        (old / name).write_bytes(b"old " + name.encode())
    assert run(fastbench, "report", str(path), "--out", str(old)).returncode == 2
    assert sorted(os.listdir(old)) == sorted(OUTPUTS)
    for name in OUTPUTS:
        assert (old / name).read_bytes() == b"old " + name.encode()


def test_out_under_a_regular_file(fastbench, cpu_run, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    p = run(fastbench, "report", str(cpu_run), "--out", str(blocker / "out"))
    assert p.returncode == 2 and "cannot create" in p.stderr and "Not a directory" in p.stderr, p.stderr
    p = run(fastbench, "report", str(cpu_run), "--out", str(blocker))
    assert p.returncode == 2 and "not a directory" in p.stderr, p.stderr
    assert blocker.read_text() == "keep"


def test_failed_drawing_keeps_the_old_report(fastbench, tmp_path):
    """matplotlib missing: exit 2 with the install hint, the old report intact."""
    fake = tmp_path / "fake"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    path = write(tmp_path / "r.json", json.dumps(profiled_doc()))
    old = tmp_path / "old"
    old.mkdir()
    (old / "index.html").write_text("old")
    p = run(fastbench, "report", str(path), "--out", str(old), env={"PYTHONPATH": str(fake)})
    assert p.returncode == 2
    assert "matplotlib is not installed: pip install matplotlib (scripts/install-deps.sh installs it)" in p.stderr
    assert os.listdir(old) == ["index.html"] and (old / "index.html").read_text() == "old"


@needs_mpl
def test_script_and_paths_with_spaces_and_quotes(fastbench, tmp_path):
    odd = tmp_path / "it's a \"dir\""
    odd.mkdir()
    script = odd / "report script.py"
    shutil.copy(SCRIPT, script)
    path = write(odd / "run 1.json", json.dumps(profiled_doc()))
    out = odd / "out $x"
    run(fastbench, "report", str(path), "--out", str(out), env={"FASTPATH_REPORT_SCRIPT": str(script)}, check=0)
    assert sorted(os.listdir(out)) == sorted(OUTPUTS)


def test_c_side_checks_without_python(fastbench, tmp_path):
    bad = write(tmp_path / "bad.json", '{"schema": "fastbench/1", "res')
    no_python = {"FASTPATH_PYTHON": str(tmp_path / "no-python")}
    p = run(fastbench, "report", str(bad), "--out", str(tmp_path / "o"), env=no_python)
    assert p.returncode == 2 and "fastbench report:" in p.stderr and "not valid JSON" in p.stderr, p.stderr
    good = write(tmp_path / "good.json", doc_with())
    p = run(fastbench, "report", str(good), "--out", str(tmp_path / "o"), env=no_python)
    assert p.returncode == 2 and "cannot run" in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [[], ["run.json"], ["--out", "d"], ["a.json", "b.json", "--out", "d"],
                                  ["a.json", "--out"], ["a.json", "--out", "d", "--bogus"]])
def test_report_usage(fastbench, args):
    p = run(fastbench, "report", *args)
    assert p.returncode == 2 and "usage" in p.stderr, p.stderr
