"""fastpath.comm without a GPU: availability, the unique id, the errors of a
communicator on a CPU context and of bad arguments, the config mirrors'
defaults. (The ctypes mirrors' layouts are checked against comm.h in
test_struct_offsets.py; collectives need a GPU or the emulated NCCL.)"""
import ctypes

import pytest

import fastpath
from fastpath import comm


def test_comm_available_is_a_bool():
    assert isinstance(comm.comm_available(), bool)
    v, origin = comm.nccl_version()
    if comm.comm_available():
        assert v >= 21800 and origin
    else:
        assert (v, origin) == (0, None)
    assert "comm" in fastpath.__all__ and fastpath.comm is comm


def _unique_id_or_skip():
    if not comm.comm_available():
        pytest.skip("libfastpath built without NCCL")
    try:
        return comm.unique_id()
    except fastpath.FastpathError as e:  # NCCL may want a network interface or a device
        pytest.skip(f"ncclGetUniqueId failed here: {e}")


def test_unique_id_is_128_fresh_bytes():
    a = _unique_id_or_skip()
    b = comm.unique_id()
    assert isinstance(a, bytes) and len(a) == comm.ID_BYTES == 128
    assert a != b


def test_without_nccl_calls_raise_unsupported():
    if comm.comm_available():
        pytest.skip("libfastpath built with NCCL")
    with pytest.raises(fastpath.FastpathError) as e:
        comm.unique_id()
    assert e.value.status == fastpath.Status.UNSUPPORTED


def test_comm_on_a_cpu_context_raises_a_clear_error():
    uid = bytes(comm.ID_BYTES)  # any id: the context is refused before NCCL is asked
    with fastpath.Context("cpu") as ctx:
        with pytest.raises(fastpath.FastpathError) as e:
            comm.Comm(ctx, uid, nranks=1, rank=0, init_timeout_ms=1000)
    if comm.comm_available():
        assert e.value.status == fastpath.Status.INVALID_ARGUMENT
        assert "CPU" in e.value.detail or "cpu" in e.value.detail, e.value.detail
    else:
        assert e.value.status == fastpath.Status.UNSUPPORTED


@pytest.mark.parametrize("bad", [b"short", "x" * 128, None, bytes(129)])
def test_comm_rejects_an_id_that_is_not_128_bytes(bad):
    with fastpath.Context("cpu") as ctx:
        with pytest.raises(ValueError, match="128 bytes"):
            comm.Comm(ctx, bad, nranks=1, rank=0)


@pytest.mark.parametrize("nranks,rank", [(0, 0), (2, 2), (1, -1)])
def test_comm_rejects_bad_ranks(nranks, rank):
    if not comm.comm_available():
        pytest.skip("libfastpath built without NCCL")
    with fastpath.Context("cpu") as ctx:
        with pytest.raises(fastpath.FastpathError) as e:
            comm.Comm(ctx, bytes(128), nranks=nranks, rank=rank)
    assert e.value.status == fastpath.Status.INVALID_ARGUMENT


def test_config_defaults_through_the_library():
    if not fastpath._lib.has("fp_comm_config_default_sized"):
        pytest.skip("libfastpath built without the comm module")
    cfg = comm.CommConfig()
    fastpath.check(fastpath.lib.fp_comm_config_default_sized(ctypes.byref(cfg), ctypes.sizeof(cfg)))
    assert cfg.struct_size == ctypes.sizeof(cfg)
    assert cfg.init_timeout_ms == 60000 and cfg.timeout_ms == 300000 and cfg.ledger_entries == 4096
    b = comm.BucketsConfig()
    fastpath.check(fastpath.lib.fp_buckets_config_default_sized(ctypes.byref(b), ctypes.sizeof(b)))
    assert b.bucket_cap_bytes == 25 << 20 and b.first_bucket_cap_bytes == 1 << 20
    assert b.op == comm.REDUCE_OPS["sum"] and b.flat_views == 0
    s = comm.CommStats()
    fastpath.check(fastpath.lib.fp_comm_stats_init_sized(ctypes.byref(s), ctypes.sizeof(s)))
    assert s.struct_size == ctypes.sizeof(s)


def test_buffer_arguments_are_checked_before_the_library():
    # a pointer needs count=; a non-pointer, non-tensor is a TypeError
    with pytest.raises(ValueError, match="count"):
        comm._buffer(0x1000, None, None, "send")
    with pytest.raises(TypeError):
        comm._buffer("0x1000", 4, "f32", "send")
    with pytest.raises(TypeError):
        comm._buffer(True, 4, "f32", "send")
    assert comm._buffer(0x1000, 4, "bf16", "send") == (0x1000, 4, fastpath.DTYPES["bf16"], None)


class _Device:
    def __init__(self, type_):
        self.type = type_

    def __str__(self):
        return self.type


class _FakeTensor:
    """What _buffer reads off a torch tensor (torch itself is not imported:
    a libfastpath linked with another NCCL than torch's, loaded first, can
    make `import torch` fail in the same process)."""

    def __init__(self, dtype, device, n=4, contiguous=True):
        self.dtype, self.device, self._n, self._contiguous = dtype, _Device(device), n, contiguous

    def data_ptr(self):
        return 0x2000

    def numel(self):
        return self._n

    def is_contiguous(self):
        return self._contiguous


_FakeTensor.__module__ = "torch.fake"


def test_torch_like_tensors_are_checked():
    with pytest.raises(ValueError, match="CUDA tensor"):
        comm._buffer(_FakeTensor("torch.float32", "cpu"), None, None, "send")
    with pytest.raises(TypeError, match="not supported"):
        comm._buffer(_FakeTensor("torch.int32", "cuda"), None, None, "send")
    with pytest.raises(ValueError, match="contiguous"):
        comm._buffer(_FakeTensor("torch.float16", "cuda", contiguous=False), None, None, "send")
    with pytest.raises(ValueError, match="exceeds"):
        comm._buffer(_FakeTensor("torch.bfloat16", "cuda", n=4), 5, None, "send")


def test_names_match_the_library():
    lib = fastpath.lib
    if not fastpath._lib.has("fp_coll_kind_name"):
        pytest.skip("libfastpath built without the comm module")
    lib.fp_coll_kind_name.restype = ctypes.c_char_p
    lib.fp_coll_kind_name.argtypes = [ctypes.c_int]
    lib.fp_reduce_op_name.restype = ctypes.c_char_p
    lib.fp_reduce_op_name.argtypes = [ctypes.c_int]
    for name, k in comm.COLL_KINDS.items():
        assert lib.fp_coll_kind_name(k).decode() == name
    for name, op in comm.REDUCE_OPS.items():
        assert lib.fp_reduce_op_name(op).decode() == name
