"""Spans, their exports, and what bounds a workload (trace.h).

The quick way:

    import fastpath, fastpath.torch
    with fastpath.profile() as p:              # every context alive or made inside
        y = fastpath.torch.layer_norm(x, (4096,), w, b)
        ...
    print(p.summary())       # per context: compute / memory / launch / transfer / sync-bound,
                             # the numbers behind it and the library capability that addresses it
    p.sqlite_path            # SQLite: torch_trace, nccl_trace (ATTACH ... AS python)
    p.chrome_path            # Chrome trace JSON: open in Perfetto
    p.verdict                # dict: the first context's overall verdict
    p.groups                 # list of dicts: one verdict per op name, largest first

profile() turns tracing on for every fastpath.Context alive when it enters
and every one created inside it (the fastpath.torch drop-ins make theirs on
first use), reads the spans when it exits, judges them against the device's
roofs (measured then: about 0.1-0.5 s; roofs=False skips it and leaves the
compute and memory shares unknown), writes the exports into out_dir (a new
temporary folder by default), and turns tracing off again on contexts it
turned it on for.

The pieces, on one context:
    enable(ctx, capacity), disable(ctx), clear(ctx), stats(ctx)
    set_timer(ctx, "events" | "cupti" | "kernel"), get_timer(ctx): how a CUDA
        context's spans are timed (two CUDA events each; CUPTI's activity
        records; or, for the ops whose kernels stamp it, the kernels
        themselves: no driver call per span); FASTPATH_TRACE_TIMER=cupti or
        kernel chooses at the first enable
    with user_range(ctx, module, stage): ...        push / pop of a user range
    with span(ctx, name, category="op", bytes=0, flops=0): ...
        a span of your own; category "sync" marks a host wait (host-timed),
        "transfer" a host<->device copy
    step(ctx), read(ctx) -> list of dicts, export_chrome(ctx, path), export_sqlite(ctx, path)
    roofs(ctx) -> dict, verdict(ctx, by="all"|"name"|"module"|"stage"|"category", key=None, roofs=None)
    groups(ctx, by="name", roofs=None) -> list of dicts

Errors raise fastpath.FastpathError with the library's message (a ring of
capacity 0, an unbalanced pop, an unwritable export path...); the context
keeps recording.
"""
import contextlib
import ctypes
import tempfile
import threading
from pathlib import Path

import fastpath as _pkg
from . import _lib
from ._lib import lib, c_int, c_size_t, c_double, c_void_p, c_char_p

P = ctypes.POINTER
u64 = ctypes.c_uint64
i64 = ctypes.c_int64


class Span(ctypes.Structure):
    """fp_trace_span."""
    _fields_ = [("struct_size", c_size_t), ("name", ctypes.c_char * 64), ("category", ctypes.c_char * 32),
                ("module", ctypes.c_char * 64), ("stage", ctypes.c_char * 32), ("step", i64), ("device", c_int),
                ("depth", c_int), ("stream", u64), ("start_s", c_double), ("end_s", c_double),
                ("bytes", c_double), ("flops", c_double), ("allocated_bytes", c_double), ("nranks", c_int),
                ("pad_", c_int)]


class TraceStats(ctypes.Structure):
    """fp_trace_stats."""
    _fields_ = [("struct_size", c_size_t), ("capacity", c_size_t), ("count", c_size_t), ("open", c_size_t),
                ("recorded", u64), ("dropped", u64), ("skipped_capturing", u64), ("unresolved", u64),
                ("step", i64), ("depth", c_int), ("enabled", c_int), ("timer", c_int),
                ("clock_error_s", c_double), ("host_timed", u64)]


class Roofs(ctypes.Structure):
    """fp_trace_roofs."""
    _fields_ = [("struct_size", c_size_t), ("compute_tflops", c_double), ("fma_tflops", c_double),
                ("copy_gbps", c_double), ("pinned_gbps", c_double)]


