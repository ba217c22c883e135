"""Python bindings for libfastpath (ctypes).

    import fastpath
    ctx = fastpath.Context("cpu")              # or "cuda:0"
    report = fastpath.ab(ctx, baseline_fn, optimized_fn)
    print(report)                               # speedup, verdict, both distributions

Errors raise fastpath.FastpathError carrying the status and the library's
detail message.

Capabilities (present when libfastpath was built with them):
    fastpath.norm        fused LayerNorm / RMSNorm (+ residual, bias, activation)
    fastpath.attention   flash attention
    fastpath.alloc       caching allocator: stats, snapshot, trace generation and replay
    fastpath.graph       CUDA graph capture / replay and the shape-bucketed graph cache
    fastpath.pipeline    host<->device copy bandwidth per host memory kind; Prefetcher
                         (the next batches copied to the GPU while this one is used)
    fastpath.trace       spans, Chrome / SQLite exports, what bounds a workload;
                         `with fastpath.profile() as p:` (p.summary(), p.sqlite_path)
    fastpath.comm        NCCL communicators (collectives with a ledger, statistics, a
                         watchdog), bucketed all-reduce overlapped with compute
Both take raw pointers (ints) with shapes, strides and dtypes, and offer a thin
numpy layer for CPU contexts. PyTorch drop-ins live in fastpath.torch
(`import fastpath.torch`; needs torch).
"""
import ctypes
import enum
import weakref

from . import _lib
from ._lib import lib

__all__ = ["Status", "FastpathError", "Context", "version", "device_count", "stats", "time", "ab",
           "Verdict", "DTYPES", "dtype_id", "convert", "norm", "attention", "alloc", "graph", "pipeline",
           "comm", "trace", "profile"]


