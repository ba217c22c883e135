#!/usr/bin/env python3
"""fastbench_report.py: the HTML page and charts of one fastbench run.

Usage:
    fastbench_report.py RUN.json --out DIR      (or: fastbench report RUN.json --out DIR)

RUN.json is a fastbench/1 document (`fastbench run ... --json RUN.json`,
`fastbench trace`). DIR is created if missing (its parent must exist) and
receives:

    index.html     device, date, commit, library version, whether the run was
                   complete; the results table (shape, both medians, speedup,
                   verdict, GB/s, TFLOP/s, % of peak, numerical check); the two
                   charts; the verdict table (per traced scenario its overall
                   VERDICT and its groups: bound, compute / memory / launch /
                   transfer / sync shares, remedy, reason; a scenario that was
                   not traced gets one row from its result's "bound"); the
                   skipped scenarios with their reason. No script, no external
                   URL: every string from the JSON is HTML-escaped.
    roofline.png   arithmetic intensity (FLOP/byte) against achieved TFLOP/s,
                   both log, under the bandwidth slope (roofs.copy_gbps, else
                   device.peak_gbps) and the BF16 tensor and FP32 roofs; one
                   point per result with both GB/s and TFLOP/s. Results with
                   GB/s only are bars against the bandwidth roof in a second
                   panel. With no known peaks (CPU runs) only the points and
                   bars are drawn, and the title says so.
    speedup.png    one bar per A/B result on a log axis with a line at 1x,
                   colored by verdict, error bars from the timing spread
                   (baseline p10 / optimized p90 .. baseline p90 / optimized p10).

The optional "roofs" object and "profiles" array (written by `fastbench
trace` and `fastbench run --profile`) are used when present.

Every file is first written under a temporary name in DIR and renamed into
place only once all three exist: a failure leaves no partial file and keeps
an older report. A bad input (missing, not a regular file, empty, not JSON,
not a fastbench/ document, a malformed result or profile, a non-numeric
number) or an unusable DIR is one line on stderr and exit status 2, with
nothing written. Needs only the standard library and matplotlib (Agg).
"""
import argparse
import html
import json
import math
import os
import sys
import tempfile

PROG = "fastbench report"
MPL_MISSING = "matplotlib is not installed: pip install matplotlib (scripts/install-deps.sh installs it)"
STAT_KEYS = ("median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms", "max_ms", "stdev_ms", "noise", "samples")
RESULT_NUMBERS = ("speedup", "max_abs_err", "max_rel_err", "tolerance", "rtol", "achieved_gbps",
                  "achieved_tflops", "pct_of_peak")
DEVICE_NUMBERS = ("peak_gbps", "peak_tflops_fp32", "peak_tflops_bf16")
ROOF_NUMBERS = ("compute_tflops", "fma_tflops", "copy_gbps", "pinned_gbps")
VERDICT_NUMBERS = ("spans", "window_ms", "busy_ms", "launch_gap_ms", "transfer_ms", "sync_ms", "compute_pct",
                   "memory_pct", "launch_pct", "transfer_pct", "transfer_gbps", "transfer_pct_of_peak", "sync_pct")
VERDICT_STRINGS = ("group", "bound", "remedy", "reason")
BOUNDS = ("compute", "memory", "launch", "transfer", "sync", "unknown")
VERDICT_COLORS = {"FASTER": "#2e7d32", "SLOWER": "#c62828", "SAME": "#757575"}


class ReportError(Exception):
    """A fault in the input or the output folder: one line, exit status 2."""


# ---- reading and checking the document ----

