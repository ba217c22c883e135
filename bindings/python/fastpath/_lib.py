"""Loads libfastpath.so and declares the C signatures used by the bindings.

Search order: $FASTPATH_LIB (an explicit choice overrides everything), the
library bundled in this package (fastpath/libfastpath.so, put there by
`pip install .`), the build tree of the checkout this file sits in
(build/ or build-gpu/libfastpath.so), then the system loader (ldconfig /
LD_LIBRARY_PATH).
"""
import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

_here = Path(__file__).resolve().parent


def _candidates():
    env = os.environ.get("FASTPATH_LIB")
    if env:
        yield env
    bundled = _here / "libfastpath.so"
    if bundled.exists():
        yield str(bundled)
    root = _here.parent.parent.parent
    if (root / "CMakeLists.txt").exists():  # a checkout's bindings/python/fastpath
        for build in ("build", "build-gpu"):
            p = root / build / "libfastpath.so"
            if p.exists():
                yield str(p)
    found = ctypes.util.find_library("fastpath")
    if found:
        yield found


def load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:  # keep looking, report all at the end
            errors.append(f"{path}: {e}")
    raise OSError("libfastpath.so not found: set FASTPATH_LIB to its path, or install the "
                  "package with `pip install .` from the repository root (which bundles it)"
                  + ("; tried " + "; ".join(errors) if errors else ""))


lib = load()
c_int, c_size_t, c_double, c_void_p, c_char_p = (ctypes.c_int, ctypes.c_size_t, ctypes.c_double,
                                                  ctypes.c_void_p, ctypes.c_char_p)


class Stats(ctypes.Structure):
    _fields_ = [(n, c_double) for n in ("median_ms", "mean_ms", "min_ms", "max_ms", "p10_ms", "p90_ms",
                                        "stdev_ms", "rel_stdev", "noise")] + [("samples", c_int)]


class TimingConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("warmup", c_int), ("min_samples", c_int),
                ("max_samples", c_int), ("max_time_s", c_double), ("target_noise", c_double),
                ("min_effect", c_double), ("flush_l2", c_int), ("min_sample_ms", c_double),
                ("use_graph", c_int)]


class CompareResult(ctypes.Structure):
    _fields_ = [("max_abs_err", c_double), ("max_rel_err", c_double), ("atol", c_double),
                ("rtol", c_double), ("count", c_size_t), ("mismatches", c_size_t),
                ("first_bad", c_size_t), ("first_bad_got", c_double), ("first_bad_ref", c_double),
                ("passed", c_int)]


class ABReport(ctypes.Structure):
    _fields_ = [("baseline", Stats), ("optimized", Stats), ("speedup", c_double), ("verdict", c_int),
                ("compared", c_int), ("agreement", CompareResult), ("achieved_gbps", c_double),
                ("achieved_tflops", c_double), ("pct_of_peak", c_double), ("bound", c_char_p)]


class ABSpec(ctypes.Structure):
    pass


TIMED_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p)

ABSpec._fields_ = [("struct_size", c_size_t), ("baseline", TIMED_FN), ("baseline_user", c_void_p),
                   ("optimized", TIMED_FN), ("optimized_user", c_void_p),
                   ("baseline_out", c_void_p), ("optimized_out", c_void_p), ("out_count", c_size_t),
                   ("out_dtype", c_int), ("atol", c_double), ("rtol", c_double),
                   ("bytes", c_double), ("flops", c_double), ("flops_on_tensor_cores", c_int)]


class DeviceInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_int), ("index", c_int),
                ("name", ctypes.c_char * 256), ("cc_major", c_int), ("cc_minor", c_int),
                ("sm_count", c_int), ("total_mem_bytes", c_size_t), ("l2_bytes", c_size_t),
                ("mem_clock_khz", c_int), ("mem_bus_width_bits", c_int), ("sm_clock_khz", c_int),
                ("peak_gbps", c_double), ("peak_tflops_fp32", c_double), ("peak_tflops_bf16", c_double),
                ("driver_version", c_int), ("runtime_version", c_int)]


