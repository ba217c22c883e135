"""Multi-GPU communication (include/fastpath/comm.h) from Python: NCCL
communicators with a ledger and statistics on every collective, a watchdog
that aborts a hung one, and bucketed all-reduce overlapped with compute.

    import fastpath, fastpath.comm as fpc
    ctx = fastpath.Context("cuda:0")
    uid = fpc.unique_id()                     # rank 0 makes it, every rank gets the same bytes
    with fpc.Comm(ctx, uid, nranks=1, rank=0) as comm:
        comm.allreduce(t)                     # a torch tensor (in place), or pointers:
        comm.allreduce(send_ptr, recv_ptr, count=n, dtype="f32")
        comm.stats()["allreduce"]["busbw_gbps"], comm.ledger()[-1]["state"]
        comm.bench("allreduce", 64 << 20)     # nccl-tests' algbw / busbw at one size

        b = fpc.Buckets(comm, grads)          # register once (torch tensors, in ready order)
        for i in range(len(grads)):           # each iteration
            ...produce grads[i]...
            b.mark_ready(i)                   # its bucket reduces on comm's stream once full
        b.wait()                              # torch's stream waits for every bucket

Buffers are ints (device pointers, with count= and dtype=) or torch CUDA
tensors (data_ptr, numel and dtype f32 / f16 / bf16 read off the tensor;
work is enqueued on torch.cuda.current_stream() unless stream= is given).
With ints and no stream, work goes to the context's stream.

comm_available() is False when libfastpath was built without NCCL (or
without the comm module): then every other call raises FastpathError
(UNSUPPORTED) or RuntimeError. Errors from the library raise
FastpathError; bad arguments of the Python layer ValueError / TypeError.
"""
import ctypes
import importlib.util
import os

import fastpath as _pkg  # the package: it imports this module after defining what is used here
from . import _lib
from ._lib import lib

def _prefer_pips_nccl():
    """libfastpath loads NCCL at its first communication call, preferring a
    libnccl.so.2 the process already has. PyTorch's wheels bring their own
    (pip's nvidia-nccl, often newer than the CUDA toolkit's): when that one
    is installed and the user has not chosen (FASTPATH_NCCL_LIB), point the
    library at it, so that importing torch after communicating does not
    find an older NCCL already loaded."""
    if os.environ.get("FASTPATH_NCCL_LIB"):
        return
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return
    for d in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(d, "lib", "libnccl.so.2")
        if os.path.exists(path):
            os.environ["FASTPATH_NCCL_LIB"] = path
            return


_prefer_pips_nccl()


__all__ = ["comm_available", "nccl_version", "unique_id", "Comm", "Buckets", "COLL_KINDS", "REDUCE_OPS", "COLL_STATES",
           "ID_BYTES"]

c_int, c_size_t, c_double, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_double, ctypes.c_void_p
c_u64, c_i64 = ctypes.c_uint64, ctypes.c_int64
P = ctypes.POINTER

ID_BYTES = 128                                                              # FP_COMM_ID_BYTES
COLL_KINDS = {"allreduce": 0, "allgather": 1, "reduce_scatter": 2, "broadcast": 3}  # fp_coll_kind
REDUCE_OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3}                       # fp_reduce_op
COLL_STATES = {0: "enqueued", 1: "started", 2: "ended", 3: "aborted"}       # fp_coll_state


class CommId(ctypes.Structure):
    """fp_comm_id."""
    _fields_ = [("bytes", ctypes.c_ubyte * ID_BYTES)]


class FailureInfo(ctypes.Structure):
    """fp_comm_failure_info."""
    _fields_ = [("status", c_int), ("seq", c_u64), ("nranks", c_int), ("missing", c_int * 64), ("nmissing", c_int),
                ("not_visible", c_int), ("message", ctypes.c_char_p)]


FAILURE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, P(FailureInfo))   # fp_comm_failure_fn


class CommConfig(ctypes.Structure):
    """fp_comm_config."""
    _fields_ = [("struct_size", c_size_t), ("init_timeout_ms", c_i64), ("timeout_ms", c_i64),
                ("ledger_entries", c_int), ("on_failure", FAILURE_FN), ("user", c_void_p)]


