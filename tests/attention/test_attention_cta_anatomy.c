/* fp_attn_cta_anatomy (src/attention/attention_cta_trace.c): the summary of
 * a traced launch's CTA records, on synthetic records of known times, and
 * its refusals; the calling thread's trace state (set / get / note / take);
 * the records as a Chrome trace (fp_attn_cta_export_chrome,
 * attention_cta_export.c), parsed back. The kernels' side:
 * test_attention_cta_trace_gpu. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention/attention_internal.h"
#include "fp_test.h"

static int near(double a, double b) { return fabs(a - b) < 1e-9; }

/* A record starting at start_us with marks at the given offsets (us; < 0: not
 * reached) after the start. */
static fp_cta_record rec(uint32_t cta, uint32_t sm, double start_us, double landed, double loop, double stored,
                         double end, uint32_t flags) {
    fp_cta_record r;
    memset(&r, 0, sizeof r);
    const uint64_t base = 1000000000ull; /* a timer far from 0 */
    const double marks[FP_CTA_MARKS] = {0.0, landed, loop, stored, end};
    for (int k = 0; k < FP_CTA_MARKS; ++k)
        if (marks[k] >= 0.0) r.t_ns[k] = base + (uint64_t)llround((start_us + marks[k]) * 1000.0);
    r.cta = cta;
    r.smid = sm;
    r.flags = flags;
    return r;
}

static void test_known_times(void) {
    /* 4 CTAs of a 2-split call on 3 SMs, and 2 records never started (a
     * capacity larger than the grid). Times in us. */
    fp_cta_record r[6];
    memset(r, 0, sizeof r);
    r[0] = rec(0, 5, 0.0, 1.0, 10.0, 10.5, 11.0, 0);
    r[1] = rec(1, 7, 0.5, 2.0, 12.0, 12.25, 16.0, FP_CTA_MERGED); /* merges: 3.75 us */
    r[2] = rec(2, 5, 1.0, 1.5, 8.0, 9.0, 9.5, 0);
    r[3] = rec(3, 9, 2.0, 3.0, 20.0, 21.0, 24.0, FP_CTA_MERGED); /* merges: 3 us */
    fp_cta_anatomy a;
    CHECK(fp_attn_cta_anatomy(r, 6, &a) == FP_OK);
    CHECK(a.ctas == 4);
    CHECK(a.sms == 3);
    CHECK(a.merged == 2);
    CHECK(near(a.span_us, 26.0));       /* 0 -> 2 + 24 */
    CHECK(near(a.start_skew_us, 2.0));
    CHECK(near(a.landed_p50_us, 1.75)); /* 1, 2, 1.5, 3: (1.5 + 2) / 2 */
    CHECK(near(a.landed_max_us, 3.0));
    CHECK(near(a.loop_p50_us, 9.5));    /* 9, 10, 6.5, 17: (9 + 10) / 2 */
    CHECK(near(a.loop_max_us, 17.0));
    CHECK(near(a.store_max_us, 1.0));   /* 0.5, 0.25, 1, 1 */
    CHECK(near(a.epilogue_p50_us, 2.75)); /* loop -> end: 1, 4, 1.5, 4 */
    CHECK(near(a.merge_max_us, 3.75));
    CHECK(near(a.end_p50_us, 13.75));   /* ends 11, 16.5, 10.5, 26: (11 + 16.5) / 2 */
    CHECK(near(a.tail_us, 26.0 - 13.75));
    /* The SMs' time over the 26 us: SM 5 runs [0, 11] (CTAs 0 and 2
     * overlap), SM 7 [0.5, 16.5], SM 9 [2, 26]: busy 11 + 16 + 24, head
     * 0 + 0.5 + 2, tail 15 + 9.5 + 0, no gap, of 3 x 26. */
    CHECK(near(a.busy_pct, 100.0 * 51.0 / 78.0));
    CHECK(near(a.head_pct, 100.0 * 2.5 / 78.0));
    CHECK(near(a.gap_pct, 0.0));
    CHECK(near(a.tail_pct, 100.0 * 24.5 / 78.0));
    CHECK(near(a.sm_end_p50_us, 16.5));
    CHECK(a.tiles == 0 && near(a.tile_ns_p50, 0.0)); /* no record says its tiles */

    /* One split (no stored mark), an odd count: medians are the middle value. */
    fp_cta_record s[3];
    s[0] = rec(0, 0, 0.0, 1.0, 5.0, -1, 5.5, 0);
    s[1] = rec(1, 1, 0.0, 2.0, 4.0, -1, 4.5, 0);
    s[2] = rec(2, 2, 1.0, 4.0, 6.0, -1, 7.0, 0);
    CHECK(fp_attn_cta_anatomy(s, 3, &a) == FP_OK);
    CHECK(a.ctas == 3 && a.sms == 3 && a.merged == 0);
    CHECK(near(a.landed_p50_us, 2.0));
    CHECK(near(a.loop_p50_us, 2.0)); /* 4, 2, 2 */
    CHECK(near(a.loop_max_us, 4.0));
    CHECK(near(a.store_max_us, 0.0) && near(a.merge_max_us, 0.0));
    CHECK(near(a.epilogue_p50_us, 0.5)); /* 0.5, 0.5, 1 */
    CHECK(near(a.span_us, 8.0));
    CHECK(near(a.end_p50_us, 5.5));

    /* A CTA with no key tile (no landed / loop marks): counted, its start and
     * end used, no landed / loop figure from it. */
    fp_cta_record e[2];
    e[0] = rec(0, 0, 0.0, 1.0, 3.0, -1, 4.0, 0);
    e[1] = rec(1, 1, 0.0, -1, -1, -1, 0.5, 0);
    CHECK(fp_attn_cta_anatomy(e, 2, &a) == FP_OK);
    CHECK(a.ctas == 2 && near(a.landed_p50_us, 1.0) && near(a.loop_p50_us, 2.0) && near(a.span_us, 4.0));
}

