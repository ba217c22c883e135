"""CUDA graphs and the shape-bucketed graph cache (include/fastpath/graph.h).

    import fastpath, fastpath.graph as fg
    ctx = fastpath.Context("cuda:0")                  # or "cpu"
    with fg.Graph(ctx, lambda stream: my_step(stream)) as g:   # captured once
        for _ in range(100):
            g.replay()                                # the whole step: one launch

    cache = fg.GraphCache(ctx, lambda stream, size: my_step(stream, size))
    size, how = cache.run(5)      # (8, "captured"): 5 rounded up to its bucket
    size, how = cache.run(7)      # (8, "replayed")
    cache.stats()["replays"], cache.histogram()       # {5: 1, 7: 1}

A callable enqueues its work on the stream it is given: an int (a
cudaStream_t; on a CPU context the context's stream handle) or None, which
the library ops take as their `stream` argument. It must not synchronize or
read device results while it is captured (graph.h, "What a callback may
do"). On a CPU context a graph records the callable and a replay calls it,
so code written once runs, and is tested, on both.

An exception raised by a callable is re-raised as the cause of a
FastpathError (status INTERNAL); bad arguments raise FastpathError with the
library's message (status INVALID_ARGUMENT, NOT_FOUND, IO, ...).
"""
import ctypes
import os

import fastpath as _pkg  # the package: it imports this module after defining what is used here
from . import _lib
from ._lib import lib

__all__ = ["available", "Pool", "Graph", "GraphCache", "default_buckets", "buckets_choose",
           "torch_stream_handle", "CAPTURE_MODES", "RUN_KINDS", "MAX_BUCKETS"]

c_int, c_size_t, c_double, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_double, ctypes.c_void_p
i64, u64 = ctypes.c_int64, ctypes.c_uint64
P = ctypes.POINTER

CAPTURE_MODES = {"thread_local": 0, "global": 1, "relaxed": 2}     # fp_graph_capture_mode
RUN_KINDS = ("replayed", "captured", "eager", "capture_failed")    # fp_graph_run 0..3
UPDATES = {1: "in_place", 2: "reinstantiated"}                     # fp_graph_update
MAX_BUCKETS = 1024                                                 # FP_GRAPH_MAX_BUCKETS

# fp_graph_step_fn: fp_status (*)(void *user, fp_stream stream, int64_t size)
STEP_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, i64)


class Config(ctypes.Structure):
    """fp_graph_config, field for field."""
    _fields_ = [("struct_size", c_size_t), ("capture_mode", c_int), ("warmup", c_int), ("pool", c_void_p)]


class Info(ctypes.Structure):
    """fp_graph_info."""
    _fields_ = [("struct_size", c_size_t), ("cpu", c_int), ("nodes", c_size_t), ("kernel_nodes", c_size_t),
                ("capture_ms", c_double), ("instantiate_ms", c_double), ("replays", u64),
                ("updates_in_place", u64), ("reinstantiations", u64)]


class BucketCost(ctypes.Structure):
    """fp_graph_bucket_cost."""
    _fields_ = [("struct_size", c_size_t), ("row_cost", c_double), ("graph_cost", c_double),
                ("graph_row_cost", c_double), ("max_buckets", c_size_t)]


class CacheConfig(ctypes.Structure):
    """fp_graph_cache_config."""
    _fields_ = [("struct_size", c_size_t), ("buckets", P(i64)), ("n_buckets", c_size_t), ("max_size", i64),
                ("lazy", c_int), ("capture_mode", c_int), ("warmup", c_int), ("pool", c_void_p)]


CACHE_COUNTERS = ("runs", "replays", "captures", "eager_above", "eager_uncapturable", "capture_failures",
                  "padded_rows", "rows")


class CacheStats(ctypes.Structure):
    """fp_graph_cache_stats."""
    _fields_ = ([("struct_size", c_size_t)] + [(f, u64) for f in CACHE_COUNTERS]
                + [("graphs", c_size_t), ("pool_bytes", c_size_t), ("capture_ms_total", c_double),
                   ("lookup_ns", c_double)])


