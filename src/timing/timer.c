/* The measuring half of the timing engine: warm-up, calibration of calls per
 * sample, sampling until the noise target or a cap, interleaved A/B. CUDA
 * contexts time with events on the stream; CPU contexts with the monotonic
 * clock (CPU work is synchronous). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "fastpath/timing.h"

#define FP_MAX_REPS 100000
#define FP_MAX_GRAPH_REPS 1024

/* The first published size of fp_timing_config (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define TIMING_CONFIG_SIZE_FIRST sizeof(fp_timing_config)

fp_status fp_timing_config_default_sized(fp_timing_config *out, size_t struct_size) {
    fp_timing_config defaults, *cfg = &defaults;
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->warmup = 3;
    cfg->min_samples = 10;
    cfg->max_samples = 1000;
    cfg->max_time_s = 2.0;
    cfg->target_noise = 0.005;
    cfg->min_effect = 0.01;
    cfg->flush_l2 = 0;
    cfg->min_sample_ms = 0.05;
    return fp_struct_init(out, struct_size, cfg, TIMING_CONFIG_SIZE_FIRST, sizeof *cfg, "fp_timing_config");
}

void(fp_timing_config_default)(fp_timing_config *cfg) {
    if (cfg) (void)fp_timing_config_default_sized(cfg, TIMING_CONFIG_SIZE_FIRST);
}

static fp_status check_config(const fp_timing_config *c) {
    FP_CHECK_ARG(c->warmup >= 0, "warmup must be >= 0 (got %d)", c->warmup);
    FP_CHECK_ARG(c->min_samples >= 1, "min_samples must be >= 1 (got %d)", c->min_samples);
    FP_CHECK_ARG(c->max_samples >= c->min_samples, "max_samples (%d) < min_samples (%d)",
                 c->max_samples, c->min_samples);
    FP_CHECK_ARG(c->max_time_s > 0 && isfinite(c->max_time_s), "max_time_s must be > 0");
    FP_CHECK_ARG(c->target_noise >= 0 && isfinite(c->target_noise), "target_noise must be >= 0");
    FP_CHECK_ARG(c->min_effect >= 0 && isfinite(c->min_effect), "min_effect must be >= 0");
    FP_CHECK_ARG(c->min_sample_ms >= 0 && isfinite(c->min_sample_ms), "min_sample_ms must be >= 0");
    FP_CHECK_ARG(c->use_graph == 0 || c->use_graph == 1, "use_graph must be 0 or 1 (got %d)", c->use_graph);
    return FP_OK;
}

/* One callable being sampled. */
typedef struct sampler {
    fp_timed_fn fn;
    void *user;
    int reps;          /* calls per sample */
    cudaGraphExec_t graph; /* use_graph: the reps calls, captured once */
    double *samples;   /* ms per call */
    int n, cap;
    int done;
    const char *stage; /* the range of its samples while tracing */
    double bytes, flops; /* per call, for that range (the optimized side's roofline) */
} sampler;

typedef struct timing_env {
    fp_context *ctx;
    cudaStream_t stream;
    const fp_timing_config *cfg;
    cudaEvent_t start, stop;
} timing_env;

static fp_status flush_l2(timing_env *env, int salt) {
    fp_context *ctx = env->ctx;
    if (!ctx->l2_flush_buf) {
        /* Twice the L2 so nothing of the op's working set survives. */
        size_t bytes = ctx->info.l2_bytes ? 2 * ctx->info.l2_bytes : (size_t)128 << 20;
        FP_CUDA_TRY(cudaMalloc(&ctx->l2_flush_buf, bytes));
        ctx->l2_flush_bytes = bytes;
    }
    FP_CUDA_TRY(cudaMemsetAsync(ctx->l2_flush_buf, salt & 0xff, ctx->l2_flush_bytes, env->stream));
    return FP_OK;
}

/* Calls a caller's callable. It cannot record a detail message (fp_set_error
 * is internal) and may return any int: its failure reaches the caller of
 * fp_time / fp_ab_run as its own status with a message saying the callable
 * failed (one of the library's ops keeps the message it set), and a value
 * outside fp_status as FP_ERR_INVALID_ARGUMENT naming it. */
