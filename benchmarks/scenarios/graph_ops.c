/* graph/... scenarios built from the library's ops (they need the norm and
 * attention modules: benchmarks/CMakeLists.txt leaves this file out
 * otherwise).
 *
 *   graph/decode_step   one decode layer step (RMSNorm with residual, paged
 *                       KV decode attention with GQA, RMSNorm) at --batch
 *                       1, 8, 64: eager vs fp_graph_cache_run (the batch's
 *                       bucket replayed), outputs compared exactly.
 *   graph/op_host_cost  host time of one call of each op (launch only:
 *                       batches of calls between synchronizations, timed
 *                       with a monotonic clock) vs one fp_graph_replay of
 *                       the same call captured; and the graph cache's
 *                       lookup (fp_graph_cache_run vs a plain replay, its
 *                       lookup_ns, fp_graph_cache_bucket alone). On CUDA
 *                       first the floor: an empty kernel's launch through
 *                       the runtime (op=launch_empty; launch_empty_512B
 *                       with a 512-byte parameter block) and through the
 *                       driver (launch_empty_driver); each op row then
 *                       reports its kernels per call and over_floor_us,
 *                       its host time past that many empty launches (what
 *                       the library's own work adds). op=axpby is the
 *                       library's smallest kernel op;
 *                       attention_decode_separate the decode call with
 *                       split-KV's separate combine kernel (the launch the
 *                       fused combine saves). --split_combine 1 runs both
 *                       scenarios with the separate combine; --kernel N
 *                       with FP_CTX_ATTENTION_KERNEL = N (6: the decode
 *                       kernel) in both; --pdl 1 with programmatic
 *                       dependent launch (FP_CTX_LAUNCH_PDL) in both.
 *   graph/pdl           the decode step with programmatic dependent launch
 *                       (optimized) against without (baseline), eagerly
 *                       (mode=eager) and replayed (mode=replay: a graph
 *                       captured with each setting), at --batch 1 and 8;
 *                       outputs compared exactly. Where the device has no
 *                       PDL (before compute capability 9.0, a CPU context)
 *                       both sides run the same: the row says so.
 *
 * GPU shapes: 32 query / 8 KV heads of 128 (hidden 4096), bf16, 1024 cached
 * keys per sequence in pages of 16. CPU contexts and --quick: 8 / 2 heads of
 * 64, 64 keys. On a CPU context a replay calls the recorded step (graph.h):
 * the rows check the paths and measure the wrapper, not a launch saved.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastpath/attention.h"
#include "fastpath/graph.h"
#include "fastpath/norm.h"
#include "scenario.h"
#include "timing/probes.h"

/* ------------------------------------------------------------------------ */
/*  The decode layer step                                                   */
/* ------------------------------------------------------------------------ */

typedef struct layer_shape {
    int heads_q, heads_kv, head_dim, seqlen_k, page;
    int max_batch; /* rows of the static buffers */
} layer_shape;

/* Weights, KV cache and the static activation buffers of every size up to
 * max_batch: a graph replays on fixed addresses, so every batch size reads
 * and writes rows [0, size) of the same buffers. */
typedef struct layer {
    fp_context *ctx;
    layer_shape s;
    fp_graph_pool *pool;
    void *x, *residual, *h, *residual_out, *attn; /* [max_batch, hidden] bf16, pool */
    void *gamma1, *gamma2;                        /* [hidden] bf16 */
    void *k, *v;                                  /* [pages, page, heads_kv, head_dim] bf16 */
    int32_t *table;                               /* [max_batch, per_seq] */
    int per_seq;
} layer;

/* One side of an A/B: the layer, where its final RMSNorm writes, and the
 * batch size it runs at eagerly (the cache passes its own size). */
typedef struct layer_side {
    layer *l;
    void *out; /* [max_batch, hidden] bf16 */
    int64_t size;
} layer_side;

static int64_t hidden_of(const layer_shape *s) { return (int64_t)s->heads_q * s->head_dim; }

static void norm_params(const layer *l, int64_t rows, const void *x, const void *residual,
                        const void *gamma, void *out, void *residual_out, fp_norm_params *p) {
    fp_norm_params_default(p);
    p->kind = FP_NORM_RMSNORM;
    p->rows = rows;
    p->cols = hidden_of(&l->s);
    p->x_dtype = p->residual_dtype = p->out_dtype = p->param_dtype = FP_BF16;
    p->x = x;
    p->residual = residual;
    p->gamma = gamma;
    p->out = out;
    p->residual_out = residual_out;
}

