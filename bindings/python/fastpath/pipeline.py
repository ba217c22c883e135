"""Host <-> device copies (include/fastpath/pipeline.h) from Python: the copy
bandwidth per host memory kind, and a prefetcher that moves the next items
of a data iterator to the GPU while the current one is being used.

    import fastpath, fastpath.pipeline as fpp
    ctx = fastpath.Context("cuda:0")                      # or "cpu"
    fpp.copy_bandwidth(ctx, "pinned", "h2d", mib=256)     # GB/s
    fpp.copy_bandwidth(ctx, "pageable", "d2h")

    for batch in fpp.Prefetcher(loader, device="cuda", depth=2):
        loss = model(batch["x"]).sum()                    # batch already on the GPU

copy_bandwidth: fp_copy_bandwidth, the roofline the pipeline's copies are
judged against (host memory kinds: "pageable", "pinned", "registered",
"write_combined"; directions "h2d", "d2h"). On a CPU context every kind is
plain memory and the copy is memcpy: a figure for the host's memory.

Prefetcher: see its docstring. Needs torch for its CUDA path only; without
torch, or without a CUDA device, it hands the items over as they come, so
the same loop runs in CI.

Errors from the library raise FastpathError; bad arguments of the Python
layer raise ValueError / TypeError.
"""
import collections
import ctypes
import importlib.util
import time as _time

import fastpath as _pkg  # the package: it imports this module after defining what is used here
from . import _lib
from ._lib import lib

__all__ = ["available", "copy_bandwidth", "Pipeline", "PinnedPool", "Prefetcher", "HOST_MEMORY_KINDS",
           "DIRECTIONS"]

c_int, c_size_t, c_double, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_double, ctypes.c_void_p
P = ctypes.POINTER

HOST_MEMORY_KINDS = {"pageable": 0, "pinned": 1, "registered": 2, "write_combined": 3}  # fp_host_memory_kind
DIRECTIONS = {"h2d": 0, "d2h": 1}                                                      # fp_copy_direction


class Chunk(ctypes.Structure):
    """fp_pipeline_chunk."""
    _fields_ = [("seq", ctypes.c_uint64), ("host_in", c_void_p), ("in_bytes", c_size_t), ("host_out", c_void_p),
                ("out_bytes", c_size_t), ("d_in", c_void_p), ("d_out", c_void_p), ("tag", c_void_p)]


# fp_pipeline_compute_fn / fp_pipeline_complete_fn
COMPUTE_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, P(Chunk))
COMPLETE_FN = ctypes.CFUNCTYPE(None, c_void_p, P(Chunk), c_int, ctypes.c_char_p)


class Config(ctypes.Structure):
    """fp_pipeline_config, field for field."""
    _fields_ = [("struct_size", c_size_t), ("depth", c_int), ("max_in_bytes", c_size_t),
                ("max_out_bytes", c_size_t), ("max_chunks_in_flight", c_int), ("max_bytes_in_flight", c_size_t),
                ("staging_threads", c_int), ("compute", COMPUTE_FN), ("complete", COMPLETE_FN), ("user", c_void_p),
                ("pinned", c_void_p)]


class PipelineStats(ctypes.Structure):
    """fp_pipeline_stats."""
    _fields_ = ([("struct_size", c_size_t)]
                + [(n, ctypes.c_uint64) for n in ("submitted", "completed", "failed", "cancelled", "staged",
                                                  "bytes_h2d", "bytes_d2h")]
                + [(n, c_double) for n in ("stage_ms", "h2d_ms", "compute_ms", "d2h_ms", "complete_ms", "wall_ms",
                                           "h2d_gbps", "d2h_gbps", "overlap_efficiency", "compute_idle_ms",
                                           "submit_wait_ms")]
                + [("max_in_flight", ctypes.c_uint64)])


class PinnedConfig(ctypes.Structure):
    """fp_pinned_config."""
    _fields_ = [("struct_size", c_size_t), ("chunk_bytes", c_size_t), ("budget_bytes", c_size_t),
                ("alloc_config", c_void_p)]


