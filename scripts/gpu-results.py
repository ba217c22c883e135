#!/usr/bin/env python3
"""Files a GPU run and checks it against the issues' targets.

    scripts/gpu-results.py OUTDIR        # OUTDIR written by scripts/gpu-check.sh
    scripts/gpu-results.py --check FILE  # only print the targets table for a fastbench JSON

Copies OUTDIR's summary, logs and JSON into
benchmarks/results/<date>-<device>-<commit>/ and rewrites the table in
benchmarks/results/README.md (between the TARGETS markers) from
benchmarks/results/targets.json: each target's figure from the newest filed
run that measured it (so a narrowed run keeps the others' rows). Prints the
table. Targets with "source": "python-bench" read the cases of
benchmarks/python/bench_torch.py's python-bench.json (name: the case's op;
params and field: the case's own keys), the others fastbench's results.
"""
import datetime
import json
import re
import shutil
import sys
from pathlib import Path

import os

ROOT = Path(__file__).resolve().parent.parent
# FASTPATH_RESULTS_DIR: another results folder (with its targets.json and
# README.md), for tests.
RESULTS = Path(os.environ.get("FASTPATH_RESULTS_DIR") or ROOT / "benchmarks" / "results")
KEEP = ("summary.txt", "ctest-gpu.log", "fastbench.json", "fastbench.txt", "python-bench.json", "python-bench.txt",
        "python-alloc.json", "logs.tar.gz", "extra.txt", "ncu.txt", "ncu.tar.gz", "command.txt")


def field(result, name):
    if name.startswith("metrics."):
        return (result.get("metrics") or {}).get(name[len("metrics."):])
    return result.get(name)


def matches(result, name, params):
    if result.get("name") not in (name if isinstance(name, list) else [name]):
        return False
    got = result.get("params") or {}
    for k, want in params.items():
        wants = want if isinstance(want, list) else [want]
        if got.get(k) not in wants:
            return False
    return True


PYTHON_SCHEMA = "fastbench-python/1"


def is_python(doc):
    """A benchmarks/python/bench_torch.py document (python-bench.json)."""
    return doc.get("schema") == PYTHON_SCHEMA


def doc_kind(doc):
    if is_python(doc):  # its device is torch's name for the GPU, or "cpu (smoke run)"
        return "cpu" if str(doc.get("device") or "cpu").startswith("cpu") else "cuda"
    return (doc.get("device") or {}).get("kind")


def doc_results(doc):
    """fastbench results, or bench_torch's cases as results: name = the op,
    params and fields = the case's own keys, failed when it has an error."""
    if not is_python(doc):
        return doc.get("results", [])
    return [{**c, "name": c.get("op"), "params": c, "status": "error" if "error" in c else "ok"}
            for c in doc.get("cases", [])]


def evaluate(doc, targets):
    kind = doc_kind(doc)
    rows = []
    for t in targets:
        # "source": "python-bench": the target reads bench_torch's cases (the
        # comparisons with PyTorch on the same GPU), else fastbench's results
        if (t.get("source") == "python-bench") != is_python(doc):
            rows.append((t, None, "not measured (other source)"))
            continue
        if t.get("device") and t["device"] != kind:
            rows.append((t, None, f"not measured ({kind} run)"))
            continue
        hits = [r for r in doc_results(doc) if matches(r, t["name"], t.get("params", {}))]
        if t.get("needs"):
            # a target this run cannot decide (another machine, or a bound
            # measured by another tool): the figures it has, not judged
            figs = [field(r, t["field"]) for r in hits if r.get("status", "ok") == "ok"]
            figure = ", ".join(f"{v:.4g}" for v in figs if v is not None) or None
            rows.append((t, figure, f"not checked: needs {t['needs']}"))
            continue
        vals = []
        for r in hits:
            v = field(r, t["field"])
            bound = field(r, t["value_field"]) if "value_field" in t else t["value"]
            if v is None or bound is None or r.get("status", "ok") != "ok":
                continue
            ok = v >= bound if t["op"] == ">=" else v <= bound
            vals.append((v, bound, ok))
        if not vals:
            rows.append((t, None, "no matching result"))
            continue
        worst = min(vals, key=lambda x: x[0]) if t["op"] == ">=" else max(vals, key=lambda x: x[0])
        met = all(ok for _, _, ok in vals)
        figure = ", ".join(f"{v:.4g}" for v, _, _ in vals)
        rows.append((t, figure, "met" if met else f"NOT met (worst {worst[0]:.4g} vs {worst[1]:.4g})"))
    return rows


