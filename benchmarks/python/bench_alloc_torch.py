#!/usr/bin/env python3
"""fastpath's caching allocator beside PyTorch's CUDA caching allocator on the
same allocation trace.

    PYTHONPATH=bindings/python FASTPATH_LIB=build/libfastpath.so \\
        python3 benchmarks/python/bench_alloc_torch.py --json alloc.json [--quick]

The trace is fastpath's generated transformer-like training trace
(fastpath.alloc.generate_trace; the same one as fastbench alloc/trace_replay:
--layers 12 --steps 4, --quick 4 and 2): persistent weights, activations
freed LIFO in backward, temporaries freed out of order, gradient buckets
recorded on a communication stream, inputs on a data stream. Three CUDA
streams (torch.cuda.Stream) stand for the trace's streams, and both
allocators see the same ones.

Each allocator replays the trace --passes times (default 2) without emptying
its cache in between: the first pass fills the cache, the last one is the
steady state. Reported per pass:
  torch      torch.empty(n, dtype=torch.uint8, device="cuda") on the op's
             stream / del, tensor.record_stream(stream); peaks from
             torch.cuda.memory_stats() (reserved_bytes / allocated_bytes /
             requested_bytes .all.peak after reset_peak_memory_stats),
             upstream calls = segment.all.allocated / .freed deltas (one
             cudaMalloc / cudaFree each), num_alloc_retries, num_ooms
  fastpath   the C replay (fp_alloc_trace_replay: per-op latency timed in C),
             and the same Python loop as torch's calling the allocator through
             ctypes (Allocator.alloc / free / record_stream), so per-op
             latencies from the same harness exist for both
  direct     cudaMalloc/cudaFree per op (fp_alloc_trace_replay_direct)
Latency: median per alloc and per free (ns). The Python-loop numbers include
the perf_counter_ns pair (reported as timer_overhead_ns) and, for torch,
creating the tensor object: that is what a PyTorch user pays per allocation.

--pluggable adds a fourth path, "torch+fastpath": the same torch loop in a
child process that first installs libfastpath as PyTorch's CUDA allocator
(fastpath.torch_alloc.use_fastpath_allocator: torch.cuda.memory.
CUDAPluggableAllocator over fp_torch_malloc / fp_torch_free; it has to happen
before CUDA is initialised, hence the subprocess). What it measures is what a
PyTorch user pays per torch.empty/del with fastpath underneath, including
PyTorch's own pluggable-allocator bookkeeping. Its peaks and upstream calls
come from fastpath.torch_alloc.stats() (torch.cuda.memory_stats() raises for
pluggable allocators), and its record_stream ops call
fastpath.torch_alloc.record_stream, because Tensor.record_stream is not routed
to pluggable allocators (a no-op there). Reported under "torch_fastpath"
beside "torch" (same trace, same streams layout, same passes).

Writes JSON (schema "fastbench-python-alloc/1") with --json and prints a
table. Exits 0 with a message when torch or CUDA is missing (--allow-cpu runs
fastpath's half on a CPU context: a test of this script, not a benchmark).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench_torch, also when imported
from bench_torch import git_commit  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def timer_overhead_ns():
    pc = time.perf_counter_ns
    xs = []
    for _ in range(2001):
        t0 = pc()
        xs.append(pc() - t0)
    return statistics.median(xs)


def median(xs):
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------

class TorchMemory:
    """Statistics and record_stream of torch's own allocator."""

    def __init__(self, torch):
        self.torch = torch

    def reset_peak(self):
        self.torch.cuda.reset_peak_memory_stats()

    def stats(self):
        return self.torch.cuda.memory_stats()

    def record_stream(self, x, stream):
        x.record_stream(stream)

    def empty_cache(self):
        self.torch.cuda.empty_cache()