static fp_status call_timed(fp_timed_fn fn, void *user, fp_stream stream) {
    const unsigned seq = fp_error_seq();
    const fp_status st = fn(user, stream);
    if (st == FP_OK) return FP_OK;
    if ((int)st < FP_OK || (int)st > FP_ERR_INTERNAL)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "the timed callable returned %d, not an fp_status", (int)st);
    if (fp_error_seq() == seq) return fp_set_error(st, "the timed callable failed: %s", fp_status_string(st));
    return st;
}

/* Runs s->reps calls (or one replay of their graph) and returns the mean
 * duration per call in *ms. */
static fp_status sample_once(timing_env *env, sampler *s, int reps, double *ms) {
    if (env->ctx->kind == FP_DEVICE_CPU) {
        double t0 = fp_now_s();
        for (int r = 0; r < reps; ++r) FP_TRY(call_timed(s->fn, s->user, NULL));
        *ms = (fp_now_s() - t0) * 1e3 / reps;
        return FP_OK;
    }
    if (env->cfg->flush_l2) FP_TRY(flush_l2(env, s->n));
    FP_CUDA_TRY(cudaEventRecord(env->start, env->stream));
    if (s->graph) FP_CUDA_TRY(cudaGraphLaunch(s->graph, env->stream));
    else
        for (int r = 0; r < reps; ++r) FP_TRY(call_timed(s->fn, s->user, (fp_stream)env->stream));
    FP_CUDA_TRY(cudaEventRecord(env->stop, env->stream));
    FP_CUDA_TRY(cudaEventSynchronize(env->stop));
    float elapsed = 0;
    FP_CUDA_TRY(cudaEventElapsedTime(&elapsed, env->start, env->stop));
    *ms = (double)elapsed / reps;
    return FP_OK;
}

/* use_graph: captures s->reps calls on the stream into s->graph. A callable
 * that fails or cannot be captured leaves the stream as it was. */
static fp_status capture_graph(timing_env *env, sampler *s) {
    if (env->stream == 0 || env->stream == cudaStreamLegacy)
        return fp_set_error(FP_ERR_UNSUPPORTED, "use_graph: the legacy default stream cannot be captured");
    FP_CUDA_TRY(cudaStreamBeginCapture(env->stream, cudaStreamCaptureModeThreadLocal));
    fp_status st = FP_OK;
    for (int r = 0; r < s->reps && st == FP_OK; ++r) st = call_timed(s->fn, s->user, (fp_stream)env->stream);
    cudaGraph_t graph = NULL;
    cudaError_t end = cudaStreamEndCapture(env->stream, &graph);
    if (st != FP_OK) {
        /* It ran during warm-up, so failing now means capture broke it (a
         * synchronization, a host read of device data, ...). */
        char detail[512];
        snprintf(detail, sizeof detail, "%s", fp_last_error());
        st = fp_set_error(FP_ERR_UNSUPPORTED, "use_graph: the callable failed while being captured "
                          "into a CUDA graph (%s: %s)", fp_status_string(st), detail);
    } else if (end != cudaSuccess) {
        st = fp_set_error(FP_ERR_UNSUPPORTED, "use_graph: the callable cannot be captured into a CUDA graph: %s",
                          cudaGetErrorString(end));
    }
    (void)cudaGetLastError();
    if (st == FP_OK) {
        cudaError_t e = cudaGraphInstantiate(&s->graph, graph, 0);
        if (e != cudaSuccess) {
            s->graph = NULL;
            st = fp_cuda_status(e, "cudaGraphInstantiate", __FILE__, __LINE__);
        }
    }
    if (graph) cudaGraphDestroy(graph);
    return st;
}

/* Warm-up, then picks calls-per-sample so one sample lasts >= min_sample_ms
 * (event and clock resolution would otherwise dominate tiny ops). */
static fp_status prepare(timing_env *env, sampler *s) {
    for (int i = 0; i < env->cfg->warmup; ++i) {
        double ms = 0;
        FP_TRY(sample_once(env, s, 1, &ms));
    }
    s->reps = 1;
    const int cuda = env->ctx->kind == FP_DEVICE_CUDA;
    if (!(env->cfg->flush_l2 && cuda)) {
        double ms = 0;
        FP_TRY(sample_once(env, s, 1, &ms));
        if (ms < env->cfg->min_sample_ms) {
            double r = ceil(env->cfg->min_sample_ms / fmax(ms, 1e-5));
            s->reps = r > FP_MAX_REPS ? FP_MAX_REPS : (int)r;
        }
    }
    if (env->cfg->use_graph && cuda) {
        if (s->reps > FP_MAX_GRAPH_REPS) s->reps = FP_MAX_GRAPH_REPS; /* graph size and instantiation time */
        FP_TRY(capture_graph(env, s));
        double ms = 0;
        FP_TRY(sample_once(env, s, s->reps, &ms)); /* first replay uploads the graph */
    }
    return FP_OK;
}

