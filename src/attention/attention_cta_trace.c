/* The CTA timeline (attention_internal.h, "The CTA timeline"): the calling
 * thread's trace buffer, which the flash launchers read
 * (kernels/attention/attention_flash.cu, attention_flash_tma_sm90.cu:
 * cta_trace_for), and the summary of one traced launch that fastbench
 * attention/decode_anatomy and attention/prefill_anatomy report. */
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

/* A record's interval on its SM (microseconds from the first start). */
typedef struct sm_span {
    uint32_t sm;
    double s, e;
} sm_span;

static int cmp_span(const void *a, const void *b) {
    const sm_span *x = a, *y = b;
    if (x->sm != y->sm) return (x->sm > y->sm) - (x->sm < y->sm);
    return (x->s > y->s) - (x->s < y->s);
}

/* Where the SMs' time goes over [0, span]: v[0..n) sorted by SM, then start.
 * Fills busy / head / gap / tail (percent of SMs x span), the SMs, and
 * ends[0..SMs) with each SM's last end. */
static void sm_time(const sm_span *v, int64_t n, double span, fp_cta_anatomy *out, double *ends) {
    double busy = 0.0, head = 0.0, gap = 0.0, tail = 0.0;
    int64_t sms = 0;
    for (int64_t i = 0; i < n;) {
        const uint32_t sm = v[i].sm;
        const double first = v[i].s;
        double end = v[i].e, holes = 0.0;
        for (++i; i < n && v[i].sm == sm; ++i) {
            if (v[i].s > end) holes += v[i].s - end; /* a hole in the union of the SM's records */
            if (v[i].e > end) end = v[i].e;
        }
        head += first;
        gap += holes;
        busy += end - first - holes;
        tail += span - end;
        ends[sms++] = end;
    }
    out->sms = sms;
    const double all = (double)sms * span;
    if (all > 0.0) {
        out->busy_pct = 100.0 * busy / all;
        out->head_pct = 100.0 * head / all;
        out->gap_pct = 100.0 * gap / all;
        out->tail_pct = 100.0 * tail / all;
    } else { /* every record a point in time: the SMs were busy throughout */
        out->busy_pct = 100.0;
    }
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
    /* one block: the SMs' spans, then five arrays of `started` doubles */
    sm_span *spans = malloc((size_t)started * (sizeof(sm_span) + 5 * sizeof(double)));
    if (!spans) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_attn_cta_anatomy: %lld records", (long long)started);
    double *landed = (double *)(spans + started), *loop = landed + started, *ends = loop + started,
           *per_tile = ends + started, *epi = per_tile + started;
    int64_t nl = 0, nloop = 0, ne = 0, nt = 0, nepi = 0, tiles = 0;
    double last_start = 0.0, last_end = 0.0, landed_max = 0.0, loop_max = 0.0, store_max = 0.0, merge_max = 0.0;
    int64_t merged = 0;
    for (int64_t i = 0; i < n; ++i) {
        const fp_cta_record *r = &records[i];
        if (!r->t_ns[FP_CTA_START]) continue;
        const double s = 1e-3 * (double)(r->t_ns[FP_CTA_START] - t0), e = 1e-3 * (double)(r->t_ns[FP_CTA_END] - t0);
        if (s > last_start) last_start = s;
        if (e > last_end) last_end = e;
        spans[ne] = (sm_span){r->smid, s, e};
        ends[ne++] = e;
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
        if (r->t_ns[FP_CTA_LOOP]) epi[nepi++] = 1e-3 * (double)(r->t_ns[FP_CTA_END] - r->t_ns[FP_CTA_LOOP]);
        if (r->t_ns[FP_CTA_LOOP] && r->tiles > 0) {
            const uint64_t from = r->t_ns[FP_CTA_LANDED] ? r->t_ns[FP_CTA_LANDED] : r->t_ns[FP_CTA_START];
            per_tile[nt++] = (double)(r->t_ns[FP_CTA_LOOP] - from) / (double)r->tiles;
            tiles += r->tiles;
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
    out->ctas = started;
    out->merged = merged;
    out->span_us = last_end;
    out->start_skew_us = last_start;
    out->landed_p50_us = median(landed, nl);
    out->landed_max_us = landed_max;
    out->loop_p50_us = median(loop, nloop);
    out->loop_max_us = loop_max;
    out->store_max_us = store_max;
    out->epilogue_p50_us = median(epi, nepi);
    out->merge_max_us = merge_max;
    out->end_p50_us = median(ends, ne);
    out->tail_us = last_end - out->end_p50_us;
    out->tiles = tiles;
    out->tile_ns_p50 = median(per_tile, nt);
    qsort(spans, (size_t)ne, sizeof *spans, cmp_span);
    sm_time(spans, ne, last_end, out, ends); /* ends: now each SM's last end */
    out->sm_end_p50_us = median(ends, out->sms);
    free(spans);
    return FP_OK;
}