def _sig(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


P = ctypes.POINTER
_sig("fp_version", c_int)
_sig("fp_version_string", c_char_p)
_sig("fp_status_string", c_char_p, c_int)
_sig("fp_last_error", c_char_p)
_sig("fp_clear_error", None)
_sig("fp_device_count", c_int, P(c_int))
_sig("fp_device_info_init", None, P(DeviceInfo))
_sig("fp_device_get_info", c_int, c_int, P(DeviceInfo))
_sig("fp_cpu_get_info", c_int, P(DeviceInfo))
_sig("fp_context_create", c_int, c_int, c_int, P(c_void_p))
_sig("fp_context_destroy", None, c_void_p)
_sig("fp_context_kind", c_int, c_void_p)
_sig("fp_context_stream", c_void_p, c_void_p)
_sig("fp_context_device_info", c_int, c_void_p, P(DeviceInfo))
_sig("fp_context_synchronize", c_int, c_void_p, c_void_p)
_sig("fp_context_set_option", c_int, c_void_p, c_int, ctypes.c_int64)
_sig("fp_stats_compute", c_int, P(c_double), c_int, P(Stats))
_sig("fp_timing_config_default", None, P(TimingConfig))
_sig("fp_time", c_int, c_void_p, c_void_p, TIMED_FN, c_void_p, P(TimingConfig), P(Stats))
_sig("fp_verdict_string", c_char_p, c_int)
_sig("fp_verdict_decide", c_int, P(Stats), P(Stats), c_double, P(c_double))
_sig("fp_ab_spec_init", None, P(ABSpec))
_sig("fp_ab_run", c_int, c_void_p, c_void_p, P(ABSpec), P(TimingConfig), P(ABReport))
_sig("fp_compare_host", c_int, c_void_p, c_void_p, c_size_t, c_int, c_double, c_double, P(CompareResult))
_sig("fp_f32_to_bf16", ctypes.c_uint16, ctypes.c_float)
_sig("fp_bf16_to_f32", ctypes.c_float, ctypes.c_uint16)
_sig("fp_dtype_size", c_size_t, c_int)
_sig("fp_convert_host", c_int, c_void_p, c_int, c_void_p, c_int, c_size_t)
_sig("fp_default_tolerance", None, c_int, P(c_double), P(c_double))


# ---------------------------------------------------------------------------
# Optional capabilities: declared when the library was built with them
# (FASTPATH_MODULES). has(name) tells; the Python modules raise a clear error
# when a capability is missing instead of failing at import time.
# ---------------------------------------------------------------------------

def has(symbol):
    try:
        getattr(lib, symbol)
        return True
    except AttributeError:
        return False


def _sig_opt(name, restype, *argtypes):
    if has(name):
        _sig(name, restype, *argtypes)


i64 = ctypes.c_int64
c_float = ctypes.c_float


class NormParams(ctypes.Structure):
    """fp_norm_params (include/fastpath/norm.h), field for field."""
    _fields_ = [("struct_size", c_size_t), ("kind", c_int), ("activation", c_int),
                ("rows", i64), ("cols", i64),
                ("x_dtype", c_int), ("residual_dtype", c_int), ("out_dtype", c_int),
                ("param_dtype", c_int),
                ("x_stride", i64), ("residual_stride", i64), ("residual_out_stride", i64),
                ("out_stride", i64),
                ("x", c_void_p), ("residual", c_void_p), ("gamma", c_void_p), ("beta", c_void_p),
                ("bias", c_void_p),
                ("out", c_void_p), ("residual_out", c_void_p), ("mean", c_void_p), ("rstd", c_void_p),
                ("eps", c_float)]


class NormBackwardParams(ctypes.Structure):
    """fp_norm_backward_params (include/fastpath/norm.h), field for field."""
    _fields_ = [("struct_size", c_size_t), ("kind", c_int), ("activation", c_int),
                ("rows", i64), ("cols", i64), ("dtype", c_int), ("param_dtype", c_int),
                ("dout_stride", i64), ("x_stride", i64), ("dresidual_out_stride", i64),
                ("dx_stride", i64),
                ("dout", c_void_p), ("x", c_void_p), ("gamma", c_void_p), ("beta", c_void_p),
                ("bias", c_void_p), ("mean", c_void_p), ("rstd", c_void_p),
                ("dresidual_out", c_void_p),
                ("dx", c_void_p), ("dgamma", c_void_p), ("dbeta", c_void_p), ("dbias", c_void_p)]


class AttentionParams(ctypes.Structure):
    """fp_attention_params (include/fastpath/attention.h), field for field."""
    _fields_ = [("struct_size", c_size_t),
                ("batch", c_int), ("seqlen_q", c_int), ("seqlen_k", c_int), ("heads_q", c_int),
                ("heads_kv", c_int), ("head_dim", c_int), ("dtype", c_int),
                ("q", c_void_p), ("q_batch_stride", i64), ("q_seq_stride", i64), ("q_head_stride", i64),
                ("k", c_void_p), ("k_batch_stride", i64), ("k_seq_stride", i64), ("k_head_stride", i64),
                ("v", c_void_p), ("v_batch_stride", i64), ("v_seq_stride", i64), ("v_head_stride", i64),
                ("o", c_void_p), ("o_batch_stride", i64), ("o_seq_stride", i64), ("o_head_stride", i64),
                ("softmax_scale", c_float), ("causal", c_int), ("window_left", c_int),
                ("window_right", c_int),
                ("lse", c_void_p), ("seqlens_k", c_void_p), ("cu_seqlens_q", c_void_p),
                ("cu_seqlens_k", c_void_p),
                # added in 0.2: paged KV cache
                ("block_table", c_void_p), ("block_table_stride", c_int), ("page_size", c_int),
                ("num_pages", c_int),
                # added in 0.3: the rows of a varlen call's packed K / V
                ("total_k", i64),
                # added in 0.4: per-tensor descales of fp8 e4m3 inputs (0 = 1)
                ("q_descale", c_float), ("k_descale", c_float), ("v_descale", c_float),
                # 0.4's tail padding, named in the header (reserved_0_4) so that 0.5's
                # field starts at 0.4's sizeof; never read, always 0
                ("reserved_0_4", c_int),
                # added in 0.5: K / V dtype (fp8 KV cache)
                ("kv_dtype", c_int)]


class AttentionKernelInfo(ctypes.Structure):
    """fp_attention_kernel_info (include/fastpath/attention.h), field for field."""
    _fields_ = [("kernel", ctypes.c_char_p), ("version", c_int), ("num_splits", c_int), ("paged", c_int),
                ("preferred", c_int), ("fallback", ctypes.c_char * 256)]


_sig_opt("fp_norm_params_default", None, P(NormParams))
_sig_opt("fp_norm_backward_params_default", None, P(NormBackwardParams))
_sig_opt("fp_norm_forward", c_int, c_void_p, c_void_p, P(NormParams))
_sig_opt("fp_norm_backward", c_int, c_void_p, c_void_p, P(NormBackwardParams))
_sig_opt("fp_norm_validate", c_int, c_void_p, c_void_p, P(NormParams), P(TimingConfig), P(ABReport))
_sig_opt("fp_norm_backward_validate", c_int, c_void_p, c_void_p, P(NormBackwardParams),
         P(TimingConfig), P(ABReport))
_sig_opt("fp_norm_forward_bytes", c_double, P(NormParams))
_sig_opt("fp_norm_backward_bytes", c_double, P(NormBackwardParams))
_sig_opt("fp_attention_params_default", None, P(AttentionParams))
_sig_opt("fp_attention_params_init", c_int, P(AttentionParams), c_size_t)
_sig_opt("fp_attention_forward", c_int, c_void_p, c_void_p, P(AttentionParams))
_sig_opt("fp_attention_forward_baseline", c_int, c_void_p, c_void_p, P(AttentionParams))
_sig_opt("fp_attention_validate", c_int, c_void_p, c_void_p, P(AttentionParams), P(TimingConfig),
         P(ABReport))
_sig_opt("fp_attention_flops", c_double, P(AttentionParams))
_sig_opt("fp_attention_last_kernel", c_int, P(AttentionKernelInfo))


def _int_range(ctype):
    """(lo, hi) of the C integer type ctype, computed once per type."""
    r = _int_ranges.get(ctype)
    if r is None:
        bits = 8 * ctypes.sizeof(ctype)
        r = ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if ctype(-1).value < 0
             else (0, (1 << bits) - 1))
        _int_ranges[ctype] = r
    return r