class Verdict(ctypes.Structure):
    """fp_trace_verdict."""
    _fields_ = ([("struct_size", c_size_t), ("group", ctypes.c_char * 64), ("spans", c_size_t)]
                + [(n, c_double) for n in ("window_s", "busy_s", "transfer_s", "launch_s", "sync_s", "busy_pct",
                                           "transfer_pct", "launch_pct", "sync_pct", "bytes", "flops",
                                           "compute_pct", "memory_pct", "transfer_bytes", "transfer_gbps",
                                           "transfer_pct_of_peak")]
                + [("collectives", c_int), ("bound", c_int), ("remedy", c_char_p), ("reason", ctypes.c_char * 256)])


BOUNDS = ("unknown", "compute", "memory", "launch", "transfer", "sync")
_GROUP_BY = {"all": 0, "name": 1, "module": 2, "stage": 3, "category": 4}


def _declare():
    sig = _lib._sig_opt
    sig("fp_trace_enable", c_int, c_void_p, c_size_t)
    sig("fp_trace_disable", c_int, c_void_p)
    sig("fp_trace_is_enabled", c_int, c_void_p)
    sig("fp_trace_clear", c_int, c_void_p)
    sig("fp_trace_set_timer", c_int, c_void_p, c_int)
    sig("fp_trace_get_timer", c_int, c_void_p)
    sig("fp_trace_begin", c_int, c_void_p, c_void_p, c_char_p, c_char_p, c_double, c_double, P(u64))
    sig("fp_trace_end", c_int, c_void_p, u64)
    sig("fp_trace_push", c_int, c_void_p, c_char_p, c_char_p)
    sig("fp_trace_pop", c_int, c_void_p)
    sig("fp_trace_step", c_int, c_void_p, P(i64))
    sig("fp_trace_get_stats", c_int, c_void_p, P(TraceStats))
    sig("fp_trace_read_sized", c_int, c_void_p, P(Span), c_size_t, c_size_t, P(c_size_t), c_int)
    sig("fp_trace_export_chrome", c_int, c_void_p, c_char_p)
    sig("fp_trace_export_sqlite", c_int, c_void_p, c_char_p)
    sig("fp_trace_roofs_init_sized", c_int, P(Roofs), c_size_t)
    sig("fp_trace_roofs_measure", c_int, c_void_p, P(Roofs))
    sig("fp_trace_verdict_spans", c_int, P(Span), c_size_t, c_size_t, c_int, c_char_p, P(Roofs), P(Verdict))
    sig("fp_trace_verdict_groups", c_int, P(Span), c_size_t, c_size_t, c_int, P(Roofs), P(Verdict), c_size_t,
        c_size_t, P(c_size_t))


_declare()
_AVAILABLE = _lib.has("fp_trace_verdict_spans")


def available():
    """True when libfastpath was built with the trace capability."""
    return _AVAILABLE


def _need():
    if not _AVAILABLE:
        raise RuntimeError("libfastpath was built without the trace capability "
                           "(FASTPATH_MODULES must include 'trace')")


def _h(ctx):
    _need()
    return ctx.handle


def _text(s, what):
    if not isinstance(s, str):
        raise TypeError(f"{what} must be a str, got {type(s).__name__}")
    return s.encode()


# ---- recording -------------------------------------------------------------------------

def enable(ctx, capacity=1 << 16):
    """Starts recording into a ring of `capacity` spans (the oldest overwritten when full)."""
    _pkg.check(lib.fp_trace_enable(_h(ctx), _lib.c_int_value(c_size_t, capacity, "capacity")))


def disable(ctx):
    _pkg.check(lib.fp_trace_disable(_h(ctx)))


def is_enabled(ctx):
    return bool(lib.fp_trace_is_enabled(_h(ctx)))


def clear(ctx):
    _pkg.check(lib.fp_trace_clear(_h(ctx)))


_TIMERS = {"events": 0, "cupti": 1, "kernel": 2}