class PinnedStats(ctypes.Structure):
    """fp_pinned_stats, field for field."""
    _fields_ = [("struct_size", c_size_t), ("host_mode", c_int), ("reserve_running", c_int),
                ("chunk_bytes", c_size_t), ("budget_bytes", c_size_t), ("bytes_pinned", c_size_t),
                ("peak_bytes_pinned", c_size_t), ("segment_bytes", c_size_t), ("registered_bytes", c_size_t),
                ("segments", ctypes.c_uint64), ("pin_calls", ctypes.c_uint64), ("pinned_bytes_total", ctypes.c_uint64),
                ("pin_ms", c_double), ("pin_gbps", c_double), ("longest_pin_call_ms", c_double),
                ("touch_ms", c_double), ("unpin_calls", ctypes.c_uint64), ("unpin_ms", c_double),
                ("register_calls", ctypes.c_uint64), ("register_ms", c_double), ("reserve_target_bytes", c_size_t),
                ("reserve_done_bytes", c_size_t), ("max_pin_lock_wait_ms", c_double), ("pin_lock_wait_ms", c_double),
                ("pin_lock_contended", ctypes.c_uint64), ("budget_refusals", ctypes.c_uint64)]


def _declare():
    sig = _lib._sig_opt
    sig("fp_host_memory_kind_name", ctypes.c_char_p, c_int)
    sig("fp_copy_bandwidth", c_int, c_void_p, c_int, c_int, c_size_t, P(_lib.TimingConfig), P(c_double),
        P(_lib.Stats))
    sig("fp_pipeline_config_default_sized", c_int, P(Config), c_size_t)
    sig("fp_pipeline_stats_init_sized", c_int, P(PipelineStats), c_size_t)
    sig("fp_pipeline_create", c_int, c_void_p, P(Config), P(c_void_p))
    sig("fp_pipeline_submit", c_int, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p,
        ctypes.c_int64, P(ctypes.c_uint64))
    sig("fp_pipeline_flush", c_int, c_void_p, ctypes.c_int64)
    sig("fp_pipeline_cancel", c_int, c_void_p, P(ctypes.c_uint64))
    sig("fp_pipeline_close", c_int, c_void_p)
    sig("fp_pipeline_destroy", None, c_void_p)
    sig("fp_pipeline_compute_stream", c_void_p, c_void_p)
    sig("fp_pipeline_get_stats", c_int, c_void_p, P(PipelineStats))
    sig("fp_pipeline_reset_stats", c_int, c_void_p)
    sig("fp_pinned_config_default_sized", c_int, P(PinnedConfig), c_size_t)
    sig("fp_pinned_stats_init_sized", c_int, P(PinnedStats), c_size_t)
    sig("fp_pinned_pool_create", c_int, c_void_p, P(PinnedConfig), P(c_void_p))
    sig("fp_pinned_pool_destroy", None, c_void_p)
    sig("fp_pinned_pool_allocator", c_void_p, c_void_p)
    sig("fp_pinned_pool_reserve", c_int, c_void_p, c_size_t)
    sig("fp_pinned_pool_reserve_wait", c_int, c_void_p, ctypes.c_int64)
    sig("fp_pinned_register", c_int, c_void_p, c_void_p, c_size_t)
    sig("fp_pinned_unregister", c_int, c_void_p, c_void_p)
    sig("fp_pinned_pool_get_stats", c_int, c_void_p, P(PinnedStats))


_declare()
_AVAILABLE = _lib.has("fp_copy_bandwidth")  # the loaded library never changes


def available():
    """True when libfastpath was built with the pipeline capability."""
    return _AVAILABLE


def _need():
    if not _AVAILABLE:
        raise RuntimeError("libfastpath was built without the pipeline capability "
                           "(FASTPATH_MODULES must include 'pipeline')")


_choice = _lib.choice


# ---- copy bandwidth --------------------------------------------------------------------

