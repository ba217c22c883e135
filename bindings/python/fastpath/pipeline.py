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

__all__ = ["available", "copy_bandwidth", "Prefetcher", "HOST_MEMORY_KINDS", "DIRECTIONS"]

c_int, c_size_t, c_double, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_double, ctypes.c_void_p
P = ctypes.POINTER

HOST_MEMORY_KINDS = {"pageable": 0, "pinned": 1, "registered": 2, "write_combined": 3}  # fp_host_memory_kind
DIRECTIONS = {"h2d": 0, "d2h": 1}                                                      # fp_copy_direction


def _declare():
    sig = _lib._sig_opt
    sig("fp_host_memory_kind_name", ctypes.c_char_p, c_int)
    sig("fp_copy_bandwidth", c_int, c_void_p, c_int, c_int, c_size_t, P(_lib.TimingConfig), P(c_double),
        P(_lib.Stats))
    # The pipeline itself (fp_pipeline_create / submit / flush / cancel /
    # close / destroy, its config and stats structs, fp_pipeline_validate):
    # declared here, with a Pipeline class below, once its C implementation
    # is in the library.


_declare()
_AVAILABLE = _lib.has("fp_copy_bandwidth")  # the loaded library never changes


def available():
    """True when libfastpath was built with the pipeline capability."""
    return _AVAILABLE


def _need():
    if not _AVAILABLE:
        raise RuntimeError("libfastpath was built without the pipeline capability "
                           "(FASTPATH_MODULES must include 'pipeline')")


def _choice(value, table, what):
    if value not in table:
        raise ValueError(f"{what} must be one of {sorted(table)}, got {value!r}")
    return table[value]


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


# ---- the pipeline ----------------------------------------------------------------------
# (fp_pipeline_*: the Pipeline class goes here with its C implementation.)


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