class FastpathTorchMemory:
    """The same for torch running on libfastpath (fastpath.torch_alloc): stats
    under torch.cuda.memory_stats()'s key names."""

    def __init__(self, fta, device_index):
        self.fta = fta
        self.device = device_index

    def reset_peak(self):
        self.fta.reset_peak(self.device)

    def stats(self):
        st = self.fta.stats(self.device)
        if st is None:  # nothing allocated on the device yet
            return {}
        return {"allocated_bytes.all.peak": st["allocated_bytes"]["peak"],
                "reserved_bytes.all.peak": st["reserved_bytes"]["peak"],
                "requested_bytes.all.peak": st["requested_bytes"]["peak"],
                "segment.all.allocated": st["upstream_allocs"],
                "segment.all.freed": st["upstream_frees"],
                "segment.all.current": st["segment_count"]["current"],
                "num_alloc_retries": st["retries"], "num_ooms": st["ooms"]}

    def record_stream(self, x, stream):
        self.fta.record_stream(x, stream)  # Tensor.record_stream would be a no-op here

    def empty_cache(self):
        self.fta.empty_cache()


def torch_pass(torch, events, streams, device, mem=None):
    """One replay of events through torch's allocator (torch's own, or
    libfastpath installed as the pluggable allocator: `mem` says whose
    statistics to read)."""
    mem = mem or TorchMemory(torch)
    pc = time.perf_counter_ns
    slots, alat, flat = {}, [], []
    torch.cuda.synchronize()
    mem.reset_peak()
    s0 = mem.stats()
    cur = None
    t_start = time.perf_counter()
    for op, size, stream, slot in events:
        if op == "alloc":
            if stream != cur:
                torch.cuda.set_stream(streams[stream])
                cur = stream
            t0 = pc()
            x = torch.empty(size, dtype=torch.uint8, device=device)
            alat.append(pc() - t0)
            slots[slot] = x
            del x
        elif op == "free":
            x = slots.pop(slot, None)
            if x is None:
                continue
            t0 = pc()
            del x  # the last reference: the block goes back to the cache
            flat.append(pc() - t0)
        else:
            x = slots.get(slot)
            if x is not None:
                mem.record_stream(x, streams[stream])
    total_ms = (time.perf_counter() - t_start) * 1e3
    slots.clear()
    torch.cuda.set_stream(torch.cuda.default_stream())
    torch.cuda.synchronize()
    s1 = mem.stats()

    def delta(k):
        return s1.get(k, 0) - s0.get(k, 0)

    peak_alloc = s1.get("allocated_bytes.all.peak", 0)
    peak_res = s1.get("reserved_bytes.all.peak", 0)
    peak_req = s1.get("requested_bytes.all.peak")
    return {"alloc_median_ns": median(alat), "free_median_ns": median(flat), "total_ms": total_ms,
            "peak_reserved": peak_res, "peak_allocated": peak_alloc, "peak_requested": peak_req,
            "reserved_over_allocated": peak_res / peak_alloc if peak_alloc else None,
            "reserved_over_requested": peak_res / peak_req if peak_req else None,
            "upstream_allocs": delta("segment.all.allocated"),
            "upstream_frees": delta("segment.all.freed"),
            "num_alloc_retries": delta("num_alloc_retries"), "num_ooms": delta("num_ooms"),
            "num_device_alloc": delta("num_device_alloc") if "num_device_alloc" in s1 else None,
            "num_device_free": delta("num_device_free") if "num_device_free" in s1 else None,
            "segments_at_end": s1.get("segment.all.current")}


def run_torch(torch, events, streams, passes, device, mem=None):
    mem = mem or TorchMemory(torch)
    torch.cuda.synchronize()
    mem.empty_cache()
    out = [torch_pass(torch, events, streams, device, mem) for _ in range(passes)]
    mem.empty_cache()
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return {"passes": out, "first": out[0], "steady": out[-1], "alloc_conf": conf,
            "version": torch.__version__}


# ---------------------------------------------------------------------------
# torch with libfastpath as its allocator (child process)
# ---------------------------------------------------------------------------

