/* attention/cpu_versions: the CPU attention's versions on a CPU context, A/B
 * with outputs compared (fp_ab_run): the portable tiled loops (the fallback
 * of builds without BLIS; before BLIS it was the CPU fast path) as the
 * baseline against the BLIS flash path fp_attention_forward runs. Shapes:
 * (batch, heads, seq, head_dim) = (1, 16, 1024, 128) causal and not,
 * (4, 32, 512, 64), and GQA decode (8 x 32 query heads, 1 query) against 8
 * KV heads x 4096 keys, head_dim 128; f32 and bf16 (--dtype picks). GFLOP/s
 * of both (4 b h sq sk d, halved when causal). --quick: seqlen 256, decode
 * 1024 keys. Skipped on CUDA contexts and in builds without BLIS. */
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h" /* the CPU versions (static link) */
#include "fastpath/attention.h"
#include "scenario.h"

typedef struct cpu_version {
    fp_thread_pool *pool;
    fp_attn_args a;
    fp_status (*fn)(fp_thread_pool *, const fp_attn_args *);
} cpu_version;

static fp_status cpu_version_fn(void *user, fp_stream stream) {
    (void)stream;
    cpu_version *v = user;
    return v->fn(v->pool, &v->a);
}

typedef struct cpu_shape {
    int batch, sq, sk, hq, hkv, d, causal;
} cpu_shape;

static void run_cpu_shape(fb_run *run, const cpu_shape *s, fp_dtype dt) {
    fp_context *ctx = fb_ctx(run);
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "dtype", fp_dtype_name(dt));
    fb_param_int(r, "batch", s->batch);
    fb_param_int(r, "seqlen_q", s->sq);
    fb_param_int(r, "seqlen_k", s->sk);
    fb_param_int(r, "heads_q", s->hq);
    fb_param_int(r, "heads_kv", s->hkv);
    fb_param_int(r, "head_dim", s->d);
    fb_param_int(r, "causal", s->causal);
    const size_t elt = fp_dtype_size(dt);
    const size_t nq = (size_t)s->batch * s->sq * s->hq * s->d, nk = (size_t)s->batch * s->sk * s->hkv * s->d;
    void *q = NULL, *k = NULL, *v = NULL, *o1 = NULL, *o2 = NULL;
    fp_status st = fp_mem_alloc(ctx, nq * elt, &q);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nk * elt, &k);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nk * elt, &v);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * elt, &o1);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * elt, &o2);
    if (st == FP_OK) st = fb_fill_random(ctx, q, nq, dt, 1, -1.0f, 1.0f);
    if (st == FP_OK) st = fb_fill_random(ctx, k, nk, dt, 2, -1.0f, 1.0f);
    if (st == FP_OK) st = fb_fill_random(ctx, v, nk, dt, 3, -1.0f, 1.0f);
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = s->batch; p.seqlen_q = s->sq; p.seqlen_k = s->sk;
    p.heads_q = s->hq; p.heads_kv = s->hkv; p.head_dim = s->d;
    p.dtype = dt; p.causal = s->causal;
    p.q = q; p.k = k; p.v = v;
    cpu_version before = {ctx->pool, {0}, fp_attn_cpu_tiled_portable};
    cpu_version after = {ctx->pool, {0}, fp_attn_cpu_flash_blas};
    p.o = o1;
    if (st == FP_OK) st = fp_attn_check(&p, 0, &before.a);
    p.o = o2;
    if (st == FP_OK) st = fp_attn_check(&p, 0, &after.a);
    const double flops = fp_attention_flops(&p);
    fp_ab_report rep;
    if (st == FP_OK) {
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = cpu_version_fn;
        spec.baseline_user = &before;
        spec.optimized = cpu_version_fn;
        spec.optimized_user = &after;
        spec.baseline_out = o1;
        spec.optimized_out = o2;
        spec.out_count = nq;
        spec.out_dtype = dt;
        spec.bytes = (double)(2 * nq + 2 * nk) * (double)elt;
        spec.flops = flops;
        st = fp_ab_run(ctx, NULL, &spec, fb_timing(run), &rep);
    }
    if (st == FP_OK) {
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "blis_gflops", flops / (rep.optimized.median_ms * 1e-3) / 1e9);
        fb_result_metric(r, "portable_gflops", flops / (rep.baseline.median_ms * 1e-3) / 1e9);
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_mem_free(ctx, q);
    fp_mem_free(ctx, k);
    fp_mem_free(ctx, v);
    fp_mem_free(ctx, o1);
    fp_mem_free(ctx, o2);
}

static fp_status run_cpu_versions(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CPU) return fb_skip(run, "CPU contexts only (--device cpu)");
    if (!fp_attn_cpu_have_blas()) return fb_skip(run, "built without BLIS: only the portable CPU path exists");
    const int quick = fb_quick(run), sl = quick ? 256 : 1024, sl2 = quick ? 256 : 512, kv = quick ? 1024 : 4096;
    const cpu_shape shapes[] = {
        {1, sl, sl, 16, 16, 128, 0},
        {1, sl, sl, 16, 16, 128, 1},
        {4, sl2, sl2, 32, 32, 64, 0},
        {8, 1, kv, 32, 8, 128, 0},
    };
    fp_dtype dts[4] = {FP_F32, FP_BF16};
    int ndt = fb_dtypes(run, dts, 4);
    if (ndt <= 0) ndt = 2;
    for (int t = 0; t < ndt; ++t)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) run_cpu_shape(run, &shapes[i], dts[t]);
    return FP_OK;
}

FB_SCENARIO(fb_attention_cpu_versions, "attention/cpu_versions",
            "CPU attention: portable tiled loops vs flash on BLIS tile GEMMs (CPU contexts)", run_cpu_versions)