def table(rows, source, runs=None):
    if runs is None:
        out = [f"Source: {source}", "", "| issue | target | figure | status |", "|---|---|---|---|"]
        for t, fig, status in rows:
            out.append(f"| {t['issue']} | {t['what']} | {fig or '-'} | {status} |")
        return "\n".join(out) + "\n"
    out = [f"Latest: {source}. Each row is from the newest filed run that measured it (a run that narrowed its "
           "scenarios leaves the other rows to older runs).", "",
           "| issue | target | figure | status | run |", "|---|---|---|---|---|"]
    for (t, fig, status), run in zip(rows, runs):
        out.append(f"| {t['issue']} | {t['what']} | {fig or '-'} | {status} | {f'`{run}`' if run else '-'} |")
    return "\n".join(out) + "\n"


def unmeasured(status):
    return status == "no matching result" or status.startswith("not measured")


def newest_rows(targets):
    """Per target, the row of the newest filed run (the JSON's date; GPU runs
    and CPU runs under cpu/, each counting only for the targets of its
    device; python-bench.json only for the targets of source python-bench)
    that has a result for it, and that run's folder."""
    docs = []
    for f in (list(RESULTS.glob("*/fastbench.json")) + list(RESULTS.glob("cpu/*/fastbench.json"))
              + list(RESULTS.glob("*/python-bench.json"))):
        try:
            docs.append((json.loads(f.read_text()), str(f.parent.relative_to(RESULTS))))
        except ValueError:
            continue
    docs.sort(key=lambda x: str(x[0].get("date") or ""), reverse=True)
    rows, runs = [], []
    for t in targets:
        row = (t, None, f"not checked: needs {t['needs']}" if t.get("needs") else "no matching result")
        run = None
        for doc, name in docs:
            r = evaluate(doc, [t])[0]
            if not unmeasured(r[2]) and (r[1] is not None or not t.get("needs")):
                row, run = r, name
                break
        rows.append(row)
        runs.append(run)
    return rows, runs


def main(argv):
    targets = json.loads((RESULTS / "targets.json").read_text())["targets"]
    if len(argv) == 3 and argv[1] == "--check":
        doc = json.loads(Path(argv[2]).read_text())
        print(table(evaluate(doc, targets), argv[2]))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(argv[1])
    if not src.is_dir():
        print(f"gpu-results: {src} is not a directory written by scripts/gpu-check.sh", file=sys.stderr)
        return 2
    doc = None
    # fastbench's results name the run; a run of the python phase alone, its python-bench.json
    for bench in (src / "fastbench.json", src / "python-bench.json"):
        try:
            doc = json.loads(bench.read_text()) if bench.exists() else None
        except ValueError as e:  # cut short while being written
            print(f"gpu-results: {bench} is not valid JSON ({e})", file=sys.stderr)
            doc = None
        if doc is not None:
            break
    if doc is None:
        # A run that failed before fastbench (build or tests): file the
        # summary and logs so the failure is on record; the table stays.
        summary = src / "summary.txt"
        text = summary.read_text() if summary.exists() else ""
        m = re.search(r"commit ([0-9a-f]{7,40}|unknown)", text)
        commit = m.group(1) if m else "unknown"
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        dest = RESULTS / f"{stamp}-nobench-{commit[:7]}"
        dest.mkdir(parents=True, exist_ok=True)
        for name in KEEP:
            if (src / name).exists():
                shutil.copy2(src / name, dest / name)
        print(text, end="")
        print(f"no fastbench results in {src}: filed the summary and logs under {dest}; "
              "the targets table is unchanged")
        return 1
    dev_name = doc.get("device") if is_python(doc) else (doc.get("device") or {}).get("name")
    dev = re.sub(r"[^A-Za-z0-9]+", "-", dev_name or "unknown").strip("-").lower()
    dest = RESULTS / f"{str(doc.get('date') or 'undated')[:10]}-{dev}-{str(doc.get('git_commit') or 'unknown')[:7]}"
    dest.mkdir(parents=True, exist_ok=True)
    for name in KEEP:
        if (src / name).exists():
            shutil.copy2(src / name, dest / name)
    partial = "" if doc.get("complete", True) else ", incomplete run: stopped before every scenario finished"
    rows, runs = newest_rows(targets)
    text = table(rows, f"`{dest.relative_to(RESULTS)}/` ({dev_name}, "
                       f"{doc.get('date')}, commit {str(doc.get('git_commit'))[:12]}{partial})", runs)
    readme = RESULTS / "README.md"
    body = readme.read_text()
    start, end = "<!-- TARGETS -->", "<!-- /TARGETS -->"
    if start in body and end in body:
        body = body[:body.index(start) + len(start)] + "\n" + text + body[body.index(end):]
    else:
        body += f"\n{start}\n{text}{end}\n"
    readme.write_text(body)
    print(text)
    print(f"filed under {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
