"""Checks the CTA timelines `fastbench trace attention/prefill_anatomy --out DIR`
writes (DIR/cta-NN-<kernel>.json, fp_attn_cta_export_chrome): each file a
Chrome trace with its process named after the kernel that ran, a track per
SM, every record an event ("cta N", v9's "item N") with its phases inside it
on its track. Usage: check_cta_trace.py DIR KERNEL... (the files' kernels in
order, e.g. flash_v10 flash_v9: one file each)."""
import json
import sys
from pathlib import Path


def check(path, kernel):
    doc = json.loads(path.read_text())
    evs = doc["traceEvents"]
    procs = [e["args"]["name"] for e in evs if e["name"] == "process_name"]
    assert len(procs) == 1 and f": {kernel} x" in procs[0], (path, procs)
    tracks = {e["tid"]: e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert tracks and all(n.startswith("SM ") for n in tracks.values()), (path, tracks)
    xs = [e for e in evs if e["ph"] == "X"]
    word = "item" if kernel == "flash_v9" else "cta"
    records = [e for e in xs if e["name"].split(" ")[0] in ("cta", "item")]
    assert records and all(e["name"].startswith(word + " ") for e in records), (path, word)
    assert len({e["name"] for e in records}) == len(records), f"{path}: a record twice"
    for e in xs:
        assert e["ts"] >= 0 and e["dur"] >= 0 and e["tid"] in tracks, (path, e)
    for e in xs:
        if e in records:
            continue
        assert e["name"] in ("first tile", "loop", "store", "merge", "arrive", "epilogue"), (path, e)
        assert any(r["tid"] == e["tid"] and r["ts"] - 1e-6 <= e["ts"] and
                   e["ts"] + e["dur"] <= r["ts"] + r["dur"] + 1e-6 for r in records), (path, e)
    assert any(e["name"] == "loop" and e["args"]["tiles"] > 0 for e in xs), f"{path}: no loop with tiles"
    return len(records)


def main():
    out, kernels = Path(sys.argv[1]), sys.argv[2:]
    files = sorted(out.glob("cta-*.json"))
    assert len(files) == len(kernels), (files, kernels)
    for f, k in zip(files, kernels):
        print(f"{f.name}: {check(f, k)} records of {k}")


if __name__ == "__main__":
    main()