class CollRecord(ctypes.Structure):
    """fp_coll_record."""
    _fields_ = [("seq", c_u64), ("kind", c_int), ("dtype", c_int), ("count", c_size_t), ("op", c_int),
                ("root", c_int), ("state", c_int), ("enqueue_ms", c_double), ("start_ms", c_double),
                ("duration_ms", c_double)]


class CollStats(ctypes.Structure):
    """fp_coll_stats."""
    _fields_ = [("calls", c_u64), ("bytes", c_double), ("busy_ms", c_double), ("latency", _lib.Stats),
                ("p99_ms", c_double), ("algbw_gbps", c_double), ("busbw_gbps", c_double)]


class CommStats(ctypes.Structure):
    """fp_comm_stats."""
    _fields_ = [("struct_size", c_size_t), ("kind", CollStats * len(COLL_KINDS)), ("enqueued", c_u64),
                ("ended", c_u64), ("aborted", c_u64), ("exposed_ms", c_double), ("iterations", c_u64)]


class CollBench(ctypes.Structure):
    """fp_coll_bench."""
    _fields_ = [("latency", _lib.Stats), ("bytes", c_double), ("algbw_gbps", c_double), ("busbw_gbps", c_double)]


class CommTensor(ctypes.Structure):
    """fp_comm_tensor."""
    _fields_ = [("data", c_void_p), ("count", c_size_t), ("dtype", c_int)]


class BucketsConfig(ctypes.Structure):
    """fp_buckets_config."""
    _fields_ = [("struct_size", c_size_t), ("bucket_cap_bytes", c_size_t), ("first_bucket_cap_bytes", c_size_t),
                ("op", c_int), ("flat_views", c_int)]


def _declare():
    sig = _lib._sig_opt
    sig("fp_comm_available", c_int)
    sig("fp_comm_nccl_version", c_int, P(ctypes.c_char_p))
    sig("fp_comm_get_unique_id", c_int, P(CommId))
    sig("fp_comm_config_default_sized", c_int, P(CommConfig), c_size_t)
    sig("fp_comm_init", c_int, c_void_p, P(CommId), c_int, c_int, P(CommConfig), P(c_void_p))
    sig("fp_comm_abort", c_int, c_void_p)
    sig("fp_comm_destroy", None, c_void_p)
    sig("fp_comm_rank", c_int, c_void_p)
    sig("fp_comm_nranks", c_int, c_void_p)
    sig("fp_comm_stream", c_void_p, c_void_p)
    sig("fp_comm_synchronize", c_int, c_void_p, c_i64)
    sig("fp_comm_failure", c_int, c_void_p, ctypes.c_char_p, c_size_t)
    sig("fp_comm_allreduce", c_int, c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p)
    sig("fp_comm_allgather", c_int, c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_void_p)
    sig("fp_comm_reduce_scatter", c_int, c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p)
    sig("fp_comm_broadcast", c_int, c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p)
    sig("fp_comm_ledger", c_int, c_void_p, P(CollRecord), c_int, P(c_int))
    sig("fp_comm_stats_init_sized", c_int, P(CommStats), c_size_t)
    sig("fp_comm_get_stats", c_int, c_void_p, P(CommStats))
    sig("fp_comm_reset_stats", c_int, c_void_p)
    sig("fp_comm_bench", c_int, c_void_p, c_int, c_size_t, c_int, P(_lib.TimingConfig), P(CollBench))
    sig("fp_buckets_config_default_sized", c_int, P(BucketsConfig), c_size_t)
    sig("fp_buckets_create", c_int, c_void_p, P(CommTensor), c_int, P(BucketsConfig), P(c_void_p))
    sig("fp_buckets_count", c_int, c_void_p)
    sig("fp_buckets_tensor_bucket", c_int, c_void_p, c_int, P(c_int), P(c_size_t))
    sig("fp_buckets_tensor_data", c_int, c_void_p, c_int, P(c_void_p))
    sig("fp_buckets_mark_ready", c_int, c_void_p, c_int, c_void_p, c_void_p)
    sig("fp_buckets_wait", c_int, c_void_p, c_void_p)
    sig("fp_buckets_destroy", None, c_void_p)


