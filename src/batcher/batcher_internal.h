/* Internals of the dynamic batcher shared by its source files: the sample
 * rings behind the statistics and the percentile summary. Not installed. */
#ifndef FASTPATH_BATCHER_INTERNAL_H
#define FASTPATH_BATCHER_INTERNAL_H

#include "fastpath/batcher.h"

/* The latest `cap` samples (microseconds) of one duration. */
typedef struct fp_sample_ring {
    double *v;
    int cap;
    int n;    /* valid samples, <= cap */
    int pos;  /* next write */
} fp_sample_ring;

fp_status fp_sample_ring_init(fp_sample_ring *r, int cap);
void fp_sample_ring_free(fp_sample_ring *r);
static inline void fp_sample_ring_push(fp_sample_ring *r, double us) {
    r->v[r->pos] = us;
    r->pos = r->pos + 1 == r->cap ? 0 : r->pos + 1;
    if (r->n < r->cap) r->n++;
}
static inline void fp_sample_ring_clear(fp_sample_ring *r) { r->n = r->pos = 0; }

/* Summarizes n samples in microseconds (copied, the input is not changed):
 * percentiles by linear interpolation, fp_stats in ms. n == 0 gives zeros. */
fp_status fp_latency_summarize(const double *us, int n, fp_batcher_latency *out);

#endif /* FASTPATH_BATCHER_INTERNAL_H */
