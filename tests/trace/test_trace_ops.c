/* The library's instrumented entry points (trace.h, "Instrumented ops"), on
 * a CPU context (test_trace_ops) or with the argument "cuda" on a CUDA one
 * (test_trace_ops_gpu on a device, test_trace_ops_gpu_emu on the emulated
 * runtime): each op records exactly one span with its name, category,
 * bytes (the library's own count) and flops, the step / module / stage of
 * the enclosing user range, inside that range's interval; nothing while
 * tracing is off or when the op refuses its arguments; no span left open;
 * ops captured into a CUDA graph record nothing during the capture
 * (skipped_capturing) while the replay records its "graph_replay" span;
 * pipeline stages and batch executions, their spans ended when the compute
 * or the executor fails. NVTX: with FASTPATH_NVTX=1 (the
 * test_trace_ops_nvtx run) every op pushes and pops a range even with
 * tracing off; without it, only while tracing is on. Prints the host cost
 * of an instrumented op with tracing off and on (bound asserted: generous). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fastpath/attention.h"
#include "fastpath/batcher.h"
#include "fastpath/graph.h"
#include "fastpath/norm.h"
#include "fastpath/pipeline.h"
#include "fastpath/trace.h"
#include "fp_test.h"
#include "trace_test_util.h"
#include "internal.h"
#include "norm/norm_launch.h" /* fp_norm_forward_version, fp_norm_backward_version */

/* CUDA times are float milliseconds from the base event: allow rounding */
#define TIME_TOL 2e-6
#define ROWS 16
#define COLS 256
#define MAX_SPANS 256

static fp_context *g_ctx;
static fp_trace_span g_spans[MAX_SPANS];

/* Device (or, on a CPU context, host) buffer filled from a seeded pattern. */
static void *dev_floats(size_t n, uint64_t seed, float lo, float hi) {
    float *h = malloc(n * sizeof *h);
    void *d = NULL;
    CHECK(h != NULL);
    if (!h) return NULL;
    fp_test_fill(h, n, seed, lo, hi);
    CHECK_OK(fp_mem_alloc(g_ctx, n * sizeof *h, &d));
    if (d) CHECK_OK(fp_mem_upload(g_ctx, d, h, n * sizeof *h, NULL));
    free(h);
    return d;
}

typedef struct norm_bufs {
    void *x, *out, *gamma, *beta, *dout, *dx, *dgamma, *dbeta;
    float *mean, *rstd;
} norm_bufs;

static void norm_bufs_make(norm_bufs *b) {
    b->x = dev_floats(ROWS * COLS, 1, -1, 1);
    b->out = dev_floats(ROWS * COLS, 2, -1, 1);
    b->gamma = dev_floats(COLS, 3, 0.5f, 1.5f);
    b->beta = dev_floats(COLS, 4, -0.5f, 0.5f);
    b->dout = dev_floats(ROWS * COLS, 5, -1, 1);
    b->dx = dev_floats(ROWS * COLS, 6, -1, 1);
    b->dgamma = dev_floats(COLS, 7, -1, 1);
    b->dbeta = dev_floats(COLS, 8, -1, 1);
    b->mean = dev_floats(ROWS, 9, -1, 1);
    b->rstd = dev_floats(ROWS, 10, 0.5f, 1.5f);
}

static void norm_bufs_free(norm_bufs *b) {
    void *v[] = {b->x, b->out, b->gamma, b->beta, b->dout, b->dx, b->dgamma, b->dbeta, b->mean, b->rstd};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; ++i) fp_mem_free(g_ctx, v[i]);
}

static void norm_fwd_params(const norm_bufs *b, fp_norm_params *p) {
    fp_norm_params_default(p);
    p->rows = ROWS;
    p->cols = COLS;
    p->x = b->x;
    p->gamma = b->gamma;
    p->beta = b->beta;
    p->out = b->out;
    p->mean = b->mean;
    p->rstd = b->rstd;
}

static void norm_bwd_params(const norm_bufs *b, fp_norm_backward_params *p) {
    fp_norm_backward_params_default(p);
    p->rows = ROWS;
    p->cols = COLS;
    p->dout = b->dout;
    p->x = b->x;
    p->gamma = b->gamma;
    p->beta = b->beta;
    p->mean = b->mean;
    p->rstd = b->rstd;
    p->dx = b->dx;
    p->dgamma = b->dgamma;
    p->dbeta = b->dbeta;
}