_declare()
_HAS_MODULE = _lib.has("fp_comm_available")  # the loaded library never changes


def comm_available():
    """True when libfastpath was built with the communication module and NCCL."""
    return bool(_HAS_MODULE and lib.fp_comm_available())


def nccl_version():
    """(version, where it was loaded from) of the NCCL in use, e.g.
    (22803, 'libnccl.so.2 on the library path'); (0, None) without one."""
    if not _HAS_MODULE:
        return 0, None
    origin = ctypes.c_char_p()
    v = lib.fp_comm_nccl_version(ctypes.byref(origin))
    return int(v), (origin.value.decode() if origin.value else None)


def _need():
    if not _HAS_MODULE:
        raise RuntimeError("libfastpath was built without the comm capability "
                           "(FASTPATH_MODULES must include 'comm')")


_choice = _lib.choice


def unique_id():
    """A fresh NCCL unique id (128 bytes): rank 0 makes it and hands the same
    bytes to every rank's Comm."""
    _need()
    uid = CommId()
    lib.fp_clear_error()
    _pkg.check(lib.fp_comm_get_unique_id(ctypes.byref(uid)))
    return bytes(uid.bytes)


# ---- buffers -----------------------------------------------------------------------------

_TORCH_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _torch_stream(t):
    import torch
    return torch.cuda.current_stream(t.device).cuda_stream


def _buffer(x, count, dtype, what):
    """(pointer, elements, fp_dtype, stream of a torch tensor or None) of a
    torch tensor or an int pointer (count and dtype then say its size)."""
    if _is_torch(x):
        name = _TORCH_DTYPES.get(str(x.dtype))
        if name is None:
            raise TypeError(f"{what}: dtype {x.dtype} is not supported (float32, float16, bfloat16)")
        if not x.is_contiguous():
            raise ValueError(f"{what}: the tensor must be contiguous")
        if x.device.type != "cuda":
            raise ValueError(f"{what}: a CUDA tensor is needed, got one on {x.device}")
        n = x.numel()
        if count is not None and count > n:
            raise ValueError(f"{what}: count {count} exceeds the tensor's {n} elements")
        return x.data_ptr(), n, _pkg.dtype_id(name), _torch_stream(x)
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{what} must be a device pointer (int) or a torch tensor, got {type(x).__name__}")
    if count is None:
        raise ValueError(f"{what}: count= is needed with a pointer")
    return _lib.c_int_value(c_void_p, x, what), count, _pkg.dtype_id(dtype or "f32"), None


def _stream_arg(stream, inferred):
    if stream is None:
        return inferred
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(f"stream must be an int handle or a torch.cuda.Stream, got {type(stream).__name__}")
    return handle


def _record_dict(r):
    return {"seq": r.seq, "kind": _name(COLL_KINDS, r.kind), "dtype": _name(_pkg.DTYPES, r.dtype),
            "count": r.count, "op": _name(REDUCE_OPS, r.op), "root": r.root,
            "state": COLL_STATES.get(r.state, str(r.state)), "enqueue_ms": r.enqueue_ms, "start_ms": r.start_ms,
            "duration_ms": r.duration_ms}


def _name(table, value):
    for k, v in table.items():
        if v == value:
            return k
    return str(value)


# ---- communicators -------------------------------------------------------------------------