def set_timer(ctx, timer):
    """Times the spans begun from now on by "events" (two CUDA events each), "cupti" (CUPTI's
    activity records, no driver call per span) or "kernel" (the ops whose kernels stamp their span:
    the norms; no driver call per span; the others keep events). Raises FastpathError when CUPTI
    cannot be used."""
    if timer not in _TIMERS:
        raise ValueError(f"timer must be one of {sorted(_TIMERS)}, got {timer!r}")
    _pkg.check(lib.fp_trace_set_timer(_h(ctx), _TIMERS[timer]))


def get_timer(ctx):
    v = lib.fp_trace_get_timer(_h(ctx))
    return next(k for k, n in _TIMERS.items() if n == v)


def stats(ctx):
    s = TraceStats(struct_size=ctypes.sizeof(TraceStats))
    _pkg.check(lib.fp_trace_get_stats(_h(ctx), ctypes.byref(s)))
    out = {f: getattr(s, f) for f, _ in TraceStats._fields_ if f != "struct_size"}
    out["timer"] = next(k for k, n in _TIMERS.items() if n == out["timer"])
    return out


def step(ctx):
    """Advances the step counter spans are tagged with; returns the new step."""
    v = i64(0)
    _pkg.check(lib.fp_trace_step(_h(ctx), ctypes.byref(v)))
    return v.value


@contextlib.contextmanager
def user_range(ctx, module=None, stage=None):
    """A user range: spans begun inside carry its module and stage."""
    _pkg.check(lib.fp_trace_push(_h(ctx), None if module is None else _text(module, "module"),
                                 None if stage is None else _text(stage, "stage")))
    try:
        yield
    finally:
        _pkg.check(lib.fp_trace_pop(ctx.handle))


def pop(ctx):
    """Closes the innermost user range (FastpathError when none is open)."""
    _pkg.check(lib.fp_trace_pop(_h(ctx)))


@contextlib.contextmanager
def span(ctx, name, category="op", bytes=0, flops=0, stream=None):
    """A span of your own around the block (category "sync": a host wait)."""
    h = u64(0)
    _pkg.check(lib.fp_trace_begin(_h(ctx), stream, _text(name, "name"), _text(category, "category"),
                                  float(bytes), float(flops), ctypes.byref(h)))
    try:
        yield
    finally:
        _pkg.check(lib.fp_trace_end(ctx.handle, h.value))


# ---- reading ---------------------------------------------------------------------------

def _spans(ctx):
    n = c_size_t(0)
    _pkg.check(lib.fp_trace_read_sized(_h(ctx), None, ctypes.sizeof(Span), 0, ctypes.byref(n), 0))
    arr = (Span * max(n.value, 1))()
    if n.value:
        _pkg.check(lib.fp_trace_read_sized(ctx.handle, arr, ctypes.sizeof(Span), n.value, ctypes.byref(n), 0))
    return arr, n.value


def _span_dict(s):
    d = {f: getattr(s, f) for f, _ in Span._fields_ if f not in ("struct_size", "pad_")}
    for k in ("name", "category", "module", "stage"):
        d[k] = d[k].decode(errors="replace")
    d["duration_s"] = s.end_s - s.start_s
    return d


def read(ctx):
    """The finished spans, oldest first, as dicts (the ring is kept)."""
    arr, n = _spans(ctx)
    return [_span_dict(arr[i]) for i in range(n)]


def export_chrome(ctx, path):
    _pkg.check(lib.fp_trace_export_chrome(_h(ctx), str(path).encode()))


def export_sqlite(ctx, path):
    _pkg.check(lib.fp_trace_export_sqlite(_h(ctx), str(path).encode()))


# ---- the verdict -----------------------------------------------------------------------

