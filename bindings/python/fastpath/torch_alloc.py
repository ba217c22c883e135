"""fastpath's caching allocator as PyTorch's CUDA allocator
(torch.cuda.memory.CUDAPluggableAllocator over fp_torch_malloc_or_throw / fp_torch_free,
include/fastpath/alloc.h).

    import fastpath.torch_alloc as fta
    fta.use_fastpath_allocator({"max_split_size": 256 << 20})   # first thing, before any CUDA tensor
    import torch
    x = torch.empty(1 << 20, device="cuda")                     # served by libfastpath
    fta.stats(0)["reserved_bytes"]["peak"]                      # torch.cuda.memory_stats() raises now

One caching allocator per device, created on the first allocation on that
device (device memory + CUDA events, the configuration given here).

What PyTorch does not route to a pluggable allocator, and what to use instead:
  - tensor.record_stream(s) is a no-op: call record_stream(tensor, s) from
    this module instead (or order the streams yourself before the tensor's
    last reference goes), else a block freed while another stream still uses
    it can be handed out again on its allocation stream at once.
  - torch.cuda.empty_cache() does nothing: call empty_cache() here.
  - torch.cuda.memory_stats() / memory_snapshot() / reset_peak_memory_stats()
    raise: use stats(device), snapshot(device), reset_peak(device).
  - CUDA graph capture gets no private pool: do not capture graphs with this
    allocator installed.
  - A failed allocation returns NULL to PyTorch, which (2.x) does not check it:
    the error surfaces at the tensor's first use rather than as
    torch.cuda.OutOfMemoryError; stats(device)["ooms"] counts them.

Everything except use_fastpath_allocator works without torch (ctypes only).
"""
import ctypes
import os

from . import _lib
from ._lib import lib
from . import alloc as _fa

__all__ = ["MALLOC_SYMBOL", "FREE_SYMBOL", "available", "library_path", "configure",
           "use_fastpath_allocator", "is_installed", "stats", "snapshot", "reset_peak",
           "empty_cache", "record_stream"]

MALLOC_SYMBOL = "fp_torch_malloc_or_throw"  # throws (RuntimeError in torch) where fp_torch_malloc returns NULL
FREE_SYMBOL = "fp_torch_free"

c_int, c_void_p, c_ssize_t = ctypes.c_int, ctypes.c_void_p, ctypes.c_ssize_t
P = ctypes.POINTER

_STATUS_NOT_FOUND = 12


def _declare():
    sig = _lib._sig_opt
    sig("fp_torch_malloc", c_void_p, c_ssize_t, c_int, c_void_p)
    sig("fp_torch_free", None, c_void_p, c_ssize_t, c_int, c_void_p)
    sig("fp_torch_record_stream", None, c_void_p, c_void_p)
    sig("fp_torch_empty_cache", None)
    sig("fp_torch_allocator_configure", c_int, P(_fa.Config))
    sig("fp_torch_allocator_get", c_int, c_int, P(c_void_p))


_declare()

_installed = None  # the CUDAPluggableAllocator once installed (torch keeps using it)


def available():
    """True when libfastpath exports the pluggable-allocator entry points."""
    return all(_lib.has(s) for s in (MALLOC_SYMBOL, FREE_SYMBOL, "fp_torch_allocator_configure",
                                     "fp_torch_allocator_get"))


def _need():
    if not available():
        raise RuntimeError("libfastpath was built without the PyTorch allocator entry points "
                           "(fp_torch_malloc / fp_torch_free: alloc module)")


def _check(status):
    from . import check  # late: fastpath/__init__ imports alloc, which this module uses
    check(status)


def library_path():
    """The path libfastpath was loaded from (what CUDAPluggableAllocator gets:
    it dlopens the same file, so both see the same per-device instances)."""
    name = lib._name
    return os.path.abspath(name) if os.sep in name else name  # a bare soname: the loader finds it


