/* alloc/... scenarios: the caching allocator against direct upstream calls
 * (malloc/free on a CPU context, cudaMalloc/cudaFree on a CUDA context).
 *
 *   alloc/cache_hit     alloc+free pair of --bytes (default 64 KiB), served
 *                       from the cache, vs the same pair straight through the
 *                       upstream; one row on 1 thread (fp_ab_run), one on
 *                       --threads (default 8) contending for one allocator
 *                       (per-pair latency sampled in batches of 32 pairs)
 *   alloc/trace_replay  the generated transformer-like trace (--layers,
 *                       --steps) replayed through a warm caching allocator vs
 *                       direct upstream calls; metrics: steady-state upstream
 *                       calls, peak reserved / peak allocated (also per pool
 *                       class: small_/large_peak_reserved_mib, ..._allocated_mib),
 *                       per-op medians, steady_stream_waits (pending blocks
 *                       reused by making the allocating stream wait on their
 *                       events: CUDA only)
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "fastpath/alloc.h"
#include "internal.h"
#include "scenario.h"

static fp_status upstream_for(fb_run *run, fp_alloc_upstream *up) {
    if (fb_kind(run) == FP_DEVICE_CPU) {
        *up = fp_alloc_upstream_host();
        return FP_OK;
    }
    return fp_alloc_upstream_device(fp_context_device_index(fb_ctx(run)), up);
}

/* ---- alloc/cache_hit ---- */

typedef struct pair_case {
    fp_allocator *a;          /* NULL: the upstream */
    fp_alloc_upstream up;
    size_t bytes;
    fp_stream stream;
} pair_case;

static inline fp_status one_pair(pair_case *c) {
    void *p = NULL;
    if (c->a) {
        FP_TRY(fp_alloc_alloc(c->a, c->bytes, c->stream, &p));
        return fp_alloc_free(c->a, p);
    }
    FP_TRY(c->up.alloc(c->up.opaque, c->bytes, &p));
    c->up.free(c->up.opaque, p, c->bytes);
    return FP_OK;
}

static fp_status pair_fn(void *user, fp_stream stream) {
    (void)stream;
    return one_pair(user);
}

enum { PAIR_BATCH = 32 };

typedef struct mt_arg {
    pair_case *c;
    pthread_barrier_t *start;
    double *samples; /* ms per pair */
    int n;
    fp_status st;
} mt_arg;

static void *mt_worker(void *p) {
    mt_arg *m = p;
    pthread_barrier_wait(m->start);
    for (int i = 0; i < m->n && m->st == FP_OK; ++i) {
        double t0 = fp_now_s();
        for (int k = 0; k < PAIR_BATCH && m->st == FP_OK; ++k) m->st = one_pair(m->c);
        m->samples[i] = (fp_now_s() - t0) * 1e3 / PAIR_BATCH;
    }
    return NULL;
}

/* Per-pair latency with `threads` threads hammering c at once. */
static fp_status measure_mt(pair_case *c, int threads, int batches, fp_stats *out) {
    pthread_t th[64];
    mt_arg args[64];
    pthread_barrier_t start;
    double *samples = malloc(sizeof(double) * (size_t)threads * (size_t)batches);
    if (!samples) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "samples");
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; ++i) {
        args[i] = (mt_arg){c, &start, samples + (size_t)i * (size_t)batches, batches, FP_OK};
        pthread_create(&th[i], NULL, mt_worker, &args[i]);
    }
    fp_status st = FP_OK;
    for (int i = 0; i < threads; ++i) {
        pthread_join(th[i], NULL);
        if (args[i].st != FP_OK) st = args[i].st;
    }
    pthread_barrier_destroy(&start);
    if (st == FP_OK) st = fp_stats_compute(samples, threads * batches, out);
    free(samples);
    return st;
}