def _roofs_struct(r):
    s = Roofs()
    _pkg.check(lib.fp_trace_roofs_init_sized(ctypes.byref(s), ctypes.sizeof(Roofs)))
    for k, v in (r or {}).items():
        if k not in ("compute_tflops", "fma_tflops", "copy_gbps", "pinned_gbps"):
            raise ValueError(f"unknown roof {k!r}")
        setattr(s, k, float(v))
    return s


def roofs(ctx):
    """The device's roofs: tensor and FMA peaks, measured copy and pinned-transfer bandwidth."""
    s = _roofs_struct(None)
    _pkg.check(lib.fp_trace_roofs_measure(_h(ctx), ctypes.byref(s)))
    return {f: getattr(s, f) for f, _ in Roofs._fields_ if f != "struct_size"}


def _verdict_dict(v):
    d = {f: getattr(v, f) for f, _ in Verdict._fields_ if f != "struct_size"}
    d["group"] = v.group.decode(errors="replace")
    d["reason"] = v.reason.decode(errors="replace")
    d["remedy"] = v.remedy.decode() if v.remedy else ""
    d["bound"] = BOUNDS[v.bound] if 0 <= v.bound < len(BOUNDS) else "?"
    d["collectives"] = bool(v.collectives)
    for k in ("compute_pct", "memory_pct", "transfer_gbps", "transfer_pct_of_peak"):
        if d[k] < 0:
            d[k] = None  # unknown
    return d


def _by(by):
    if by not in _GROUP_BY:
        raise ValueError(f"by must be one of {sorted(_GROUP_BY)}, got {by!r}")
    return _GROUP_BY[by]


def verdict(ctx, by="all", key=None, roofs=None):
    """What bounds the spans of ctx's ring (by="all"), or of one group (by=name|module|stage|category,
    key=its value): a dict with bound, reason, remedy and the shares behind them. roofs: a dict as
    roofs(ctx) returns (None: unknown, so compute / memory shares are None)."""
    _need()
    arr, n = _spans(ctx)
    r = _roofs_struct(roofs)
    v = Verdict(struct_size=ctypes.sizeof(Verdict))
    _pkg.check(lib.fp_trace_verdict_spans(arr, n, ctypes.sizeof(Span), _by(by),
                                          None if key is None else _text(key, "key"), ctypes.byref(r),
                                          ctypes.byref(v)))
    return _verdict_dict(v)


def _groups(arr, n, by, r):
    count = c_size_t(0)
    _pkg.check(lib.fp_trace_verdict_groups(arr, n, ctypes.sizeof(Span), _by(by), ctypes.byref(r), None,
                                           ctypes.sizeof(Verdict), 0, ctypes.byref(count)))
    out = (Verdict * max(count.value, 1))()
    _pkg.check(lib.fp_trace_verdict_groups(arr, n, ctypes.sizeof(Span), _by(by), ctypes.byref(r), out,
                                           ctypes.sizeof(Verdict), count.value, ctypes.byref(count)))
    return [_verdict_dict(out[i]) for i in range(count.value)]


def groups(ctx, by="name", roofs=None):
    """One verdict per distinct name (module, stage, category), largest window first."""
    _need()
    arr, n = _spans(ctx)
    return _groups(arr, n, by, _roofs_struct(roofs))


# ---- fastpath.profile() ----------------------------------------------------------------

_lock = threading.Lock()
_active = []


def _on_new_context(ctx):
    """Called by fastpath.Context for every new context: active profiles trace it."""
    with _lock:
        profiles = list(_active)
    for p in profiles:
        p._attach(ctx)