static void attention_params(const layer *l, int64_t batch, fp_attention_params *p) {
    fp_attention_params_default(p);
    p->batch = (int)batch;
    p->seqlen_q = 1;
    p->seqlen_k = l->s.seqlen_k;
    p->heads_q = l->s.heads_q;
    p->heads_kv = l->s.heads_kv;
    p->head_dim = l->s.head_dim;
    p->dtype = FP_BF16;
    p->q = l->h;
    p->k = l->k;
    p->v = l->v;
    p->o = l->attn;
    p->block_table = l->table;
    p->block_table_stride = l->per_seq;
    p->page_size = l->s.page;
    p->num_pages = l->s.max_batch * l->per_seq;
}

/* fp_graph_step_fn: s = x + residual, h = RMSNorm(s); attn = decode
 * attention of h over the paged cache; out = RMSNorm(attn). Rows [0, size). */
static fp_status layer_step(void *user, fp_stream stream, int64_t size) {
    layer_side *side = user;
    layer *l = side->l;
    fp_norm_params np;
    norm_params(l, size, l->x, l->residual, l->gamma1, l->h, l->residual_out, &np);
    fp_status st = fp_norm_forward(l->ctx, stream, &np);
    fp_attention_params ap;
    attention_params(l, size, &ap);
    if (st == FP_OK) st = fp_attention_forward(l->ctx, stream, &ap);
    norm_params(l, size, l->attn, NULL, l->gamma2, side->out, NULL, &np);
    if (st == FP_OK) st = fp_norm_forward(l->ctx, stream, &np);
    return st;
}

static void layer_free(layer *l) {
    if (l->pool) {
        void *pooled[] = {l->x, l->residual, l->h, l->residual_out, l->attn};
        for (size_t i = 0; i < sizeof pooled / sizeof pooled[0]; ++i) fp_graph_pool_free(l->pool, pooled[i]);
    }
    fp_graph_pool_destroy(l->pool);
    fp_mem_free(l->ctx, l->gamma1);
    fp_mem_free(l->ctx, l->gamma2);
    fp_mem_free(l->ctx, l->k);
    fp_mem_free(l->ctx, l->v);
    fp_mem_free(l->ctx, l->table);
    memset(l, 0, sizeof *l);
}

/* The activations come from a graph pool (graph.h: static buffers keep their
 * address for as long as a graph uses them); the weights and the cache are
 * ordinary context memory, which never moves either. Sequence b's pages are
 * b * per_seq .. (b + 1) * per_seq - 1. */
static fp_status layer_init(layer *l, fp_context *ctx, const layer_shape *s) {
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->s = *s;
    l->per_seq = (s->seqlen_k + s->page - 1) / s->page;
    const size_t act = (size_t)s->max_batch * (size_t)hidden_of(s);
    const size_t kv = (size_t)s->max_batch * l->per_seq * s->page * s->heads_kv * s->head_dim;
    const size_t n_table = (size_t)s->max_batch * l->per_seq;
    fp_status st = fp_graph_pool_create(ctx, &l->pool);
    void **pooled[] = {&l->x, &l->residual, &l->h, &l->residual_out, &l->attn};
    for (size_t i = 0; i < sizeof pooled / sizeof pooled[0] && st == FP_OK; ++i)
        st = fp_graph_pool_alloc(l->pool, act * 2, pooled[i]);
    if (st == FP_OK) st = fb_fill_random(ctx, l->x, act, FP_BF16, 21, -2.0f, 2.0f);
    if (st == FP_OK) st = fb_fill_random(ctx, l->residual, act, FP_BF16, 22, -1.0f, 1.0f);
    if (st == FP_OK) st = fb_alloc_random(ctx, (size_t)hidden_of(s), FP_BF16, 23, 0.5f, 1.5f, &l->gamma1);
    if (st == FP_OK) st = fb_alloc_random(ctx, (size_t)hidden_of(s), FP_BF16, 24, 0.5f, 1.5f, &l->gamma2);
    if (st == FP_OK) st = fb_alloc_random(ctx, kv, FP_BF16, 25, -1.0f, 1.0f, &l->k);
    if (st == FP_OK) st = fb_alloc_random(ctx, kv, FP_BF16, 26, -1.0f, 1.0f, &l->v);
    if (st == FP_OK) st = fp_mem_alloc(ctx, n_table * sizeof(int32_t), (void **)&l->table);
    if (st == FP_OK) {
        int32_t *h_table = malloc(n_table * sizeof(int32_t));
        if (!h_table) st = FP_ERR_OUT_OF_MEMORY;
        for (size_t e = 0; h_table && e < n_table; ++e) h_table[e] = (int32_t)e;
        if (st == FP_OK) st = fp_mem_upload(ctx, l->table, h_table, n_table * sizeof(int32_t), NULL);
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL); /* h_table is freed next */
        free(h_table);
    }
    if (st != FP_OK) layer_free(l);
    return st;
}