/* Records of a persistent kernel (v9: one per item, several on an SM, the
 * next one starting before the last ends), with their tiles: the loop's
 * rate and where each SM's time goes. */
static void test_sm_time(void) {
    fp_cta_record r[5];
    r[0] = rec(0, 0, 0.0, -1, 9.0, -1, 10.0, 0);  /* no landed mark: 9 us from its start */
    r[1] = rec(0, 0, 12.0, -1, 7.0, -1, 8.0, 0);  /* after a 2 us gap on SM 0 */
    r[2] = rec(1, 1, 1.0, 1.0, 10.0, -1, 13.0, 0); /* landed at 2, loop done at 11: 9 us */
    r[3] = rec(1, 1, 13.0, -1, 8.0, -1, 9.0, 0);  /* starts before r[2] ends: no gap */
    r[4] = rec(2, 2, 0.0, -1, -1, -1, 2.0, 0);    /* no tiles */
    r[0].tiles = 3; /* 3000 ns a tile */
    r[1].tiles = 7; /* 1000 */
    r[2].tiles = 4; /* 2250 */
    r[3].tiles = 0; /* a loop mark without tiles: no rate from it */
    fp_cta_anatomy a;
    CHECK(fp_attn_cta_anatomy(r, 5, &a) == FP_OK);
    CHECK(a.ctas == 5 && a.sms == 3);
    CHECK(near(a.span_us, 22.0));
    CHECK(a.tiles == 14);
    CHECK(near(a.tile_ns_p50, 2250.0));
    /* SM 0: [0, 10] + [12, 20], SM 1: [1, 22], SM 2: [0, 2] of 3 x 22 us */
    CHECK(near(a.busy_pct, 100.0 * 41.0 / 66.0));
    CHECK(near(a.head_pct, 100.0 * 1.0 / 66.0));
    CHECK(near(a.gap_pct, 100.0 * 2.0 / 66.0));
    CHECK(near(a.tail_pct, 100.0 * 22.0 / 66.0));
    CHECK(near(a.busy_pct + a.head_pct + a.gap_pct + a.tail_pct, 100.0));
    CHECK(near(a.sm_end_p50_us, 20.0)); /* 20, 22, 2 */
    CHECK(near(a.epilogue_p50_us, 1.0)); /* 1, 1, 3, 1: a loop mark without tiles still ends a loop */
    /* the records in another order: the same summary */
    fp_cta_record q[5] = {r[3], r[1], r[4], r[0], r[2]};
    fp_cta_anatomy b;
    CHECK(fp_attn_cta_anatomy(q, 5, &b) == FP_OK);
    CHECK(near(b.busy_pct, a.busy_pct) && near(b.gap_pct, a.gap_pct) && near(b.tail_pct, a.tail_pct) &&
          near(b.tile_ns_p50, a.tile_ns_p50) && near(b.sm_end_p50_us, a.sm_end_p50_us));
}