def copy_bandwidth(ctx, kind="pinned", direction="h2d", mib=256, max_time_s=None, min_samples=None,
                   stats=False):
    """GB/s (1e9 bytes per second, bytes / median time) of copies of `mib`
    MiB between host memory of `kind` and device memory in `direction`, by
    fp_copy_bandwidth (which checks one copy against the source before timing).
    stats=True returns (gbps, the timing statistics as a dict)."""
    _need()
    k = _choice(kind, HOST_MEMORY_KINDS, "kind")
    d = _choice(direction, DIRECTIONS, "direction")
    if isinstance(mib, bool) or not isinstance(mib, int) or mib < 1:
        raise ValueError(f"mib must be a positive int, got {mib!r}")
    nbytes = _lib.c_int_value(c_size_t, mib << 20, "mib << 20")
    cfg = _pkg._config(max_time_s, min_samples)
    gbps = c_double(0)
    out = _lib.Stats()
    _pkg.check(lib.fp_copy_bandwidth(ctx.handle, k, d, nbytes, ctypes.byref(cfg), ctypes.byref(gbps),
                                     ctypes.byref(out)))
    return (gbps.value, _pkg._stats_dict(out)) if stats else gbps.value


# ---- pinned pools ----------------------------------------------------------------------

class PinnedPool(_lib.Closeable):
    """fp_pinned_pool (pinned.h): pinned host memory at its real size, one
    registration per segment, under a process-wide lock; a background
    reserve that pins segments of chunk_bytes one call at a time, so it never
    stalls other pinners for long; registration of existing arrays; a
    budget. Give it to Pipeline(pinned=pool) for staging buffers.

        with fpp.PinnedPool(ctx, chunk_bytes=64 << 20, budget_bytes=8 << 30) as pool:
            pool.reserve(1 << 30)       # pins in the background, returns at once
            pool.reserve_wait()
            pool.stats()["pin_gbps"], pool.stats()["longest_pin_call_ms"]

    On a CPU context "pinning" is touching the pages (host mode): the same
    bookkeeping, no CUDA."""

    def __init__(self, ctx, chunk_bytes=0, budget_bytes=0):
        _need()
        self.ctx = ctx  # must outlive the pool
        cfg = PinnedConfig()
        _pkg.check(lib.fp_pinned_config_default_sized(ctypes.byref(cfg), ctypes.sizeof(cfg)))
        if chunk_bytes:
            cfg.chunk_bytes = _lib.c_int_value(c_size_t, chunk_bytes, "chunk_bytes")
        cfg.budget_bytes = _lib.c_int_value(c_size_t, budget_bytes, "budget_bytes")
        self._h = c_void_p()
        self._registered = {}
        lib.fp_clear_error()
        _pkg.check(lib.fp_pinned_pool_create(ctx.handle, ctypes.byref(cfg), ctypes.byref(self._h)))

    def _pool(self):
        if not self._h:
            raise ValueError("pinned pool is closed")
        return self._h

    @property
    def handle(self):
        """The pool's caching allocator (what Pipeline(pinned=...) takes)."""
        return c_void_p(lib.fp_pinned_pool_allocator(self._pool()))

    def reserve(self, nbytes):
        """Starts pinning nbytes into the pool's cache on a background thread."""
        _pkg.check(lib.fp_pinned_pool_reserve(self._pool(), _lib.c_int_value(c_size_t, nbytes, "nbytes")))

    def reserve_wait(self, timeout_ms=-1):
        """Waits for the reserve; raises its failure (e.g. the budget) or TIMEOUT."""
        lib.fp_clear_error()
        _pkg.check(lib.fp_pinned_pool_reserve_wait(self._pool(), int(timeout_ms)))

    def register(self, array):
        """Pins a numpy array / CPU tensor in place until unregister (or close)."""
        ptr, n = _host_buffer(array, "array", True)
        lib.fp_clear_error()
        _pkg.check(lib.fp_pinned_register(self._pool(), ptr, n))
        self._registered[ptr] = array  # keep it alive while pinned

    def unregister(self, array):
        ptr, _ = _host_buffer(array, "array", True)
        lib.fp_clear_error()
        _pkg.check(lib.fp_pinned_unregister(self._pool(), ptr))
        self._registered.pop(ptr, None)

    def stats(self):
        """fp_pinned_stats as a dict: bytes pinned, pin_gbps, longest_pin_call_ms, ..."""
        s = PinnedStats()
        _pkg.check(lib.fp_pinned_stats_init_sized(ctypes.byref(s), ctypes.sizeof(s)))
        _pkg.check(lib.fp_pinned_pool_get_stats(self._pool(), ctypes.byref(s)))
        d = {f: getattr(s, f) for f, _ in PinnedStats._fields_ if f != "struct_size"}
        d["host_mode"], d["reserve_running"] = bool(d["host_mode"]), bool(d["reserve_running"])
        return d

    def close(self):
        """Cancels a reserve, unregisters what is registered, unpins everything."""
        if self._h:
            h, self._h = self._h, c_void_p()
            lib.fp_pinned_pool_destroy(h)
            self._registered.clear()


