/* The CTA timeline as a Chrome trace (attention_internal.h,
 * fp_attn_cta_export_chrome): one track per SM, each record an event with its
 * phases nested inside, for Perfetto's UI or chrome://tracing. fastbench
 * writes one per kernel of each attention/decode_anatomy and
 * prefill_anatomy row under `fastbench trace ... --out DIR`. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h"

/* Tracks per SM: records that overlap on an SM (two resident CTAs, v9's
 * chained items) go to its next track, so that a track's events nest. */
#define CTA_TRACKS_PER_SM 16

typedef struct placed {
    int64_t i;   /* the record */
    uint64_t s;  /* its start */
    uint32_t sm; /* its SM */
} placed;

/* by SM, then start, then record */
static int cmp_placed(const void *a, const void *b) {
    const placed *x = a, *y = b;
    if (x->sm != y->sm) return x->sm < y->sm ? -1 : 1;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* One complete event: name, [from, to) ns after t0 on track tid, args (a
 * JSON object's members, "" for none). */
static void slice(FILE *f, const char *name, uint64_t from, uint64_t to, uint64_t t0, int tid, const char *args) {
    fprintf(f,
            ",\n{\"name\":\"%s\",\"cat\":\"cta\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d,"
            "\"args\":{%s}}",
            name, 1e-3 * (double)(from - t0), 1e-3 * (double)(to - from), tid, args);
}

static void track_name(FILE *f, int tid, uint32_t sm, int k) {
    if (k == 0)
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"SM %u\"}}", tid,
                sm);
    else
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"SM %u (%d)\"}}",
                tid, sm, k + 1);
    fprintf(f, ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
            tid, tid);
}

/* The events of record r on track tid: the record, then its phases. */
static void record_events(FILE *f, const fp_cta_record *r, int64_t i, int items, uint64_t t0, int tid) {
    const uint64_t *t = r->t_ns;
    char name[48], args[160];
    snprintf(name, sizeof name, "%s %lld", items ? "item" : "cta", (long long)i);
    snprintf(args, sizeof args, "\"cta\":%u,\"sm\":%u,\"tiles\":%u,\"merged\":%d", r->cta, r->smid, r->tiles,
             (r->flags & FP_CTA_MERGED) ? 1 : 0);
    slice(f, name, t[FP_CTA_START], t[FP_CTA_END], t0, tid, args);
    const uint64_t loop_from = t[FP_CTA_LANDED] ? t[FP_CTA_LANDED] : t[FP_CTA_START];
    if (t[FP_CTA_LANDED]) slice(f, "first tile", t[FP_CTA_START], t[FP_CTA_LANDED], t0, tid, "");
    if (t[FP_CTA_LOOP]) {
        snprintf(args, sizeof args, "\"tiles\":%u,\"ns_per_tile\":%.1f", r->tiles,
                 r->tiles ? (double)(t[FP_CTA_LOOP] - loop_from) / r->tiles : 0.0);
        slice(f, "loop", loop_from, t[FP_CTA_LOOP], t0, tid, args);
    }
    const uint64_t after = t[FP_CTA_LOOP] ? t[FP_CTA_LOOP] : loop_from;
    if (t[FP_CTA_STORED]) {
        slice(f, "store", after, t[FP_CTA_STORED], t0, tid, "");
        slice(f, (r->flags & FP_CTA_MERGED) ? "merge" : "arrive", t[FP_CTA_STORED], t[FP_CTA_END], t0, tid, "");
    } else if (t[FP_CTA_LOOP]) {
        slice(f, "epilogue", t[FP_CTA_LOOP], t[FP_CTA_END], t0, tid, "");
    }
}

fp_status fp_attn_cta_export_chrome(const fp_cta_record *records, int64_t n, int items, const char *label,
                                    const char *path) {
    fp_cta_anatomy a; /* the same checks as the summary: marks in order, every started record ended */
    FP_TRY(fp_attn_cta_anatomy(records, n, &a));
    if (!label) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fp_attn_cta_export_chrome: label is NULL");
    placed *p = malloc((size_t)a.ctas * sizeof *p);
    if (!p) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_attn_cta_export_chrome: %lld records", (long long)a.ctas);
    int64_t np = 0;
    uint64_t t0 = UINT64_MAX;
    for (int64_t i = 0; i < n; ++i)
        if (records[i].t_ns[FP_CTA_START]) {
            p[np++] = (placed){i, records[i].t_ns[FP_CTA_START], records[i].smid};
            if (records[i].t_ns[FP_CTA_START] < t0) t0 = records[i].t_ns[FP_CTA_START];
        }
    qsort(p, (size_t)np, sizeof *p, cmp_placed);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cJSON *js = cJSON_CreateString(label);
    char *quoted = js ? cJSON_PrintUnformatted(js) : NULL; /* the label as a JSON string */
    if (f && quoted) {
        fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"
                   "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":%s}}",
                quoted);
        uint64_t track_end[CTA_TRACKS_PER_SM];
        int tracks = 0;
        for (int64_t k = 0; k < np; ++k) {
            const fp_cta_record *r = &records[p[k].i];
            if (k == 0 || r->smid != records[p[k - 1].i].smid) tracks = 0; /* a new SM */
            int slot = 0;
            while (slot < tracks && track_end[slot] > r->t_ns[FP_CTA_START]) ++slot;
            if (slot == CTA_TRACKS_PER_SM) { /* all taken: the one free first (its events then overlap) */
                slot = 0;
                for (int j = 1; j < tracks; ++j)
                    if (track_end[j] < track_end[slot]) slot = j;
            }
            const int tid = 1 + (int)r->smid * CTA_TRACKS_PER_SM + slot;
            if (slot == tracks) {
                track_name(f, tid, r->smid, slot);
                ++tracks;
            }
            track_end[slot] = r->t_ns[FP_CTA_END];
            record_events(f, r, p[k].i, items, t0, tid);
        }
        fputs("\n]}\n", f);
    }
    const int ok = f && quoted && !ferror(f);
    if (f) fclose(f);
    cJSON_free(quoted);
    cJSON_Delete(js);
    free(p);
    fp_status st = ok ? fp_write_file_atomic(path, text, len, "fp_attn_cta_export_chrome")
                      : fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_attn_cta_export_chrome: the JSON of %lld records",
                                     (long long)a.ctas);
    free(text);
    return st;
}