_int_ranges = {}


def c_int_value(ctype, value, name):
    """int(value) when it fits the C integer type ctype, else ValueError
    naming the argument. ctypes keeps only the low bits of an integer that
    does not fit (2**32 + 1 in a c_int is 1, -1 in a c_size_t is SIZE_MAX),
    which would turn bad input into a different, valid one."""
    v = int(value)
    lo, hi = _int_range(ctype)
    if not lo <= v <= hi:
        raise ValueError(f"{name} = {v} is out of range for its C type {ctype.__name__} "
                         f"[{lo}, {hi}]")
    return v


def _field_range(cls, name):
    """(ctype, lo, hi) of integer field `name` of a ctypes struct class (its
    bases' fields too), computed once per field: set_ints runs on every call
    of the PyTorch drop-ins."""
    r = _field_ranges.get((cls, name))
    if r is None:
        types = {}
        for c in reversed(cls.__mro__):
            types.update(dict(getattr(c, "_fields_", ())))
        t = types[name]
        r = _field_ranges[(cls, name)] = (t, *_int_range(t))
    return r


_field_ranges = {}


def set_ints(struct, **values):
    """Sets integer fields of a ctypes struct, each range-checked against its
    C type (c_int_value); the field name is the argument named."""
    cls = type(struct)
    for name, value in values.items():
        r = _field_ranges.get((cls, name)) or _field_range(cls, name)
        v = int(value)
        if not r[1] <= v <= r[2]:
            raise ValueError(f"{name} = {v} is out of range for its C type {r[0].__name__} "
                             f"[{r[1]}, {r[2]}]")
        setattr(struct, name, v)