/* --batch (1..256: the default bucket list ends at 256, a larger batch
 * would run eagerly) and --kv (>= 1; the pages hold int32 ids) as given.
 * Returns 0, or 1 after reporting a failed row naming the bad option. */
static int bad_options(fb_run *run) {
    const int64_t batch = fb_opt_int(run, "batch", 1), kv = fb_opt_int(run, "kv", 1);
    const int64_t sc = fb_opt_int(run, "split_combine", 0), kernel = fb_opt_int(run, "kernel", 0);
    const int64_t pdl = fb_opt_int(run, "pdl", 0);
    const char *why = batch < 1 || batch > 256     ? "--batch must be in [1, 256]"
                      : kv < 1 || kv > (1 << 24)   ? "--kv must be in [1, 16777216]"
                      : sc != 0 && sc != 1         ? "--split_combine must be 0 or 1"
                      : kernel < 0 || kernel > 10  ? "--kernel must be in [0, 10]"
                      : pdl != 0 && pdl != 1       ? "--pdl must be 0 or 1"
                                                   : NULL;
    if (!why) return 0;
    fb_result_fail(fb_result_new(run), FP_ERR_INVALID_ARGUMENT, why);
    return 1;
}

/* --split_combine for the run (FP_CTX_ATTENTION_SPLIT_COMBINE: 0 fused, the
 * default; 1 a separate combine kernel), --kernel (FP_CTX_ATTENTION_KERNEL:
 * the flash version the attention calls prefer, e.g. 6, the decode kernel)
 * and --pdl (FP_CTX_LAUNCH_PDL 1: programmatic dependent launch); the
 * defaults again after it. */
static void set_run_options(fb_run *run, int on) {
    fp_context_set_option(fb_ctx(run), FP_CTX_ATTENTION_SPLIT_COMBINE, on ? fb_opt_int(run, "split_combine", 0) : 0);
    fp_context_set_option(fb_ctx(run), FP_CTX_ATTENTION_KERNEL, on ? fb_opt_int(run, "kernel", 0) : 0);
    fp_context_set_option(fb_ctx(run), FP_CTX_LAUNCH_PDL, on && fb_opt_int(run, "pdl", 0) ? 1 : 0);
}

/* The run's --kernel and --pdl as row parameters, where given. */
static void run_params(fb_run *run, fb_result *r) {
    if (fb_opt_given(run, "kernel")) fb_param_int(r, "kernel", fb_opt_int(run, "kernel", 0));
    if (fb_opt_given(run, "pdl")) fb_param_int(r, "pdl", fb_opt_int(run, "pdl", 0));
}

/* Default shapes: see the file's header. */
static layer_shape layer_shape_for(fb_run *run, int max_batch) {
    const int small = fb_quick(run) || fb_kind(run) != FP_DEVICE_CUDA;
    layer_shape s = {small ? 8 : 32, small ? 2 : 8, small ? 64 : 128, small ? 64 : 1024, 16, max_batch};
    s.seqlen_k = (int)fb_opt_int(run, "kv", s.seqlen_k);
    return s;
}

/* ---- graph/decode_step ---- */

typedef struct cache_side {
    fp_graph_cache *cache;
    int64_t n;
} cache_side;

static fp_status eager_fn(void *user, fp_stream stream) {
    layer_side *side = user;
    return layer_step(side, stream, side->size);
}

static fp_status cache_fn(void *user, fp_stream stream) {
    cache_side *c = user;
    return fp_graph_cache_run(c->cache, stream, c->n, NULL, NULL);
}

/* The run's A/B of baseline against optimized, their bf16 outputs (count
 * values each) required equal bit for bit: the same kernels on the same
 * rows. */