# ---- the pipeline ----------------------------------------------------------------------

def _host_buffer(x, what, writable):
    """(address, bytes) of a C-contiguous numpy array or CPU torch tensor."""
    if hasattr(x, "data_ptr") and hasattr(x, "is_contiguous"):  # a torch tensor
        if x.device.type != "cpu" or not x.is_contiguous():
            raise ValueError(f"{what} must be a contiguous CPU tensor")
        return x.data_ptr(), x.numel() * x.element_size()
    np = _np()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be a numpy array or a torch CPU tensor, got {type(x).__name__}")
    if not x.flags.c_contiguous or (writable and not x.flags.writeable):
        raise ValueError(f"{what} must be C-contiguous{' and writable' if writable else ''}")
    return x.ctypes.data, x.nbytes


class PipelineChunk:
    """What compute(stream, chunk) gets: seq, in_bytes, out_bytes, d_in and
    d_out (device addresses as ints; d_out None without output) and tag."""
    __slots__ = ("seq", "in_bytes", "out_bytes", "d_in", "d_out", "tag")

    def __init__(self, c, tag):
        self.seq, self.in_bytes, self.out_bytes = c.seq, c.in_bytes, c.out_bytes
        self.d_in, self.d_out, self.tag = c.d_in, c.d_out, tag