def read_document(path):
    """The parsed document at path, or ReportError naming what is wrong."""
    if not os.path.exists(path):
        raise ReportError(f"cannot open {path}: no such file")
    if not os.path.isfile(path):
        raise ReportError(f"{path} is not a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ReportError(f"cannot read {path}: {e.strerror}") from None
    if not data.strip():
        raise ReportError(f"{path} is empty")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise ReportError(f"{path} is not valid JSON (truncated?): {e}") from None


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def number(obj, key, where):
    """obj[key] as a float, None when absent or null; ReportError otherwise."""
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ReportError(f"{where}: {key} is not a number ({json.dumps(v)[:40]})")
    if not math.isfinite(v):
        raise ReportError(f"{where}: {key} is not a finite number ({v})")
    return float(v)


def text(obj, key, where, default=""):
    """obj[key] as a string, default when absent or null; ReportError otherwise."""
    v = obj.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise ReportError(f"{where}: {key} is not a string")
    return v


def obj_or_none(obj, key, where):
    v = obj.get(key)
    if v is not None and not isinstance(v, dict):
        raise ReportError(f"{where}: {key} is not an object")
    return v


def list_or_empty(obj, key, where):
    v = obj.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise ReportError(f"{where}: {key} is not an array")
    return v


def check_stats(stats, where):
    return None if stats is None else {k: number(stats, k, where) for k in STAT_KEYS}


def named(obj, key, where):
    """Checks obj is an object whose obj[key] is a string; the place to name in later messages."""
    if not isinstance(obj, dict):
        raise ReportError(f"{where} is not an object")
    if not isinstance(obj.get(key), str):
        raise ReportError(f"{where}: {key} is not a string")
    return f"{where} ({obj[key]})"


def check_result(r, where):
    """One entry of "results", normalised: numbers are floats or None."""
    where = named(r, "name", where)
    out = {k: number(r, k, where) for k in RESULT_NUMBERS}
    out["name"] = r["name"]
    out["params"] = obj_or_none(r, "params", where) or {}
    out["status"] = text(r, "status", where, "OK")
    for key in ("detail", "verdict", "note", "bound"):
        out[key] = text(r, key, where)
    for side in ("baseline", "optimized"):
        out[side] = check_stats(obj_or_none(r, side, where), f"{where}.{side}")
    passed = r.get("passed")
    if passed is not None and not isinstance(passed, bool):
        raise ReportError(f"{where}: passed is not true, false or null")
    out["passed"] = passed
    return out


def check_verdict(v, where):
    if not isinstance(v, dict):
        raise ReportError(f"{where} is not an object")
    out = {k: number(v, k, where) for k in VERDICT_NUMBERS}
    out.update({k: text(v, k, where) for k in VERDICT_STRINGS})
    return out


def check_profile(p, where):
    where = named(p, "scenario", where)
    overall = p.get("overall")
    groups = list_or_empty(p, "groups", where)
    return {
        "scenario": p["scenario"],
        "spans": number(p, "spans", where),
        "dropped": number(p, "dropped", where),
        "overall": None if overall is None else check_verdict(overall, f"{where}.overall"),
        "groups": [check_verdict(g, f"{where}.groups[{i}]") for i, g in enumerate(groups)],
    }


def check_skipped(s, where):
    if not isinstance(s, dict):
        raise ReportError(f"{where} is not an object")
    return {"name": text(s, "name", where, "?"), "reason": text(s, "reason", where)}


def check_document(doc, path):
    """The document normalised for drawing, or ReportError naming the fault."""
    if not isinstance(doc, dict):
        raise ReportError(f"{path} is not a fastbench JSON report (not an object)")
    schema = doc.get("schema")
    if not isinstance(schema, str) or not schema.startswith("fastbench/"):
        raise ReportError(f"{path} is not a fastbench JSON report (schema {json.dumps(schema)[:40]})")
    if not isinstance(doc.get("results"), list):
        raise ReportError(f"{path}: results is not an array")
    device = obj_or_none(doc, "device", path) or {}
    roofs = obj_or_none(doc, "roofs", path) or {}
    complete = doc.get("complete")
    return {
        "schema": schema,
        "date": text(doc, "date", path, "?"),
        "git_commit": text(doc, "git_commit", path, "?"),
        "library_version": text(doc, "library_version", path, "?"),
        "complete": complete if isinstance(complete, bool) else None,
        "device": dict({k: number(device, k, f"{path}: device") for k in DEVICE_NUMBERS},
                       name=text(device, "name", f"{path}: device", "unknown device"),
                       kind=text(device, "kind", f"{path}: device", "?")),
        "roofs": {k: number(roofs, k, f"{path}: roofs") for k in ROOF_NUMBERS},
        "results": [check_result(r, f"{path}: results[{i}]") for i, r in enumerate(doc["results"])],
        "profiles": [check_profile(p, f"{path}: profiles[{i}]")
                     for i, p in enumerate(list_or_empty(doc, "profiles", path))],
        "skipped": [check_skipped(s, f"{path}: skipped[{i}]")
                    for i, s in enumerate(list_or_empty(doc, "skipped", path))],
    }


def load(path):
    return check_document(read_document(path), path)


# ---- numbers the charts and tables share ----

def positive(v):
    return v is not None and v > 0


def intensity(tflops, gbps):
    """Arithmetic intensity, FLOP/byte, of a TFLOP/s and a GB/s rate."""
    return tflops * 1e12 / (gbps * 1e9)


def roof_values(doc):
    """The bandwidth roof (GB/s) and the compute roofs [(label, TFLOP/s)], 0 / [] when unknown.
    The run's measured roofs win over the device's datasheet peaks."""
    roofs, dev = doc["roofs"], doc["device"]

    def pick(measured, peak):
        return measured if positive(measured) else (peak if positive(peak) else 0.0)

    gbps = pick(roofs["copy_gbps"], dev["peak_gbps"])
    compute = [("BF16 tensor", pick(roofs["compute_tflops"], dev["peak_tflops_bf16"])),
               ("FP32", pick(roofs["fma_tflops"], dev["peak_tflops_fp32"]))]
    return gbps, [(name, v) for name, v in compute if v > 0]


def params_string(params, limit=None):
    s = ",".join(f"{k}={v}" for k, v in params.items())
    return s if limit is None or len(s) <= limit else s[:limit - 1] + "\u2026"


def row_label(r, limit=40):
    shape = params_string(r["params"], limit)
    return f"{r['name']} {shape}" if shape else r["name"]


def roofline_points(results):
    """[(label, FLOP/byte, TFLOP/s)] of the results with both rates > 0."""
    return [(row_label(r, 24), intensity(r["achieved_tflops"], r["achieved_gbps"]), r["achieved_tflops"])
            for r in results if positive(r["achieved_tflops"]) and positive(r["achieved_gbps"])]


def bandwidth_only(results):
    """[(label, GB/s)] of the results with GB/s but no FLOP rate."""
    return [(row_label(r, 24), r["achieved_gbps"])
            for r in results if positive(r["achieved_gbps"]) and not positive(r["achieved_tflops"])]


def speedup_rows(results):
    """[(label, speedup, low, high, verdict)] of the A/B results; low/high None without a spread."""
    rows = []
    for r in results:
        if not positive(r["speedup"]):
            continue
        s, b, o = r["speedup"], r["baseline"] or {}, r["optimized"] or {}
        low = high = None
        if all(positive(x.get(k)) for x, k in ((b, "p10_ms"), (b, "p90_ms"), (o, "p10_ms"), (o, "p90_ms"))):
            low, high = min(b["p10_ms"] / o["p90_ms"], s), max(b["p90_ms"] / o["p10_ms"], s)
        rows.append((row_label(r), s, low, high, r["verdict"]))
    return rows


# ---- charts ----

def plain(label):
    """A label matplotlib draws as it is ('$' would start mathtext)."""
    return label.replace("$", r"\$")


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ReportError(MPL_MISSING) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def draw_roofs(ax, gbps, compute, xlo, xhi):
    """The bandwidth slope up to each compute roof, each labelled with its value."""
    for name, peak in compute:
        if gbps:
            ridge = intensity(peak, gbps)
            xs = [xlo, ridge, xhi] if xlo < ridge < xhi else [xlo, xhi]
            ax.plot(xs, [min(gbps * x / 1e3, peak) for x in xs], color="#1565c0", lw=1.5)
        else:
            ax.plot([xlo, xhi], [peak, peak], color="#1565c0", lw=1.5)
        ax.text(xhi, peak, f"{name} {peak:.4g} TFLOP/s", ha="right", va="bottom", fontsize=8)
    if gbps:
        if not compute:
            ax.plot([xlo, xhi], [gbps * xlo / 1e3, gbps * xhi / 1e3], color="#1565c0", lw=1.5)
        ax.text(xlo, gbps * xlo / 1e3, f"{gbps:.4g} GB/s", ha="left", va="bottom", fontsize=8, rotation=20)


def draw_roofline_panel(ax, points, gbps, compute):
    ridges = [intensity(p, gbps) for _, p in compute] if gbps else []
    xs = [x for _, x, _ in points] + ridges
    xlo, xhi = (min(xs) / 10, max(xs) * 10) if xs else (1e-2, 1e3)
    draw_roofs(ax, gbps, compute, xlo, xhi)
    for label, x, y in points:
        ax.plot([x], [y], "o", color="#e65100")
        ax.annotate(plain(label), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if not points:
        ax.text(0.5, 0.5, "no result has both GB/s and TFLOP/s", transform=ax.transAxes, ha="center")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(xlo, xhi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="both", alpha=0.3)


def draw_bandwidth_panel(ax, bars, gbps):
    labels = [plain(label) for label, _ in bars]
    values = [v for _, v in bars]
    ax.barh(range(len(bars)), values, color="#ef6c00")
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    if gbps:
        ax.axvline(gbps, color="#1565c0", lw=1.5)
        ax.text(gbps, -0.6, f"roof {gbps:.4g} GB/s", ha="right", va="bottom", fontsize=8)
    for i, v in enumerate(values):
        note = f"{v:.4g} GB/s" + (f" ({100 * v / gbps:.0f}%)" if gbps else "")
        ax.text(v, i, " " + note, va="center", fontsize=7)
    ax.set_xlim(0, max(values + [gbps]) * 1.35)
    ax.set_xlabel("achieved GB/s (no FLOPs counted: not on the roofline)")


def draw_roofline(plt, doc, path):
    gbps, compute = roof_values(doc)
    points, bars = roofline_points(doc["results"]), bandwidth_only(doc["results"])
    panels = 2 if bars else 1
    height = 5 + (max(2.5, 0.3 * len(bars) + 1) if bars else 0)
    fig, axes = plt.subplots(panels, 1, figsize=(10, height), squeeze=False,
                             gridspec_kw={"height_ratios": [5] + ([height - 5] if bars else [])})
    title = f"Roofline: {doc['device']['name']}"
    if not gbps and not compute:
        title += " (no device peaks known: points only)"
    axes[0][0].set_title(plain(title))
    draw_roofline_panel(axes[0][0], points, gbps, compute)
    if bars:
        draw_bandwidth_panel(axes[1][0], bars, gbps)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def draw_speedup(plt, doc, path):
    rows = speedup_rows(doc["results"])
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.32 * len(rows) + 1.5)))
    ax.set_title(plain(f"Speedup of optimized over baseline: {doc['device']['name']}"))
    if not rows:
        ax.text(0.5, 0.5, "no A/B results", transform=ax.transAxes, ha="center")
        ax.set_yticks([])
    for i, (label, s, low, high, verdict) in enumerate(rows):
        err = [[s - low], [high - s]] if low is not None else None
        # from the 1x line: right for a speedup, left for a slowdown
        ax.barh(i, s - 1.0, left=1.0, xerr=err, color=VERDICT_COLORS.get(verdict, "#1565c0"), capsize=2)
        ax.text(max(s, high or s), i, f" {s:.2f}x", va="center", fontsize=7)
    ax.set_xscale("log")
    if rows:
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([plain(r[0]) for r in rows], fontsize=7)
        ax.invert_yaxis()
        lo = min(min(r[1], r[2] or r[1]) for r in rows)
        hi = max(max(r[1], r[3] or r[1]) for r in rows)
        ax.set_xlim(min(lo, 1.0) / 1.3, max(hi, 1.0) * 1.6)
    times = plt.FuncFormatter(lambda x, _: f"{x:g}x")
    ax.xaxis.set_major_formatter(times)
    ax.xaxis.set_minor_formatter(times)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("speedup (log; FASTER green, SLOWER red, SAME grey)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


# ---- the HTML page ----

def esc(v):
    return html.escape(str(v), quote=True)


def fmt(v, spec=".3g", suffix=""):
    return "-" if v is None else f"{v:{spec}}{suffix}"


def fmt_ms(ms):
    if ms is None or ms <= 0:
        return "-"
    if ms < 1e-3:
        return f"{ms * 1e6:.1f} ns"
    if ms < 1:
        return f"{ms * 1e3:.2f} us"
    if ms < 1e3:
        return f"{ms:.3f} ms"
    return f"{ms / 1e3:.2f} s"


def failed(r):
    """fastbench writes fp_status_string's "ok" for a row that ran."""
    return r["status"].lower() != "ok"


def check_cell(r):
    if failed(r):
        return "FAILED" + (f": {r['detail']}" if r["detail"] else f" ({r['status']})")
    cell = {True: "ok", False: "MISMATCH", None: "-"}[r["passed"]]
    if r["passed"] is not None and r["max_abs_err"] is not None:
        cell += f" (max err {r['max_abs_err']:.2e})"
    return cell + (f"; {r['note']}" if r["note"] else "")


class Cell(str):
    """A table cell already in HTML (its text escaped by whoever made it)."""


def table(headers, rows):
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(cell if isinstance(cell, Cell) else f"<td>{esc(cell)}</td>"
                                      for cell in row) + "</tr>" for row in rows)
    return f"<table>\n<tr>{head}</tr>\n{body}\n</table>"