static fp_status exact_ab(fb_run *run, fp_timed_fn baseline, void *baseline_user, void *baseline_out,
                          fp_timed_fn optimized, void *optimized_user, void *optimized_out, size_t count,
                          fp_ab_report *rep) {
    fp_ab_spec spec;
    fp_ab_spec_init(&spec);
    spec.baseline = baseline;
    spec.baseline_user = baseline_user;
    spec.optimized = optimized;
    spec.optimized_user = optimized_user;
    spec.baseline_out = baseline_out;
    spec.optimized_out = optimized_out;
    spec.out_count = count;
    spec.out_dtype = FP_BF16;
    spec.atol = spec.rtol = 0;
    return fp_ab_run(fb_ctx(run), NULL, &spec, fb_timing(run), rep);
}

/* Batch n runs eagerly at n (baseline) and through the cache at n's bucket
 * (optimized): rows [0, n) must agree bit for bit (same kernels, same data;
 * rows of the padding [n, bucket) are not compared). */
static void run_decode_shape(fb_run *run, int64_t n) {
    fp_context *ctx = fb_ctx(run);
    fb_result *r = fb_result_new(run);
    fb_param_int(r, "batch", n);
    run_params(run, r);
    fp_graph_cache_config cfg;
    fp_graph_cache_config_default(&cfg);
    int64_t bucket = n;
    size_t nb = 0;
    int64_t buckets[FP_GRAPH_MAX_BUCKETS];
    fp_status st = fp_graph_default_buckets(cfg.max_size, buckets, FP_GRAPH_MAX_BUCKETS, &nb);
    for (size_t i = 0; st == FP_OK && i < nb; ++i)
        if (buckets[i] >= n) {
            bucket = buckets[i];
            break;
        }
    layer_shape shape = layer_shape_for(run, (int)bucket);
    fb_param_int(r, "seqlen_k", shape.seqlen_k);
    layer l;
    memset(&l, 0, sizeof l);
    void *out_eager = NULL, *out_graph = NULL;
    const size_t act = (size_t)bucket * (size_t)hidden_of(&shape);
    if (st == FP_OK) st = layer_init(&l, ctx, &shape);
    if (st == FP_OK) st = fp_mem_alloc(ctx, act * 2, &out_eager);
    if (st == FP_OK) st = fp_mem_alloc(ctx, act * 2, &out_graph);
    if (st == FP_OK) st = fp_mem_fill(ctx, out_eager, 0xff, act * 2, NULL); /* NaN poison */
    if (st == FP_OK) st = fp_mem_fill(ctx, out_graph, 0xff, act * 2, NULL);
    layer_side eager = {&l, out_eager, n}, graphed = {&l, out_graph, 0};
    cfg.pool = l.pool;
    fp_graph_cache *cache = NULL;
    if (st == FP_OK) st = fp_graph_cache_create(ctx, layer_step, &graphed, &cfg, &cache);
    /* the first run captures (and runs the step eagerly): the A/B then times
     * replays only */
    fp_graph_run how = FP_GRAPH_RUN_EAGER;
    int64_t ran_at = 0;
    if (st == FP_OK) st = fp_graph_cache_run(cache, NULL, n, &ran_at, &how);
    if (st == FP_OK && (how != FP_GRAPH_RUN_CAPTURED || ran_at != bucket)) {
        fb_result_fail(r, FP_ERR_INTERNAL, "first fp_graph_cache_run did not capture the batch's bucket");
        st = FP_ERR_INTERNAL;
    }
    cache_side cs = {cache, n};
    fp_ab_report rep;
    if (st == FP_OK) {
        st = exact_ab(run, eager_fn, &eager, out_eager, cache_fn, &cs, out_graph,
                      (size_t)n * (size_t)hidden_of(&shape), &rep);
    }
    fp_graph_cache_stats cst;
    fp_graph_cache_stats_init(&cst);
    if (st == FP_OK) st = fp_graph_cache_get_stats(cache, &cst);
    if (st == FP_OK) {
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "saved_us_per_step", (rep.baseline.median_ms - rep.optimized.median_ms) * 1e3);
        fb_result_metric(r, "lookup_ns", cst.lookup_ns);
        fb_result_metric(r, "bucket", (double)bucket);
        fb_result_metric(r, "captures", (double)cst.captures);
        fb_result_metric(r, "capture_ms", cst.capture_ms_total);
        /* every timed run after the first must have been a replay */
        if (cst.captures != 1 || cst.replays + 1 != cst.runs)
            fb_result_note(r, "cache: %llu runs, %llu replays, %llu captures", (unsigned long long)cst.runs,
                           (unsigned long long)cst.replays, (unsigned long long)cst.captures);
        else if (fb_kind(run) != FP_DEVICE_CUDA)
            fb_result_note(r, "cpu: a replay calls the step");
    } else if (st != FP_ERR_INTERNAL) {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_graph_cache_destroy(cache); /* before the pool its graphs use */
    if (l.ctx) layer_free(&l);
    fp_mem_free(ctx, out_eager);
    fp_mem_free(ctx, out_graph);
}

