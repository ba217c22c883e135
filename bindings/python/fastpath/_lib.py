"""Loads libfastpath.so and declares the C signatures used by the bindings.

Search order: $FASTPATH_LIB, the build tree next to this checkout
(build/libfastpath.so), then the system loader (ldconfig / LD_LIBRARY_PATH).
"""
import ctypes
import ctypes.util
import os
from pathlib import Path

_here = Path(__file__).resolve().parent


def _candidates():
    env = os.environ.get("FASTPATH_LIB")
    if env:
        yield env
    root = _here.parent.parent.parent
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
    raise OSError("libfastpath.so not found: set FASTPATH_LIB to its path"
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
                ("min_effect", c_double), ("flush_l2", c_int), ("min_sample_ms", c_double)]


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