class Pipeline(_lib.Closeable):
    """fp_pipeline: chunks of host data staged into pinned memory, copied to
    the device, computed on and copied back, `depth` chunks in flight.

        def compute(stream, chunk):        # enqueue work on `stream`
            fastpath.norm...(..., chunk.d_in, ..., chunk.d_out, stream=stream)
        with fpp.Pipeline(ctx, compute, max_in_bytes=8 << 20, max_out_bytes=8 << 20) as p:
            for x, y in zip(inputs, outputs):
                p.submit(x, y)             # numpy arrays / CPU tensors
            p.flush()                      # raises for the first failed chunk

    compute(stream, chunk) runs on the pipeline's dispatcher thread; raising
    fails that chunk only (status INTERNAL; flush raises it). on_complete(seq,
    status, message, tag), if given, runs in submission order on the
    completion thread (status a fastpath.Status: OK, CANCELLED, ...). The
    arrays passed to submit are kept alive until their chunk completed."""

    def __init__(self, ctx, compute, max_in_bytes, max_out_bytes=0, depth=3, max_chunks_in_flight=0,
                 max_bytes_in_flight=0, staging_threads=0, on_complete=None, pinned=None):
        _need()
        import threading
        self.ctx, self.pinned = ctx, pinned  # both must outlive the pipeline
        self._compute, self._on_complete = compute, on_complete
        self._refs, self._lock, self._next_id = {}, threading.Lock(), 1
        self._errors = {}
        cfg = Config()
        _pkg.check(lib.fp_pipeline_config_default_sized(ctypes.byref(cfg), ctypes.sizeof(cfg)))
        _lib.set_ints(cfg, depth=depth, max_chunks_in_flight=max_chunks_in_flight, staging_threads=staging_threads)
        for name, v in (("max_in_bytes", max_in_bytes), ("max_out_bytes", max_out_bytes),
                        ("max_bytes_in_flight", max_bytes_in_flight)):
            setattr(cfg, name, _lib.c_int_value(c_size_t, v, name))
        self._cfn = COMPUTE_FN(self._call_compute)  # held for the pipeline's life
        self._kfn = COMPLETE_FN(self._call_complete)
        cfg.compute, cfg.complete = self._cfn, self._kfn
        cfg.pinned = pinned.handle.value if pinned is not None else None
        self._h = c_void_p()
        lib.fp_clear_error()
        _pkg.check(lib.fp_pipeline_create(ctx.handle, ctypes.byref(cfg), ctypes.byref(self._h)))

    def _tag(self, c):
        with self._lock:
            refs = self._refs.get(c.contents.tag or 0)
        return refs[2] if refs else None

    def _call_compute(self, user, stream, c):
        try:
            self._compute(stream, PipelineChunk(c.contents, self._tag(c)))
            return 0
        except BaseException as e:  # noqa: B902 - nothing may unwind through C
            with self._lock:
                self._errors[c.contents.seq] = e
            return int(_pkg.Status.INTERNAL)

    def _call_complete(self, user, c, status, message):
        key, seq = c.contents.tag or 0, c.contents.seq
        with self._lock:
            refs = self._refs.pop(key, None)
            err = self._errors.get(seq) if status else self._errors.pop(seq, None)
        if self._on_complete is not None:
            msg = message.decode(errors="replace") if message else ""
            if err is not None:
                msg = f"compute raised {type(err).__name__}: {err}"
            try:
                self._on_complete(seq, _pkg.Status(status), msg, refs[2] if refs else None)
            except BaseException:  # noqa: B902 - a callback's failure must not unwind through C
                pass

    @property
    def handle(self):
        if not self._h:
            raise ValueError("pipeline is closed")
        return self._h

    @property
    def compute_stream(self):
        """The stream compute gets (a cudaStream_t as an int; None on a CPU context)."""
        return lib.fp_pipeline_compute_stream(self.handle)

    def submit(self, data_in, out=None, tag=None, timeout_ms=-1):
        """Queues data_in (and out, to receive as many bytes as out holds);
        returns the chunk's seq. Blocks while the pipeline is full
        (timeout_ms < 0), fails at once (0: QUEUE_FULL) or after timeout_ms
        (TIMEOUT)."""
        pin, nin = _host_buffer(data_in, "data_in", False)
        pout, nout = _host_buffer(out, "out", True) if out is not None else (None, 0)
        with self._lock:
            key = self._next_id
            self._next_id += 1
            self._refs[key] = (data_in, out, tag)
        seq = ctypes.c_uint64(0)
        lib.fp_clear_error()
        st = lib.fp_pipeline_submit(self.handle, pin, nin, pout, nout, c_void_p(key), int(timeout_ms),
                                    ctypes.byref(seq))
        if st != 0:
            with self._lock:
                self._refs.pop(key, None)
        _pkg.check(st)
        return seq.value

    def flush(self, timeout_ms=-1):
        """Waits for every chunk submitted so far; raises FastpathError for
        the first that failed since the last flush (a compute's exception as
        its cause)."""
        lib.fp_clear_error()
        st = lib.fp_pipeline_flush(self.handle, int(timeout_ms))
        if st != 0:
            with self._lock:
                errs, self._errors = self._errors, {}
            first = errs[min(errs)] if errs else None
            if first is not None and not isinstance(first, Exception):
                raise first
            if first is not None:
                raise _pkg.FastpathError(st, f"compute raised {type(first).__name__}: {first}") from first
        _pkg.check(st)

    def cancel(self):
        """Cancels the chunks that have not started; returns how many."""
        n = ctypes.c_uint64(0)
        _pkg.check(lib.fp_pipeline_cancel(self.handle, ctypes.byref(n)))
        return n.value

    def close_input(self):
        """No more submits (SHUT_DOWN); chunks in flight go on."""
        _pkg.check(lib.fp_pipeline_close(self.handle))

    def stats(self, reset=False):
        """The statistics as a dict (fp_pipeline_stats); reset=True zeroes them after reading."""
        s = PipelineStats()
        _pkg.check(lib.fp_pipeline_stats_init_sized(ctypes.byref(s), ctypes.sizeof(s)))
        _pkg.check(lib.fp_pipeline_get_stats(self.handle, ctypes.byref(s)))
        if reset:
            _pkg.check(lib.fp_pipeline_reset_stats(self.handle))
        return {f: getattr(s, f) for f, _ in PipelineStats._fields_ if f != "struct_size"}

    def close(self):
        """Cancels what has not started, waits for the rest, releases everything."""
        if self._h:
            h, self._h = self._h, c_void_p()
            lib.fp_pipeline_destroy(h)