static fp_status run_decode_step(fb_run *run) {
    if (bad_options(run)) return FP_OK;
    set_run_options(run, 1);
    static const int64_t batches[] = {1, 8, 64};
    if (fb_opt_given(run, "batch")) run_decode_shape(run, fb_opt_int(run, "batch", 1));
    else
        for (size_t i = 0; i < sizeof batches / sizeof batches[0]; ++i) run_decode_shape(run, batches[i]);
    set_run_options(run, 0);
    return FP_OK;
}

/* ---- graph/pdl ---- */

/* One side: the step at `size` with FP_CTX_LAUNCH_PDL `pdl` (1 or -1), run
 * eagerly or (g set) as the replay of its capture. */
typedef struct pdl_side {
    layer_side step;
    int pdl;
    fp_graph *g;
} pdl_side;

static fp_status pdl_step_fn(void *user, fp_stream stream) {
    pdl_side *p = user;
    const fp_status st = fp_context_set_option(p->step.l->ctx, FP_CTX_LAUNCH_PDL, p->pdl);
    return st == FP_OK ? layer_step(&p->step, stream, p->step.size) : st;
}

static fp_status pdl_replay_fn(void *user, fp_stream stream) {
    pdl_side *p = user;
    return fp_graph_replay(p->g, stream);
}

static void run_pdl_shape(fb_run *run, int64_t n, int replay) {
    fp_context *ctx = fb_ctx(run);
    fb_result *r = fb_result_new(run);
    fb_param_int(r, "batch", n);
    fb_param_str(r, "mode", replay ? "replay" : "eager");
    run_params(run, r); /* --kernel (run_pdl refuses --pdl) */
    const layer_shape shape = layer_shape_for(run, (int)n);
    fb_param_int(r, "seqlen_k", shape.seqlen_k);
    layer l;
    memset(&l, 0, sizeof l);
    void *out_off = NULL, *out_on = NULL;
    const size_t act = (size_t)n * (size_t)hidden_of(&shape);
    fp_status st = layer_init(&l, ctx, &shape);
    if (st == FP_OK) st = fp_mem_alloc(ctx, act * 2, &out_off);
    if (st == FP_OK) st = fp_mem_alloc(ctx, act * 2, &out_on);
    if (st == FP_OK) st = fp_mem_fill(ctx, out_off, 0xff, act * 2, NULL); /* NaN poison */
    if (st == FP_OK) st = fp_mem_fill(ctx, out_on, 0xff, act * 2, NULL);
    pdl_side off = {{&l, out_off, n}, -1, NULL}, on = {{&l, out_on, n}, 1, NULL};
    fp_graph_config gc;
    fp_graph_config_default(&gc);
    gc.pool = l.pool;
    if (replay && st == FP_OK) st = fp_graph_capture(ctx, NULL, pdl_step_fn, &off, &gc, &off.g);
    if (replay && st == FP_OK) st = fp_graph_capture(ctx, NULL, pdl_step_fn, &on, &gc, &on.g);
    fp_ab_report rep;
    if (st == FP_OK) {
        fp_timed_fn fn = replay ? pdl_replay_fn : pdl_step_fn;
        st = exact_ab(run, fn, &off, out_off, fn, &on, out_on, act, &rep);
    }
    fp_device_info info;
    fp_device_info_init(&info);
    if (st == FP_OK) st = fp_context_device_info(ctx, &info);
    if (st == FP_OK) {
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "saved_us_per_step", (rep.baseline.median_ms - rep.optimized.median_ms) * 1e3);
        const int available = fb_kind(run) == FP_DEVICE_CUDA && info.cc_major >= 9;
        fb_result_metric(r, "pdl_available", available);
        if (!available)
            fb_result_note(r, "no programmatic dependent launch on this device: both sides run the same");
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_graph_destroy(off.g); /* before the pool their buffers come from */
    fp_graph_destroy(on.g);
    fp_context_set_option(ctx, FP_CTX_LAUNCH_PDL, 0);
    if (l.ctx) layer_free(&l);
    fp_mem_free(ctx, out_off);
    fp_mem_free(ctx, out_on);
}