def results_table(results):
    rows = []
    for r in results:
        b, o = r["baseline"] or {}, r["optimized"] or {}
        rows.append([r["name"], params_string(r["params"]), fmt_ms(b.get("median_ms")),
                     fmt_ms(o.get("median_ms")), fmt(r["speedup"], ".3f", "x"), r["verdict"] or "-",
                     fmt(r["achieved_gbps"] or None, ".4g"), fmt(r["achieved_tflops"] or None, ".4g"),
                     fmt(r["pct_of_peak"], ".1f", "%"), check_cell(r)])
    return table(["scenario", "shape", "baseline", "optimized", "speedup", "verdict", "GB/s", "TFLOP/s",
                  "% of peak", "check"], rows)


VERDICT_HEADERS = ["scenario", "group", "bound", "compute %", "memory %", "launch %", "transfer % (GB/s)",
                   "sync %", "remedy", "reason"]


def verdict_row(scenario, group, v):
    transfer = fmt(v["transfer_pct"], ".1f")
    if v["transfer_gbps"] is not None:
        of_peak = v["transfer_pct_of_peak"]
        pinned = f", {of_peak:.0f}% of pinned" if of_peak is not None else ""
        transfer += f" ({v['transfer_gbps']:.4g} GB/s{pinned})"
    return [scenario, group, v["bound"] or "unknown", fmt(v["compute_pct"], ".1f"), fmt(v["memory_pct"], ".1f"),
            fmt(v["launch_pct"], ".1f"), transfer, fmt(v["sync_pct"], ".1f"), v["remedy"] or "-",
            v["reason"] or "-"]


