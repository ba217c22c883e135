/*
 * libfastpath timing engine: the built-in timer every optimization uses.
 *
 *   fp_time()        measures one callable on a context's stream: CUDA events
 *                    on a GPU, a monotonic clock on the CPU; warm-up, then
 *                    samples until the relative noise target or a cap is hit.
 *   fp_ab_run()      baseline vs optimized, interleaved ABAB, a noise-aware
 *                    verdict, numerical agreement of the two outputs and a
 *                    roofline figure.
 *   fp_stats_*(), fp_verdict_decide(), fp_compare_*()
 *                    the pure pieces, usable on durations and outputs measured
 *                    elsewhere (fastbench compare uses them on JSON files).
 *
 * All functions are thread-safe for distinct contexts; one context must not
 * time two things at once (the samples would interfere anyway).
 */
#ifndef FASTPATH_TIMING_H
#define FASTPATH_TIMING_H

#include "fastpath/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/*  Statistics                                                              */
/* ======================================================================== */

typedef struct fp_stats {
    double median_ms, mean_ms, min_ms, max_ms, p10_ms, p90_ms, stdev_ms;
    double rel_stdev;   /* stdev / mean (0 when mean is 0) */
    double noise;       /* robust relative spread: (p90 - p10) / (2.563 * median),
                           i.e. a sigma estimate immune to a few outliers */
    int samples;
} fp_stats;

/* Computes statistics of n >= 1 durations (ms, each finite and >= 0).
 * Percentiles interpolate linearly between order statistics. Does not modify
 * the input. FP_ERR_INVALID_ARGUMENT on NULL, n < 1 or a bad sample. */
FP_API fp_status fp_stats_compute(const double *samples_ms, int n, fp_stats *out);

/* ======================================================================== */
/*  Measuring one callable                                                  */
/* ======================================================================== */

/* The work to time: enqueue it on `stream` (GPU) or run it (CPU). Returning
 * anything but FP_OK aborts the measurement with that status. */
typedef fp_status (*fp_timed_fn)(void *user, fp_stream stream);

typedef struct fp_timing_config {
    size_t struct_size;
    int warmup;              /* untimed calls first (default 3) */
    int min_samples;         /* default 10 */
    int max_samples;         /* default 1000 */
    double max_time_s;       /* wall-clock cap per measurement (default 2.0) */
    double target_noise;     /* stop once the samples' relative spread (the
                                robust `noise` of fp_stats, nvbench's stdrel
                                idea) is below this (default 0.005), or once
                                the median is pinned: its relative standard
                                error 1.25 * noise / sqrt(n) < target / 5 */
    double min_effect;       /* A/B: gaps below this relative size are SAME
                                even if the noise is lower (default 0.01) */
    int flush_l2;            /* CUDA: memset an L2-sized buffer before every
                                sample (cold-cache timing); forces 1 call/sample */
    double min_sample_ms;    /* batch calls so one sample lasts at least this
                                long (default 0.05 ms); ignored with flush_l2 */
    int use_graph;           /* CUDA: capture each sample's calls into a CUDA
                                graph once and time its replays, so launch
                                gaps between small kernels do not count
                                (default 0). The callable must be capturable
                                (no synchronization, no host reads of device
                                data); otherwise FP_ERR_UNSUPPORTED. Ignored on
                                CPU contexts. Not with the legacy stream 0. */
} fp_timing_config;

/* Fills the defaults listed above. */
FP_API fp_status fp_timing_config_default_sized(fp_timing_config *cfg, size_t struct_size);
/* The exported fp_timing_config_default writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_timing_config_default)(fp_timing_config *cfg);
#define fp_timing_config_default(cfg) fp_timing_config_default_sized((cfg), sizeof *(cfg))

/* Times fn on ctx/stream. cfg NULL means defaults. Each sample is the mean
 * duration of the calls batched into it. Returns fn's status if it fails,
 * FP_ERR_CUDA if event timing fails. */
FP_API fp_status fp_time(fp_context *ctx, fp_stream stream, fp_timed_fn fn, void *user,
                         const fp_timing_config *cfg, fp_stats *out);

/* ======================================================================== */
/*  Verdict                                                                 */
/* ======================================================================== */

typedef enum fp_verdict { FP_VERDICT_SAME = 0, FP_VERDICT_FASTER = 1, FP_VERDICT_SLOWER = 2 } fp_verdict;

/* "SAME", "FASTER", "SLOWER". */
FP_API const char *fp_verdict_string(fp_verdict v);

/* Noise-aware comparison of two timings. speedup = baseline median /
 * optimized median (> 1: optimized is faster). Each median's relative
 * standard error is taken as 1.25 * noise / sqrt(samples); the gap counts
 * only if |ln(speedup)| exceeds max(min_effect, 3 * sqrt(se_b^2 + se_o^2)),
 * so a difference the samples cannot resolve is SAME. fp_ab_run's samples
 * are interleaved, so drift cancels and all of them count; to compare two
 * separate runs, where drift between runs does not cancel, pass samples = 1
 * (the samples' own spread becomes the noise), as fastbench compare does.
 * Sets *speedup if non-NULL. Thread-safe, pure. */