static fp_status run_pdl(fb_run *run) {
    if (bad_options(run)) return FP_OK;
    if (fb_opt_given(run, "pdl")) {
        fb_result_fail(fb_result_new(run), FP_ERR_INVALID_ARGUMENT, "graph/pdl sets --pdl itself (0 against 1)");
        return FP_OK;
    }
    set_run_options(run, 1);
    static const int64_t batches[] = {1, 8};
    const size_t nb = fb_opt_given(run, "batch") ? 1 : sizeof batches / sizeof batches[0];
    for (size_t i = 0; i < nb; ++i) {
        const int64_t n = fb_opt_given(run, "batch") ? fb_opt_int(run, "batch", 1) : batches[i];
        run_pdl_shape(run, n, 0);
        run_pdl_shape(run, n, 1);
    }
    set_run_options(run, 0);
    return FP_OK;
}

/* ---- graph/op_host_cost ---- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Host time of one call (scenario.h: fb_host_time) on the run's context. */
static fp_status host_time(fb_run *run, fp_timed_fn fn, void *user, fp_stats *out) {
    return fb_host_time(run, fb_ctx(run), fn, user, out);
}

static fp_status replay_fn(void *user, fp_stream stream) { return fp_graph_replay(user, stream); }

typedef struct op_case {
    fp_context *ctx;
    layer *l;
    void *fill_buf;
    fp_attention_params prefill;
    int probe;          /* launch_probe's variant */
    double floor_us;    /* host_us of the empty runtime launch, 0 if not measured */
} op_case;

/* The floor: one empty-kernel launch (timing/probes.h), no library work. */
static fp_status op_launch_probe(void *user, fp_stream stream) {
    op_case *c = user;
    return fp_launch_probe(c->ctx, stream, c->probe);
}

/* The library's smallest kernel op: fp_axpby on 256 floats (graph/chain's
 * kernel), i.e. the floor plus the wrapper's checks and device check. */
static fp_status op_axpby(void *user, fp_stream stream) {
    op_case *c = user;
    float *buf = c->fill_buf;
    return fp_axpby(c->ctx, stream, 1, FP_F32, 256, 1.0f, buf, 1.0f, buf + 256, buf + 512);
}

static fp_status op_norm(void *user, fp_stream stream) {
    op_case *c = user;
    fp_norm_params np;
    norm_params(c->l, c->l->s.max_batch, c->l->x, c->l->residual, c->l->gamma1, c->l->h, c->l->residual_out,
                &np);
    return fp_norm_forward(c->ctx, stream, &np);
}

static fp_status op_decode(void *user, fp_stream stream) {
    op_case *c = user;
    fp_attention_params ap;
    attention_params(c->l, c->l->s.max_batch, &ap);
    return fp_attention_forward(c->ctx, stream, &ap);
}

static fp_status op_prefill(void *user, fp_stream stream) {
    op_case *c = user;
    return fp_attention_forward(c->ctx, stream, &c->prefill);
}

static fp_status op_fill(void *user, fp_stream stream) {
    op_case *c = user;
    return fp_mem_fill(c->ctx, c->fill_buf, 0x3c, 4096, stream);
}

/* One row: the op's host cost (baseline) vs one replay of its capture.
 * Returns the host cost in us (0 when the row failed). */
static double host_cost_row(fb_run *run, const char *name, fp_timed_fn fn, op_case *c) {
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "op", name);
    run_params(run, r);
    fp_graph *g = NULL;
    fp_stats base, opt;
    fp_status st = host_time(run, fn, c, &base);
    if (st == FP_OK) st = fp_graph_capture(c->ctx, NULL, fn, c, NULL, &g);
    if (st == FP_OK) st = host_time(run, replay_fn, g, &opt);
    fp_graph_info info;
    fp_graph_info_init(&info);
    if (st == FP_OK) st = fp_graph_get_info(g, &info);
    if (st == FP_OK) {
        fp_ab_report rep;
        fb_host_report(run, &base, &opt, &rep);
        fb_result_set_ab(r, &rep);
        const double host_us = base.median_ms * 1e3;
        fb_result_metric(r, "host_us", host_us);
        fb_result_metric(r, "replay_host_us", opt.median_ms * 1e3);
        /* kernels one call launches, and the host time past that many empty
         * launches: what the library's own work costs over the platform's */
        fb_result_metric(r, "kernels", (double)info.kernel_nodes);
        if (c->floor_us > 0 && info.kernel_nodes > 0)
            fb_result_metric(r, "over_floor_us", host_us - (double)info.kernel_nodes * c->floor_us);
        if (fb_kind(run) != FP_DEVICE_CUDA) fb_result_note(r, "cpu: a call runs the op");
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_status dst = fp_graph_destroy(g);
    if (dst != FP_OK && st == FP_OK) {
        fb_result_fail(r, dst, fp_last_error());
        st = dst;
    }
    return st == FP_OK ? base.median_ms * 1e3 : 0.0;
}