def _device_index(device):
    """int, None (0), "cuda[:N]" or a torch.device -> the CUDA ordinal."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        if device == "cuda":
            return 0
        if device.startswith("cuda:") and device[5:].isdigit() and device[5:].isascii():
            return int(device[5:])
    elif getattr(device, "type", None) == "cuda":  # torch.device
        return device.index or 0
    raise ValueError(f"device must be an int, 'cuda[:N]' or a torch.device, got {device!r}")


def configure(config=None, **kwargs):
    """fp_torch_allocator_configure: the configuration every per-device
    instance is created with. config: None (defaults), an
    fastpath.alloc.Config, or a dict of fastpath.alloc.make_config keyword
    arguments (max_split_size, max_non_split_rounding, divisions,
    memory_cap_bytes, memory_fraction, garbage_collection_threshold,
    event_ring_size); keyword arguments are merged into the dict. Raises
    FastpathError (INVALID_ARGUMENT) for a bad configuration or once anything
    was allocated (the instances exist then)."""
    _need()
    if isinstance(config, _fa.Config):
        if kwargs:
            raise TypeError("pass either a Config or keyword arguments, not both")
        cfg = config
    elif config is None and not kwargs:
        cfg = None
    else:
        merged = dict(config or {})
        merged.update(kwargs)
        cfg = _fa.make_config(**merged)
    _check(lib.fp_torch_allocator_configure(ctypes.byref(cfg) if cfg is not None else None))


def use_fastpath_allocator(config=None):
    """Makes libfastpath PyTorch's CUDA allocator for this process: configure(config),
    then torch.cuda.memory.change_current_allocator(CUDAPluggableAllocator(
    library_path(), "fp_torch_malloc_or_throw", "fp_torch_free")). Returns the
    CUDAPluggableAllocator. Must run before PyTorch initialises CUDA (before
    the first CUDA tensor, torch.cuda.synchronize(), ...): raises RuntimeError
    otherwise, and when torch has no CUDA. A second call returns the installed
    allocator (with config None; another config raises, as the instances may
    already exist)."""
    global _installed
    _need()
    import torch  # needs torch; everything else in this module does not
    if _installed is not None:
        if config is not None:
            raise RuntimeError("fastpath allocator already installed: its configuration is fixed "
                               "(call use_fastpath_allocator(config) once, first)")
        return _installed
    if not torch.cuda.is_available():
        raise RuntimeError("use_fastpath_allocator: torch has no usable CUDA device")
    if torch.cuda.is_initialized():
        raise RuntimeError("use_fastpath_allocator must be called before PyTorch initialises CUDA "
                           "(before the first CUDA tensor or torch.cuda call that allocates); "
                           "PyTorch cannot swap an allocator that is already in use: call it "
                           "at the top of the program")
    configure(config)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(library_path(), MALLOC_SYMBOL, FREE_SYMBOL)
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError("use_fastpath_allocator: PyTorch refused to change its CUDA allocator "
                           f"(already initialised?): {e}") from e
    _installed = alloc
    return alloc


def is_installed():
    """True once use_fastpath_allocator succeeded in this process."""
    return _installed is not None


def _instance(device):
    """The per-device fp_allocator handle, or None while nothing was allocated
    on that device. FastpathError NO_DEVICE for a device that does not exist."""
    _need()
    h = c_void_p()
    st = lib.fp_torch_allocator_get(_device_index(device), ctypes.byref(h))
    if st == _STATUS_NOT_FOUND:
        return None
    _check(st)
    return h


def stats(device=None):
    """device: an int (None: 0), "cuda[:N]" or a torch.device. The
    statistics of device's instance as fastpath.alloc.Allocator.stats()
    returns them (current/peak/total/freed of allocated, requested,
    reserved, active and inactive-split bytes and counts, upstream calls,
    cache hits/misses, retries, ooms, "pools"), or None while nothing was
    allocated on that device."""
    h = _instance(device)
    if h is None:
        return None
    st = _fa.Stats()
    st.struct_size = ctypes.sizeof(_fa.Stats)
    _check(lib.fp_alloc_get_stats(h, ctypes.byref(st)))
    return _fa._stats_dict(st)


def snapshot(device=None):
    """fp_alloc_snapshot_json of device's instance, parsed (None while
    nothing was allocated on that device)."""
    import json
    h = _instance(device)
    if h is None:
        return None
    p = c_void_p()
    _check(lib.fp_alloc_snapshot_json(h, ctypes.byref(p)))
    try:
        return json.loads(ctypes.string_at(p.value).decode())
    finally:
        lib.fp_alloc_json_free(p)


def reset_peak(device=None):
    """Sets every peak of device's instance to its current value (no-op
    while nothing was allocated on that device)."""
    h = _instance(device)
    if h is not None:
        _check(lib.fp_alloc_reset_peak(h))


def empty_cache():
    """Returns every cached, unused segment of every instance to CUDA
    (torch.cuda.empty_cache() does not reach a pluggable allocator)."""
    _need()
    lib.fp_torch_empty_cache()


def record_stream(tensor, stream):
    """What tensor.record_stream(stream) does with PyTorch's own allocator:
    the block behind `tensor` is reused only after the work queued on
    `stream` when it is freed has completed. tensor: a torch.Tensor from the
    installed allocator (or a raw pointer int); stream: a torch.cuda.Stream
    (or a raw cudaStream_t int). Unknown pointers are ignored."""
    _need()
    if hasattr(tensor, "untyped_storage"):
        ptr = tensor.untyped_storage().data_ptr()  # the block's start, also for a view
    elif hasattr(tensor, "data_ptr"):
        ptr = tensor.data_ptr()
    else:
        ptr = int(tensor)
    handle = stream.cuda_stream if hasattr(stream, "cuda_stream") else stream
    if ptr:
        lib.fp_torch_record_stream(ptr, handle or None)
