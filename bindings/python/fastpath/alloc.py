"""The caching allocator (include/fastpath/alloc.h) from Python: an
allocator on a context, its statistics (totals and per pool class) and JSON
snapshot, and the allocation-trace tools: generate a transformer-like trace,
look at it as a list of events, replay it through the caching allocator or
straight through the upstream (cudaMalloc/cudaFree or malloc/free).

    import fastpath, fastpath.alloc as fa
    ctx = fastpath.Context("cpu")                 # or "cuda:0"
    trace = fa.generate_trace(layers=4, steps=2)
    trace.events()[:3]        # [("alloc", 25165824, 0, 0), ("alloc", ...), ...]
    report = fa.replay(ctx, trace)                # two passes: cold, then steady
    report["steady"]["upstream_allocs"], report["steady"]["reserved_over_allocated"]

Events are (op, size, stream, id): op is "alloc", "free" or "record_stream";
size is the requested bytes of an "alloc" (0 otherwise); stream is the trace's
stream index (0 for "free"); id names the allocation (ids are reused once
freed, like the C trace's slots).

Pointers are ints; streams are ints (cudaStream_t values, e.g. a
torch.cuda.Stream's .cuda_stream) or None (the context's own stream).
"""
import ctypes
import json

from . import _lib
from ._lib import lib

__all__ = ["available", "Allocator", "Trace", "generate_trace", "replay", "replay_direct",
           "OPS", "POOL_CLASSES"]

c_int, c_size_t, c_double, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_double, ctypes.c_void_p
u8, u16, u32, u64, i64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64
P = ctypes.POINTER

OPS = ("alloc", "free", "record_stream")         # fp_alloc_trace_kind 0, 1, 2
POOL_CLASSES = ("large", "small")                # fp_alloc_pool_class 0, 1
STAT_FIELDS = ("allocated_bytes", "requested_bytes", "reserved_bytes", "active_bytes",
               "inactive_split_bytes", "allocation_count", "segment_count", "active_count",
               "inactive_split_count")
POW2_INTERVALS = 64


class Config(ctypes.Structure):
    """fp_alloc_config, field for field."""
    _fields_ = [("struct_size", c_size_t), ("max_split_size", c_size_t),
                ("max_non_split_rounding", c_size_t),
                ("roundup_power2_divisions", u32 * POW2_INTERVALS),
                ("memory_cap_bytes", c_size_t), ("memory_fraction", c_double),
                ("garbage_collection_threshold", c_double), ("event_ring_size", c_size_t)]


class Stat(ctypes.Structure):
    """fp_alloc_stat."""
    _fields_ = [("current", i64), ("peak", i64), ("total", u64), ("freed", u64)]


class PoolStats(ctypes.Structure):
    """fp_alloc_pool_stats."""
    _fields_ = [(f, Stat) for f in STAT_FIELDS] + [
        ("upstream_allocs", u64), ("upstream_frees", u64), ("cache_hits", u64), ("cache_misses", u64)]


COUNTERS = ("upstream_allocs", "upstream_frees", "upstream_failures", "cache_hits", "cache_misses",
            "retries", "ooms", "oversize_allocations", "gc_releases", "pending_event_blocks")


class Stats(ctypes.Structure):
    """fp_alloc_stats (with pools[] appended)."""
    _fields_ = ([("struct_size", c_size_t)] + [(f, Stat) for f in STAT_FIELDS]
                + [(c, u64) for c in COUNTERS] + [("pools", PoolStats * 2)])


class Upstream(ctypes.Structure):
    """fp_alloc_upstream: four pointers (alloc, free, total_bytes, opaque)."""
    _fields_ = [("alloc", c_void_p), ("free", c_void_p), ("total_bytes", c_void_p), ("opaque", c_void_p)]


class TraceOp(ctypes.Structure):
    """fp_alloc_trace_op."""
    _fields_ = [("kind", u8), ("stream", u8), ("reserved", u16), ("slot", u32), ("size", u64)]


class TraceStruct(ctypes.Structure):
    """fp_alloc_trace."""
    _fields_ = [("ops", P(TraceOp)), ("n_ops", c_size_t), ("n_slots", u32), ("n_streams", u32)]


class TraceConfig(ctypes.Structure):
    """fp_alloc_trace_config."""
    _fields_ = [("struct_size", c_size_t), ("layers", c_int), ("steps", c_int), ("streams", c_int),
                ("batch", c_int), ("hidden", c_int), ("heads", c_int), ("max_seq", c_int),
                ("random_free_fraction", c_double), ("seed", u64)]