static void sampler_free(sampler *s) {
    if (s->graph) cudaGraphExecDestroy(s->graph);
    s->graph = NULL;
    free(s->samples);
    s->samples = NULL;
}

/* While ctx traces, each measured sample runs inside a user range whose
 * stage names its side ("baseline", "optimized", "timed"): the spans of
 * the ops it runs carry it, so a trace of an A/B splits by side (trace.h,
 * fp_trace_verdict_spans by stage). */
static int stage_push(fp_context *ctx, const sampler *s) {
    return s->stage && fp_ctx_traced(ctx) &&
           ctx->trace_hooks->push(ctx, s->stage, s->bytes * s->reps, s->flops * s->reps);
}

static fp_status take_sample(timing_env *env, sampler *s) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        double *p = realloc(s->samples, (size_t)cap * sizeof *p);
        if (!p) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "sample buffer");
        s->samples = p;
        s->cap = cap;
    }
    double ms = 0;
    const int pushed = stage_push(env->ctx, s);
    const fp_status st = sample_once(env, s, s->reps, &ms);
    if (pushed) env->ctx->trace_hooks->pop(env->ctx);
    FP_TRY(st);
    s->samples[s->n++] = ms;
    return FP_OK;
}

/* The stopping rule documented on fp_timing_config.target_noise. */
static int converged(const fp_timing_config *cfg, const sampler *s) {
    if (s->n < cfg->min_samples) return 0;
    if (s->n >= cfg->max_samples) return 1;
    fp_stats st;
    if (fp_stats_compute(s->samples, s->n, &st) != FP_OK) return 1;
    if (st.noise <= cfg->target_noise) return 1;
    return 1.2533 * st.noise / sqrt((double)s->n) < cfg->target_noise / 5.0;
}

static fp_status env_open(timing_env *env, fp_context *ctx, fp_stream stream,
                          const fp_timing_config *cfg) {
    memset(env, 0, sizeof *env);
    env->ctx = ctx;
    env->cfg = cfg;
    if (ctx->kind == FP_DEVICE_CUDA) {
        FP_TRY(fp_ctx_activate(ctx));
        env->stream = fp_ctx_stream(ctx, stream);
        FP_CUDA_TRY(cudaEventCreate(&env->start));
        FP_CUDA_TRY(cudaEventCreate(&env->stop));
    }
    return FP_OK;
}

static void env_close(timing_env *env) {
    if (env->start) cudaEventDestroy(env->start);
    if (env->stop) cudaEventDestroy(env->stop);
}

/* Samples each of n callables in turn (A B A B ...) until all converge, or
 * the time cap (max_time_s per callable) is spent. */
static fp_status run_interleaved(timing_env *env, sampler *s, int n) {
    for (int i = 0; i < n; ++i) FP_TRY(prepare(env, &s[i]));
    double t0 = fp_now_s(), cap = env->cfg->max_time_s * n;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < n; ++i) {
            if (s[i].done) continue;
            FP_TRY(take_sample(env, &s[i]));
            s[i].done = converged(env->cfg, &s[i]);
            pending += !s[i].done;
        }
        if (!pending) return FP_OK;
        if (fp_now_s() - t0 > cap) {
            /* Out of time: every side keeps what it has, min_samples or not
             * (a caller asking for 1000 samples of a 1 s op gets fewer). */
            return FP_OK;
        }
    }
}

fp_status fp_time(fp_context *ctx, fp_stream stream, fp_timed_fn fn, void *user,
                  const fp_timing_config *cfg, fp_stats *out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(fn);
    FP_CHECK_NOT_NULL(out);
    fp_timing_config def;
    if (!cfg) { fp_timing_config_default(&def); cfg = &def; }
    FP_STRUCT_IN(&cfg, def, TIMING_CONFIG_SIZE_FIRST, fp_timing_config_default, "fp_timing_config (cfg)");
    FP_TRY(check_config(cfg));
    timing_env env;
    sampler s = {.fn = fn, .user = user, .stage = "timed"};
    fp_status st = env_open(&env, ctx, stream, cfg);
    if (st == FP_OK) st = run_interleaved(&env, &s, 1);
    if (st == FP_OK) st = fp_stats_compute(s.samples, s.n, out);
    env_close(&env);
    sampler_free(&s);
    return st;
}