def c_struct_size(default_fn):
    """The struct_size the C *_default function writes (read from a buffer
    larger than any params struct), to check a ctypes mirror against."""
    buf = ctypes.create_string_buffer(4096)
    default_fn(ctypes.cast(buf, c_void_p))
    return c_size_t.from_buffer(buf).value


def init_struct(cls, default_name):
    """A cls filled by the C default function after checking that the ctypes
    layout has the size the library expects. The default function is run
    and checked once per class; later calls copy its result (the defaults
    are constants, and this runs on every call of the PyTorch drop-ins)."""
    template = _templates.get((cls, default_name))
    if template is None:
        fn = getattr(lib, default_name)
        want = _checked_sizes.get(default_name)
        if want is None:
            raw = ctypes.CFUNCTYPE(None, c_void_p)((default_name, lib))
            want = _checked_sizes[default_name] = c_struct_size(raw)
        if want != ctypes.sizeof(cls):
            raise RuntimeError(f"{cls.__name__}: ctypes size {ctypes.sizeof(cls)} != {want} "
                               f"written by {default_name}: bindings and libfastpath are out of "
                               "sync")
        s = cls()
        fn(ctypes.byref(s))
        template = _templates[(cls, default_name)] = bytes(s)
    return cls.from_buffer_copy(template)


_checked_sizes = {}
_templates = {}


def struct_packer(cls):
    """A struct.Struct laying out every field of the ctypes struct class cls
    in declaration order, padding included (written as zeros), checked
    against the class's offsets and size: pack_into(instance, 0, *values)
    fills a whole params struct in one call instead of a setattr per field
    (the hot path of the PyTorch drop-ins). Pointers pack as unsigned
    integers (0 = NULL); float fields take what ctypes.c_float(v).value
    gives (pack raises where ctypes would store inf)."""
    codes = {ctypes.c_float: "f", ctypes.c_double: "d"}
    for t in (ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, c_void_p):
        signed = t(-1).value < 0  # c_void_p(-1) is 2**64 - 1: unsigned
        codes[t] = {4: "iI", 8: "qQ"}[ctypes.sizeof(t)][0 if signed else 1]
    fmt, end = "=", 0
    for name, t in cls._fields_:
        field = getattr(cls, name)
        code = codes.get(t)
        if code is None:
            raise TypeError(f"{cls.__name__}.{name}: no struct code for {t.__name__}")
        if field.offset < end:
            raise TypeError(f"{cls.__name__}.{name}: fields out of order (offset {field.offset})")
        fmt += (f"{field.offset - end}x" if field.offset > end else "") + code
        end = field.offset + field.size
    if ctypes.sizeof(cls) > end:
        fmt += f"{ctypes.sizeof(cls) - end}x"
    packer = struct.Struct(fmt)
    if packer.size != ctypes.sizeof(cls):
        raise RuntimeError(f"{cls.__name__}: packed size {packer.size} != {ctypes.sizeof(cls)}")
    return packer


def choice(value, table, what):
    """table[value], or ValueError naming what and the choices."""
    if value not in table:
        raise ValueError(f"{what} must be one of {sorted(table)}, got {value!r}")
    return table[value]


class Closeable:
    """Context-manager and finalizer plumbing for a class owning a library
    handle: `with` and garbage collection both call its close()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