def _declare():
    sig = _lib._sig_opt
    sig("fp_graph_pool_create", c_int, c_void_p, P(c_void_p))
    sig("fp_graph_pool_destroy", c_int, c_void_p)
    sig("fp_graph_pool_alloc", c_int, c_void_p, c_size_t, P(c_void_p))
    sig("fp_graph_pool_free", c_int, c_void_p, c_void_p)
    sig("fp_graph_pool_reserved", c_int, c_void_p, P(c_size_t))
    sig("fp_graph_config_default_sized", c_int, P(Config), c_size_t)
    sig("fp_graph_capture", c_int, c_void_p, c_void_p, _lib.TIMED_FN, c_void_p, P(Config), P(c_void_p))
    sig("fp_graph_replay", c_int, c_void_p, c_void_p)
    sig("fp_graph_recapture", c_int, c_void_p, c_void_p, _lib.TIMED_FN, c_void_p, P(c_int))
    sig("fp_graph_destroy", c_int, c_void_p)
    sig("fp_graph_info_init_sized", c_int, P(Info), c_size_t)
    sig("fp_graph_get_info", c_int, c_void_p, P(Info))
    sig("fp_graph_default_buckets", c_int, i64, P(i64), c_size_t, P(c_size_t))
    sig("fp_graph_bucket_cost_default_sized", c_int, P(BucketCost), c_size_t)
    sig("fp_graph_buckets_choose", c_int, P(i64), P(u64), c_size_t, P(BucketCost), P(i64), c_size_t,
        P(c_size_t), P(c_double))
    sig("fp_graph_cache_config_default_sized", c_int, P(CacheConfig), c_size_t)
    sig("fp_graph_cache_create", c_int, c_void_p, STEP_FN, c_void_p, P(CacheConfig), P(c_void_p))
    sig("fp_graph_cache_destroy", None, c_void_p)
    sig("fp_graph_cache_bucket", c_int, c_void_p, i64, P(i64))
    sig("fp_graph_cache_run", c_int, c_void_p, c_void_p, i64, P(i64), P(c_int))
    sig("fp_graph_cache_capture", c_int, c_void_p, c_int)
    sig("fp_graph_cache_set_buckets", c_int, c_void_p, P(i64), c_size_t)
    sig("fp_graph_cache_buckets", c_int, c_void_p, P(i64), c_size_t, P(c_size_t))
    sig("fp_graph_cache_rebucket", c_int, c_void_p, P(BucketCost))
    sig("fp_graph_cache_stats_init_sized", c_int, P(CacheStats), c_size_t)
    sig("fp_graph_cache_get_stats", c_int, c_void_p, P(CacheStats))
    sig("fp_graph_cache_capture_error", ctypes.c_char_p, c_void_p)
    sig("fp_graph_cache_histogram", c_int, c_void_p, P(i64), P(u64), c_size_t, P(c_size_t))
    sig("fp_graph_cache_save_histogram", c_int, c_void_p, ctypes.c_char_p)
    sig("fp_graph_cache_load_histogram", c_int, c_void_p, ctypes.c_char_p)


_declare()
_AVAILABLE = _lib.has("fp_graph_capture")  # the loaded library never changes


def available():
    """True when libfastpath was built with the graph capability."""
    return _AVAILABLE


def _need():
    if not _AVAILABLE:
        raise RuntimeError("libfastpath was built without the graph capability "
                           "(FASTPATH_MODULES must include 'graph')")


def _init(cls, fn_name):
    """A cls filled by the library's *_sized default / init function (which
    rejects a struct_size it does not know: the mirror is out of sync)."""
    s = cls()
    _pkg.check(getattr(lib, fn_name)(ctypes.byref(s), ctypes.sizeof(s)))
    return s


def _path(path):
    return os.fsencode(os.fspath(path))


def _capture_mode(mode):
    if isinstance(mode, int):
        return mode  # passed through: the library rejects unknown values
    try:
        return CAPTURE_MODES[mode]
    except KeyError:
        raise ValueError(f"capture_mode must be one of {sorted(CAPTURE_MODES)}, got {mode!r}") from None


def _stream(stream):
    """None (the context's stream) or an int handle (a torch.cuda.Stream is
    accepted too: its .cuda_stream)."""
    if stream is None:
        return None
    return _lib.c_int_value(c_void_p, torch_stream_handle(stream), "stream") or None