typedef struct attn_bufs {
    void *q, *k, *v, *o;
} attn_bufs;

#define ATT_HEADS 2
#define ATT_DIM 64
#define ATT_SEQ 32

static void attn_bufs_make(attn_bufs *b) {
    const size_t n = (size_t)ATT_SEQ * ATT_HEADS * ATT_DIM;
    b->q = dev_floats(n, 21, -1, 1);
    b->k = dev_floats(n, 22, -1, 1);
    b->v = dev_floats(n, 23, -1, 1);
    b->o = dev_floats(n, 24, -1, 1);
}

static void attn_bufs_free(attn_bufs *b) {
    fp_mem_free(g_ctx, b->q);
    fp_mem_free(g_ctx, b->k);
    fp_mem_free(g_ctx, b->v);
    fp_mem_free(g_ctx, b->o);
}

static void attn_params(const attn_bufs *b, int seqlen_q, fp_attention_params *p) {
    fp_attention_params_default(p);
    p->batch = 1;
    p->seqlen_q = seqlen_q;
    p->seqlen_k = ATT_SEQ;
    p->heads_q = p->heads_kv = ATT_HEADS;
    p->head_dim = ATT_DIM;
    p->dtype = FP_F32;
    p->q = b->q;
    p->k = b->k;
    p->v = b->v;
    p->o = b->o;
}

/* Q, O, K, V once each: attention's roofline bytes (fp_attn_bytes). */
static double attn_bytes(const fp_attention_params *p) {
    return 4.0 * p->head_dim *
           (2.0 * p->batch * p->seqlen_q * p->heads_q + 2.0 * p->batch * p->seqlen_k * p->heads_kv);
}

static fp_trace_stats stats(void) { return stats_of(g_ctx); }

/* Reads (and clears) the ring: the finished spans into g_spans. */
static size_t take_spans(void) {
    size_t n = 0;
    CHECK_OK(fp_trace_read(g_ctx, g_spans, MAX_SPANS, &n, 1));
    return n;
}

static const fp_trace_span *find(size_t n, const char *name, int *count) {
    const fp_trace_span *hit = NULL;
    *count = 0;
    for (size_t i = 0; i < n; ++i)
        if (strcmp(g_spans[i].name, name) == 0) {
            hit = &g_spans[i];
            ++*count;
        }
    return hit;
}

/* the times' tolerance: TIME_TOL, plus the kernel timer's placement error
 * against the event-timed ranges (FASTPATH_TRACE_TIMER=kernel) */
static double time_tol(void) { return TIME_TOL + stats().clock_error_s; }

static int inside(const fp_trace_span *outer, const fp_trace_span *in) {
    const double tol = time_tol();
    return in->start_s >= outer->start_s - tol && in->end_s <= outer->end_s + tol && in->start_s <= in->end_s;
}

/* The one span named `name` with these fields, inside the range span
 * "model/layer3" (module "model", stage "layer3", step 5). */
static void expect_op(size_t n, const char *name, const char *category, double bytes, double flops) {
    int count = 0, rc = 0;
    const fp_trace_span *s = find(n, name, &count);
    const fp_trace_span *range = find(n, "model/layer3", &rc);
    CHECK_MSG(count == 1, "%s: %d spans (want 1)", name, count);
    CHECK(rc == 1);
    if (!s || !range) return;
    CHECK_MSG(strcmp(s->category, category) == 0, "%s: category '%s' (want '%s')", name, s->category, category);
    CHECK_MSG(s->bytes == bytes, "%s: bytes %.17g (want %.17g)", name, s->bytes, bytes);
    CHECK_MSG(s->flops == flops, "%s: flops %.17g (want %.17g)", name, s->flops, flops);
    CHECK_MSG(strcmp(s->module, "model") == 0 && strcmp(s->stage, "layer3") == 0 && s->step == 5,
              "%s: tags '%s' '%s' step %lld", name, s->module, s->stage, (long long)s->step);
    CHECK(s->depth == 1);
    CHECK_MSG(inside(range, s), "%s [%.9f, %.9f] not inside the range [%.9f, %.9f]", name, s->start_s, s->end_s,
              range->start_s, range->end_s);
}