class Comm(_lib.Closeable):
    """fp_comm: one rank of an NCCL communicator on ctx's device (a CUDA
    context). Every rank of `nranks` constructs one with the same `id`
    (unique_id()'s bytes); construction returns once all have, or raises
    TIMEOUT after init_timeout_ms. A collective that started and has not
    ended after timeout_ms is aborted by the watchdog (failure() says which
    ranks did not enter it); < 0 turns either limit off."""

    def __init__(self, ctx, id, nranks, rank, timeout_ms=300000, init_timeout_ms=60000, ledger_entries=None):
        _need()
        self.ctx = ctx  # must outlive the communicator
        self._h = c_void_p()
        if not isinstance(id, (bytes, bytearray)) or len(id) != ID_BYTES:
            raise ValueError(f"id must be {ID_BYTES} bytes (unique_id()), got {type(id).__name__}"
                             + (f" of {len(id)}" if isinstance(id, (bytes, bytearray)) else ""))
        uid = CommId()
        ctypes.memmove(uid.bytes, bytes(id), ID_BYTES)
        cfg = CommConfig()
        _pkg.check(lib.fp_comm_config_default_sized(ctypes.byref(cfg), ctypes.sizeof(cfg)))
        _lib.set_ints(cfg, timeout_ms=timeout_ms, init_timeout_ms=init_timeout_ms)
        if ledger_entries is not None:
            _lib.set_ints(cfg, ledger_entries=ledger_entries)
        lib.fp_clear_error()
        _pkg.check(lib.fp_comm_init(ctx.handle, ctypes.byref(uid), _lib.c_int_value(c_int, nranks, "nranks"),
                                    _lib.c_int_value(c_int, rank, "rank"), ctypes.byref(cfg),
                                    ctypes.byref(self._h)))

    def _comm(self):
        if not self._h:
            raise ValueError("communicator is closed")
        return self._h

    @property
    def rank(self):
        return lib.fp_comm_rank(self._comm())

    @property
    def nranks(self):
        return lib.fp_comm_nranks(self._comm())

    @property
    def stream(self):
        """The communicator's own stream (an int cudaStream_t handle)."""
        return lib.fp_comm_stream(self._comm()) or 0

    # -- collectives --
    def allreduce(self, send, recv=None, count=None, dtype=None, op="sum", stream=None):
        """recv = op over the ranks of send (recv None: in place)."""
        sp, n, dt, s = _buffer(send, count, dtype, "send")
        rp = sp if recv is None else _buffer(recv, count if count is not None else n, dtype, "recv")[0]
        self._call(lib.fp_comm_allreduce, sp, rp, count if count is not None else n, dt,
                   _choice(op, REDUCE_OPS, "op"), _stream_arg(stream, s))

    def allgather(self, send, recv, count=None, dtype=None, stream=None):
        """recv (nranks x count) gets every rank's send (count elements; a
        tensor's numel by default) at rank x count."""
        sp, n, dt, s = _buffer(send, count, dtype, "send")
        n = count if count is not None else n
        rp = _buffer(recv, n * self.nranks, dtype, "recv")[0]
        self._call(lib.fp_comm_allgather, sp, rp, n, dt, _stream_arg(stream, s))

    def reduce_scatter(self, send, recv, count=None, dtype=None, op="sum", stream=None):
        """send holds nranks x count elements; recv (count: a tensor's numel
        by default) gets block `rank` reduced over the ranks."""
        rp, n, dt, s = _buffer(recv, count, dtype, "recv")
        n = count if count is not None else n
        sp = _buffer(send, n * self.nranks, dtype, "send")[0]
        self._call(lib.fp_comm_reduce_scatter, sp, rp, n, dt, _choice(op, REDUCE_OPS, "op"), _stream_arg(stream, s))

    def broadcast(self, send, recv=None, count=None, dtype=None, root=0, stream=None):
        """root's send into every rank's recv (recv None: in place)."""
        sp, n, dt, s = _buffer(send, count, dtype, "send")
        rp = sp if recv is None else _buffer(recv, count if count is not None else n, dtype, "recv")[0]
        self._call(lib.fp_comm_broadcast, sp, rp, count if count is not None else n, dt,
                   _lib.c_int_value(c_int, root, "root"), _stream_arg(stream, s))

    def _call(self, fn, *args):
        h = self._comm()
        args = [_lib.c_int_value(c_size_t, a, "count") if i == 2 else a for i, a in enumerate(args)]
        lib.fp_clear_error()
        _pkg.check(fn(h, *args))

    def synchronize(self, timeout_ms=-1):
        """Waits for every collective enqueued so far (TIMEOUT after timeout_ms)."""
        lib.fp_clear_error()
        _pkg.check(lib.fp_comm_synchronize(self._comm(), int(timeout_ms)))

    # -- ledger and statistics --
    def stats(self, reset=False):
        """fp_comm_stats as a dict: per collective kind ("allreduce", ...) its
        calls, bytes, busy_ms, latency (a dict), p99_ms, algbw_gbps,
        busbw_gbps; and enqueued, ended, aborted, exposed_ms, iterations."""
        s = CommStats()
        _pkg.check(lib.fp_comm_stats_init_sized(ctypes.byref(s), ctypes.sizeof(s)))
        _pkg.check(lib.fp_comm_get_stats(self._comm(), ctypes.byref(s)))
        if reset:
            _pkg.check(lib.fp_comm_reset_stats(self._comm()))
        d = {}
        for name, k in COLL_KINDS.items():
            c = s.kind[k]
            d[name] = {"calls": c.calls, "bytes": c.bytes, "busy_ms": c.busy_ms,
                       "latency": _pkg._stats_dict(c.latency), "p99_ms": c.p99_ms, "algbw_gbps": c.algbw_gbps,
                       "busbw_gbps": c.busbw_gbps}
        d.update(enqueued=s.enqueued, ended=s.ended, aborted=s.aborted, exposed_ms=s.exposed_ms,
                 iterations=s.iterations)
        return d

    def reset_stats(self):
        _pkg.check(lib.fp_comm_reset_stats(self._comm()))

    def ledger(self, max_entries=4096):
        """The last collectives (oldest first), each a dict: seq, kind, dtype,
        count, op, root, state ("enqueued" / "started" / "ended" /
        "aborted"), enqueue_ms, start_ms, duration_ms."""
        m = _lib.c_int_value(c_int, max_entries, "max_entries")
        if m < 1:
            raise ValueError("max_entries must be >= 1")
        recs = (CollRecord * m)()
        n = c_int(0)
        _pkg.check(lib.fp_comm_ledger(self._comm(), recs, m, ctypes.byref(n)))
        return [_record_dict(recs[i]) for i in range(n.value)]

    def failure(self):
        """None while healthy; else (Status, the watchdog's report)."""
        buf = ctypes.create_string_buffer(8192)
        st = lib.fp_comm_failure(self._comm(), buf, len(buf))
        if st == 0:
            return None
        status = _pkg.Status(st) if st in _pkg.Status._value2member_map_ else st
        return status, buf.value.decode(errors="replace")

    def abort(self):
        """ncclCommAbort: pending collectives dropped; later calls fail (SHUT_DOWN)."""
        _pkg.check(lib.fp_comm_abort(self._comm()))

    def bench(self, kind, nbytes, dtype="f32", max_time_s=None, min_samples=None):
        """nccl-tests' measurement of one collective at nbytes (every rank
        calls it with the same arguments): a dict with latency (a dict of
        the per-call time), bytes, algbw_gbps, busbw_gbps."""
        k = _choice(kind, COLL_KINDS, "kind")
        out = CollBench()
        cfg = _pkg._config(max_time_s, min_samples)
        lib.fp_clear_error()
        _pkg.check(lib.fp_comm_bench(self._comm(), k, _lib.c_int_value(c_size_t, nbytes, "nbytes"),
                                     _pkg.dtype_id(dtype), ctypes.byref(cfg), ctypes.byref(out)))
        return {"latency": _pkg._stats_dict(out.latency), "bytes": out.bytes, "algbw_gbps": out.algbw_gbps,
                "busbw_gbps": out.busbw_gbps}

    def close(self):
        """Waits for the collectives enqueued so far, then releases the communicator."""
        if getattr(self, "_h", None):
            h, self._h = self._h, c_void_p()
            lib.fp_comm_destroy(h)