def _i64_array(values, what):
    vals = [_lib.c_int_value(i64, v, what) for v in values]
    return (i64 * max(len(vals), 1))(*vals), len(vals)


def _cost(row_cost, graph_cost, graph_row_cost, max_buckets):
    c = _init(BucketCost, "fp_graph_bucket_cost_default_sized")
    c.row_cost, c.graph_cost, c.graph_row_cost = float(row_cost), float(graph_cost), float(graph_row_cost)
    _lib.set_ints(c, max_buckets=max_buckets)
    return c


def torch_stream_handle(stream):
    """The int handle of a torch.cuda.Stream (its .cuda_stream), e.g.
    torch_stream_handle(torch.cuda.current_stream()); an int is returned as
    is. Replay a graph on the stream torch enqueues on, so that it is
    ordered with torch's own work."""
    handle = getattr(stream, "cuda_stream", stream)
    if not isinstance(handle, int):
        raise TypeError(f"stream must be an int handle or a torch.cuda.Stream, got {type(stream).__name__}")
    return handle


def default_buckets(max_size):
    """vLLM's capture sizes up to max_size: [1, 2, 4, 8, 16, 24, ...]."""
    _need()
    max_size = _lib.c_int_value(i64, max_size, "max_size")
    return _fill_list(lambda out, cap, n: lib.fp_graph_default_buckets(max_size, out, cap, n))


def _fill_list(call, first=MAX_BUCKETS):
    """The list a C function writes as (out, capacity, *n = full count):
    called again with room for all of it when the first buffer was short."""
    n = c_size_t(0)
    out = (i64 * first)()
    lib.fp_clear_error()
    _pkg.check(call(out, first, ctypes.byref(n)))
    if n.value > first:
        out = (i64 * n.value)()
        _pkg.check(call(out, n.value, ctypes.byref(n)))
    return list(out[:n.value])


def buckets_choose(sizes, counts, row_cost=1.0, graph_cost=0.25, graph_row_cost=0.0, max_buckets=0):
    """The bucket list minimising padding work plus graphs held for the
    histogram (sizes[i] seen counts[i] times): (buckets, objective). See
    fp_graph_bucket_cost for the cost model."""
    _need()
    sizes, counts = list(sizes), list(counts)
    if len(sizes) != len(counts):
        raise ValueError(f"sizes and counts differ in length ({len(sizes)} != {len(counts)})")
    s_arr, n = _i64_array(sizes, "size")
    c_arr = (u64 * max(n, 1))(*[_lib.c_int_value(u64, c, "count") for c in counts])
    cost = _cost(row_cost, graph_cost, graph_row_cost, max_buckets)
    out = (i64 * max(n, 1))()  # every bucket is an observed size
    n_out, objective = c_size_t(0), c_double(0)
    lib.fp_clear_error()
    _pkg.check(lib.fp_graph_buckets_choose(s_arr, c_arr, n, ctypes.byref(cost), out, len(out),
                                           ctypes.byref(n_out), ctypes.byref(objective)))
    return list(out[:n_out.value]), objective.value


class Pool(_lib.Closeable):
    """A graph pool: static buffers that keep their address (alloc / free,
    ints), and the memory of the graphs given it (Graph(pool=...),
    GraphCache(pool=...)). Close it after the graphs that use it."""

    def __init__(self, ctx):
        _need()
        self.ctx = ctx  # the pool must not outlive its context
        self._h = c_void_p()
        lib.fp_clear_error()
        _pkg.check(lib.fp_graph_pool_create(ctx.handle, ctypes.byref(self._h)))

    @property
    def handle(self):
        if not self._h:
            raise ValueError("graph pool is closed")
        return self._h

    def alloc(self, nbytes):
        p = c_void_p()
        lib.fp_clear_error()
        _pkg.check(lib.fp_graph_pool_alloc(self.handle, _lib.c_int_value(c_size_t, nbytes, "nbytes"),
                                           ctypes.byref(p)))
        return p.value

    def free(self, ptr):
        lib.fp_clear_error()
        _pkg.check(lib.fp_graph_pool_free(self.handle, ptr))

    def reserved(self):
        n = c_size_t(0)
        _pkg.check(lib.fp_graph_pool_reserved(self.handle, ctypes.byref(n)))
        return n.value

    def close(self):
        if self._h:
            lib.fp_clear_error()
            st = lib.fp_graph_pool_destroy(self._h)
            if st == 0:
                self._h = c_void_p()
            _pkg.check(st)  # a graph still uses it: kept, and said so