/* The cache's step for the lookup row: one fill of 16 bytes per row (the
 * 4 KiB fill buffer holds 256 rows), so that the launch is as cheap as
 * launches get and the lookup shows. */
static fp_status fill_step(void *user, fp_stream stream, int64_t size) {
    op_case *c = user;
    return fp_mem_fill(c->ctx, c->fill_buf, 0x3c, (size_t)size * 16, stream);
}

typedef struct lookup_case {
    op_case *c;
    fp_graph_cache *cache;
    int64_t n;
} lookup_case;

static fp_status lookup_run_fn(void *user, fp_stream stream) {
    lookup_case *lc = user;
    return fp_graph_cache_run(lc->cache, stream, lc->n, NULL, NULL);
}

static fp_status lookup_plain_fn(void *user, fp_stream stream) {
    lookup_case *lc = user;
    return fill_step(lc->c, stream, lc->n);
}

/* fp_graph_cache_run of a captured bucket (baseline) vs fp_graph_replay of
 * a plain graph of the same step: the difference is the lookup. Also
 * reported: the cache's own lookup_ns and fp_graph_cache_bucket alone. */
static void lookup_row(fb_run *run, op_case *c) {
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "op", "cache_lookup");
    const int64_t n = 24; /* a bucket of the default list: no padding */
    fp_graph_cache *cache = NULL;
    fp_graph_cache_config cfg;
    fp_graph_cache_config_default(&cfg);
    cfg.max_size = 256;
    fp_status st = fp_graph_cache_create(c->ctx, fill_step, c, &cfg, &cache);
    lookup_case lc = {c, cache, n};
    fp_graph *g = NULL;
    fp_stats base, opt;
    if (st == FP_OK) st = fp_graph_cache_run(cache, NULL, n, NULL, NULL); /* captures */
    if (st == FP_OK) st = host_time(run, lookup_run_fn, &lc, &base);
    fp_graph_cache_stats cst;
    fp_graph_cache_stats_init(&cst);
    if (st == FP_OK) st = fp_graph_cache_get_stats(cache, &cst);
    /* fp_graph_cache_bucket alone, sizes 1..256 round-robin: every path of
     * the search, not one answer over and over */
    enum { BUCKET_CALLS = 100000 };
    double bucket_ms = 0;
    if (st == FP_OK) {
        int64_t b = 0, sum = 0;
        const double t0 = now_ms();
        for (int i = 0; i < BUCKET_CALLS && st == FP_OK; ++i) {
            st = fp_graph_cache_bucket(cache, 1 + i % 256, &b);
            sum += b;
        }
        bucket_ms = now_ms() - t0;
        /* every bucket is >= 1: the check uses the results, so the loop
         * cannot be dropped as dead code */
        if (st == FP_OK && sum < BUCKET_CALLS) {
            fb_result_fail(r, FP_ERR_INTERNAL, "fp_graph_cache_bucket returned a bucket < 1");
            st = FP_ERR_INTERNAL;
        }
    }
    /* a plain graph of the same step at n: what the replay itself costs */
    if (st == FP_OK) st = fp_graph_capture(c->ctx, NULL, lookup_plain_fn, &lc, NULL, &g);
    if (st == FP_OK) st = host_time(run, replay_fn, g, &opt);
    if (st == FP_OK) {
        fp_ab_report rep;
        fb_host_report(run, &base, &opt, &rep);
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "lookup_ns", cst.lookup_ns);
        fb_result_metric(r, "bucket_ns", bucket_ms * 1e6 / BUCKET_CALLS);
        fb_result_metric(r, "run_host_us", base.median_ms * 1e3);
        fb_result_metric(r, "replay_host_us", opt.median_ms * 1e3);
        fb_result_note(r, "baseline: fp_graph_cache_run, optimized: fp_graph_replay");
    } else if (st != FP_ERR_INTERNAL) {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_graph_destroy(g);
    fp_graph_cache_destroy(cache);
}