static void run_ops(const norm_bufs *nb, const attn_bufs *ab) {
    fp_norm_params fp;
    fp_norm_backward_params bp;
    fp_attention_params pre, dec;
    norm_fwd_params(nb, &fp);
    norm_bwd_params(nb, &bp);
    attn_params(ab, ATT_SEQ, &pre);
    attn_params(ab, 1, &dec);
    CHECK_OK(fp_norm_forward(g_ctx, NULL, &fp));
    CHECK_OK(fp_norm_backward(g_ctx, NULL, &bp));
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &pre));
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &dec));
    CHECK_OK(fp_attention_forward_baseline(g_ctx, NULL, &pre));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
}
#define OPS_RUN 5 /* run_ops' op calls */
/* run_ops' fp_context_synchronize: a "sync" span (host wait) on a CUDA
 * context; a CPU context has nothing to wait for and records none */
static size_t syncs_run(void) { return fp_context_kind(g_ctx) == FP_DEVICE_CUDA; }

static void test_ops(const norm_bufs *nb, const attn_bufs *ab) {
    fp_norm_params fp;
    fp_norm_backward_params bp;
    fp_attention_params pre, dec;
    norm_fwd_params(nb, &fp);
    norm_bwd_params(nb, &bp);
    attn_params(ab, ATT_SEQ, &pre);
    attn_params(ab, 1, &dec);

    /* off: nothing */
    CHECK_OK(fp_trace_enable(g_ctx, MAX_SPANS));
    CHECK_OK(fp_trace_disable(g_ctx));
    run_ops(nb, ab);
    fp_trace_stats st = stats();
    CHECK_MSG(st.count == 0 && st.recorded == 0 && st.open == 0, "tracing off: %zu spans", st.count);

    /* on, inside a user range */
    CHECK_OK(fp_trace_enable(g_ctx, MAX_SPANS));
    CHECK_OK(fp_trace_set_step(g_ctx, 5));
    CHECK_OK(fp_trace_push(g_ctx, "model", "layer3"));
    run_ops(nb, ab);
    CHECK_OK(fp_trace_pop(g_ctx));
    st = stats();
    CHECK(st.open == 0 && st.dropped == 0);
    size_t n = take_spans();
    CHECK_MSG(n == OPS_RUN + syncs_run() + 1, "%zu spans (want %d ops, %zu sync and the range)", n, OPS_RUN,
              syncs_run());
    int nsync = 0;
    const fp_trace_span *sync = find(n, "synchronize", &nsync);
    CHECK((size_t)nsync == syncs_run());
    if (sync) /* host-timed, tagged as the ops */
        CHECK(!strcmp(sync->category, FP_TRACE_SYNC) && sync->end_s >= sync->start_s &&
              !strcmp(sync->module, "model") && sync->step == 5);
    expect_op(n, "norm_fwd", "op", fp_norm_forward_bytes(&fp), 0);
    expect_op(n, "norm_bwd", "op", fp_norm_backward_bytes(&bp), 0);
    expect_op(n, "attention_fwd", "op", attn_bytes(&pre), fp_attention_flops(&pre));
    expect_op(n, "attention_decode", "op", attn_bytes(&dec), fp_attention_flops(&dec));
    expect_op(n, "attention_fwd_baseline", "op", attn_bytes(&pre), fp_attention_flops(&pre));
    CHECK(fp_norm_forward_bytes(&fp) > 0 && fp_attention_flops(&pre) > 0);

    /* refused arguments: no span, none left open, the error as before */
    fp_norm_params badf = fp;
    badf.rows = 0;
    fp_norm_backward_params badb = bp;
    badb.dx = NULL;
    fp_attention_params bada = pre;
    bada.head_dim = 0;
    CHECK_STATUS(fp_norm_forward(g_ctx, NULL, &badf), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_norm_forward(g_ctx, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_norm_forward_version(g_ctx, NULL, &fp, 9), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_norm_backward(g_ctx, NULL, &badb), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &bada), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_attention_forward_baseline(g_ctx, NULL, &bada), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_norm_forward(NULL, NULL, &fp), FP_ERR_INVALID_ARGUMENT);
    st = stats();
    CHECK_MSG(st.count == 0 && st.open == 0 && st.recorded == 0, "refused ops: %zu spans, %zu open", st.count,
              st.open);
    /* the versioned entry points: one span each, as the default ones */
    CHECK_OK(fp_norm_forward_version(g_ctx, NULL, &fp, 0));
    CHECK_OK(fp_norm_backward_version(g_ctx, NULL, &bp, 0));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    n = take_spans();
    int c1 = 0, c2 = 0;
    (void)find(n, "norm_fwd", &c1);
    (void)find(n, "norm_bwd", &c2);
    CHECK(n == 2 + syncs_run() && c1 == 1 && c2 == 1);

    /* validate's runs are spans too: the fused op and its unfused baseline,
     * each timed sample in a range whose stage names its side (timing.h) */
    fp_timing_config tc;
    fp_timing_config_default(&tc);
    tc.warmup = 1;
    tc.min_samples = tc.max_samples = 2;
    tc.min_sample_ms = 0; /* one call per sample */
    tc.max_time_s = 1;
    fp_ab_report rep;
    CHECK_OK(fp_norm_validate(g_ctx, NULL, &fp, &tc, &rep));
    n = take_spans();
    int fused_opt = 0, unfused_base = 0, untagged = 0, ranges = 0;
    for (size_t i = 0; i < n; ++i) {
        const fp_trace_span *s = &g_spans[i];
        if (!strcmp(s->category, "range")) {
            ranges += !strcmp(s->name, "optimized") || !strcmp(s->name, "baseline");
            continue;
        }
        fused_opt += !strcmp(s->name, "norm_fwd") && !strcmp(s->stage, "optimized");
        unfused_base += !strcmp(s->name, "norm_fwd_unfused") && !strcmp(s->stage, "baseline");
        untagged += (!strcmp(s->name, "norm_fwd") || !strcmp(s->name, "norm_fwd_unfused")) && !s->stage[0];
        if (!strcmp(s->name, "norm_fwd_unfused")) CHECK(s->bytes == fp_norm_forward_bytes(&fp));
    }
    /* 2 samples a side; untagged a side: the check run, the warm-up, the
     * calibration of calls per sample */
    CHECK_MSG(fused_opt == 2 && unfused_base == 2 && ranges == 4 && untagged == 6,
              "validate: %d fused optimized, %d unfused baseline, %d ranges, %d untagged", fused_opt, unfused_base,
              ranges, untagged);
}