/* The file at path, NUL-terminated (NULL if unreadable). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1e300;
}
static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The complete event named `name` (its first), NULL if none. */
static const cJSON *event(const cJSON *evs, const char *name) {
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) if (strcmp(str(e, "ph"), "X") == 0 && strcmp(str(e, "name"), name) == 0) return e;
    return NULL;
}

/* Exports recs, parses the file back; NULL (a check failed) if either fails. */
static cJSON *export_parse(const fp_cta_record *recs, int64_t n, int items, const char *label, const char *path) {
    CHECK(fp_attn_cta_export_chrome(recs, n, items, label, path) == FP_OK);
    char *text = slurp(path);
    CHECK(text != NULL);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    CHECK(doc != NULL);
    free(text);
    return doc;
}

static void test_export(void) {
    char path[] = "/tmp/fp_cta_export_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    /* v9-like items (test_sm_time's records): SM 1's two overlap */
    fp_cta_record r[5];
    r[0] = rec(0, 0, 0.0, -1, 9.0, -1, 10.0, 0);
    r[1] = rec(0, 0, 12.0, -1, 7.0, -1, 8.0, 0);
    r[2] = rec(1, 1, 1.0, 1.0, 10.0, -1, 13.0, 0);
    r[3] = rec(1, 1, 13.0, -1, 8.0, -1, 9.0, 0);
    r[4] = rec(2, 2, 0.0, -1, -1, -1, 2.0, 0);
    r[2].tiles = 4;
    cJSON *doc = export_parse(r, 5, 1, "flash_v9 \"x1\"", path);
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
    CHECK(cJSON_IsArray(evs));
    int xs = 0, tracks = 0, named = 0, nested = 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(str(e, "name"), "process_name") == 0)
            named = strcmp(str(cJSON_GetObjectItemCaseSensitive(e, "args"), "name"), "flash_v9 \"x1\"") == 0;
        if (strcmp(str(e, "name"), "thread_name") == 0) ++tracks;
        if (strcmp(str(e, "ph"), "X") == 0) ++xs;
    }
    CHECK(named);
    CHECK(tracks == 4); /* SM 0, SM 1 and its second track, SM 2 */
    CHECK(xs == 14);    /* 5 records; loops 4, epilogues 4, one first tile */
    /* item 2: its first tile and loop, on its track, inside it */
    const cJSON *it = event(evs, "item 2"), *ft = event(evs, "first tile");
    CHECK(it && ft && near(num(it, "ts"), 1.0) && near(num(it, "dur"), 13.0) && near(num(ft, "ts"), 1.0) &&
          near(num(ft, "dur"), 1.0) && num(ft, "tid") == num(it, "tid"));
    const cJSON *a = it ? cJSON_GetObjectItemCaseSensitive(it, "args") : NULL;
    CHECK(a && num(a, "cta") == 1 && num(a, "sm") == 1 && num(a, "tiles") == 4);
    const cJSON *i3 = event(evs, "item 3");
    CHECK(i3 && it && num(i3, "tid") != num(it, "tid")); /* overlaps item 2: another track */
    const cJSON *i0 = event(evs, "item 0"), *i1 = event(evs, "item 1");
    CHECK(i0 && i1 && num(i0, "tid") == num(i1, "tid")); /* one after the other: one track */
    /* every phase lies inside a record of its track */
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(str(e, "ph"), "X") != 0 || strncmp(str(e, "name"), "item", 4) == 0) continue;
        int inside = 0;
        const cJSON *o;
        cJSON_ArrayForEach(o, evs) if (strncmp(str(o, "name"), "item", 4) == 0 && num(o, "tid") == num(e, "tid") &&
                                       num(e, "ts") >= num(o, "ts") - 1e-9 &&
                                       num(e, "ts") + num(e, "dur") <= num(o, "ts") + num(o, "dur") + 1e-9) inside = 1;
        nested = nested && inside;
    }
    CHECK(nested);
    const cJSON *loop2 = NULL; /* item 2's loop: from its landed mark at 2 us */
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(str(e, "name"), "loop") == 0 && num(e, "ts") > 1.5 && num(e, "ts") < 2.5) loop2 = e;
    }
    CHECK(loop2 && near(num(cJSON_GetObjectItemCaseSensitive(loop2, "args"), "ns_per_tile"), 2250.0));
    cJSON_Delete(doc);

    /* split CTAs (test_known_times' records): store, then merge or arrive */
    fp_cta_record k[2];
    k[0] = rec(0, 5, 0.0, 1.0, 10.0, 10.5, 11.0, 0);
    k[1] = rec(1, 7, 0.5, 2.0, 12.0, 12.25, 16.0, FP_CTA_MERGED);
    doc = export_parse(k, 2, 0, "flash_v1", path);
    evs = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
    const cJSON *merge = event(evs, "merge"), *arrive = event(evs, "arrive"), *c1 = event(evs, "cta 1");
    CHECK(event(evs, "cta 0") && c1 && merge && arrive && event(evs, "store") && !event(evs, "epilogue"));
    CHECK(merge && c1 && near(num(merge, "ts"), 12.75) && near(num(merge, "dur"), 3.75) &&
          num(merge, "tid") == num(c1, "tid"));
    cJSON_Delete(doc);

    /* refusals: nothing written */
    fp_cta_record none[2];
    memset(none, 0, sizeof none);
    unlink(path);
    CHECK(fp_attn_cta_export_chrome(none, 2, 0, "x", path) == FP_ERR_INVALID_ARGUMENT);
    CHECK(fp_attn_cta_export_chrome(k, 2, 0, NULL, path) == FP_ERR_INVALID_ARGUMENT);
    CHECK(access(path, F_OK) != 0);
    CHECK(fp_attn_cta_export_chrome(k, 2, 0, "x", "/nonexistent-dir/cta.json") == FP_ERR_IO);
    CHECK(strstr(fp_last_error(), "/nonexistent-dir/cta.json") != NULL);
}