def untraced_row(r):
    bound = r["bound"] or ("failed" if failed(r) else "unknown")
    pct = fmt(r["pct_of_peak"], ".1f")
    note = f"launch / transfer / sync: not traced (fastbench trace {r['name']} --out DIR)"
    reason = f"{pct}% of peak in the A/B timing" if r["pct_of_peak"] is not None else "-"
    return [r["name"], params_string(r["params"]) or "-", bound, pct if bound == "compute" else "-",
            pct if bound == "memory" else "-", Cell(f'<td colspan="3">{esc(note)}</td>'), "-", reason]


def verdict_table(doc):
    rows = []
    for p in doc["profiles"]:
        if p["overall"] is not None:
            row = verdict_row(p["scenario"], "overall", p["overall"])
            if positive(p["dropped"]):
                row[-1] += f" ({p['dropped']:.0f} spans dropped: the trace ring overflowed)"
            rows.append(row)
        rows += [verdict_row(p["scenario"], g["group"] or "?", g) for g in p["groups"]]
    traced = {p["scenario"] for p in doc["profiles"]}
    rows += [untraced_row(r) for r in doc["results"] if r["name"] not in traced]
    return table(VERDICT_HEADERS, rows)


def skipped_list(skipped):
    if not skipped:
        return "<p>none</p>"
    items = "\n".join(f"<li>{esc(s['name'])}: {esc(s['reason'])}</li>" for s in skipped)
    return f"<ul>\n{items}\n</ul>"


