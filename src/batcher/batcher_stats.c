/* Sample rings and percentile summaries behind fp_batcher_get_stats. The
 * timing engine's fp_stats_compute gives the fp_stats part; p99 (which
 * fp_stats does not carry) uses the same interpolation on a sorted copy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "batcher_internal.h"
#include "internal.h"

fp_status fp_sample_ring_init(fp_sample_ring *r, int cap) {
    memset(r, 0, sizeof *r);
    r->v = malloc((size_t)cap * sizeof *r->v);
    if (!r->v) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "batcher stats window of %d samples", cap);
    r->cap = cap;
    return FP_OK;
}

void fp_sample_ring_free(fp_sample_ring *r) {
    free(r->v);
    memset(r, 0, sizeof *r);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy's default (linear) percentile of sorted s[0..n). */
static double pct_sorted(const double *s, int n, double q) {
    double pos = q * (n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : n - 1;
    return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

fp_status fp_latency_summarize(const double *us, int n, fp_batcher_latency *out) {
    memset(out, 0, sizeof *out);
    if (n <= 0) return FP_OK;
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "stats buffer of %d samples", n);
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        /* Durations come from a monotonic clock; clamp rounding noise. */
        s[i] = us[i] > 0 ? us[i] * 1e-3 : 0.0; /* ms for fp_stats */
        sum += us[i] > 0 ? us[i] : 0.0;
    }
    fp_status st = fp_stats_compute(s, n, &out->stats);
    if (st == FP_OK) {
        qsort(s, (size_t)n, sizeof *s, cmp_double);
        out->p50_us = pct_sorted(s, n, 0.50) * 1e3;
        out->p90_us = pct_sorted(s, n, 0.90) * 1e3;
        out->p99_us = pct_sorted(s, n, 0.99) * 1e3;
        out->max_us = s[n - 1] * 1e3;
        out->mean_us = sum / n;
    }
    free(s);
    return st;
}