static void test_refusals(void) {
    fp_cta_record r[2];
    memset(r, 0, sizeof r);
    fp_cta_anatomy a;
    memset(&a, 0x5A, sizeof a);
    CHECK(fp_attn_cta_anatomy(r, 2, &a) == FP_ERR_INVALID_ARGUMENT); /* nothing started */
    CHECK(a.ctas == 0 && a.span_us == 0.0);                           /* zeroed */
    CHECK(strstr(fp_last_error(), "none of the 2 records") != NULL);
    CHECK(fp_attn_cta_anatomy(NULL, 2, &a) == FP_ERR_INVALID_ARGUMENT);
    CHECK(fp_attn_cta_anatomy(r, -1, &a) == FP_ERR_INVALID_ARGUMENT);
    CHECK(fp_attn_cta_anatomy(r, 2, NULL) == FP_ERR_INVALID_ARGUMENT);
    CHECK(fp_attn_cta_anatomy(r, 0, &a) == FP_ERR_INVALID_ARGUMENT);
    /* marks going backwards */
    r[0] = rec(0, 0, 0.0, 2.0, 1.0, -1, 3.0, 0);
    CHECK(fp_attn_cta_anatomy(r, 1, &a) == FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "before an earlier mark") != NULL);
    /* started, never ended */
    r[0] = rec(0, 0, 0.0, 1.0, 2.0, -1, -1, 0);
    CHECK(fp_attn_cta_anatomy(r, 1, &a) == FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "has no end") != NULL);
}

static void test_thread_state(void) {
    fp_cta_record buf[4];
    int64_t cap = -1;
    CHECK(fp_attn_cuda_cta_trace_get(&cap) == NULL && cap == 0); /* off by default */
    fp_attn_cuda_cta_trace_set(buf, 4);
    CHECK(fp_attn_cuda_cta_trace_get(&cap) == buf && cap == 4);
    CHECK(fp_attn_cuda_cta_trace_take() == 0);
    fp_attn_cuda_cta_trace_note(3);
    CHECK(fp_attn_cuda_cta_trace_take() == 3);
    CHECK(fp_attn_cuda_cta_trace_take() == 0); /* taken */
    fp_attn_cuda_cta_trace_set(buf, 0);           /* capacity 0: off */
    CHECK(fp_attn_cuda_cta_trace_get(&cap) == NULL && cap == 0);
    fp_attn_cuda_cta_trace_set(NULL, 8);
    CHECK(fp_attn_cuda_cta_trace_get(&cap) == NULL && cap == 0);
}

int main(void) {
    test_known_times();
    test_sm_time();
    test_export();
    test_refusals();
    test_thread_state();
    TEST_END();
}
