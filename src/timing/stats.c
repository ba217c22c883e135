/* Pure pieces of the timing engine: statistics of samples, the noise-aware
 * verdict, numerical agreement of host arrays and roofline arithmetic. No
 * context or device calls (host-only builds such as the TSan tests link this
 * file alone); fp_compare, which downloads, is in compare.c. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "internal.h"
#include "fastpath/timing.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void fp_sort_doubles(double *v, int n) {
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_double);
}

/* Linear interpolation between order statistics (numpy's default). */
double fp_percentile_sorted(const double *s, int n, double q) {
    double pos = q * (n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : n - 1;
    double frac = pos - lo;
    return s[lo] + (s[hi] - s[lo]) * frac;
}

void fp_stats_from_sorted(const double *s, int n, fp_stats *out) {
    fp_stats st;
    memset(&st, 0, sizeof st);
    st.samples = n;
    st.min_ms = s[0];
    st.max_ms = s[n - 1];
    st.median_ms = fp_percentile_sorted(s, n, 0.5);
    st.p10_ms = fp_percentile_sorted(s, n, 0.1);
    st.p90_ms = fp_percentile_sorted(s, n, 0.9);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += s[i];
    st.mean_ms = sum / n;
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += (s[i] - st.mean_ms) * (s[i] - st.mean_ms);
    st.stdev_ms = n > 1 ? sqrt(ss / (n - 1)) : 0.0;
    st.rel_stdev = st.mean_ms > 0 ? st.stdev_ms / st.mean_ms : 0.0;
    /* p90 - p10 of a normal distribution spans 2 * 1.2816 sigma. */
    st.noise = st.median_ms > 0 ? (st.p90_ms - st.p10_ms) / (2.5631 * st.median_ms) : 0.0;
    *out = st;
}

fp_status fp_stats_compute(const double *samples_ms, int n, fp_stats *out) {
    FP_CHECK_NOT_NULL(samples_ms);
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(n >= 1, "argument 'n' must be >= 1 (got %d)", n);
    for (int i = 0; i < n; ++i)
        FP_CHECK_ARG(isfinite(samples_ms[i]) && samples_ms[i] >= 0,
                     "sample %d is %g: samples must be finite and >= 0", i, samples_ms[i]);
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "stats buffer of %d samples", n);
    memcpy(s, samples_ms, (size_t)n * sizeof *s);
    fp_sort_doubles(s, n);
    fp_stats_from_sorted(s, n, out);
    free(s);
    return FP_OK;
}

const char *fp_verdict_string(fp_verdict v) {
    switch (v) {
    case FP_VERDICT_SAME: return "SAME";
    case FP_VERDICT_FASTER: return "FASTER";
    case FP_VERDICT_SLOWER: return "SLOWER";
    }
    return "UNKNOWN";
}

/* Relative standard error of a median from the robust spread of its samples
 * (1.2533 = sqrt(pi/2): the median's efficiency against the mean). */
static double median_rel_error(const fp_stats *s) {
    return 1.2533 * s->noise / sqrt(s->samples > 1 ? (double)s->samples : 1.0);
}

fp_verdict fp_verdict_decide(const fp_stats *baseline, const fp_stats *optimized, double min_effect,
                             double *speedup) {
    if (!baseline || !optimized || baseline->median_ms <= 0 || optimized->median_ms <= 0) {
        if (speedup) *speedup = 0;
        return FP_VERDICT_SAME;
    }
    double sp = baseline->median_ms / optimized->median_ms;
    if (speedup) *speedup = sp;
    double eb = median_rel_error(baseline), eo = median_rel_error(optimized);
    double threshold = fmax(min_effect, 3.0 * sqrt(eb * eb + eo * eo));
    double gap = log(sp);
    if (gap > log1p(threshold)) return FP_VERDICT_FASTER;
    if (-gap > log1p(threshold)) return FP_VERDICT_SLOWER;
    return FP_VERDICT_SAME;
}