class ReplayResult(ctypes.Structure):
    """fp_alloc_replay_result."""
    _fields_ = [("struct_size", c_size_t), ("alloc_latency", _lib.Stats), ("free_latency", _lib.Stats),
                ("total_ms", c_double), ("upstream_allocs", u64), ("upstream_frees", u64),
                ("peak_requested", c_size_t), ("peak_allocated", c_size_t), ("peak_reserved", c_size_t)]


def _declare():
    sig = _lib._sig_opt
    sig("fp_alloc_config_default", None, P(Config))
    sig("fp_alloc_config_set_divisions", c_int, P(Config), c_size_t, c_size_t, u32)
    sig("fp_alloc_create_for_context", c_int, c_void_p, P(Config), P(c_void_p))
    sig("fp_alloc_destroy", None, c_void_p)
    sig("fp_alloc_alloc", c_int, c_void_p, c_size_t, c_void_p, P(c_void_p))
    sig("fp_alloc_free", c_int, c_void_p, c_void_p)
    sig("fp_alloc_record_stream", c_int, c_void_p, c_void_p, c_void_p)
    sig("fp_alloc_usable_size", c_int, c_void_p, c_void_p, P(c_size_t))
    sig("fp_alloc_round_size", c_int, c_void_p, c_size_t, P(c_size_t))
    sig("fp_alloc_empty_cache", c_int, c_void_p)
    sig("fp_alloc_trim", c_int, c_void_p, c_size_t)
    sig("fp_alloc_synchronize_events", c_int, c_void_p)
    sig("fp_alloc_get_stats", c_int, c_void_p, P(Stats))
    sig("fp_alloc_reset_peak", c_int, c_void_p)
    sig("fp_alloc_snapshot_json", c_int, c_void_p, P(c_void_p))
    sig("fp_alloc_json_free", None, c_void_p)
    sig("fp_alloc_upstream_host", Upstream)
    sig("fp_alloc_upstream_device", c_int, c_int, P(Upstream))
    sig("fp_alloc_trace_config_default", None, P(TraceConfig))
    sig("fp_alloc_trace_generate", c_int, P(TraceConfig), P(P(TraceStruct)))
    sig("fp_alloc_trace_destroy", None, P(TraceStruct))
    sig("fp_alloc_trace_replay", c_int, c_void_p, P(TraceStruct), P(c_void_p), c_int, P(ReplayResult))
    sig("fp_alloc_trace_replay_direct", c_int, P(Upstream), P(TraceStruct), c_int, P(ReplayResult))
    sig("fp_context_device_index", c_int, c_void_p)


_declare()


def available():
    """True when libfastpath was built with the allocator (and its per-pool stats)."""
    return _lib.has("fp_alloc_create_for_context") and _lib.has("fp_alloc_upstream_region")


def _need():
    if not available():
        raise RuntimeError("libfastpath was built without the caching allocator (alloc module)")


def _check(status):
    from . import check  # late: fastpath/__init__ imports this module
    check(status)


def _stat_dict(s):
    return {"current": s.current, "peak": s.peak, "total": s.total, "freed": s.freed}


def _stats_dict(st):
    d = {f: _stat_dict(getattr(st, f)) for f in STAT_FIELDS}
    d.update({c: getattr(st, c) for c in COUNTERS})
    d["pools"] = {}
    for i, name in enumerate(POOL_CLASSES):
        p = st.pools[i]
        pd = {f: _stat_dict(getattr(p, f)) for f in STAT_FIELDS}
        pd.update({c: getattr(p, c) for c in ("upstream_allocs", "upstream_frees", "cache_hits",
                                               "cache_misses")})
        d["pools"][name] = pd
    return d


def _latency_dict(s):
    return {f: getattr(s, f) for f, _ in _lib.Stats._fields_}


def make_config(max_split_size=None, max_non_split_rounding=None, divisions=None, memory_cap_bytes=0,
                memory_fraction=0.0, garbage_collection_threshold=0.0, event_ring_size=0):
    """An fp_alloc_config from keyword arguments (None: the C default).
    divisions: a list of (lo_bytes, hi_bytes, divisions) for
    fp_alloc_config_set_divisions (roundup_power2_divisions per size interval)."""
    _need()
    cfg = _lib.init_struct(Config, "fp_alloc_config_default")
    if max_split_size is not None:
        _lib.set_ints(cfg, max_split_size=max_split_size)
    if max_non_split_rounding is not None:
        _lib.set_ints(cfg, max_non_split_rounding=max_non_split_rounding)
    for lo, hi, d in divisions or ():
        _check(lib.fp_alloc_config_set_divisions(ctypes.byref(cfg), _size(lo, "lo_bytes"), _size(hi, "hi_bytes"),
                                                 _lib.c_int_value(ctypes.c_uint32, d, "divisions")))
    _lib.set_ints(cfg, memory_cap_bytes=memory_cap_bytes, event_ring_size=event_ring_size)
    cfg.memory_fraction = float(memory_fraction)
    cfg.garbage_collection_threshold = float(garbage_collection_threshold)
    return cfg