FP_API fp_verdict fp_verdict_decide(const fp_stats *baseline, const fp_stats *optimized,
                                    double min_effect, double *speedup);

/* ======================================================================== */
/*  Numerical agreement                                                     */
/* ======================================================================== */

typedef struct fp_compare_result {
    double max_abs_err;
    double max_rel_err;   /* max |a-b| / max(|ref|, tiny) */
    double atol, rtol;    /* tolerance used: |a-b| <= atol + rtol * |ref| */
    size_t count;         /* elements compared */
    size_t mismatches;    /* elements outside tolerance (NaN counts) */
    size_t first_bad;     /* index of the first mismatch, or SIZE_MAX */
    double first_bad_got, first_bad_ref;
    int passed;
} fp_compare_result;

/* Default tolerance for outputs of dtype computed in f32 accumulation:
 * f32 atol 1e-5 rtol 1e-5, f16 atol 1e-3 rtol 2e-3, bf16 atol 1e-2 rtol 1.6e-2. */
FP_API void fp_default_tolerance(fp_dtype dtype, double *atol, double *rtol);

/* Compares n host elements `got` against `ref` (both of dtype). atol/rtol
 * < 0 select the dtype default. FP_ERR_INVALID_ARGUMENT (out untouched) for
 * NULL pointers, a dtype other than f32/f16/bf16, or a NaN atol / rtol. */
FP_API fp_status fp_compare_host(const void *ref, const void *got, size_t n, fp_dtype dtype,
                                 double atol, double rtol, fp_compare_result *out);

/* Same, with both arrays in ctx memory (downloaded for the comparison). */
FP_API fp_status fp_compare(fp_context *ctx, const void *ref, const void *got, size_t n,
                            fp_dtype dtype, double atol, double rtol, fp_compare_result *out);

/* ======================================================================== */
/*  A/B runner with roofline                                                */
/* ======================================================================== */

typedef struct fp_ab_spec {
    size_t struct_size;
    fp_timed_fn baseline;   void *baseline_user;
    fp_timed_fn optimized;  void *optimized_user;
    /* Outputs to compare after one untimed run of each (ctx memory; NULL to
     * skip the check). The baseline output is the reference. */
    const void *baseline_out;
    const void *optimized_out;
    size_t out_count;
    fp_dtype out_dtype;
    double atol, rtol;      /* < 0: dtype default */
    /* Roofline: what the optimized version must move and compute at least. */
    double bytes;           /* bytes read + written by the op (0: unknown) */
    double flops;           /* floating-point operations (0: unknown) */
    int flops_on_tensor_cores; /* compare FLOPs against the bf16 tensor peak */
} fp_ab_spec;

/* Initializes a spec (zeroes it, sets struct_size, atol = rtol = -1). */
FP_API fp_status fp_ab_spec_init_sized(fp_ab_spec *spec, size_t struct_size);
/* The exported fp_ab_spec_init writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_ab_spec_init)(fp_ab_spec *spec);
#define fp_ab_spec_init(spec) fp_ab_spec_init_sized((spec), sizeof *(spec))

typedef struct fp_ab_report {
    fp_stats baseline, optimized;
    double speedup;
    fp_verdict verdict;
    int compared;                 /* 1 if outputs were checked */
    fp_compare_result agreement;
    double achieved_gbps;         /* bytes / optimized median, 0 if unknown */
    double achieved_tflops;
    double pct_of_peak;           /* of the bound that is larger (memory or
                                     compute); < 0 when the peak is unknown */
    const char *bound;            /* "memory", "compute" or "unknown" */
} fp_ab_report;

/* Runs both callables once, compares their outputs, then times them
 * interleaved (A B A B ...) so drift hits both alike, until each side meets
 * the noise target or the caps. FP_OK means the measurement completed; check
 * report->agreement.passed for the numerical verdict. */
FP_API fp_status fp_ab_run(fp_context *ctx, fp_stream stream, const fp_ab_spec *spec,
                           const fp_timing_config *cfg, fp_ab_report *report);

/* Roofline arithmetic on its own: given a duration and the op's bytes and
 * FLOPs and the device's peaks, fills achieved_gbps, achieved_tflops,
 * pct_of_peak and bound of report. Pure. */
FP_API void fp_roofline(const fp_device_info *dev, double median_ms, double bytes, double flops,
                        int tensor_cores, fp_ab_report *report);

/* Measures the device-to-device copy bandwidth (cudaMemcpyAsync on CUDA,
 * memcpy on the CPU) over `bytes` (0: 1 GiB on CUDA, 64 MiB on CPU), counting
 * bytes read plus bytes written: the practical memory roofline that
 * memory-bound ops are judged against. Allocates two buffers of `bytes`. */
FP_API fp_status fp_measure_copy_bandwidth(fp_context *ctx, size_t bytes, double *gbps);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_TIMING_H */
