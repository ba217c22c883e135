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
    /* One sort serves fp_stats and the p50/p90/p99 it does not carry. */
    fp_sort_doubles(s, n);
    fp_stats_from_sorted(s, n, &out->stats);
    out->p50_us = fp_percentile_sorted(s, n, 0.50) * 1e3;
    out->p90_us = fp_percentile_sorted(s, n, 0.90) * 1e3;
    out->p99_us = fp_percentile_sorted(s, n, 0.99) * 1e3;
    out->max_us = s[n - 1] * 1e3;
    out->mean_us = sum / n;
    free(s);
    return FP_OK;
}
