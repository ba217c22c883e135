/* fp_attn_cta_anatomy (src/attention/attention_cta_trace.c): the summary of
 * a traced launch's CTA records, on synthetic records of known times, and
 * its refusals; the calling thread's trace state (set / get / note / take).
 * The kernels' side: test_attention_cta_trace_gpu. */
#include <math.h>
#include <stdio.h>
#include <string.h>

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
    test_refusals();
    test_thread_state();
    TEST_END();
}