/* The first published size of fp_ab_spec (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define AB_SPEC_SIZE_FIRST sizeof(fp_ab_spec)

fp_status fp_ab_spec_init_sized(fp_ab_spec *out, size_t struct_size) {
    fp_ab_spec defaults, *spec = &defaults;
    memset(spec, 0, sizeof *spec);
    spec->struct_size = sizeof *spec;
    spec->atol = -1;
    spec->rtol = -1;
    return fp_struct_init(out, struct_size, spec, AB_SPEC_SIZE_FIRST, sizeof *spec, "fp_ab_spec");
}

void(fp_ab_spec_init)(fp_ab_spec *spec) {
    if (spec) (void)fp_ab_spec_init_sized(spec, AB_SPEC_SIZE_FIRST);
}

fp_status fp_ab_run(fp_context *ctx, fp_stream stream, const fp_ab_spec *spec,
                    const fp_timing_config *cfg, fp_ab_report *report) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(spec);
    FP_CHECK_NOT_NULL(report);
    fp_ab_spec full_spec;
    FP_STRUCT_IN(&spec, full_spec, AB_SPEC_SIZE_FIRST, fp_ab_spec_init, "fp_ab_spec (spec)");
    FP_CHECK_ARG(!isnan(spec->atol) && !isnan(spec->rtol),
                 "spec atol %g / rtol %g is NaN (pass < 0 for the dtype default)", spec->atol, spec->rtol);
    FP_CHECK_ARG(spec->baseline && spec->optimized, "spec needs both a baseline and an optimized callable");
    FP_CHECK_ARG((spec->baseline_out == NULL) == (spec->optimized_out == NULL),
                 "spec gives only one of baseline_out / optimized_out");
    fp_timing_config def;
    if (!cfg) { fp_timing_config_default(&def); cfg = &def; }
    FP_STRUCT_IN(&cfg, def, TIMING_CONFIG_SIZE_FIRST, fp_timing_config_default, "fp_timing_config (cfg)");
    FP_TRY(check_config(cfg));

    fp_ab_report rep;
    memset(&rep, 0, sizeof rep);
    /* One untimed run of each, then the numerical check: a fast wrong answer
     * is not a result. */
    FP_TRY(call_timed(spec->baseline, spec->baseline_user, stream));
    FP_TRY(call_timed(spec->optimized, spec->optimized_user, stream));
    FP_TRY(fp_context_synchronize(ctx, stream));
    if (spec->baseline_out && spec->out_count > 0) {
        FP_TRY(fp_compare(ctx, spec->baseline_out, spec->optimized_out, spec->out_count,
                          spec->out_dtype, spec->atol, spec->rtol, &rep.agreement));
        rep.compared = 1;
    } else {
        rep.agreement.passed = 1;
        rep.agreement.first_bad = SIZE_MAX;
    }

    timing_env env;
    sampler s[2] = {{.fn = spec->baseline, .user = spec->baseline_user, .stage = "baseline"},
                    {.fn = spec->optimized, .user = spec->optimized_user, .stage = "optimized",
                     .bytes = spec->bytes, .flops = spec->flops}};
    fp_status st = env_open(&env, ctx, stream, cfg);
    if (st == FP_OK) st = run_interleaved(&env, s, 2);
    if (st == FP_OK) st = fp_stats_compute(s[0].samples, s[0].n, &rep.baseline);
    if (st == FP_OK) st = fp_stats_compute(s[1].samples, s[1].n, &rep.optimized);
    env_close(&env);
    sampler_free(&s[0]);
    sampler_free(&s[1]);
    if (st != FP_OK) return st;
    rep.verdict = fp_verdict_decide(&rep.baseline, &rep.optimized, cfg->min_effect, &rep.speedup);
    fp_roofline(&ctx->info, rep.optimized.median_ms, spec->bytes, spec->flops,
                spec->flops_on_tensor_cores, &rep);
    *report = rep;
    return FP_OK;
}