STYLE = """body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; font-size: 0.85em; margin-bottom: 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #eee; }
img { max-width: 100%; border: 1px solid #ddd; margin-bottom: 1em; }"""


def render_html(doc):
    dev = doc["device"]
    gbps, compute = roof_values(doc)
    peaks = ", ".join([f"{gbps:.4g} GB/s"] * bool(gbps) + [f"{n} {v:.4g} TFLOP/s" for n, v in compute])
    complete = {True: "yes", False: "no (stopped early: partial results)", None: "unknown"}[doc["complete"]]
    facts = [("device", f"{dev['name']} ({dev['kind']})"), ("roofs", peaks or "unknown"), ("date", doc["date"]),
             ("commit", doc["git_commit"]), ("library version", doc["library_version"]),
             ("complete", complete), ("schema", doc["schema"])]
    fact_rows = "\n".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>fastbench report: {esc(dev['name'])}, {esc(doc['date'])}</title>
<style>
{STYLE}
</style>
</head>
<body>
<h1>fastbench report: {esc(dev['name'])}</h1>
<table>
{fact_rows}
</table>
<h2>Results</h2>
{results_table(doc['results'])}
<h2>Roofline</h2>
<img src="roofline.png" alt="roofline">
<h2>Speedups</h2>
<img src="speedup.png" alt="speedup per A/B result">
<h2>Verdict table</h2>
{verdict_table(doc)}
<h2>Skipped scenarios</h2>
{skipped_list(doc['skipped'])}
</body>
</html>
"""


# ---- writing the report ----

def prepare_dir(out):
    """Creates out if missing (not its parents); True when it was created here."""
    if os.path.isdir(out):
        return False
    if os.path.exists(out):
        raise ReportError(f"--out {out} exists and is not a directory")
    try:
        os.mkdir(out)
    except OSError as e:
        raise ReportError(f"cannot create --out {out}: {e.strerror}") from None
    return True


def write_report(out, producers):
    """Runs each producer(tmp_path) into a temporary file in out, then renames
    them all into place; on any failure removes the temporaries (and out when
    it was created here) and keeps what was there before."""
    created = prepare_dir(out)
    umask = os.umask(0)
    os.umask(umask)
    temps = []
    try:
        for name, produce in producers:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out)
            os.close(fd)
            temps.append((tmp, os.path.join(out, name)))
            produce(tmp)
            os.chmod(tmp, 0o666 & ~umask)
        for tmp, final in temps:
            os.replace(tmp, final)
    except BaseException as e:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.remove(tmp)
        if created:
            try:
                os.rmdir(out)
            except OSError:
                pass
        if isinstance(e, OSError):
            raise ReportError(f"cannot write the report in {out}: {e.strerror or e}") from None
        raise


def write_text(content):
    def produce(path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    return produce


def make_report(run_json, out):
    doc = load(run_json)
    plt = import_pyplot()
    write_report(out, [("roofline.png", lambda p: draw_roofline(plt, doc, p)),
                       ("speedup.png", lambda p: draw_speedup(plt, doc, p)),
                       ("index.html", write_text(render_html(doc)))])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fastbench_report.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_json", metavar="RUN.json")
    parser.add_argument("--out", required=True, metavar="DIR")
    args = parser.parse_args(argv)
    try:
        make_report(args.run_json, args.out)
    except ReportError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    print(f"{PROG}: wrote {os.path.join(args.out, 'index.html')}, roofline.png, speedup.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