def pluggable_child(args, layers, steps, out_path):
    """Runs in a fresh process: installs fastpath before anything initialises
    CUDA, then the torch loop; writes its result as JSON to out_path."""
    import fastpath.torch_alloc as fta
    config = {"max_split_size": args.max_split_mib << 20} if args.max_split_mib else {}
    fta.use_fastpath_allocator(config or None)  # must precede every CUDA call
    import torch
    import fastpath.alloc as fa
    dev = torch.device(args.device)
    torch.cuda.set_device(dev)
    trace = fa.generate_trace(layers=layers, steps=steps, seed=args.seed)
    events = trace.events()
    tstreams = [torch.cuda.Stream() for _ in range(max(trace.n_streams, 1))]
    index = dev.index or 0
    res = run_torch(torch, events, tstreams, args.passes, args.device, FastpathTorchMemory(fta, index))
    res["config"] = config
    res["record_stream"] = "fastpath.torch_alloc.record_stream (Tensor.record_stream is a no-op)"
    res["stats_after"] = fta.stats(index)
    trace.close()
    Path(out_path).write_text(json.dumps(res))
    return 0


def run_pluggable(args, layers, steps):
    """The torch loop with fastpath as torch's allocator, in a subprocess."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "pluggable.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--pluggable-child", str(out),
               "--layers", str(layers), "--steps", str(steps), "--seed", str(args.seed),
               "--passes", str(args.passes), "--device", args.device]
        if args.max_split_mib:
            cmd += ["--max-split-mib", str(args.max_split_mib)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0 or not out.exists():
            return {"error": f"child exited {r.returncode}: {(r.stderr or r.stdout)[-2000:]}"}
        return json.loads(out.read_text())


# ---------------------------------------------------------------------------
# fastpath
# ---------------------------------------------------------------------------

def fastpath_python_loop(fa, ctx, events, streams, passes, config):
    """The same loop as torch_pass through Allocator.alloc/free (ctypes)."""
    pc = time.perf_counter_ns
    out = []
    with fa.Allocator(ctx, **config) as a:
        for _ in range(passes):
            a.reset_peak()
            st0 = a.stats()
            slots, alat, flat = {}, [], []
            t_start = time.perf_counter()
            for op, size, stream, slot in events:
                if op == "alloc":
                    s = streams[stream]
                    t0 = pc()
                    p = a.alloc(size, s)
                    alat.append(pc() - t0)
                    slots[slot] = p
                elif op == "free":
                    p = slots.pop(slot, None)
                    if p is None:
                        continue
                    t0 = pc()
                    a.free(p)
                    flat.append(pc() - t0)
                else:
                    p = slots.get(slot)
                    if p is not None:
                        a.record_stream(p, streams[stream])
            total_ms = (time.perf_counter() - t_start) * 1e3
            st1 = a.stats()
            out.append({"alloc_median_ns": median(alat), "free_median_ns": median(flat),
                        "total_ms": total_ms,
                        "upstream_allocs": st1["upstream_allocs"] - st0["upstream_allocs"],
                        "upstream_frees": st1["upstream_frees"] - st0["upstream_frees"],
                        "peak_reserved": st1["reserved_bytes"]["peak"],
                        "peak_allocated": st1["allocated_bytes"]["peak"],
                        "reserved_over_allocated": (st1["reserved_bytes"]["peak"]
                                                    / max(st1["allocated_bytes"]["peak"], 1))})
        if ctx.is_cuda:
            ctx.synchronize()
    return out


def run_fastpath(fa, ctx, trace, events, streams, passes, config):
    rep = fa.replay(ctx, trace, streams=streams if ctx.is_cuda else None, passes=passes,
                    time_ops=True, **config)
    py_streams = streams if ctx.is_cuda else [i + 1 for i in range(max(trace.n_streams, 1))]
    loop = fastpath_python_loop(fa, ctx, events, py_streams, passes, config)

    def short(p):
        return {"alloc_median_ns": p["alloc_latency"]["median_ms"] * 1e6,
                "free_median_ns": p["free_latency"]["median_ms"] * 1e6,
                "total_ms": p["total_ms"], "upstream_allocs": p["upstream_allocs"],
                "upstream_frees": p["upstream_frees"], "peak_reserved": p["peak_reserved"],
                "peak_allocated": p["peak_allocated"], "peak_requested": p["peak_requested"],
                "reserved_over_allocated": p["reserved_over_allocated"],
                "reserved_over_requested": p["reserved_over_requested"],
                "retries": None}

    passes_out = [short(p) for p in rep["passes"]]
    passes_out[-1]["retries"] = rep["stats"]["retries"]
    return {"passes": passes_out, "first": passes_out[0], "steady": passes_out[-1],
            "python_loop": loop[-1], "python_loop_passes": loop, "config": config,
            "stats_after": rep["stats"]}


def run_direct(fa, ctx, trace):
    d = fa.replay_direct(ctx, trace)
    return {"alloc_median_ns": d["alloc_latency"]["median_ms"] * 1e6,
            "free_median_ns": d["free_latency"]["median_ms"] * 1e6, "total_ms": d["total_ms"],
            "upstream_allocs": d["upstream_allocs"], "upstream_frees": d["upstream_frees"],
            "peak_requested": d["peak_requested"]}


# ---------------------------------------------------------------------------

def fmt(v, scale=1.0, nd=0):
    if v is None:
        return "-"
    return f"{v / scale:.{nd}f}"


def print_table(doc):
    MiB = float(1 << 20)
    rows = [("path", "pass", "alloc ns", "free ns", "total ms", "upstream a/f", "peak res MiB",
             "peak alloc MiB", "res/alloc", "res/req")]

    def add(name, label, p):
        rows.append((name, label, fmt(p.get("alloc_median_ns")), fmt(p.get("free_median_ns")),
                     fmt(p.get("total_ms"), nd=2),
                     f"{p.get('upstream_allocs', '-')}/{p.get('upstream_frees', '-')}",
                     fmt(p.get("peak_reserved"), MiB, 1), fmt(p.get("peak_allocated"), MiB, 1),
                     fmt(p.get("reserved_over_allocated"), nd=3),
                     fmt(p.get("reserved_over_requested"), nd=3)))

    fp = doc["fastpath"]
    add("fastpath (C replay)", "first", fp["first"])
    add("fastpath (C replay)", "steady", fp["steady"])
    add("fastpath (py loop)", "steady", fp["python_loop"])
    if doc.get("torch"):
        add("torch", "first", doc["torch"]["first"])
        add("torch", "steady", doc["torch"]["steady"])
    tf = doc.get("torch_fastpath")
    if tf and "steady" in tf:
        add("torch+fastpath", "first", tf["first"])
        add("torch+fastpath", "steady", tf["steady"])
    if doc.get("direct"):
        add("direct " + ("cudaMalloc" if doc["device"].startswith("cuda") else "malloc"), "-",
            doc["direct"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if doc.get("torch"):
        t = doc["torch"]["steady"]
        print(f"torch: num_alloc_retries {t['num_alloc_retries']}, num_ooms {t['num_ooms']}, "
              f"segments at end {t['segments_at_end']}, PYTORCH_CUDA_ALLOC_CONF="
              f"{doc['torch']['alloc_conf'] or '(unset)'}")
    if tf and "error" in tf:
        print(f"torch+fastpath failed: {tf['error']}")
    if doc.get("pluggable_note"):
        print(f"torch+fastpath: {doc['pluggable_note']}")
    print(f"timer overhead (perf_counter_ns pair): {doc['timer_overhead_ns']:.0f} ns")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the small trace (layers 4, steps 2)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--max-split-mib", type=int, help="fastpath max_split_size (default: none)")
    ap.add_argument("--no-direct", action="store_true", help="skip the cudaMalloc/cudaFree baseline")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="without torch/CUDA, run fastpath's half on a CPU context (script test)")
    ap.add_argument("--pluggable", action="store_true",
                    help="also run the torch loop with libfastpath as torch's allocator (subprocess)")
    ap.add_argument("--pluggable-child", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    layers = args.layers or (4 if args.quick else 12)
    steps = args.steps or (2 if args.quick else 4)
    if args.pluggable_child:
        return pluggable_child(args, layers, steps, args.pluggable_child)

    torch = None
    reason = None
    try:
        import torch  # noqa: F811
        if not torch.cuda.is_available():
            reason = "CUDA is not available to torch"
    except ImportError:
        reason = "torch is not installed"
    if reason and not args.allow_cpu:
        print(f"bench_alloc_torch: {reason}: nothing to compare (--allow-cpu runs fastpath's half "
              "on the CPU)", file=sys.stderr)
        return 0
    try:
        import fastpath
        import fastpath.alloc as fa
    except OSError as e:
        print(f"bench_alloc_torch: cannot load libfastpath: {e}", file=sys.stderr)
        return 2
    if not fa.available():
        print("bench_alloc_torch: libfastpath was built without the allocator", file=sys.stderr)
        return 2

    use_cuda = reason is None and fastpath.device_count() > 0
    device = args.device if use_cuda else "cpu"
    ctx = fastpath.Context(device)
    trace = fa.generate_trace(layers=layers, steps=steps, seed=args.seed)
    events = trace.events()
    config = {}
    if args.max_split_mib:
        config["max_split_size"] = args.max_split_mib << 20

    streams = None
    tstreams = None
    if use_cuda:
        torch.cuda.set_device(torch.device(device))
        tstreams = [torch.cuda.Stream() for _ in range(max(trace.n_streams, 1))]
        streams = [s.cuda_stream for s in tstreams]

    doc = {"schema": "fastbench-python-alloc/1", "git_commit": git_commit(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": device, "fastpath_version": fastpath.version(),
           "trace": {"layers": layers, "steps": steps, "seed": args.seed, "ops": len(trace),
                     "streams": trace.n_streams, "allocs": sum(1 for e in events if e[0] == "alloc"),
                     "peak_requested": trace.peak_requested()},
           "passes": args.passes, "timer_overhead_ns": timer_overhead_ns(), "torch": None,
           "torch_fastpath": None, "direct": None}
    if use_cuda:
        doc["device_name"] = torch.cuda.get_device_name(torch.device(device))
        doc["torch"] = run_torch(torch, events, tstreams, args.passes, device)
    child_failed = False
    if args.pluggable:
        import fastpath.torch_alloc as fta
        if not use_cuda:
            doc["pluggable_note"] = f"skipped: {reason or 'no CUDA device'}"
        elif not fta.available():
            doc["pluggable_note"] = "skipped: libfastpath lacks fp_torch_malloc / fp_torch_free"
        else:
            doc["torch_fastpath"] = run_pluggable(args, layers, steps)
            child_failed = "error" in doc["torch_fastpath"]
    doc["fastpath"] = run_fastpath(fa, ctx, trace, events, streams, args.passes, config)
    if not args.no_direct:
        doc["direct"] = run_direct(fa, ctx, trace)
    if reason:
        doc["note"] = f"{reason}: fastpath on the CPU only (--allow-cpu), not a benchmark"

    print(f"trace: {len(trace)} ops ({doc['trace']['allocs']} allocs), layers {layers}, steps {steps}, "
          f"{trace.n_streams} streams, peak requested {trace.peak_requested() / (1 << 20):.1f} MiB; "
          f"device {doc.get('device_name', device)}")
    print_table(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    trace.close()
    ctx.close()
    return 1 if child_failed else 0


if __name__ == "__main__":
    sys.exit(main())