static fp_status run_op_host_cost(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    if (bad_options(run)) return FP_OK;
    set_run_options(run, 1);
    const int64_t batch = fb_opt_int(run, "batch", 8);
    layer_shape shape = layer_shape_for(run, (int)batch);
    layer l;
    op_case c;
    memset(&c, 0, sizeof c);
    c.ctx = ctx;
    c.l = &l;
    fp_status st = layer_init(&l, ctx, &shape);
    /* prefill: one sequence of 128 tokens (64 on CPU), self-attention on
     * the layer's own buffers viewed as [1, tokens, heads, head_dim] */
    const int tokens = fb_kind(run) == FP_DEVICE_CUDA && !fb_quick(run) ? 128 : 16;
    void *pq = NULL, *pkv = NULL, *po = NULL;
    const size_t nq = (size_t)tokens * shape.heads_q * shape.head_dim;
    const size_t nkv = (size_t)tokens * shape.heads_kv * shape.head_dim;
    if (st == FP_OK) st = fb_alloc_random(ctx, nq, FP_BF16, 31, -1.0f, 1.0f, &pq);
    if (st == FP_OK) st = fb_alloc_random(ctx, 2 * nkv, FP_BF16, 32, -1.0f, 1.0f, &pkv);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * 2, &po);
    if (st == FP_OK) st = fp_mem_alloc(ctx, 1 << 12, &c.fill_buf);
    if (st == FP_OK) st = fp_mem_fill(ctx, c.fill_buf, 0, 1 << 12, NULL); /* axpby reads it */
    if (st == FP_OK) {
        fp_attention_params *p = &c.prefill;
        fp_attention_params_default(p);
        p->batch = 1;
        p->seqlen_q = p->seqlen_k = tokens;
        p->heads_q = shape.heads_q;
        p->heads_kv = shape.heads_kv;
        p->head_dim = shape.head_dim;
        p->dtype = FP_BF16;
        p->causal = 1;
        p->q = pq;
        p->k = pkv;
        p->v = (char *)pkv + nkv * 2;
        p->o = po;
    }
    if (st != FP_OK) {
        fb_result *r = fb_result_new(run);
        fb_result_fail(r, st, fp_last_error());
    } else {
        if (fb_kind(run) == FP_DEVICE_CUDA) {
            /* the floors: empty launches through the runtime (8-byte and
             * 512-byte parameters) and through the driver, where available */
            static const char *const probe_names[3] = {"launch_empty", "launch_empty_512B",
                                                       "launch_empty_driver"};
            for (int v = 0; v < 3; ++v) {
                c.probe = v;
                fp_status pst = fp_launch_probe(ctx, NULL, v);
                if (pst == FP_OK) pst = fp_context_synchronize(ctx, NULL);
                if (pst == FP_ERR_UNSUPPORTED) continue; /* e.g. the driver launch under the emulation */
                const double us = host_cost_row(run, probe_names[v], op_launch_probe, &c);
                if (v == 0) c.floor_us = us;
            }
        }
        host_cost_row(run, "axpby", op_axpby, &c);
        host_cost_row(run, "mem_fill", op_fill, &c);
        host_cost_row(run, "norm_fwd", op_norm, &c);
        host_cost_row(run, "attention_decode", op_decode, &c);
        if (fb_kind(run) == FP_DEVICE_CUDA && !fb_opt_given(run, "split_combine")) {
            /* the same with split-KV's separate combine kernel: the launch
             * the fused combine saves */
            fp_context_set_option(ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 1);
            host_cost_row(run, "attention_decode_separate", op_decode, &c);
            set_run_options(run, 1);
        }
        host_cost_row(run, "attention_prefill", op_prefill, &c);
        lookup_row(run, &c);
    }
    if (l.ctx) layer_free(&l);
    fp_mem_free(ctx, pq);
    fp_mem_free(ctx, pkv);
    fp_mem_free(ctx, po);
    fp_mem_free(ctx, c.fill_buf);
    set_run_options(run, 0);
    return FP_OK;
}

FB_SCENARIO(fb_graph_decode_step, "graph/decode_step",
            "decode layer step (RMSNorm, paged-KV decode attention, RMSNorm): eager vs graph cache replay",
            run_decode_step)
FB_SCENARIO(fb_graph_pdl, "graph/pdl",
            "decode layer step with programmatic dependent launch vs without, eager and replayed",
            run_pdl)
FB_SCENARIO(fb_graph_op_host_cost, "graph/op_host_cost",
            "host time of one call of each op (launch only) vs one graph replay; graph cache lookup cost",
            run_op_host_cost)