def _size(value, name):
    """A size_t argument, range-checked (a negative size is not SIZE_MAX)."""
    return _lib.c_int_value(c_size_t, value, name)


class Allocator(_lib.Closeable):
    """A caching allocator for a context (fp_alloc_create_for_context): device
    memory and CUDA events on a CUDA context, host memory on a CPU context.
    Keyword arguments as make_config. Pointers it returns are ints; every
    pointer still live when it is closed becomes invalid."""

    def __init__(self, ctx, **config):
        _need()
        self._ctx = ctx  # keep the context alive while the allocator is
        cfg = make_config(**config)
        self._h = c_void_p()
        _check(lib.fp_alloc_create_for_context(ctx.handle, ctypes.byref(cfg), ctypes.byref(self._h)))

    @property
    def handle(self):
        if not self._h:
            raise ValueError("allocator is closed")
        return self._h

    def _stream(self, stream):
        return stream if stream is not None else lib.fp_context_stream(self._ctx.handle)

    def alloc(self, size, stream=None):
        """A block of `size` bytes for use on `stream` (None: the context's
        stream); returns its address (0 for size 0)."""
        p = c_void_p()
        _check(lib.fp_alloc_alloc(self.handle, _size(size, "size"), self._stream(stream), ctypes.byref(p)))
        return p.value or 0

    def free(self, ptr):
        _check(lib.fp_alloc_free(self.handle, ptr or None))

    def record_stream(self, ptr, stream):
        _check(lib.fp_alloc_record_stream(self.handle, ptr, self._stream(stream)))

    def usable_size(self, ptr):
        n = c_size_t()
        _check(lib.fp_alloc_usable_size(self.handle, ptr, ctypes.byref(n)))
        return n.value

    def round_size(self, size):
        n = c_size_t()
        _check(lib.fp_alloc_round_size(self.handle, _size(size, "size"), ctypes.byref(n)))
        return n.value

    def empty_cache(self):
        _check(lib.fp_alloc_empty_cache(self.handle))

    def trim(self, target_reserved):
        _check(lib.fp_alloc_trim(self.handle, _size(target_reserved, "target_reserved")))

    def synchronize_events(self):
        _check(lib.fp_alloc_synchronize_events(self.handle))

    def reset_peak(self):
        _check(lib.fp_alloc_reset_peak(self.handle))

    def stats(self):
        """fp_alloc_get_stats as a dict: the nine current/peak/total/freed
        statistics, the counters, and "pools": {"large": {...}, "small": {...}}."""
        st = Stats()
        st.struct_size = ctypes.sizeof(Stats)
        _check(lib.fp_alloc_get_stats(self.handle, ctypes.byref(st)))
        return _stats_dict(st)

    def snapshot(self):
        """fp_alloc_snapshot_json, parsed."""
        p = c_void_p()
        _check(lib.fp_alloc_snapshot_json(self.handle, ctypes.byref(p)))
        try:
            return json.loads(ctypes.string_at(p.value).decode())
        finally:
            lib.fp_alloc_json_free(p)

    def close(self):
        if self._h:
            lib.fp_alloc_destroy(self._h)
            self._h = c_void_p()


class Trace(_lib.Closeable):
    """An allocation trace (fp_alloc_trace). Build one with generate_trace."""

    def __init__(self, ptr):
        self._p = ptr

    @property
    def _t(self):
        if not self._p:
            raise ValueError("trace is closed")
        return self._p.contents

    def __len__(self):
        return self._t.n_ops

    @property
    def n_slots(self):
        return self._t.n_slots

    @property
    def n_streams(self):
        return self._t.n_streams

    def events(self):
        """The ops as a list of (op, size, stream, id) tuples, in order."""
        t = self._t
        ops = ctypes.cast(t.ops, P(TraceOp * t.n_ops)).contents if t.n_ops else []
        return [(OPS[o.kind], int(o.size), int(o.stream), int(o.slot)) for o in ops]

    def peak_requested(self):
        """Peak of live requested bytes over the trace (what the replays
        report as peak_requested), computed here from the events."""
        live, peak, sizes = 0, 0, {}
        for op, size, _, slot in self.events():
            if op == "alloc":
                sizes[slot] = size
                live += size
                peak = max(peak, live)
            elif op == "free" and slot in sizes:
                live -= sizes.pop(slot)
        return peak

    def close(self):
        if self._p:
            lib.fp_alloc_trace_destroy(self._p)
            self._p = None