void fp_default_tolerance(fp_dtype dtype, double *atol, double *rtol) {
    double a, r;
    switch (dtype) {
    case FP_F16: a = 1e-3; r = 2e-3; break;      /* 2^-10 mantissa, ~2 ulp */
    case FP_BF16: a = 1e-2; r = 1.6e-2; break;   /* 2^-7 mantissa, ~2 ulp */
    default: a = 1e-5; r = 1e-5; break;
    }
    if (atol) *atol = a;
    if (rtol) *rtol = r;
}

fp_status fp_compare_host(const void *ref, const void *got, size_t n, fp_dtype dtype, double atol,
                          double rtol, fp_compare_result *out) {
    FP_CHECK_NOT_NULL(ref);
    FP_CHECK_NOT_NULL(got);
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(dtype == FP_F32 || dtype == FP_F16 || dtype == FP_BF16,
                 "dtype %s cannot be compared", fp_dtype_name(dtype));
    /* A NaN bound would pass nothing (every comparison with it is false)
     * while looking like a tolerance: refuse it. */
    FP_CHECK_ARG(!isnan(atol) && !isnan(rtol), "tolerance atol %g / rtol %g is NaN (pass < 0 for the dtype default)",
                 atol, rtol);
    double da, dr;
    fp_default_tolerance(dtype, &da, &dr);
    fp_compare_result res;
    memset(&res, 0, sizeof res);
    res.atol = atol < 0 ? da : atol;
    res.rtol = rtol < 0 ? dr : rtol;
    res.count = n;
    res.first_bad = SIZE_MAX;
    for (size_t i = 0; i < n; ++i) {
        double r = fp_load_f32(ref, dtype, i), g = fp_load_f32(got, dtype, i);
        double err;
        int bad;
        if (isnan(r) || isnan(g)) {
            err = INFINITY; /* NaN never passes: it is how unwritten poison shows */
            bad = 1;
        } else if (isinf(r) || isinf(g)) {
            err = (r == g) ? 0.0 : INFINITY;
            bad = r != g;
        } else {
            err = fabs(g - r);
            bad = !(err <= res.atol + res.rtol * fabs(r));
        }
        if (err > res.max_abs_err) res.max_abs_err = err;
        /* Relative error only where |ref| is above the absolute tolerance:
         * near zero it says nothing. */
        if (fabs(r) > res.atol && err / fabs(r) > res.max_rel_err) res.max_rel_err = err / fabs(r);
        if (bad) {
            if (res.mismatches == 0) {
                res.first_bad = i;
                res.first_bad_got = g;
                res.first_bad_ref = r;
            }
            res.mismatches++;
        }
    }
    res.passed = res.mismatches == 0;
    *out = res;
    return FP_OK;
}

void fp_roofline(const fp_device_info *dev, double median_ms, double bytes, double flops,
                 int tensor_cores, fp_ab_report *rep) {
    if (!rep) return;
    rep->achieved_gbps = 0;
    rep->achieved_tflops = 0;
    rep->pct_of_peak = -1;
    rep->bound = "unknown";
    if (median_ms <= 0) return;
    double s = median_ms * 1e-3;
    if (bytes > 0) rep->achieved_gbps = bytes / s / 1e9;
    if (flops > 0) rep->achieved_tflops = flops / s / 1e12;
    if (!dev) return;
    double peak_flops = (tensor_cores ? dev->peak_tflops_bf16 : dev->peak_tflops_fp32) * 1e12;
    double t_mem = (bytes > 0 && dev->peak_gbps > 0) ? bytes / (dev->peak_gbps * 1e9) : 0;
    double t_cmp = (flops > 0 && peak_flops > 0) ? flops / peak_flops : 0;
    if (t_mem <= 0 && t_cmp <= 0) return;
    rep->bound = t_mem >= t_cmp ? "memory" : "compute";
    rep->pct_of_peak = 100.0 * fmax(t_mem, t_cmp) / s;
}