static fp_status graph_step(void *user, fp_stream stream) {
    return fp_norm_forward(g_ctx, stream, (const fp_norm_params *)user);
}

/* CUDA: the op captured records nothing (counted as skipped), the replay is
 * one "graph_replay" span. CPU: the replay runs the function, whose op span
 * lies inside the replay's. */
static void test_graph(const norm_bufs *nb, int cuda) {
    fp_norm_params fp;
    norm_fwd_params(nb, &fp);
    fp_graph_config cfg;
    fp_graph_config_default(&cfg);
    cfg.warmup = 0;
    CHECK_OK(fp_trace_clear(g_ctx));
    fp_graph *g = NULL;
    CHECK_OK(fp_graph_capture(g_ctx, NULL, graph_step, &fp, &cfg, &g));
    fp_trace_stats st = stats();
    CHECK_MSG(st.count == 0 && st.open == 0, "capture: %zu spans", st.count);
    CHECK_MSG(st.skipped_capturing == (cuda ? 1u : 0u), "skipped_capturing %llu",
              (unsigned long long)st.skipped_capturing);
    if (!g) return;
    CHECK_OK(fp_graph_replay(g, NULL));
    CHECK_OK(fp_graph_replay(g, NULL));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    CHECK(stats().open == 0);
    size_t n = take_spans();
    int nrep = 0, nop = 0;
    const fp_trace_span *rep = find(n, "graph_replay", &nrep);
    const fp_trace_span *op = find(n, "norm_fwd", &nop);
    CHECK_MSG(nrep == 2 && nop == (cuda ? 0 : 2), "%d replay spans, %d op spans", nrep, nop);
    if (rep) CHECK(strcmp(rep->category, "graph") == 0 && rep->bytes == 0);
    if (op && rep) CHECK(inside(rep, op)); /* the last of each */
    CHECK_STATUS(fp_graph_replay(NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_graph_destroy(g));
    CHECK(stats().count == 0);
}

static fp_status pipe_compute(void *user, fp_stream stream, const fp_pipeline_chunk *c) {
    if (user) return FP_ERR_UNSUPPORTED; /* the failing pipeline */
    return fp_mem_fill(g_ctx, c->d_out, 0x33, c->out_bytes, stream);
}

static void test_pipeline(void) {
    enum { CHUNK = 4096, NCHUNK = 3 };
    char *in = malloc(CHUNK * NCHUNK), *out = malloc(CHUNK * NCHUNK);
    CHECK(in && out);
    if (!in || !out) return;
    memset(in, 0x5a, CHUNK * NCHUNK);
    fp_pipeline_config cfg;
    fp_pipeline_config_default(&cfg);
    cfg.depth = 2;
    cfg.max_in_bytes = cfg.max_out_bytes = CHUNK;
    cfg.staging_threads = 1;
    cfg.compute = pipe_compute;
    CHECK_OK(fp_trace_clear(g_ctx));
    fp_pipeline *p = NULL;
    CHECK_OK(fp_pipeline_create(g_ctx, &cfg, &p));
    if (!p) return;
    for (int i = 0; i < NCHUNK; ++i)
        CHECK_OK(fp_pipeline_submit(p, in + i * CHUNK, CHUNK, out + i * CHUNK, CHUNK, NULL, -1, NULL));
    CHECK_OK(fp_pipeline_flush(p, -1));
    for (int i = 0; i < CHUNK * NCHUNK; ++i)
        if (out[i] != 0x33) {
            CHECK_MSG(0, "pipeline output byte %d is 0x%02x (want 0x33)", i, (unsigned char)out[i]);
            break;
        }
    fp_pipeline_destroy(p);
    CHECK(stats().open == 0);
    size_t n = take_spans();
    const char *names[3] = {"pipeline_h2d", "pipeline_compute", "pipeline_d2h"};
    for (int k = 0; k < 3; ++k) {
        int count = 0;
        const fp_trace_span *s = find(n, names[k], &count);
        CHECK_MSG(count == NCHUNK, "%s: %d spans (want %d)", names[k], count, NCHUNK);
        if (s) CHECK(strcmp(s->category, "pipeline") == 0 && s->bytes == (k == 1 ? 0 : CHUNK));
    }
    CHECK(n == 3 * NCHUNK);
    /* a compute that fails: its stage's span still ends, the d2h is not run */
    int fail = 1;
    cfg.user = &fail;
    p = NULL;
    CHECK_OK(fp_pipeline_create(g_ctx, &cfg, &p));
    if (p) {
        CHECK_OK(fp_pipeline_submit(p, in, CHUNK, out, CHUNK, NULL, -1, NULL));
        CHECK_STATUS(fp_pipeline_flush(p, -1), FP_ERR_UNSUPPORTED);
        fp_pipeline_destroy(p);
    }
    CHECK(stats().open == 0);
    n = take_spans();
    int nc = 0, nd = 0;
    (void)find(n, "pipeline_compute", &nc);
    (void)find(n, "pipeline_d2h", &nd);
    CHECK_MSG(nc == 1 && nd == 0 && n == 2, "failed compute: %zu spans, %d compute, %d d2h", n, nc, nd);
    free(in);
    free(out);
}

static fp_status batch_exec(void *user, fp_batch_item *items, int count, int padded) {
    (void)padded;
    if (user) return FP_ERR_UNSUPPORTED; /* the failing executor */
    for (int i = 0; i < count; ++i) memcpy(items[i].output, items[i].input, items[i].input_size);
    return FP_OK;
}

static void run_batches(fp_context *trace_ctx, int nreq, int fail) {
    fp_batcher_config cfg;
    fp_batcher_config_default(&cfg);
    cfg.max_batch_size = 1;
    cfg.trace_context = trace_ctx;
    fp_batcher *b = NULL;
    CHECK_OK(fp_batcher_create(&cfg, batch_exec, fail ? &fail : NULL, &b));
    if (!b) return;
    for (int i = 0; i < nreq; ++i) {
        int in = i, got = -1;
        fp_batch_submit_info info;
        fp_batch_submit_info_default(&info);
        info.input = &in;
        info.input_size = sizeof in;
        info.output = &got;
        info.output_size = sizeof got;
        fp_batch_request *req = NULL;
        CHECK_OK(fp_batcher_submit(b, &info, &req));
        fp_status rs = FP_ERR_INTERNAL;
        CHECK_OK(fp_batch_request_wait(req, 10 * 1000000LL, &rs));
        CHECK(fail ? rs == FP_ERR_UNSUPPORTED : rs == FP_OK && got == i);
        fp_batch_request_release(req);
    }
    CHECK_OK(fp_batcher_destroy(b));
}

static void test_batcher(void) {
    CHECK_OK(fp_trace_clear(g_ctx));
    run_batches(NULL, 2, 0); /* no trace context: nothing */
    CHECK(stats().count == 0);
    run_batches(g_ctx, 2, 1); /* failed batches: their spans ended too */
    run_batches(g_ctx, 1, 0);
    CHECK(stats().open == 0);
    size_t n = take_spans();
    int count = 0;
    const fp_trace_span *s = find(n, "batch_execute", &count);
    CHECK_MSG(count == 3 && n == 3, "%d batch spans of %zu (want 3)", count, n);
    if (s) CHECK(strcmp(s->category, "batch") == 0);
}

/* NVTX ranges: with FASTPATH_NVTX=1 one per op and user range even with
 * tracing off; else none while off, one each while on. Opened and closed
 * balance. */
static void test_nvtx(const norm_bufs *nb, const attn_bufs *ab) {
    const char *e = getenv("FASTPATH_NVTX");
    const int env = e && strcmp(e, "1") == 0;
    CHECK(fp_nvtx_env_enabled() == env);
    uint64_t pu0, po0, pu1, po1;
    CHECK_OK(fp_trace_disable(g_ctx));
    fp_nvtx_counts(&pu0, &po0);
    CHECK_OK(fp_trace_push(g_ctx, "model", "off"));
    run_ops(nb, ab);
    CHECK_OK(fp_trace_pop(g_ctx));
    fp_nvtx_counts(&pu1, &po1);
    CHECK_MSG(pu1 - pu0 == (env ? OPS_RUN + syncs_run() + 1 : 0u) && po1 - po0 == pu1 - pu0, "off: %llu opened, %llu closed",
              (unsigned long long)(pu1 - pu0), (unsigned long long)(po1 - po0));
    CHECK_OK(fp_trace_enable(g_ctx, MAX_SPANS));
    CHECK_OK(fp_trace_push(g_ctx, "model", "on"));
    run_ops(nb, ab);
    fp_nvtx_counts(&pu0, &po0);
    CHECK_MSG(pu0 - pu1 == OPS_RUN + syncs_run() + 1 && po0 - po1 == OPS_RUN + syncs_run(), "on: %llu opened, %llu closed",
              (unsigned long long)(pu0 - pu1), (unsigned long long)(po0 - po1));
    CHECK_OK(fp_trace_pop(g_ctx));
    fp_nvtx_counts(&pu1, &po1);
    CHECK(pu1 == pu0 && po1 == po0 + 1);
    CHECK(stats().open == 0);
    (void)take_spans();
}

/* Median ns of an fp_norm_forward call on a small shape. */
static double op_ns(const fp_norm_params *p, int calls) {
    double t[5];
    for (int r = 0; r < 5; ++r) {
        const double t0 = fp_now_s();
        for (int i = 0; i < calls; ++i)
            if (fp_norm_forward(g_ctx, NULL, p) != FP_OK) return -1;
        CHECK_OK(fp_context_synchronize(g_ctx, NULL));
        t[r] = (fp_now_s() - t0) * 1e9 / calls;
    }
    for (int i = 1; i < 5; ++i)
        for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
            const double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[2];
}

static void test_host_cost(const norm_bufs *nb, int cuda) {
    fp_norm_params p;
    norm_fwd_params(nb, &p);
    p.rows = 1; /* the op's own work small: the tracing cost shows */
    const int calls = fp_test_quick() ? 200 : 2000;
    CHECK_OK(fp_trace_disable(g_ctx));
    const double off = op_ns(&p, calls);
    CHECK_OK(fp_trace_enable(g_ctx, 4096));
    const double on = op_ns(&p, calls);
    CHECK_OK(fp_trace_clear(g_ctx));
    printf("host cost of fp_norm_forward (1 x %d, %s context, FASTPATH_NVTX %s): tracing off %.0f ns, on %.0f ns "
           "(+%.0f ns a span)\n",
           COLS, cuda ? "CUDA" : "CPU", fp_nvtx_env_enabled() ? "on" : "off", off, on, on - off);
    CHECK(off > 0 && on > 0);
    /* generous: a span is about 0.1-1 us; sanitizers and the emulation slow it */
    CHECK_MSG(on - off < 200e3, "tracing adds %.0f ns per op", on - off);
    /* the CUPTI timer (trace.h): the span without a driver call, and what
     * CUPTI's own recording adds to every launch (tracing off, collector on) */
    if (cuda && fp_trace_get_timer(g_ctx) == FP_TRACE_TIMER_EVENTS) {
        /* the kernel timer: the norm's kernel stamps its span, no event */
        CHECK_OK(fp_trace_set_timer(g_ctx, FP_TRACE_TIMER_KERNEL));
        CHECK_OK(fp_trace_enable(g_ctx, 4096));
        const double on_kernel = op_ns(&p, calls);
        const fp_trace_stats ks = stats();
        CHECK_MSG(ks.unresolved == 0 && ks.recorded > 0, "kernel timer: %llu recorded, %llu unresolved",
                  (unsigned long long)ks.recorded, (unsigned long long)ks.unresolved);
        CHECK_OK(fp_trace_set_timer(g_ctx, FP_TRACE_TIMER_EVENTS));
        CHECK_OK(fp_trace_clear(g_ctx));
        printf("host cost of fp_norm_forward, kernel timer: tracing on %.0f ns (+%.0f ns a span)\n", on_kernel,
               on_kernel - off);
        CHECK_MSG(on_kernel - off < 200e3, "the kernel timer adds %.0f ns per op", on_kernel - off);
        const fp_status ts = fp_trace_set_timer(g_ctx, FP_TRACE_TIMER_CUPTI);
        if (ts != FP_OK) {
            printf("CUPTI timer unavailable: %s\n", fp_last_error());
            return;
        }
        CHECK_OK(fp_trace_enable(g_ctx, 4096));
        const double on_cupti = op_ns(&p, calls);
        CHECK_OK(fp_trace_disable(g_ctx));
        const double off_cupti = op_ns(&p, calls);
        CHECK_OK(fp_trace_set_timer(g_ctx, FP_TRACE_TIMER_EVENTS));
        CHECK_OK(fp_trace_clear(g_ctx));
        printf("host cost of fp_norm_forward, CUPTI timer: tracing on %.0f ns (+%.0f ns a span over tracing off "
               "without CUPTI); CUPTI recording, tracing off: %.0f ns (+%.0f ns of CUPTI per call)\n",
               on_cupti, on_cupti - off, off_cupti, off_cupti - off);
        CHECK(on_cupti > 0 && off_cupti > 0);
        CHECK_MSG(on_cupti - off < 200e3, "the CUPTI timer adds %.0f ns per op", on_cupti - off);
    } else if (cuda) {
        const fp_trace_timer tm = fp_trace_get_timer(g_ctx);
        printf("(timer: %s, from FASTPATH_TRACE_TIMER)\n",
               tm == FP_TRACE_TIMER_CUPTI ? "CUPTI" : tm == FP_TRACE_TIMER_KERNEL ? "kernel" : "events");
    }
}

int main(int argc, char **argv) {
    const int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (cuda) {
        g_ctx = fp_test_cuda_context_or_skip();
    } else {
        CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &g_ctx));
    }
    if (!g_ctx) return 1;
    norm_bufs nb;
    attn_bufs ab;
    norm_bufs_make(&nb);
    attn_bufs_make(&ab);
    test_ops(&nb, &ab);
    test_graph(&nb, cuda);
    test_pipeline();
    test_batcher();
    test_nvtx(&nb, &ab);
    test_host_cost(&nb, cuda);
    CHECK(stats().open == 0);
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    norm_bufs_free(&nb);
    attn_bufs_free(&ab);
    fp_context_destroy(g_ctx);
    TEST_END();
}