def generate_trace(layers=None, steps=None, streams=None, batch=None, hidden=None, heads=None,
                   max_seq=None, random_free_fraction=None, seed=None):
    """fp_alloc_trace_generate: a transformer-training-like trace (None: the C
    default for that field). fastbench's alloc/trace_replay uses layers=12,
    steps=4 (--quick: layers=4, steps=2) and the other defaults."""
    _need()
    cfg = _lib.init_struct(TraceConfig, "fp_alloc_trace_config_default")
    for name, v in (("layers", layers), ("steps", steps), ("streams", streams), ("batch", batch),
                    ("hidden", hidden), ("heads", heads), ("max_seq", max_seq), ("seed", seed)):
        if v is not None:
            _lib.set_ints(cfg, **{name: v})
    if random_free_fraction is not None:
        cfg.random_free_fraction = float(random_free_fraction)
    p = P(TraceStruct)()
    _check(lib.fp_alloc_trace_generate(ctypes.byref(cfg), ctypes.byref(p)))
    return Trace(p)


def _result_dict(r):
    return {"alloc_latency": _latency_dict(r.alloc_latency), "free_latency": _latency_dict(r.free_latency),
            "total_ms": r.total_ms, "upstream_allocs": r.upstream_allocs,
            "upstream_frees": r.upstream_frees, "peak_requested": r.peak_requested,
            "peak_allocated": r.peak_allocated, "peak_reserved": r.peak_reserved,
            "reserved_over_allocated": r.peak_reserved / r.peak_allocated if r.peak_allocated else None,
            "reserved_over_requested": r.peak_reserved / r.peak_requested if r.peak_requested else None}


def _streams_array(ctx, trace, streams):
    """The stream table of a replay: None on a CPU context (the C side uses
    distinct fake handles), the given list, or the context's stream for every
    trace stream on a CUDA context."""
    n = max(trace.n_streams, 1)
    if streams is None:
        if not ctx.is_cuda:
            return None
        streams = [lib.fp_context_stream(ctx.handle)] * n
    if len(streams) < trace.n_streams:
        raise ValueError(f"the trace uses {trace.n_streams} streams, {len(streams)} given")
    return (c_void_p * len(streams))(*[s or None for s in streams])


def replay(ctx, trace, streams=None, passes=2, time_ops=True, allocator=None, **config):
    """Replays trace through a caching allocator on ctx (a new one with
    **config, or `allocator`), `passes` times in a row keeping the cache: the
    first pass fills it, later ones show the steady state. streams: one
    cudaStream_t (int) per trace stream on a CUDA context (None: the
    context's stream for all). Returns {"passes": [...], "first": ...,
    "steady": ..., "stats": allocator stats after the last pass, "ops": n,
    "device": ctx.device}; each pass has per-op latency statistics (ms),
    upstream calls, and peak requested / allocated / reserved bytes."""
    _need()
    if passes < 1:
        raise ValueError("passes must be >= 1")
    own = allocator is None
    a = Allocator(ctx, **config) if own else allocator
    try:
        arr = _streams_array(ctx, trace, streams)
        out = []
        for _ in range(passes):
            r = ReplayResult()
            r.struct_size = ctypes.sizeof(ReplayResult)
            _check(lib.fp_alloc_trace_replay(a.handle, trace._p, arr, int(bool(time_ops)),
                                             ctypes.byref(r)))
            out.append(_result_dict(r))
        if ctx.is_cuda:
            ctx.synchronize()
        return {"passes": out, "first": out[0], "steady": out[-1], "stats": a.stats(),
                "ops": len(trace), "device": ctx.device}
    finally:
        if own:
            a.close()


def replay_direct(ctx, trace, time_ops=True):
    """The baseline: trace straight through the context's upstream
    (cudaMalloc/cudaFree on a CUDA context, malloc/free on a CPU one)."""
    _need()
    if ctx.is_cuda:
        up = Upstream()
        _check(lib.fp_alloc_upstream_device(lib.fp_context_device_index(ctx.handle), ctypes.byref(up)))
    else:
        up = lib.fp_alloc_upstream_host()
    r = ReplayResult()
    r.struct_size = ctypes.sizeof(ReplayResult)
    _check(lib.fp_alloc_trace_replay_direct(ctypes.byref(up), trace._p, int(bool(time_ops)),
                                            ctypes.byref(r)))
    d = _result_dict(r)
    d["ops"] = len(trace)
    d["device"] = ctx.device
    return d