# ---- Prefetcher ------------------------------------------------------------------------

def _torch_module():
    """torch if it is installed (imported on first need: it is slow to import), else None."""
    global _torch_cache
    if _torch_cache is False:
        _torch_cache = None
        if importlib.util.find_spec("torch") is not None:
            import torch
            _torch_cache = torch
    return _torch_cache


_torch_cache = False
_numpy = None


def _np():
    global _numpy
    if _numpy is None:
        import numpy
        _numpy = numpy
    return _numpy


def _map(x, leaf):
    """x with leaf(t) for every tensor / array t in it (tuples, namedtuples,
    lists and dicts rebuilt, anything else as it is)."""
    if isinstance(x, dict):
        out = {k: _map(v, leaf) for k, v in x.items()}
        if type(x) is not dict:  # OrderedDict and the like; not those whose constructor differs
            try:
                out = type(x)(out)
            except TypeError:
                pass
        return out
    if isinstance(x, tuple):
        items = [_map(v, leaf) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, list):
        return [_map(v, leaf) for v in x]
    return leaf(x)


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


_END = object()  # the source is exhausted


class _Failed:
    """The source raised here: handed to the consumer in place of this item."""

    def __init__(self, error):
        self.error = error


class Prefetcher:
    """Wraps an iterable of batches (torch tensors or numpy arrays, or
    tuples / namedtuples / lists / dicts of them, nested; anything else is
    passed along as it is) and hands them out on `device`, the next `depth`
    items already on their way.

    device: "cuda", "cuda:N", a torch.device, a fastpath.Context, "cpu", or
    None (the current CUDA device when torch sees one, else "cpu").

    On CUDA (torch installed and a CUDA device): each host tensor is pinned
    (tensor.pin_memory() unless it already is) and copied with
    .to(device, non_blocking=True) on a side stream (torch.cuda.Stream),
    followed by an event; numpy arrays become tensors first
    (torch.from_numpy). When an item is handed out, the consumer's current
    stream waits on its event (no host synchronization), and every device
    tensor of it is record_stream'ed on that stream so the caching allocator
    does not reuse its memory before the consumer's work on it has run (the
    scheme of DALI's prefetch queue and torchtnt's CudaDataPrefetcher).
    Tensors already on the device are passed along.

    Otherwise (device "cpu", no torch, or no CUDA device, even when "cuda"
    was asked for: the same code runs in CI) items are handed out as they
    come: numpy arrays stay numpy arrays unless as_torch=True, which makes
    them tensors (torch.from_numpy, no copy). self.device says which: a
    torch.device on CUDA, "cpu" otherwise.

    Both read `depth` items ahead of the consumer. An exception raised by the
    source reaches the consumer at the item where it happened: the items
    before it first, nothing read past it until it has been raised; after it
    the prefetcher goes on with the source (a generator is finished then).
    iter() starts a new pass over the iterable (a new epoch) once the
    previous one has ended, else continues the current one. len() is the
    source's. stats(): items handed out, bytes copied to the device,
    consumer_wait_ms (host time spent in next(): reading the source,
    pinning, enqueueing copies), and, on CUDA, not_ready (items whose copy
    had not finished when handed out: the consumer's stream waited on it).
    Not thread-safe: one consumer.
    """

    def __init__(self, iterable, device=None, depth=2, as_torch=False):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        self._source = iterable
        self.depth = depth
        self.as_torch = bool(as_torch)
        self.device = self._resolve(device)
        self._cuda = self.device != "cpu"
        self._torch = _torch_module() if (self._cuda or self.as_torch) else None
        if self.as_torch and self._torch is None:
            raise RuntimeError("Prefetcher(as_torch=True) needs torch")
        self._stream = self._torch.cuda.Stream(device=self.device) if self._cuda else None
        self._it = None                    # the current pass's iterator
        self._ended = False                # the current pass has raised StopIteration
        self._queue = collections.deque()  # (item, event, host tensors kept alive) / _Failed / _END
        self._stalled = False              # a _Failed or _END is queued: read no further
        self._items = self._bytes = self._not_ready = 0
        self._wait_s = 0.0

    @staticmethod
    def _resolve(device):
        if isinstance(device, _pkg.Context):
            device = device.device
        name = str(device) if device is not None else None
        if name == "cpu":
            return "cpu"
        if name is not None and not (name == "cuda" or (name[:5] == "cuda:" and name[5:].isdigit()
                                                         and name[5:].isascii())):
            raise ValueError(f"device must be 'cpu', 'cuda[:N]', a torch.device, a fastpath.Context "
                             f"or None, got {device!r}")
        torch = _torch_module()
        if torch is None or not torch.cuda.is_available():
            return "cpu"
        dev = torch.device(name) if name is not None else torch.device("cuda", torch.cuda.current_device())
        return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())

    # ---- iterator protocol ----

    def __iter__(self):
        if self._it is None or self._ended:  # a new pass
            self._it = iter(self._source)
            self._ended = self._stalled = False
            self._fill()
        return self

    def __next__(self):
        if self._ended:  # until iter() starts a new pass, as the protocol wants
            raise StopIteration
        t0 = _time.perf_counter()
        try:
            if self._it is None:
                self.__iter__()
            if not self._queue:
                self._fill()
            head = self._queue.popleft()
            if head is _END:
                self._ended = True
                raise StopIteration
            if isinstance(head, _Failed):
                self._stalled = False  # the next call reads on (nothing past it read before this one)
                raise head.error
            self._fill()  # the next copy overlaps the consumer's work on this item
            item, event, _ = head
            if event is not None:
                self._hand_over(item, event)
            self._items += 1
            return item
        finally:
            self._wait_s += _time.perf_counter() - t0

    def __len__(self):
        return len(self._source)  # TypeError for a source without one, as len() would say

    def __bool__(self):  # not len(): a generator source has none
        return True

    def stats(self):
        s = {"items": self._items, "bytes_copied": self._bytes, "consumer_wait_ms": self._wait_s * 1e3,
             "depth": self.depth, "device": str(self.device)}
        if self._cuda:
            s["not_ready"] = self._not_ready
        return s

    # ---- reading ahead ----

    def _fill(self):
        while len(self._queue) < self.depth and not self._stalled:
            try:
                item = next(self._it)
            except StopIteration:
                self._queue.append(_END)
                self._stalled = True
            except Exception as e:  # noqa: BLE001 - handed to the consumer at this item
                self._queue.append(_Failed(e))
                self._stalled = True
            else:
                self._queue.append(self._stage(item))

    def _stage(self, item):
        if not self._cuda:
            return (_map(item, self._as_torch) if self.as_torch else item), None, None
        torch = self._torch
        hosts = []

        def to_device(x):
            if isinstance(x, _np().ndarray):
                x = torch.from_numpy(x)
            if not isinstance(x, torch.Tensor) or x.device == self.device:
                return x
            if x.device.type == "cpu":
                if not x.is_pinned():
                    x = x.pin_memory()
                hosts.append(x)  # alive until handed out (the copy reads it)
                self._bytes += x.numel() * x.element_size()
            return x.to(self.device, non_blocking=True)

        with torch.cuda.stream(self._stream):
            out = _map(item, to_device)
            event = torch.cuda.Event()
            event.record(self._stream)
        return out, event, hosts

    def _as_torch(self, x):
        return self._torch.from_numpy(x) if isinstance(x, _np().ndarray) else x

    def _hand_over(self, item, event):
        torch = self._torch
        consumer = torch.cuda.current_stream(self.device)
        if not event.query():
            self._not_ready += 1
        consumer.wait_event(event)
        for t in _leaves(item):
            if isinstance(t, torch.Tensor) and t.device == self.device:
                t.record_stream(consumer)
