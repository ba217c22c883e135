/* The CTA timeline (attention_internal.h, "The CTA timeline"): the calling
 * thread's trace buffer, which the mma.sync launchers read
 * (kernels/attention/attention_flash.cu), and the summary of one traced
 * launch that fastbench attention/decode_anatomy reports. */
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h"

static _Thread_local fp_cta_record *tl_records;
static _Thread_local int64_t tl_capacity;
static _Thread_local int64_t tl_last;

void fp_attn_cuda_cta_trace_set(fp_cta_record *records, int64_t capacity) {
    tl_records = capacity > 0 ? records : NULL;
    tl_capacity = records && capacity > 0 ? capacity : 0;
    tl_last = 0;
}

int64_t fp_attn_cuda_cta_trace_take(void) {
    const int64_t n = tl_last;
    tl_last = 0;
    return n;
}

fp_cta_record *fp_attn_cuda_cta_trace_get(int64_t *capacity) {
    if (capacity) *capacity = tl_capacity;
    return tl_records;
}

void fp_attn_cuda_cta_trace_note(int64_t ctas) { tl_last = ctas; }

static int cmp_u32(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorted in place: the timing engine's helpers,
 * src/timing/stats.c); 0 for n = 0. */
static double median(double *v, int64_t n) {
    if (n <= 0) return 0.0;
    fp_sort_doubles(v, (int)n);
    return fp_percentile_sorted(v, (int)n, 0.5);
}

fp_status fp_attn_cta_anatomy(const fp_cta_record *records, int64_t n, fp_cta_anatomy *out) {
    if (!out) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fp_attn_cta_anatomy: out is NULL");
    memset(out, 0, sizeof *out);
    if (!records || n < 0)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fp_attn_cta_anatomy: records NULL or n %lld < 0", (long long)n);
    /* First pass: check every started record, find the first start. */
    int64_t started = 0;
    uint64_t t0 = UINT64_MAX;
    for (int64_t i = 0; i < n; ++i) {
        const fp_cta_record *r = &records[i];
        if (!r->t_ns[FP_CTA_START]) continue;
        uint64_t last = 0;
        for (int k = 0; k < FP_CTA_MARKS; ++k) {
            if (!r->t_ns[k]) continue;
            if (r->t_ns[k] < last)
                return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                                    "fp_attn_cta_anatomy: record %lld (cta %u): mark %d at %llu ns is before an "
                                    "earlier mark (%llu ns)",
                                    (long long)i, r->cta, k, (unsigned long long)r->t_ns[k],
                                    (unsigned long long)last);
            last = r->t_ns[k];
        }
        if (!r->t_ns[FP_CTA_END])
            return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fp_attn_cta_anatomy: record %lld (cta %u) has no end",
                                (long long)i, r->cta);
        if (r->t_ns[FP_CTA_START] < t0) t0 = r->t_ns[FP_CTA_START];
        ++started;
    }
    if (started == 0)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fp_attn_cta_anatomy: none of the %lld records has a start",
                            (long long)n);
    double *landed = malloc((size_t)started * sizeof(double));
    double *loop = malloc((size_t)started * sizeof(double));
    double *ends = malloc((size_t)started * sizeof(double));
    uint32_t *sms = malloc((size_t)started * sizeof(uint32_t));
    if (!landed || !loop || !ends || !sms) {
        free(landed);
        free(loop);
        free(ends);
        free(sms);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_attn_cta_anatomy: %lld records", (long long)started);
    }
    int64_t nl = 0, nloop = 0, ne = 0;
    double last_start = 0.0, last_end = 0.0, landed_max = 0.0, loop_max = 0.0, store_max = 0.0, merge_max = 0.0;
    int64_t merged = 0;
    for (int64_t i = 0; i < n; ++i) {
        const fp_cta_record *r = &records[i];
        if (!r->t_ns[FP_CTA_START]) continue;
        const double s = 1e-3 * (double)(r->t_ns[FP_CTA_START] - t0), e = 1e-3 * (double)(r->t_ns[FP_CTA_END] - t0);
        if (s > last_start) last_start = s;
        if (e > last_end) last_end = e;
        ends[ne] = e;
        sms[ne++] = r->smid;
        if (r->t_ns[FP_CTA_LANDED]) {
            const double l = 1e-3 * (double)(r->t_ns[FP_CTA_LANDED] - r->t_ns[FP_CTA_START]);
            landed[nl++] = l;
            if (l > landed_max) landed_max = l;
            if (r->t_ns[FP_CTA_LOOP]) {
                const double d = 1e-3 * (double)(r->t_ns[FP_CTA_LOOP] - r->t_ns[FP_CTA_LANDED]);
                loop[nloop++] = d;
                if (d > loop_max) loop_max = d;
            }
        }
        if (r->t_ns[FP_CTA_STORED] && r->t_ns[FP_CTA_LOOP]) {
            const double d = 1e-3 * (double)(r->t_ns[FP_CTA_STORED] - r->t_ns[FP_CTA_LOOP]);
            if (d > store_max) store_max = d;
        }
        if (r->flags & FP_CTA_MERGED) {
            ++merged;
            if (r->t_ns[FP_CTA_STORED]) {
                const double d = 1e-3 * (double)(r->t_ns[FP_CTA_END] - r->t_ns[FP_CTA_STORED]);
                if (d > merge_max) merge_max = d;
            }
        }
    }
    qsort(sms, (size_t)ne, sizeof *sms, cmp_u32);
    int64_t distinct = 0;
    for (int64_t i = 0; i < ne; ++i)
        if (i == 0 || sms[i] != sms[i - 1]) ++distinct;
    out->ctas = started;
    out->sms = distinct;
    out->merged = merged;
    out->span_us = last_end;
    out->start_skew_us = last_start;
    out->landed_p50_us = median(landed, nl);
    out->landed_max_us = landed_max;
    out->loop_p50_us = median(loop, nloop);
    out->loop_max_us = loop_max;
    out->store_max_us = store_max;
    out->merge_max_us = merge_max;
    out->end_p50_us = median(ends, ne);
    out->tail_us = last_end - out->end_p50_us;
    free(landed);
    free(loop);
    free(ends);
    free(sms);
    return FP_OK;
}