class Status(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    OUT_OF_MEMORY = 3
    NO_DEVICE = 4
    CUDA = 5
    CUBLAS = 6
    NCCL = 7
    TIMEOUT = 8
    QUEUE_FULL = 9
    SHUT_DOWN = 10
    CANCELLED = 11
    NOT_FOUND = 12
    MISMATCH = 13
    IO = 14
    INTERNAL = 15


class Verdict(enum.IntEnum):
    SAME = 0
    FASTER = 1
    SLOWER = 2


class FastpathError(RuntimeError):
    def __init__(self, status, detail):
        self.status = Status(status) if status in Status._value2member_map_ else status
        self.detail = detail
        super().__init__(f"{lib.fp_status_string(status).decode()}: {detail}")


def check(status):
    """Raises FastpathError for a non-OK status, with fp_last_error()."""
    if status != 0:
        raise FastpathError(status, lib.fp_last_error().decode(errors="replace"))


def version():
    return lib.fp_version_string().decode()


def device_count():
    n = ctypes.c_int(0)
    check(lib.fp_device_count(ctypes.byref(n)))
    return n.value


DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
_DTYPE_ALIASES = {"float32": "f32", "float": "f32", "float16": "f16", "half": "f16",
                  "bfloat16": "bf16"}


def dtype_id(dtype):
    """fp_dtype value of "f32" / "f16" / "bf16" (or float32/float16/half/bfloat16,
    or the int itself)."""
    if isinstance(dtype, int):
        if dtype not in DTYPES.values():
            raise ValueError(f"unknown dtype id {dtype}")
        return dtype
    name = _DTYPE_ALIASES.get(str(dtype), str(dtype))
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[name]


def dtype_size(dtype):
    return 4 if dtype_id(dtype) == 0 else 2


def convert(src_ptr, src_dtype, dst_ptr, dst_dtype, n):
    """Converts n host elements between f32 / f16 / bf16 (round to nearest even)."""
    check(lib.fp_convert_host(src_ptr, dtype_id(src_dtype), dst_ptr, dtype_id(dst_dtype),
                              _lib.c_int_value(ctypes.c_size_t, n, "n")))


def _opt_ptr(p):
    """None / 0 -> NULL, else the address as an int (ctypes c_void_p field)."""
    return int(p) if p else None


# Every open Context (fastpath.profile() traces those alive when it starts).
_live_contexts = weakref.WeakSet()


class Context(_lib.Closeable):
    """An execution context: "cpu" or "cuda" / "cuda:N"."""

    def __init__(self, device="cpu"):
        d = device if isinstance(device, str) else None
        if d == "cpu":
            kind, index = 0, 0
        elif d == "cuda" or (d and d.startswith("cuda:") and d[5:].isdigit() and d[5:].isascii()):
            kind = 1
            index = _lib.c_int_value(ctypes.c_int, d[5:], "device index") if d != "cuda" else 0
        else:  # "cudafoo", "cuda:", "cuda:-1", "cuda:x" are typos, not cuda:0
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        self._h = ctypes.c_void_p()
        check(lib.fp_context_create(kind, index, ctypes.byref(self._h)))
        self.device = device
        _live_contexts.add(self)
        if trace.available():
            trace._on_new_context(self)  # an active fastpath.profile() traces it

    @property
    def handle(self):
        if not self._h:
            raise ValueError("context is closed")
        return self._h

    @property
    def is_cuda(self):
        return lib.fp_context_kind(self.handle) == 1

    def info(self):
        info = _lib.DeviceInfo()
        lib.fp_device_info_init(ctypes.byref(info))
        check(lib.fp_context_device_info(self.handle, ctypes.byref(info)))
        return {f: (getattr(info, f).decode() if f == "name" else getattr(info, f))
                for f, _ in _lib.DeviceInfo._fields_ if f != "struct_size"}

    # fp_context_option (include/fastpath/core.h), by name
    OPTIONS = {"cpu_threads": 1, "workspace_bytes": 2, "scratch_keep_bytes": 3, "attention_kernel": 4,
               "attention_split_combine": 5, "launch_pdl": 6}

    def set_option(self, name, value):
        """fp_context_set_option by name (Context.OPTIONS), e.g.
        set_option("attention_kernel", 6): the decode kernel for the
        attention calls it takes (core.h says what each option means and
        which values it accepts; a bad value raises FastpathError with the
        library's message). For the torch drop-ins' context:
        fastpath.torch.context_for("cuda").set_option(...)."""
        if name not in self.OPTIONS:
            raise ValueError(f"unknown context option {name!r}: one of {', '.join(sorted(self.OPTIONS))}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"context option {name!r} takes an int, got {type(value).__name__}")
        check(lib.fp_context_set_option(self.handle, self.OPTIONS[name],
                                        _lib.c_int_value(ctypes.c_int64, value, name)))

    def synchronize(self, stream=None):
        check(lib.fp_context_synchronize(self.handle, stream))

    def close(self):
        if self._h:
            lib.fp_context_destroy(self._h)
            self._h = ctypes.c_void_p()


_AGREEMENT_FIELDS = ("passed", "max_abs_err", "max_rel_err", "atol", "rtol", "count", "mismatches")


def _ab_report_dict(rep):
    a = rep.agreement
    # Without compared outputs the agreement is a placeholder (passed = 1):
    # no verdict either way, every field None.
    agreement = {f: getattr(a, f) if rep.compared else None for f in _AGREEMENT_FIELDS}
    if rep.compared:
        agreement["passed"] = bool(a.passed)
    return {"baseline": _stats_dict(rep.baseline), "optimized": _stats_dict(rep.optimized),
            "speedup": rep.speedup, "verdict": Verdict(rep.verdict).name,
            "compared": bool(rep.compared), "agreement": agreement,
            "achieved_gbps": rep.achieved_gbps, "achieved_tflops": rep.achieved_tflops,
            "pct_of_peak": rep.pct_of_peak if rep.pct_of_peak >= 0 else None,
            "bound": rep.bound.decode() if rep.bound else "unknown"}


def _stats_dict(s):
    return {f: getattr(s, f) for f, _ in _lib.Stats._fields_}


def stats(samples_ms):
    """Statistics of durations (ms) as computed by the timing engine."""
    arr = (ctypes.c_double * len(samples_ms))(*samples_ms)
    out = _lib.Stats()
    check(lib.fp_stats_compute(arr, len(samples_ms), ctypes.byref(out)))
    return _stats_dict(out)


def _config(max_time_s=None, min_samples=None, flush_l2=False, use_graph=False):
    cfg = _lib.TimingConfig()
    lib.fp_timing_config_default(ctypes.byref(cfg))
    if max_time_s is not None:
        cfg.max_time_s = max_time_s
    if min_samples is not None:
        _lib.set_ints(cfg, min_samples=min_samples, max_samples=max(cfg.max_samples, int(min_samples)))
    cfg.flush_l2 = int(bool(flush_l2))
    cfg.use_graph = int(bool(use_graph))
    return cfg


class _Timed:
    """A Python callable fn(stream) as an fp_timed_fn (or, with another ctypes
    prototype proto(status, user, *args), fn(*args) as that callback: the
    graph step's fn(stream, size)). An exception aborts the measurement with
    Status.INTERNAL (the library records no detail for a callable's failure)
    and is kept, so that _check can raise it as the FastpathError's cause
    with its message as the detail. Holds the ctypes function object: keep
    the _Timed alive for the whole C call (for as long as the library may
    call it)."""

    def __init__(self, fn, proto=None):
        self.error = None

        def call(user, *args):
            try:
                fn(*args)
                return 0
            except BaseException as e:  # noqa: B902 - nothing may unwind through C
                if self.error is None:
                    self.error = e
                return int(Status.INTERNAL)
        self.cfn = (proto or _lib.TIMED_FN)(call)

    def check(self, status, *others):
        """check(status), but a callable's exception becomes the detail."""
        for t in (self, *others):
            if status != 0 and t.error is not None:
                if not isinstance(t.error, Exception):  # KeyboardInterrupt, SystemExit
                    raise t.error
                raise FastpathError(status, f"callable raised {type(t.error).__name__}: "
                                            f"{t.error}") from t.error
        check(status)


def time(ctx, fn, max_time_s=None, min_samples=None, flush_l2=False, use_graph=False):
    """Times fn(stream) on ctx; returns the statistics as a dict. An exception
    raised by fn is re-raised as the cause of a FastpathError (INTERNAL)."""
    t = _Timed(fn)
    cfg = _config(max_time_s, min_samples, flush_l2, use_graph)
    out = _lib.Stats()
    lib.fp_clear_error()
    t.check(lib.fp_time(ctx.handle, None, t.cfn, None, ctypes.byref(cfg), ctypes.byref(out)))
    return _stats_dict(out)


def ab(ctx, baseline, optimized, bytes=0.0, flops=0.0, max_time_s=None, min_samples=None,
       flush_l2=False, use_graph=False):
    """Baseline vs optimized through the timing engine (interleaved, noise-aware
    verdict, roofline). Compare outputs yourself, or use a capability's validate."""
    spec = _lib.ABSpec()
    lib.fp_ab_spec_init(ctypes.byref(spec))
    b, o = _Timed(baseline), _Timed(optimized)
    spec.baseline, spec.optimized = b.cfn, o.cfn
    spec.bytes, spec.flops = float(bytes), float(flops)
    cfg = _config(max_time_s, min_samples, flush_l2, use_graph)
    rep = _lib.ABReport()
    lib.fp_clear_error()
    b.check(lib.fp_ab_run(ctx.handle, None, ctypes.byref(spec), ctypes.byref(cfg), ctypes.byref(rep)), o)
    return _ab_report_dict(rep)


from . import norm, attention, alloc, graph, pipeline, comm, trace  # noqa: E402  (they use the names above)
from .trace import profile  # noqa: E402