class Profile:
    """What `fastpath.profile()` returns; see the module's docstring."""

    def __init__(self, contexts=None, capacity=1 << 16, out_dir=None, roofs=True):
        _need()
        if not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int (spans in each context's ring), got {capacity!r}")
        self.capacity, self.measure_roofs = capacity, roofs
        self._given = list(contexts) if contexts is not None else None
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self._ctxs = {}            # id -> (ctx, tracing was on before)
        self._mu = threading.Lock()
        self.results = []          # one dict per context, after the block

    def _attach(self, ctx):
        with self._mu:
            if id(ctx) in self._ctxs or not getattr(ctx, "_h", None):
                return
            was = is_enabled(ctx)
            if not was:
                enable(ctx, self.capacity)
            self._ctxs[id(ctx)] = (ctx, was)

    def __enter__(self):
        for ctx in (self._given if self._given is not None else list(_pkg._live_contexts)):
            self._attach(ctx)
        if self._given is None:
            with _lock:
                _active.append(self)
        return self

    def __exit__(self, *exc):
        with _lock:
            if self in _active:
                _active.remove(self)
        with self._mu:
            entries = list(self._ctxs.values())
        error = None
        try:
            if self.out_dir is None:
                self.out_dir = Path(tempfile.mkdtemp(prefix="fastpath-profile-"))
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            error = e
        for i, (ctx, was) in enumerate(entries):
            if not getattr(ctx, "_h", None):
                continue  # closed inside the block: its spans went with it
            try:
                if error is None:
                    self.results.append(self._judge(ctx, i))
            except Exception as e:  # every context is still turned off; the first error is raised
                error = error or e
            finally:
                if not was:
                    disable(ctx)
        if error is not None and not exc[0]:
            raise error
        return False

    def _judge(self, ctx, i):
        arr, n = _spans(ctx)
        st = stats(ctx)
        r = _roofs_struct(roofs(ctx) if self.measure_roofs and n else None)
        v = Verdict(struct_size=ctypes.sizeof(Verdict))
        _pkg.check(lib.fp_trace_verdict_spans(arr, n, ctypes.sizeof(Span), 0, None, ctypes.byref(r),
                                              ctypes.byref(v)))
        label = str(ctx.device)
        stem = f"{i}-{label.replace(':', '')}"
        sqlite_path, chrome_path = self.out_dir / f"{stem}.sqlite", self.out_dir / f"{stem}.trace.json"
        export_sqlite(ctx, sqlite_path)
        export_chrome(ctx, chrome_path)
        return {"device": label, "spans": n, "dropped": st["dropped"], "verdict": _verdict_dict(v),
                "groups": _groups(arr, n, "name", r),
                "roofs": {f: getattr(r, f) for f, _ in Roofs._fields_ if f != "struct_size"},
                "sqlite": str(sqlite_path), "chrome": str(chrome_path)}

    def _first(self):
        for res in self.results:
            if res["spans"]:
                return res
        if not self.results:
            raise ValueError("nothing was profiled: no fastpath context was alive or created in the block")
        return self.results[0]

    @property
    def verdict(self):
        return self._first()["verdict"]

    @property
    def groups(self):
        return self._first()["groups"]

    @property
    def sqlite_path(self):
        return self._first()["sqlite"]

    @property
    def chrome_path(self):
        return self._first()["chrome"]

    def summary(self, top=5):
        """Text: per context, its bound with the numbers and the remedy, and the largest groups."""
        lines = []
        for res in self.results:
            v = res["verdict"]
            lines.append(f"{res['device']}: {v['bound']}-bound ({res['spans']} spans"
                         + (f", {res['dropped']} dropped" if res["dropped"] else "") + f"): {v['reason']}")
            lines.append(f"  remedy: {v['remedy']}")
            for g in res["groups"][:top]:
                lines.append(f"  {g['group']:<28} {g['bound']:<8} {g['window_s'] * 1e3:9.3f} ms  {g['reason']}")
            lines.append(f"  SQLite: {res['sqlite']}  Chrome trace: {res['chrome']}")
        return "\n".join(lines) if lines else "nothing was profiled"


def profile(contexts=None, capacity=1 << 16, out_dir=None, roofs=True):
    """`with fastpath.profile() as p:` traces every context (or those given) for the block; see the
    module's docstring."""
    return Profile(contexts, capacity, out_dir, roofs)
