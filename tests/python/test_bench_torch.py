"""benchmarks/python/bench_torch.py: exits cleanly without torch; with torch,
a tiny CPU smoke run writes the fastbench-python/1 JSON (per-backend SDPA
rows, the torch.compile fields), --max-seconds stops starting cases and says
what was not run, and a case that raises is recorded without ending the run."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "python" / "bench_torch.py"
BACKENDS = {"flash", "efficient", "cudnn", "math"}
SMOKE_SDPA = ["sdpa 2x4x64x64 full", "sdpa 2x4x64x64 causal", "sdpa 2x2x64x128 full",
              "sdpa 2x2x64x128 causal"]
SMOKE_RMS = ["rms_norm 33x256", "rms_norm 7x1537"]


def test_without_torch_exits_cleanly():
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed")
    r = subprocess.run([sys.executable, str(SCRIPT), "--json", "unused.json"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "torch is not installed" in r.stderr
    assert not Path("unused.json").exists()


def need_torch_and_fastpath():
    pytest.importorskip("torch")
    import fastpath
    if not (fastpath.norm.available() and fastpath.attention.available()):
        pytest.skip("built without norm or attention")


def check_sdpa_row(c):
    """The per-backend fields of a measured sdpa row."""
    assert set(c["backends"]) == BACKENDS, c
    ran = {}
    for name, b in c["backends"].items():
        if "median_ms" in b:
            assert b["median_ms"] > 0 and b["tflops"] > 0 and b["max_err"] < 0.05, (name, b)
            ran[name] = b["median_ms"]
        else:  # refused / missing / skipped, with its reason
            assert set(b) in ({"error"}, {"skipped"}) and list(b.values())[0], (name, b)
    # the existing fields are the flash backend's (torch's CPU flash kernel on the smoke run)
    assert "flash" in ran and c["torch_median_ms"] == ran["flash"]
    assert c["speedup"] == pytest.approx(ran["flash"] / c["fastpath_median_ms"])
    assert c["best_torch_backend"] == min(ran, key=ran.get)
    assert c["best_torch_median_ms"] == min(ran.values())
    assert c["speedup_vs_best"] == pytest.approx(min(ran.values()) / c["fastpath_median_ms"])
    assert c["fastpath_vs_torch_max_diff"] < 0.05


def test_smoke_cpu_writes_json(tmp_path):
    need_torch_and_fastpath()
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--smoke-cpu", "--compiled", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "fastbench-python/1" and doc["git_commit"] and doc["date"]
    assert doc["complete"] is True and doc["stopped_reason"] is None and doc["not_run"] == []
    ops = {c["op"] for c in doc["cases"]}
    assert ops == {"add_layer_norm_gelu", "rms_norm", "sdpa", "sdpa_decode"}
    assert len(doc["cases"]) == 9
    decode = [c for c in doc["cases"] if c["op"] == "sdpa_decode"]
    assert len(decode) == 1 and decode[0]["shape"] == [2, 4, 2, 96, 64], decode
    for c in decode:  # GQA: 4 query heads on 2 KV heads, every backend asked with enable_gqa
        assert "error" not in c and c["path"] == "fastpath" and c["kernel"]["kernel"] == "cpu", c
        assert c["fastpath_max_err"] < 0.05
        check_sdpa_row(c)
        kv_bytes = 2 * 2 * 96 * 2 * 64 * 2
        assert c["kv_gbps"] == pytest.approx(kv_bytes / (c["fastpath_median_ms"] * 1e6))
        for b in c["backends"].values():
            if "median_ms" in b:
                assert b["kv_gbps"] == pytest.approx(kv_bytes / (b["median_ms"] * 1e6))
    for c in doc["cases"]:
        if c["op"] == "sdpa_decode":
            continue
        assert "error" not in c, c
        assert c["path"] == "fastpath", c
        assert c["fastpath_median_ms"] > 0 and c["speedup"] > 0
        assert c["fastpath_max_err"] < 0.05
        # --compiled: inductor's kernel and the drop-in in a compiled graph (norm / rms),
        # the flash-selected eager call compiled (sdpa)
        assert c["torch_compiled_median_ms"] > 0 and c["torch_compiled_max_err"] < 0.05, c
        if c["op"] == "sdpa":
            # which libfastpath kernel ran (fp_attention_last_kernel): the CPU implementation here
            assert c["kernel"]["kernel"] == "cpu", c["kernel"]
            check_sdpa_row(c)
            # the math backend runs at seqlen 64 (default --math-max-seqlen 2048)
            assert "median_ms" in c["backends"]["math"]
        else:
            assert c["fastpath_compiled_median_ms"] > 0
    # the table: one line per sdpa case with every backend's column
    lines = r.stdout.splitlines()
    hdr = next(line for line in lines if line.startswith("sdpa BxHxLxD"))
    for col in ("fastpath", "flash", "effic", "cudnn", "math", "compile", "best", "vs best"):
        assert col in hdr, hdr
    assert sum(line.startswith(("2x4x64x64 ", "2x2x64x128 ")) for line in lines) == 4, r.stdout
    hdr = next(line for line in lines if line.startswith("decode BxHqxHkvxLxD"))
    assert "GB/s" in hdr and "vs best" in hdr, hdr
    assert sum(line.startswith("2x4x2x96x64 ") for line in lines) == 1, r.stdout
    assert "9 of 9 cases" in r.stdout


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_torch_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_max_seconds_zero_runs_nothing(tmp_path):
    need_torch_and_fastpath()
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--smoke-cpu", "--max-seconds", "0", "--only",
                        "sdpa,rms", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["cases"] == [] and doc["complete"] is False
    assert "--max-seconds 0" in doc["stopped_reason"]
    assert doc["not_run"] == SMOKE_SDPA + SMOKE_RMS  # in --only's order
    assert "NOT RUN (--max-seconds 0" in r.stdout and "0 of 6 cases" in r.stdout


def test_max_seconds_stops_between_cases(tmp_path, monkeypatch, capsys):
    """A fake clock that each timing advances by 100 s (a smoke sdpa case
    times fastpath, flash and math, then the compiled call): with
    --max-seconds 500 the first case runs whole (starts at 0, its compile step
    at 300 s), the second starts (400 s) but skips its compile step (700 s),
    then no case starts."""
    need_torch_and_fastpath()
    bench = load_bench()
    now = [0.0]
    monkeypatch.setattr(bench, "_clock", lambda: now[0])
    real_median = bench.median_ms

    def slow_median(torch, fn, warmup, iters):
        now[0] += 100.0
        return real_median(torch, fn, warmup, iters)

    monkeypatch.setattr(bench, "median_ms", slow_median)
    out = tmp_path / "bench.json"
    rc = bench.main(["--smoke-cpu", "--compiled", "--only", "sdpa,rms", "--max-seconds", "500",
                     "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["max_seconds"] == 500
    assert "--max-seconds 500 reached" in doc["stopped_reason"]
    assert [c["op"] for c in doc["cases"]] == ["sdpa", "sdpa"]  # --only's order: sdpa first
    first, second = doc["cases"]
    check_sdpa_row(first)
    assert first["torch_compiled_median_ms"] > 0
    check_sdpa_row(second)
    assert "--max-seconds 500 reached" in second["torch_compiled_skipped"]
    assert "torch_compiled_median_ms" not in second
    assert doc["not_run"] == SMOKE_SDPA[2:] + SMOKE_RMS
    assert "NOT RUN (--max-seconds 500 reached" in printed
    assert "sdpa 2x2x64x128 full" in printed and "2 of 6 cases" in printed


def test_failing_case_and_backend_are_recorded(tmp_path, monkeypatch, capsys):
    """A case that raises becomes a row with "error" and later cases still
    run; a backend that raises (as CUDA's "No available kernel") is recorded
    in "backends" with its reason; math above --math-max-seqlen is skipped."""
    need_torch_and_fastpath()
    bench = load_bench()
    real_ref, calls = bench.sdpa_reference, []

    def flaky_ref(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return real_ref(*a, **kw)

    real_ctx = bench.sdpa_backend_ctx

    def no_cudnn(torch, name):
        if name == "cudnn":
            raise RuntimeError("No available kernel. Aborting execution.")
        return real_ctx(torch, name)

    monkeypatch.setattr(bench, "sdpa_reference", flaky_ref)
    monkeypatch.setattr(bench, "sdpa_backend_ctx", no_cudnn)
    out = tmp_path / "bench.json"
    rc = bench.main(["--smoke-cpu", "--only", "sdpa", "--math-max-seqlen", "32", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and doc["not_run"] == []
    assert len(doc["cases"]) == 4
    bad = doc["cases"][1]
    assert bad["op"] == "sdpa" and bad["shape"] == [2, 4, 64, 64] and bad["causal"] is True
    assert "injected failure" in bad["error"] and "median_ms" not in str(bad)
    for c in doc["cases"][:1] + doc["cases"][2:]:
        check_sdpa_row(c)
        assert "No available kernel" in c["backends"]["cudnn"]["error"]
        assert c["backends"]["math"] == {"skipped": "seqlen 64 > --math-max-seqlen 32"}
    assert "FAILED (1" in printed and "sdpa 2x4x64x64 causal" in printed
    assert "cudnn err: no kernel" in printed or "cudnn err: RuntimeError" in printed


def test_bench_overhead_smoke():
    need_torch_and_fastpath()
    script = SCRIPT.parent / "bench_overhead.py"
    r = subprocess.run([sys.executable, str(script), "--smoke"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0] for line in r.stdout.splitlines()[3:] if line.strip()}
    for op in ("layer_norm", "rms_norm", "add_layer_norm", "layer_norm_fwd_bwd",
               "add_layer_norm_fwd_bwd", "sdpa", "kvcache", "c_call"):
        assert op in rows, r.stdout
    assert "fallbacks: 0 " in r.stdout


def test_launch_path_cost_smoke():
    # both rows run (torch's driver-bound calls stubbed), and the guard path
    # hands the legacy stream for torch's stream 0 (the script checks it)
    need_torch_and_fastpath()
    script = SCRIPT.parent / "launch_path_cost.py"
    r = subprocess.run([sys.executable, str(script), "--calls", "200"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith(("guard path", "fast path"))]
    assert len(rows) == 2 and all(float(line.split()[-1]) > 0 for line in rows), r.stdout
