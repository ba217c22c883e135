/* Pipeline test cases shared by test_pipeline.c (CPU context) and
 * test_pipeline_gpu.c (CUDA context: a GPU, or the emulated runtime with
 * asynchronous streams). The compute is a library op (fp_axpby: out = 2 in
 * + 0, exact in f32), so on CUDA it is real device work ordered by the
 * pipeline's events; a missing dependency shows as wrong output. */
#ifndef PIPELINE_CASES_H
#define PIPELINE_CASES_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastpath/pipeline.h"
#include "fp_test.h"
#include "internal.h"
#ifndef FP_TSAN_BUILD
#include "timing/probes.h"
#endif

static fp_context *pc_ctx;

/* Host memory for inputs and outputs: pageable, or pinned on CUDA. */
static void *pc_host_alloc(size_t n, int pinned) {
    void *p = NULL;
    if (pinned && fp_context_kind(pc_ctx) == FP_DEVICE_CUDA) {
        if (cudaHostAlloc(&p, n, cudaHostAllocPortable) != cudaSuccess) return NULL;
        return p;
    }
    return malloc(n);
}
static void pc_host_free(void *p, int pinned) {
    if (pinned && fp_context_kind(pc_ctx) == FP_DEVICE_CUDA) cudaFreeHost(p);
    else free(p);
}

static void pc_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static fp_status fp_set_error_for_test(fp_status st, uint64_t seq) {
    return fp_set_error(st, "test failure %llu", (unsigned long long)seq);
}

/* The compute: out = 1.5 in + 0.5 in, optionally failing some chunks and
 * optionally held at a gate (to fill the pipeline). */
typedef struct pc_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gate_closed;
    int fail_mod, fail_rem;         /* fail chunks with seq % mod == rem (mod 0: none) */
    uint64_t order[4096];           /* completion order */
    fp_status status[4096];
    char first_msg[256];
    int ncomplete;
    int computes;
    fp_pipeline *self;              /* for the calls-from-callback checks */
    fp_status from_cb_flush, from_cb_submit_block, from_cb_submit_nb;
    int check_from_callback;
} pc_state;

static void pc_state_init(pc_state *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
}
static void pc_state_destroy(pc_state *s) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}
static void pc_gate(pc_state *s, int closed) {
    pthread_mutex_lock(&s->mu);
    s->gate_closed = closed;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static fp_status pc_compute(void *user, fp_stream stream, const fp_pipeline_chunk *c) {
    pc_state *s = user;
    pthread_mutex_lock(&s->mu);
    s->computes++;
    while (s->gate_closed) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (s->check_from_callback && s->self) {
        s->from_cb_flush = fp_pipeline_flush(s->self, -1);
        s->from_cb_submit_block = fp_pipeline_submit(s->self, c->host_in, 4, NULL, 0, NULL, -1, NULL);
        s->check_from_callback = 0;
    }
    if (s->fail_mod && c->seq % (uint64_t)s->fail_mod == (uint64_t)s->fail_rem)
        return fp_set_error_for_test(FP_ERR_INVALID_ARGUMENT, c->seq);
    if (!c->out_bytes) return FP_OK;
#ifdef FP_TSAN_BUILD /* no kernels linked: the CPU context's "device" buffers are host memory */
    (void)stream;
    const float *x = c->d_in;
    float *y = c->d_out;
    for (size_t i = 0; i < c->in_bytes / 4; ++i) y[i] = 1.5f * x[i] + 0.5f * x[i];
    return FP_OK;
#else
    return fp_axpby(pc_ctx, stream, 2, FP_F32, c->in_bytes / 4, 1.5f, c->d_in, 0.5f, c->d_in, c->d_out);
#endif
}

static void pc_complete(void *user, const fp_pipeline_chunk *c, fp_status st, const char *msg) {
    pc_state *s = user;
    pthread_mutex_lock(&s->mu);
    if (s->ncomplete < 4096) {
        s->order[s->ncomplete] = c->seq;
        s->status[s->ncomplete] = st;
    }
    if (st != FP_OK && !s->first_msg[0]) snprintf(s->first_msg, sizeof s->first_msg, "%s", msg);
    s->ncomplete++;
    pthread_mutex_unlock(&s->mu);
}

static fp_pipeline_config pc_config(pc_state *s, size_t max_bytes, int depth) {
    fp_pipeline_config cfg;
    fp_pipeline_config_default(&cfg);
    cfg.depth = depth;
    cfg.max_in_bytes = max_bytes;
    cfg.max_out_bytes = max_bytes;
    cfg.compute = pc_compute;
    cfg.complete = pc_complete;
    cfg.user = s;
    return cfg;
}

static void pc_fill(float *x, size_t n, uint64_t seed) { fp_test_fill(x, n, seed, -4, 4); }

/* Every output element must be 2 x its input: also catches an unwritten
 * (poisoned) element and a chunk's output landing at another chunk. */
static size_t pc_bad(const float *in, const float *out, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i)
        if (out[i] != 2.0f * in[i]) bad++;
    return bad;
}