class Graph(_lib.Closeable):
    """fn(stream) captured once on ctx (after `warmup` eager calls); replay()
    launches it. Keep fn's buffers alive and at their addresses for as long
    as the graph lives."""

    def __init__(self, ctx, fn, stream=None, warmup=1, capture_mode="thread_local", pool=None):
        _need()
        self.ctx, self.pool = ctx, pool  # both must outlive the graph
        cfg = _init(Config, "fp_graph_config_default_sized")
        _lib.set_ints(cfg, warmup=warmup, capture_mode=_capture_mode(capture_mode))
        cfg.pool = pool.handle.value if pool is not None else None
        # held for the graph's life: a CPU context's replay calls it
        self._fn = _pkg._Timed(fn)
        self._h = c_void_p()
        lib.fp_clear_error()
        self._fn.check(lib.fp_graph_capture(ctx.handle, _stream(stream), self._fn.cfn, None, ctypes.byref(cfg),
                                            ctypes.byref(self._h)))

    @property
    def handle(self):
        if not self._h:
            raise ValueError("graph is closed")
        return self._h

    def replay(self, stream=None):
        """Launches the graph on stream (None: the context's), asynchronously."""
        self._fn.error = None
        lib.fp_clear_error()
        self._fn.check(lib.fp_graph_replay(self.handle, _stream(stream)))

    def recapture(self, fn=None, stream=None):
        """Captures fn (None: the current callable again) and swaps it in:
        "in_place" when CUDA updated the instantiated graph,
        "reinstantiated" when the topology changed. On failure the graph
        keeps its previous capture (and callable)."""
        t = self._fn if fn is None else _pkg._Timed(fn)
        t.error = None
        how = c_int(0)
        lib.fp_clear_error()
        t.check(lib.fp_graph_recapture(self.handle, _stream(stream), t.cfn, None, ctypes.byref(how)))
        self._fn = t
        return UPDATES.get(how.value, how.value)

    def info(self):
        """nodes, kernel_nodes, capture_ms, instantiate_ms, replays,
        updates_in_place, reinstantiations and cpu (True: a CPU context's
        recorded callable)."""
        info = _init(Info, "fp_graph_info_init_sized")
        _pkg.check(lib.fp_graph_get_info(self.handle, ctypes.byref(info)))
        d = {f: getattr(info, f) for f, _ in Info._fields_ if f != "struct_size"}
        d["cpu"] = bool(d["cpu"])
        return d

    def close(self):
        if self._h:
            h, self._h = self._h, c_void_p()
            lib.fp_clear_error()
            _pkg.check(lib.fp_graph_destroy(h))