static fp_status run_cache_hit(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    int gpu = fb_kind(run) == FP_DEVICE_CUDA;
    size_t bytes = (size_t)fb_opt_int(run, "bytes", 64 << 10);
    int threads = (int)fb_opt_int(run, "threads", 8);
    if (bytes == 0 || threads < 1 || threads > 64) return fb_skip(run, "--bytes must be > 0, --threads in [1, 64]");
    pair_case base = {NULL, {0}, bytes, fp_context_stream(ctx)}, opt;
    fp_status st = upstream_for(run, &base.up);
    opt = base;
    if (st == FP_OK) st = fp_alloc_create_for_context(ctx, NULL, &opt.a);
    if (st == FP_OK) st = one_pair(&opt); /* first call reserves the segment */

    fb_result *r1 = fb_result_new(run);
    fb_param_int(r1, "bytes", (int64_t)bytes);
    fb_param_int(r1, "threads", 1);
    fp_ab_report rep;
    fp_alloc_stats s0, s1;
    s0.struct_size = s1.struct_size = sizeof s0;
    if (st == FP_OK) st = fp_alloc_get_stats(opt.a, &s0);
    if (st == FP_OK) {
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = pair_fn;
        spec.baseline_user = &base;
        spec.optimized = pair_fn;
        spec.optimized_user = &opt;
        st = fp_ab_run(ctx, NULL, &spec, fb_timing(run), &rep);
    }
    if (st == FP_OK) st = fp_alloc_get_stats(opt.a, &s1);
    if (st == FP_OK) {
        fb_result_set_ab(r1, &rep);
        fb_result_metric(r1, "pair_ns", rep.optimized.median_ms * 1e6);
        fb_result_metric(r1, "upstream_pair_ns", rep.baseline.median_ms * 1e6);
        fb_result_metric(r1, "upstream_calls", (double)(s1.upstream_allocs - s0.upstream_allocs));
        fb_result_note(r1, "baseline: %s", gpu ? "cudaMalloc+cudaFree" : "malloc+free");
    } else {
        fb_result_fail(r1, st, fp_last_error());
    }

    if (threads > 1 && st == FP_OK) {
        fb_result *r2 = fb_result_new(run);
        fb_param_int(r2, "bytes", (int64_t)bytes);
        fb_param_int(r2, "threads", threads);
        int batches = fb_quick(run) ? 200 : 2000;
        /* cudaMalloc pairs cost microseconds: fewer samples for the baseline. */
        int base_batches = gpu ? batches / 20 + 1 : batches;
        fp_ab_report mt;
        memset(&mt, 0, sizeof mt);
        mt.achieved_gbps = mt.achieved_tflops = 0;
        mt.pct_of_peak = -1;
        mt.bound = "unknown";
        st = measure_mt(&base, threads, base_batches, &mt.baseline);
        if (st == FP_OK) st = measure_mt(&opt, threads, batches, &mt.optimized);
        if (st == FP_OK) {
            mt.verdict = fp_verdict_decide(&mt.baseline, &mt.optimized, fb_timing(run)->min_effect, &mt.speedup);
            fb_result_set_ab(r2, &mt);
            fb_result_metric(r2, "pair_ns", mt.optimized.median_ms * 1e6);
            fb_result_metric(r2, "upstream_pair_ns", mt.baseline.median_ms * 1e6);
        } else {
            fb_result_fail(r2, st, fp_last_error());
        }
    }
    fp_alloc_destroy(opt.a);
    return FP_OK;
}

/* ---- alloc/trace_replay ---- */

typedef struct replay_case {
    fp_allocator *a;          /* NULL: direct */
    fp_alloc_upstream up;
    const fp_alloc_trace *t;
    const fp_stream *streams;
} replay_case;

static fp_status replay_fn(void *user, fp_stream stream) {
    (void)stream;
    replay_case *c = user;
    fp_alloc_replay_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    if (c->a) return fp_alloc_trace_replay(c->a, c->t, c->streams, 0, &r);
    return fp_alloc_trace_replay_direct(&c->up, c->t, 0, &r);
}