/* ------------------------------------------------------------------------ */

/* Many chunks of several sizes, pageable and pinned: outputs right, in
 * order, statistics consistent. */
static void pc_test_order(int pinned) {
    pc_state s;
    pc_state_init(&s);
    /* Every 8th chunk full-size (above 2 MiB: split over the staging
     * threads), the rest small, some of odd lengths. */
    const size_t chunk = (size_t)5 << 19, small = fp_test_quick() ? (64 << 10) : (1 << 20);
    const int nch = fp_test_quick() ? 24 : 64;
    size_t total = 0, sizes[64];
    for (int i = 0; i < nch; ++i) {
        sizes[i] = i % 8 == 0 ? chunk : i % 7 == 6 ? small / 4 + 4 * (size_t)i : small;
        total += sizes[i];
    }
    float *in = pc_host_alloc(total, pinned), *out = pc_host_alloc(total, pinned);
    CHECK(in && out);
    pc_fill(in, total / 4, 11);
    memset(out, 0xff, total);
    fp_pipeline_config cfg = pc_config(&s, chunk, 3);
    cfg.staging_threads = 3;
    fp_pipeline *p = NULL;
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    size_t off = 0;
    for (int i = 0; i < nch; ++i) {
        uint64_t seq = 99;
        CHECK_OK(fp_pipeline_submit(p, (char *)in + off, sizes[i], (char *)out + off, sizes[i], NULL, -1, &seq));
        CHECK(seq == (uint64_t)i);
        off += sizes[i];
    }
    CHECK_OK(fp_pipeline_flush(p, -1));
    CHECK_MSG(pc_bad(in, out, total / 4) == 0, "pinned=%d: %zu of %zu outputs wrong", pinned,
              pc_bad(in, out, total / 4), total / 4);
    CHECK(s.ncomplete == nch);
    for (int i = 0; i < nch && i < s.ncomplete; ++i) CHECK(s.order[i] == (uint64_t)i && s.status[i] == FP_OK);
    fp_pipeline_stats st;
    fp_pipeline_stats_init(&st);
    CHECK_OK(fp_pipeline_get_stats(p, &st));
    CHECK(st.submitted == (uint64_t)nch && st.completed == (uint64_t)nch && st.failed == 0 && st.cancelled == 0);
    CHECK(st.bytes_h2d == total && st.bytes_d2h == total);
    /* CPU: everything is staged; CUDA: pageable inputs are, pinned ones not. */
    int cuda = fp_context_kind(pc_ctx) == FP_DEVICE_CUDA;
    CHECK_MSG(st.staged == (cuda && pinned ? 0u : (uint64_t)nch), "staged %llu", (unsigned long long)st.staged);
    CHECK(st.wall_ms > 0 && st.h2d_ms >= 0 && st.compute_ms >= 0 && st.max_in_flight >= 1);
    CHECK(st.overlap_efficiency > 0);
    CHECK_OK(fp_pipeline_reset_stats(p));
    CHECK_OK(fp_pipeline_get_stats(p, &st));
    CHECK(st.submitted == 0 && st.completed == 0 && st.wall_ms == 0);
    fp_pipeline_destroy(p);
    pc_host_free(in, pinned);
    pc_host_free(out, pinned);
    pc_state_destroy(&s);
}

