"""fastbench trace SCENARIO --out DIR and run --profile: each scenario's timed
samples traced and judged by the five-dimension verdict (trace.h), the
spans exported as a Chrome trace and a SQLite database with the A/B results
in its runs table, the verdict table in `fastbench report`; the progress line
on a terminal; bad arguments. On the CPU (or the GPU when one is present
and no --device is given: these tests pass --device cpu)."""
import json
import os
import pty
import sqlite3
import subprocess
from pathlib import Path

import pytest

BOUNDS = {"compute", "memory", "launch", "transfer", "sync", "unknown"}


def run(fastbench, *args, check=None):
    p = subprocess.run([fastbench, *args], capture_output=True, text=True, timeout=600)
    if check is not None:
        assert p.returncode == check, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def traced(fastbench, tmp_path_factory):
    out = tmp_path_factory.mktemp("trace") / "out"  # made by fastbench (its parent exists)
    p = run(fastbench, "trace", "attention/prefill", "timing/copy", "--quick", "--device", "cpu",
            "--seq", "256", "--out", str(out), check=0)
    return out, p


def test_trace_writes_run_json_with_verdicts(traced):
    out, p = traced
    doc = json.loads((out / "run.json").read_text())
    assert doc["schema"] == "fastbench/1" and doc["complete"] is True
    roofs = doc["roofs"]
    assert roofs["fma_tflops"] > 0 and roofs["copy_gbps"] > 0 and roofs["pinned_gbps"] > 0
    profiles = {pr["scenario"]: pr for pr in doc["profiles"]}
    assert set(profiles) == {"attention/prefill", "timing/copy"}
    for pr in profiles.values():
        v = pr["overall"]
        assert v["bound"] in BOUNDS and v["reason"] and v["remedy"]
        assert pr["spans"] > 0 and pr["dropped"] == 0
        total = v["busy_ms"] + v["launch_gap_ms"] + v["transfer_ms"] + v["sync_ms"]
        assert total == pytest.approx(v["window_ms"], rel=1e-6)
        for g in pr["groups"]:
            assert g["bound"] in BOUNDS
    # flash attention on the CPU: its ops carry FLOPs and bytes; arithmetic-bound
    att = profiles["attention/prefill"]
    assert att["from_samples"] is False
    assert att["overall"]["bound"] == "compute", att["overall"]
    names = {g["group"] for g in att["groups"]}
    assert "attention_fwd" in names and "baseline" in names
    # the copy probe runs no library op: its samples stand in, with the A/B's bytes
    cp = profiles["timing/copy"]
    assert cp["from_samples"] is True and cp["overall"]["bound"] == "memory"
    assert cp["overall"]["memory_pct"] > 0
    assert "profile: compute-bound" in p.stdout and "profile: memory-bound" in p.stdout


def test_trace_chrome_and_sqlite(traced):
    out, _ = traced
    chrome = json.loads((out / "trace.json").read_text())
    events = chrome["traceEvents"] if isinstance(chrome, dict) else chrome
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)
    assert {"attention_fwd", "optimized", "baseline"} <= {e["name"] for e in spans}
    db = sqlite3.connect(out / "trace.sqlite")
    # the optimized side's share of each scenario's sample time, as a profiling query would ask
    rows = db.execute("""
        SELECT step, stage, SUM(duration) / SUM(SUM(duration)) OVER (PARTITION BY step) AS share
        FROM torch_trace WHERE category = 'range' AND stage IN ('baseline', 'optimized')
        GROUP BY step, stage ORDER BY step, stage""").fetchall()
    assert len(rows) == 4
    for step in {r[0] for r in rows}:
        assert sum(r[2] for r in rows if r[0] == step) == pytest.approx(1.0)
    doc = json.loads((out / "run.json").read_text())
    runs = db.execute("SELECT label, speedup, verdict, git_commit FROM runs").fetchall()
    assert len(runs) == sum(1 for r in doc["results"] if "baseline" in r)
    assert all(r[0].split()[0] in ("attention/prefill", "timing/copy") for r in runs)
    assert all(r[3] == doc["git_commit"] for r in runs)
    # every span of a scenario carries its number as the step
    steps = {pr["scenario"]: pr["step"] for pr in doc["profiles"]}
    n = db.execute("SELECT COUNT(*) FROM torch_trace WHERE name = 'attention_fwd' AND step = ?",
                   (steps["attention/prefill"],)).fetchone()[0]
    assert n > 0


def test_report_shows_the_verdicts(fastbench, traced, tmp_path):
    pytest.importorskip("matplotlib")
    out, _ = traced
    run(fastbench, "report", str(out / "run.json"), "--out", str(tmp_path / "r"), check=0)
    page = (tmp_path / "r" / "index.html").read_text()
    assert "tensor cores" in page and "fusion" in page  # the remedies of compute and memory
    assert "<td>overall</td>" in page and "attention_fwd" in page


def test_run_profile_adds_profiles(fastbench, tmp_path):
    path = tmp_path / "run.json"
    p = run(fastbench, "run", "timing/self_check", "--quick", "--device", "cpu", "--profile", "--json", str(path),
            check=0)
    doc = json.loads(path.read_text())
    assert "roofs" in doc and [pr["scenario"] for pr in doc["profiles"]] == ["timing/self_check"]
    assert "roofs:" in p.stdout
    # without --profile: neither
    run(fastbench, "run", "timing/self_check", "--quick", "--device", "cpu", "--json", str(path), check=0)
    doc = json.loads(path.read_text())
    assert "profiles" not in doc and "roofs" not in doc


def test_trace_bad_arguments(fastbench, tmp_path):
    for args in (["trace", "timing/copy", "--device", "cpu"],  # no --out
                 ["trace", "--out", str(tmp_path / "x"), "--device", "cpu"],  # no scenario
                 ["run", "timing/copy", "--device", "cpu", "--out", str(tmp_path / "y")]):  # --out is trace's
        p = run(fastbench, *args)
        assert p.returncode == 2 and p.stderr.strip(), args
    f = tmp_path / "file"
    f.write_text("keep")
    p = run(fastbench, "trace", "timing/copy", "--quick", "--device", "cpu", "--out", str(f))
    assert p.returncode == 2 and "not a directory" in p.stderr and f.read_text() == "keep"
    p = run(fastbench, "trace", "timing/copy", "--quick", "--device", "cpu", "--out", str(tmp_path / "no" / "dir"))
    assert p.returncode == 2 and "cannot create" in p.stderr
    assert not (tmp_path / "no").exists()


def test_progress_line_on_a_terminal(fastbench):
    """With stdout and stderr on a terminal: [k/N], the scenario, elapsed and
    (from the second scenario) the time left; not when piped (the other tests)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([fastbench, "run", "timing/self_check", "timing/copy", "--quick", "--device", "cpu"],
                            stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert "[1/2] timing/copy" in text and "elapsed" in text
    assert "[2/2] timing/self_check" in text and "left)" in text
    piped = run(fastbench, "run", "timing/self_check", "--quick", "--device", "cpu", check=0)
    assert "[1/1]" not in piped.stderr and "[1/1]" not in piped.stdout