static fp_status run_trace_replay(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    int gpu = fb_kind(run) == FP_DEVICE_CUDA;
    fp_alloc_trace_config tc;
    fp_alloc_trace_config_default(&tc);
    tc.layers = (int)fb_opt_int(run, "layers", fb_quick(run) ? 4 : 12);
    tc.steps = (int)fb_opt_int(run, "steps", fb_quick(run) ? 2 : 4);
    tc.seed = (uint64_t)fb_opt_int(run, "seed", 1);
    fp_alloc_trace *t = NULL;
    fp_stream streams[3] = {fp_context_stream(ctx), NULL, NULL};
    cudaStream_t own[2] = {NULL, NULL};
    fb_result *r = fb_result_new(run);
    fb_param_int(r, "layers", tc.layers);
    fb_param_int(r, "steps", tc.steps);
    replay_case base = {NULL, {0}, NULL, NULL}, opt;
    fp_status st = fp_alloc_trace_generate(&tc, &t);
    if (st == FP_OK) st = upstream_for(run, &base.up);
    if (st == FP_OK && gpu) {
        st = fp_ctx_activate(ctx);
        for (int i = 0; i < 2 && st == FP_OK; ++i) {
            if (cudaStreamCreateWithFlags(&own[i], cudaStreamNonBlocking) != cudaSuccess)
                st = fp_set_error(FP_ERR_CUDA, "cudaStreamCreate failed");
            streams[i + 1] = (fp_stream)own[i];
        }
    }
    base.t = t;
    base.streams = gpu ? streams : NULL;
    opt = base;
    if (st == FP_OK) st = fp_alloc_create_for_context(ctx, NULL, &opt.a);
    fp_alloc_replay_result first, steady, direct;
    memset(&first, 0, sizeof first);
    first.struct_size = sizeof first;
    steady = direct = first;
    /* First pass fills the cache; the second shows the steady state. */
    uint64_t w0 = 0, w1 = 0;
    if (st == FP_OK) st = fp_alloc_trace_replay(opt.a, t, opt.streams, 0, &first);
    if (st == FP_OK) st = fp_alloc_stream_wait_counts(opt.a, &w0, NULL);
    if (st == FP_OK) st = fp_alloc_trace_replay(opt.a, t, opt.streams, 1, &steady);
    if (st == FP_OK) st = fp_alloc_stream_wait_counts(opt.a, &w1, NULL);
    if (st == FP_OK) st = fp_alloc_trace_replay_direct(&base.up, t, 1, &direct);
    fp_ab_report rep;
    if (st == FP_OK) {
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = replay_fn;
        spec.baseline_user = &base;
        spec.optimized = replay_fn;
        spec.optimized_user = &opt;
        st = fp_ab_run(ctx, NULL, &spec, fb_timing(run), &rep);
    }
    if (st == FP_OK) {
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "steady_upstream_calls", (double)(steady.upstream_allocs + steady.upstream_frees));
        fb_result_metric(r, "reserved_over_allocated",
                         (double)steady.peak_reserved / (double)(steady.peak_allocated ? steady.peak_allocated : 1));
        fb_result_metric(r, "first_pass_upstream_allocs", (double)first.upstream_allocs);
        fb_result_metric(r, "steady_stream_waits", (double)(w1 - w0));
        fb_result_metric(r, "direct_upstream_calls", (double)(direct.upstream_allocs + direct.upstream_frees));
        fb_result_metric(r, "alloc_median_ns", steady.alloc_latency.median_ms * 1e6);
        fb_result_metric(r, "direct_alloc_median_ns", direct.alloc_latency.median_ms * 1e6);
        fb_result_metric(r, "peak_reserved_mib", (double)steady.peak_reserved / (1 << 20));
        fb_result_metric(r, "peak_allocated_mib", (double)steady.peak_allocated / (1 << 20));
        fb_result_metric(r, "ops", (double)t->n_ops);
        /* Per pool class, from the last (steady) replay: its peaks were reset
         * at its start. */
        fp_alloc_stats ps;
        ps.struct_size = sizeof ps;
        if (fp_alloc_get_stats(opt.a, &ps) == FP_OK) {
            const fp_alloc_pool_stats *sm = &ps.pools[FP_ALLOC_POOL_SMALL], *lg = &ps.pools[FP_ALLOC_POOL_LARGE];
            fb_result_metric(r, "small_peak_reserved_mib", (double)sm->reserved_bytes.peak / (1 << 20));
            fb_result_metric(r, "small_peak_allocated_mib", (double)sm->allocated_bytes.peak / (1 << 20));
            fb_result_metric(r, "large_peak_reserved_mib", (double)lg->reserved_bytes.peak / (1 << 20));
            fb_result_metric(r, "large_peak_allocated_mib", (double)lg->allocated_bytes.peak / (1 << 20));
        }
        fb_result_note(r, "baseline: %s per op", gpu ? "cudaMalloc/cudaFree" : "malloc/free");
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_alloc_destroy(opt.a);
    for (int i = 0; i < 2; ++i)
        if (own[i]) cudaStreamDestroy(own[i]);
    fp_alloc_trace_destroy(t);
    return FP_OK;
}

FB_SCENARIO(alloc_cache_hit, "alloc/cache_hit",
            "caching allocator alloc+free pair (cache hit) vs upstream, 1 and 8 threads", run_cache_hit)
FB_SCENARIO(alloc_trace_replay, "alloc/trace_replay",
            "transformer-like allocation trace: caching allocator vs direct upstream calls",
            run_trace_replay)