/* Chunks without output (no d2h stage). */
static void pc_test_no_output(void) {
    pc_state s;
    pc_state_init(&s);
    fp_pipeline_config cfg = pc_config(&s, 4096, 2);
    cfg.max_out_bytes = 0;
    fp_pipeline *p = NULL;
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    float in[1024];
    pc_fill(in, 1024, 3);
    for (int i = 0; i < 10; ++i) CHECK_OK(fp_pipeline_submit(p, in, sizeof in, NULL, 0, NULL, -1, NULL));
    CHECK_STATUS(fp_pipeline_submit(p, in, sizeof in, in, 4, NULL, -1, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_pipeline_flush(p, -1));
    fp_pipeline_stats st;
    fp_pipeline_stats_init(&st);
    CHECK_OK(fp_pipeline_get_stats(p, &st));
    CHECK(st.completed == 10 && st.bytes_d2h == 0 && st.bytes_h2d == 10 * sizeof in);
    fp_pipeline_destroy(p);
    pc_state_destroy(&s);
}

/* Back-pressure on chunks and on bytes: non-blocking and timed submits
 * refused while full, accepted once chunks complete. */
static void pc_test_backpressure(void) {
    pc_state s;
    pc_state_init(&s);
    fp_pipeline_config cfg = pc_config(&s, 4096, 1);
    cfg.max_chunks_in_flight = 3;
    fp_pipeline *p = NULL;
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    float in[1024], out[4][1024];
    pc_fill(in, 1024, 5);
    pc_gate(&s, 1);
    for (int i = 0; i < 3; ++i) CHECK_OK(fp_pipeline_submit(p, in, sizeof in, out[i], sizeof in, NULL, 0, NULL));
    CHECK_STATUS(fp_pipeline_submit(p, in, sizeof in, out[3], sizeof in, NULL, 0, NULL), FP_ERR_QUEUE_FULL);
    CHECK_STATUS(fp_pipeline_submit(p, in, sizeof in, out[3], sizeof in, NULL, 30, NULL), FP_ERR_TIMEOUT);
    CHECK_STATUS(fp_pipeline_flush(p, 20), FP_ERR_TIMEOUT);
    pc_gate(&s, 0);
    CHECK_OK(fp_pipeline_submit(p, in, sizeof in, out[3], sizeof in, NULL, 5000, NULL));
    CHECK_OK(fp_pipeline_flush(p, 10000));
    for (int i = 0; i < 4; ++i) CHECK(pc_bad(in, out[i], 1024) == 0);
    fp_pipeline_stats st;
    fp_pipeline_stats_init(&st);
    CHECK_OK(fp_pipeline_get_stats(p, &st));
    CHECK(st.max_in_flight == 3 && st.submit_wait_ms > 0);
    fp_pipeline_destroy(p);

    /* Bytes: two 4 KiB chunks fit under 10 KiB, a third does not; a 1 KiB one does. */
    cfg.max_chunks_in_flight = 0;
    cfg.max_bytes_in_flight = 10240;
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    pc_gate(&s, 1);
    CHECK_OK(fp_pipeline_submit(p, in, 4096, out[0], 4096, NULL, 0, NULL));
    CHECK_OK(fp_pipeline_submit(p, in, 4096, out[1], 4096, NULL, 0, NULL));
    CHECK_STATUS(fp_pipeline_submit(p, in, 4096, out[2], 4096, NULL, 0, NULL), FP_ERR_QUEUE_FULL);
    CHECK_OK(fp_pipeline_submit(p, in, 1024, out[2], 1024, NULL, 0, NULL));
    pc_gate(&s, 0);
    CHECK_OK(fp_pipeline_flush(p, -1));
    fp_pipeline_destroy(p);
    pc_state_destroy(&s);
}

/* A failing compute fails its chunk only; flush reports the first. */
static void pc_test_errors(void) {
    pc_state s;
    pc_state_init(&s);
    s.fail_mod = 5;
    s.fail_rem = 3;
    fp_pipeline_config cfg = pc_config(&s, 4096, 3);
    fp_pipeline *p = NULL;
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    enum { N = 20 };
    static float in[N][1024], out[N][1024];
    for (int i = 0; i < N; ++i) {
        pc_fill(in[i], 1024, 100 + (uint64_t)i);
        memset(out[i], 0xff, sizeof out[i]);
        CHECK_OK(fp_pipeline_submit(p, in[i], 4096, out[i], 4096, NULL, -1, NULL));
    }
    fp_status st = fp_pipeline_flush(p, -1);
    CHECK_STATUS(st, FP_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(fp_last_error(), "chunk 3 ") != NULL && strstr(fp_last_error(), "test failure 3") != NULL,
              "flush message: %s", fp_last_error());
    CHECK(strstr(s.first_msg, "test failure 3") != NULL);
    CHECK(s.ncomplete == N);
    for (int i = 0; i < N; ++i) {
        CHECK(s.order[i] == (uint64_t)i);
        if (i % 5 == 3) {
            CHECK(s.status[i] == FP_ERR_INVALID_ARGUMENT);
        } else {
            CHECK(s.status[i] == FP_OK);
            CHECK(pc_bad(in[i], out[i], 1024) == 0);
        }
    }
    CHECK_OK(fp_pipeline_flush(p, -1)); /* the failure was reported once */
    fp_pipeline_stats stt;
    fp_pipeline_stats_init(&stt);
    CHECK_OK(fp_pipeline_get_stats(p, &stt));
    CHECK(stt.failed == 4 && stt.completed == N);
    fp_pipeline_destroy(p);
    pc_state_destroy(&s);
}

/* Cancel: chunks not started complete CANCELLED, in order; the pipeline
 * stays usable. */
static void pc_test_cancel(void) {
    pc_state s;
    pc_state_init(&s);
    fp_pipeline_config cfg = pc_config(&s, 4096, 1);
    cfg.max_chunks_in_flight = 16;
    fp_pipeline *p = NULL;
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    static float in[1024], out[12][1024];
    pc_fill(in, 1024, 9);
    pc_gate(&s, 1);
    for (int i = 0; i < 10; ++i) CHECK_OK(fp_pipeline_submit(p, in, 4096, out[i], 4096, NULL, -1, NULL));
    /* Wait until chunk 0 is in its compute (started), then cancel the rest. */
    for (int k = 0; k < 2000; ++k) {
        pthread_mutex_lock(&s.mu);
        int c = s.computes;
        pthread_mutex_unlock(&s.mu);
        if (c) break;
        pc_sleep_ms(1);
    }
    uint64_t n = 0;
    CHECK_OK(fp_pipeline_cancel(p, &n));
    CHECK_MSG(n == 9, "cancelled %llu, want 9", (unsigned long long)n);
    CHECK_OK(fp_pipeline_cancel(p, &n));
    CHECK(n == 0);
    pc_gate(&s, 0);
    CHECK_STATUS(fp_pipeline_flush(p, -1), FP_ERR_CANCELLED);
    CHECK(s.ncomplete == 10 && s.status[0] == FP_OK && pc_bad(in, out[0], 1024) == 0);
    for (int i = 1; i < 10; ++i) CHECK(s.order[i] == (uint64_t)i && s.status[i] == FP_ERR_CANCELLED);
    /* Still usable. */
    CHECK_OK(fp_pipeline_submit(p, in, 4096, out[10], 4096, NULL, -1, NULL));
    CHECK_OK(fp_pipeline_flush(p, -1));
    CHECK(pc_bad(in, out[10], 1024) == 0);
    fp_pipeline_stats st;
    fp_pipeline_stats_init(&st);
    CHECK_OK(fp_pipeline_get_stats(p, &st));
    CHECK(st.cancelled == 9 && st.completed == 11);
    fp_pipeline_destroy(p);
    pc_state_destroy(&s);
}

/* Destroy with chunks queued and one held in its compute: every callback
 * runs, nothing hangs. */
typedef struct pc_opener {
    pc_state *s;
    int after_ms;
} pc_opener;
static void *pc_open_later(void *arg) {
    pc_opener *o = arg;
    pc_sleep_ms(o->after_ms);
    pc_gate(o->s, 0);
    return NULL;
}
static void pc_test_destroy_in_flight(void) {
    pc_state s;
    pc_state_init(&s);
    fp_pipeline_config cfg = pc_config(&s, 4096, 2);
    fp_pipeline *p = NULL;
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    static float in[1024], out[6][1024];
    pc_fill(in, 1024, 13);
    pc_gate(&s, 1);
    for (int i = 0; i < 6; ++i) CHECK_OK(fp_pipeline_submit(p, in, 4096, out[i], 4096, NULL, -1, NULL));
    pc_opener o = {&s, 50};
    pthread_t th;
    pthread_create(&th, NULL, pc_open_later, &o);
    fp_pipeline_destroy(p);
    pthread_join(th, NULL);
    CHECK(s.ncomplete == 6);
    for (int i = 0; i < 6 && i < s.ncomplete; ++i) {
        CHECK(s.order[i] == (uint64_t)i);
        CHECK(s.status[i] == FP_OK || s.status[i] == FP_ERR_CANCELLED);
        if (s.status[i] == FP_OK) CHECK(pc_bad(in, out[i], 1024) == 0);
    }
    CHECK(s.status[5] == FP_ERR_CANCELLED);
    pc_state_destroy(&s);
}

/* Bad input: clear statuses, nothing queued. */
static void pc_test_bad_input(void) {
    pc_state s;
    pc_state_init(&s);
    fp_pipeline *p = NULL;
    fp_pipeline_config cfg = pc_config(&s, 4096, 2);
    fp_pipeline_config bad = cfg;
    bad.compute = NULL;
    CHECK_STATUS(fp_pipeline_create(pc_ctx, &bad, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "compute") != NULL);
    bad = cfg;
    bad.depth = 0;
    CHECK_STATUS(fp_pipeline_create(pc_ctx, &bad, &p), FP_ERR_INVALID_ARGUMENT);
    bad.depth = 65;
    CHECK_STATUS(fp_pipeline_create(pc_ctx, &bad, &p), FP_ERR_INVALID_ARGUMENT);
    bad = cfg;
    bad.max_in_bytes = 0;
    CHECK_STATUS(fp_pipeline_create(pc_ctx, &bad, &p), FP_ERR_INVALID_ARGUMENT);
    bad = cfg;
    bad.max_bytes_in_flight = 100; /* below one chunk */
    CHECK_STATUS(fp_pipeline_create(pc_ctx, &bad, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "max_bytes_in_flight") != NULL);
    bad = cfg;
    bad.struct_size = 3;
    CHECK_STATUS(fp_pipeline_create(pc_ctx, &bad, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pipeline_create(NULL, &cfg, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pipeline_create(pc_ctx, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(p == NULL);

    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    static float in[2048], out[2048];
    pc_fill(in, 2048, 17);
    CHECK_STATUS(fp_pipeline_submit(p, in, 0, out, 4, NULL, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pipeline_submit(p, in, 4100, out, 4, NULL, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pipeline_submit(p, in, 4096, out, 4100, NULL, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pipeline_submit(p, in, 4096, NULL, 4096, NULL, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pipeline_submit(p, NULL, 4096, out, 4096, NULL, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pipeline_submit(NULL, in, 4096, out, 4096, NULL, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_pipeline_stats st;
    fp_pipeline_stats_init(&st);
    CHECK_OK(fp_pipeline_get_stats(p, &st));
    CHECK(st.submitted == 0);
    /* Calls from the pipeline's own callback. */
    s.self = p;
    s.check_from_callback = 1;
    CHECK_OK(fp_pipeline_submit(p, in, 4096, out, 4096, NULL, -1, NULL));
    CHECK_OK(fp_pipeline_flush(p, -1));
    CHECK(s.from_cb_flush == FP_ERR_INVALID_ARGUMENT && s.from_cb_submit_block == FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_pipeline_close(p));
    CHECK_OK(fp_pipeline_close(p));
    CHECK_STATUS(fp_pipeline_submit(p, in, 4096, out, 4096, NULL, -1, NULL), FP_ERR_SHUT_DOWN);
    CHECK_OK(fp_pipeline_flush(p, -1));
    fp_pipeline_destroy(p);
    fp_pipeline_destroy(NULL);
    pc_state_destroy(&s);
}

/* Concurrent submitters: every chunk completes once, outputs right. */
typedef struct pc_submitter {
    fp_pipeline *p;
    const float *in;
    float *out;
    int n;
    fp_status st;
} pc_submitter;
static void *pc_submit_many(void *arg) {
    pc_submitter *t = arg;
    for (int i = 0; i < t->n && t->st == FP_OK; ++i)
        t->st = fp_pipeline_submit(t->p, t->in + 256 * i, 1024, t->out + 256 * i, 1024, NULL, -1, NULL);
    return NULL;
}
static void pc_test_threads(void) {
    pc_state s;
    pc_state_init(&s);
    fp_pipeline_config cfg = pc_config(&s, 1024, 3);
    cfg.max_chunks_in_flight = 4;
    fp_pipeline *p = NULL;
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    enum { T = 3, PER = 40 };
    static float in[T][256 * PER], out[T][256 * PER];
    pc_submitter sub[T];
    pthread_t th[T];
    for (int t = 0; t < T; ++t) {
        pc_fill(in[t], 256 * PER, 200 + (uint64_t)t);
        memset(out[t], 0xff, sizeof out[t]);
        sub[t] = (pc_submitter){p, in[t], out[t], PER, FP_OK};
        pthread_create(&th[t], NULL, pc_submit_many, &sub[t]);
    }
    for (int t = 0; t < T; ++t) pthread_join(th[t], NULL);
    CHECK_OK(fp_pipeline_flush(p, -1));
    for (int t = 0; t < T; ++t) {
        CHECK_OK(sub[t].st);
        CHECK(pc_bad(in[t], out[t], 256 * PER) == 0);
    }
    CHECK(s.ncomplete == T * PER);
    for (int i = 0; i < s.ncomplete && i < T * PER; ++i) CHECK(s.order[i] == (uint64_t)i);
    fp_pipeline_destroy(p);
    pc_state_destroy(&s);
}

#ifndef FP_TSAN_BUILD
/* The built-in A/B on a small input: outputs agree, figures filled. */
static void pc_test_validate(void) {
    pc_state s;
    pc_state_init(&s);
    size_t chunk = 64 << 10, bytes = 16 * chunk + 4096;
    float *in = malloc(bytes), *out = malloc(bytes);
    pc_fill(in, bytes / 4, 21);
    fp_pipeline_config cfg = pc_config(&s, chunk, 3);
    fp_timing_config tc;
    fp_timing_config_default(&tc);
    tc.warmup = 1;
    tc.min_samples = 3;
    tc.max_samples = 5;
    tc.max_time_s = 0.5;
    fp_pipeline_ab_report rep;
    fp_pipeline_ab_report_init(&rep);
    CHECK_OK(fp_pipeline_validate(pc_ctx, &cfg, in, bytes, out, &tc, &rep));
    CHECK(rep.outputs_equal == 1);
    CHECK(pc_bad(in, out, bytes / 4) == 0);
    CHECK(rep.baseline.samples >= 3 && rep.optimized.samples >= 3 && rep.speedup > 0);
    CHECK(rep.pipeline.completed == 17 && rep.pipeline.bytes_h2d == bytes);
    CHECK(rep.copy_ms > 0 && rep.compute_ms > 0 && rep.overlap_bound_ms > 0);
    CHECK_STATUS(fp_pipeline_validate(pc_ctx, &cfg, in, 0, out, &tc, &rep), FP_ERR_INVALID_ARGUMENT);
    free(in);
    free(out);
    pc_state_destroy(&s);
}
#endif

/* Staging from a pinned pool: a budget below one staging buffer is a
 * clear refusal at create; with room, the pipeline's buffers come from the
 * pool's reserve (no pin during create) and outputs are right. */
static void pc_test_pinned_pool(void) {
    pc_state s;
    pc_state_init(&s);
    fp_pinned_config pcfg;
    fp_pinned_config_default(&pcfg);
    pcfg.chunk_bytes = (size_t)16 << 20;
    pcfg.budget_bytes = (size_t)1 << 20;
    fp_pinned_pool *pool = NULL;
    CHECK_OK(fp_pinned_pool_create(pc_ctx, &pcfg, &pool));
    fp_pipeline_config cfg = pc_config(&s, (size_t)2 << 20, 2);
    cfg.pinned = fp_pinned_pool_allocator(pool);
    fp_pipeline *p = NULL;
    CHECK_STATUS(fp_pipeline_create(pc_ctx, &cfg, &p), FP_ERR_OUT_OF_MEMORY);
    CHECK_MSG(strstr(fp_last_error(), "budget") != NULL, "message: %s", fp_last_error());
    CHECK(p == NULL);
    fp_pinned_pool_destroy(pool);

    pcfg.budget_bytes = (size_t)64 << 20;
    CHECK_OK(fp_pinned_pool_create(pc_ctx, &pcfg, &pool));
    CHECK_OK(fp_pinned_pool_reserve(pool, (size_t)16 << 20));
    CHECK_OK(fp_pinned_pool_reserve_wait(pool, -1));
    fp_pinned_stats before, after;
    fp_pinned_stats_init(&before);
    fp_pinned_stats_init(&after);
    CHECK_OK(fp_pinned_pool_get_stats(pool, &before));
    cfg.pinned = fp_pinned_pool_allocator(pool);
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    CHECK_OK(fp_pinned_pool_get_stats(pool, &after));
    CHECK_MSG(after.pin_calls == before.pin_calls, "pipeline create pinned %llu more pieces",
              (unsigned long long)(after.pin_calls - before.pin_calls));
    size_t n = (size_t)2 << 20;
    float *in = malloc(n), *out = malloc(n);
    pc_fill(in, n / 4, 31);
    memset(out, 0xff, n);
    CHECK_OK(fp_pipeline_submit(p, in, n, out, n, NULL, -1, NULL));
    CHECK_OK(fp_pipeline_flush(p, -1));
    CHECK(pc_bad(in, out, n / 4) == 0);
    fp_pipeline_destroy(p);
    /* Back in the pool's cache: a new pipeline pins nothing either. */
    CHECK_OK(fp_pipeline_create(pc_ctx, &cfg, &p));
    CHECK_OK(fp_pinned_pool_get_stats(pool, &after));
    CHECK(after.pin_calls == before.pin_calls);
    fp_pipeline_destroy(p);
    fp_pinned_pool_destroy(pool);
    free(in);
    free(out);
    pc_state_destroy(&s);
}

static void pc_run_all(fp_context *ctx) {
    pc_ctx = ctx;
    pc_test_bad_input();
    pc_test_order(0);
    pc_test_order(1);
    pc_test_no_output();
    pc_test_backpressure();
    pc_test_errors();
    pc_test_cancel();
    pc_test_destroy_in_flight();
    pc_test_threads();
#ifndef FP_TSAN_BUILD /* the A/B needs the timing engine, not in the TSan build */
    pc_test_validate();
#endif
    pc_test_pinned_pool();
}

#endif /* PIPELINE_CASES_H */