class GraphCache(_lib.Closeable):
    """One graph per batch-size bucket of step(stream, size). run(n) rounds n
    up to its bucket, replays that bucket's graph, capturing it on first
    use; sizes above the largest bucket run eagerly. The step reads and
    writes the same buffers for every size (rows [0, size)); pad rows
    [n, bucket) yourself before run()."""

    choose_buckets = staticmethod(buckets_choose)

    def __init__(self, ctx, step, buckets=None, max_size=256, lazy=True, warmup=1,
                 capture_mode="thread_local", pool=None):
        _need()
        self.ctx, self.pool = ctx, pool
        cfg = _init(CacheConfig, "fp_graph_cache_config_default_sized")
        if buckets is not None:
            arr, n = _i64_array(buckets, "bucket")
            cfg.buckets, cfg.n_buckets = ctypes.cast(arr, P(i64)), n  # copied by the library
        _lib.set_ints(cfg, max_size=max_size, lazy=int(bool(lazy)), warmup=warmup,
                      capture_mode=_capture_mode(capture_mode))
        cfg.pool = pool.handle.value if pool is not None else None
        self._step = _pkg._Timed(step, STEP_FN)  # held: the cache calls it until closed
        self._h = c_void_p()
        lib.fp_clear_error()
        self._step.check(lib.fp_graph_cache_create(ctx.handle, self._step.cfn, None, ctypes.byref(cfg),
                                                   ctypes.byref(self._h)))

    @property
    def handle(self):
        if not self._h:
            raise ValueError("graph cache is closed")
        return self._h

    def bucket(self, n):
        """The bucket n runs at, or None above the largest bucket."""
        b = i64(0)
        lib.fp_clear_error()
        st = lib.fp_graph_cache_bucket(self.handle, _lib.c_int_value(i64, n, "n"), ctypes.byref(b))
        if st == _pkg.Status.NOT_FOUND:
            return None
        _pkg.check(st)
        return b.value

    def run(self, n, stream=None):
        """One step for a batch of n: (size it ran at, how), how one of
        RUN_KINDS ("replayed", "captured", "eager", "capture_failed")."""
        size, how = i64(0), c_int(0)
        self._step.error = None
        lib.fp_clear_error()
        self._step.check(lib.fp_graph_cache_run(self.handle, _stream(stream), _lib.c_int_value(i64, n, "n"),
                                          ctypes.byref(size), ctypes.byref(how)))
        return size.value, RUN_KINDS[how.value] if 0 <= how.value < len(RUN_KINDS) else how.value

    def capture(self, all_buckets=False):
        """Captures the buckets the histogram uses (all_buckets: every one)."""
        self._step.error = None
        lib.fp_clear_error()
        self._step.check(lib.fp_graph_cache_capture(self.handle, int(bool(all_buckets))))

    @property
    def buckets(self):
        h = self.handle
        return _fill_list(lambda out, cap, n: lib.fp_graph_cache_buckets(h, out, cap, n))

    @buckets.setter
    def buckets(self, values):
        self.set_buckets(values)

    def set_buckets(self, values):
        """Replaces the bucket list (graphs of buckets that remain are kept)."""
        arr, n = _i64_array(values, "bucket")
        lib.fp_clear_error()
        _pkg.check(lib.fp_graph_cache_set_buckets(self.handle, arr, n))

    def rebucket(self, row_cost=1.0, graph_cost=0.25, graph_row_cost=0.0, max_buckets=0):
        """buckets_choose over the cache's histogram, then set_buckets with
        the result. Returns the new list."""
        cost = _cost(row_cost, graph_cost, graph_row_cost, max_buckets)
        lib.fp_clear_error()
        _pkg.check(lib.fp_graph_cache_rebucket(self.handle, ctypes.byref(cost)))
        return self.buckets

    def stats(self):
        s = _init(CacheStats, "fp_graph_cache_stats_init_sized")
        _pkg.check(lib.fp_graph_cache_get_stats(self.handle, ctypes.byref(s)))
        return {f: getattr(s, f) for f, _ in CacheStats._fields_ if f != "struct_size"}

    def capture_error(self):
        """Why the last failed capture failed ("" if none)."""
        return (lib.fp_graph_cache_capture_error(self.handle) or b"").decode(errors="replace")

    def histogram(self):
        """{size: count} of the sizes run (and loaded), sorted by size."""
        n, cap = c_size_t(0), 4096
        while True:
            sizes, counts = (i64 * cap)(), (u64 * cap)()
            lib.fp_clear_error()
            _pkg.check(lib.fp_graph_cache_histogram(self.handle, sizes, counts, cap, ctypes.byref(n)))
            if n.value <= cap:
                return dict(zip(sizes[:n.value], counts[:n.value]))
            cap = n.value  # sizes were added meanwhile (another thread ran): again

    def save_histogram(self, path):
        lib.fp_clear_error()
        _pkg.check(lib.fp_graph_cache_save_histogram(self.handle, _path(path)))

    def load_histogram(self, path):
        """Adds a saved histogram's counts (unchanged on any error)."""
        lib.fp_clear_error()
        _pkg.check(lib.fp_graph_cache_load_histogram(self.handle, _path(path)))

    def close(self):
        if self._h:
            h, self._h = self._h, c_void_p()
            lib.fp_graph_cache_destroy(h)