# ---- buckets -------------------------------------------------------------------------------

class Buckets(_lib.Closeable):
    """fp_buckets: tensors registered once, packed into buckets (caps in MiB;
    the first bucket has its own smaller cap so that communication starts
    early); each iteration, mark_ready(i) once tensor i is produced, and a
    full bucket is all-reduced on the communicator's stream while compute
    goes on; wait() makes the compute stream wait for all of them.

    tensors: torch CUDA tensors, or (pointer, count, dtype) tuples, listed
    in the order they become ready. flat_views=True: the buckets own the
    memory and tensor i lives at tensor_data(i) (pointers may be None)."""

    def __init__(self, comm, tensors, bucket_cap_mb=25, first_bucket_cap_mb=1, op="sum", flat_views=False):
        _need()
        self.comm = comm  # must outlive the buckets
        self._h = c_void_p()
        self._tensors = list(tensors)  # kept alive: the buckets use their memory
        if not self._tensors:
            raise ValueError("tensors is empty")
        arr = (CommTensor * len(self._tensors))()
        for i, t in enumerate(self._tensors):
            if _is_torch(t):
                ptr, n, dt, _ = _buffer(t, None, None, f"tensors[{i}]")
            else:
                try:
                    ptr, n, dt = t
                except (TypeError, ValueError):
                    raise TypeError(f"tensors[{i}] must be a torch tensor or a (pointer, count, dtype) tuple") \
                        from None
                if ptr is not None:
                    ptr = _lib.c_int_value(c_void_p, ptr, f"tensors[{i}] pointer")
                dt = _pkg.dtype_id(dt)
            arr[i].data, arr[i].count, arr[i].dtype = ptr, _lib.c_int_value(c_size_t, n, "count"), dt
        cfg = BucketsConfig()
        _pkg.check(lib.fp_buckets_config_default_sized(ctypes.byref(cfg), ctypes.sizeof(cfg)))
        if bucket_cap_mb <= 0 or first_bucket_cap_mb <= 0:
            raise ValueError("bucket_cap_mb and first_bucket_cap_mb must be > 0")
        cfg.bucket_cap_bytes = int(bucket_cap_mb * (1 << 20))
        cfg.first_bucket_cap_bytes = int(first_bucket_cap_mb * (1 << 20))
        cfg.op = _choice(op, REDUCE_OPS, "op")
        cfg.flat_views = 1 if flat_views else 0
        lib.fp_clear_error()
        _pkg.check(lib.fp_buckets_create(comm._comm(), arr, len(self._tensors), ctypes.byref(cfg),
                                         ctypes.byref(self._h)))

    def _b(self):
        if not self._h:
            raise ValueError("buckets are closed")
        return self._h

    @property
    def count(self):
        """How many buckets the tensors were packed into."""
        return lib.fp_buckets_count(self._b())

    def __len__(self):
        return len(self._tensors)

    def tensor_bucket(self, i):
        """(bucket index, offset in elements in it) of tensor i."""
        b, off = c_int(0), c_size_t(0)
        _pkg.check(lib.fp_buckets_tensor_bucket(self._b(), _lib.c_int_value(c_int, i, "i"), ctypes.byref(b),
                                                ctypes.byref(off)))
        return b.value, off.value

    def tensor_data(self, i):
        """Where tensor i lives (an int pointer): its own, or its view with flat_views."""
        p = c_void_p()
        _pkg.check(lib.fp_buckets_tensor_data(self._b(), _lib.c_int_value(c_int, i, "i"), ctypes.byref(p)))
        return p.value or 0

    def mark_ready(self, i, stream=None):
        """Tensor i is ready once the work enqueued so far on `stream` completes
        (default: torch's current stream for a torch tensor, else the
        context's stream)."""
        i = _lib.c_int_value(c_int, i, "i")
        t = self._tensors[i] if 0 <= i < len(self._tensors) else None
        inferred = _torch_stream(t) if stream is None and _is_torch(t) else None
        lib.fp_clear_error()
        _pkg.check(lib.fp_buckets_mark_ready(self._b(), i, None, _stream_arg(stream, inferred)))

    def wait(self, stream=None):
        """Ends the iteration: `stream` waits on the device for every bucket's
        reduction (default: torch's current stream if the tensors are torch's)."""
        first = next((t for t in self._tensors if _is_torch(t)), None)
        inferred = _torch_stream(first) if stream is None and first is not None else None
        lib.fp_clear_error()
        _pkg.check(lib.fp_buckets_wait(self._b(), _stream_arg(stream, inferred)))

    def close(self):
        if getattr(self, "_h", None):
            h, self._h = self._h, c_void_p()
            lib.fp_buckets_destroy(h)
