/* timing/... scenarios: memory-bound probes that exercise the timing engine
 * end to end, and a self-check of its verdict.
 *
 *   timing/elementwise  out = a*x + b*y: naive (v1) vs vectorized (v2)
 *   timing/copy         library copy (cudaMemcpy / memcpy) vs vector copy
 *                       kernel (threaded memcpy on CPU): the practical
 *                       memory roofline other ops are judged against
 *   timing/self_check   the same callable as A and B: the verdict must be SAME
 */
#include <stdlib.h>
#include <string.h>

#include "scenario.h"
#include "timing/probes.h"

typedef struct axpby_case {
    fp_context *ctx;
    int version;
    fp_dtype dtype;
    size_t n;
    void *x, *y, *out;
} axpby_case;

static fp_status axpby_fn(void *user, fp_stream stream) {
    axpby_case *c = user;
    return fp_axpby(c->ctx, stream, c->version, c->dtype, c->n, 1.5f, c->x, -0.75f, c->y, c->out);
}

static fp_status run_elementwise(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    int gpu = fb_kind(run) == FP_DEVICE_CUDA;
    size_t n = (size_t)fb_opt_int(run, "n", gpu ? (64 << 20) : (fb_quick(run) ? (1 << 20) : (8 << 20)));
    fp_dtype dts[8] = {FP_F32, FP_BF16};
    int ndt = fb_dtypes(run, dts, 8);
    if (ndt == 0) ndt = 2;
    for (int d = 0; d < ndt; ++d) {
        fp_dtype dt = dts[d];
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "n", (int64_t)n);
        fb_param_str(r, "dtype", fp_dtype_name(dt));
        axpby_case base = {ctx, 1, dt, n, NULL, NULL, NULL}, opt;
        void *out2 = NULL;
        fp_status st = fb_alloc_random(ctx, n, dt, 1, -1.0f, 1.0f, &base.x);
        if (st == FP_OK) st = fb_alloc_random(ctx, n, dt, 2, -1.0f, 1.0f, &base.y);
        if (st == FP_OK) st = fp_mem_alloc(ctx, n * fp_dtype_size(dt), &base.out);
        if (st == FP_OK) st = fp_mem_alloc(ctx, n * fp_dtype_size(dt), &out2);
        /* Poison both outputs: an unwritten element shows as NaN. */
        if (st == FP_OK) st = fp_mem_fill(ctx, base.out, 0xff, n * fp_dtype_size(dt), NULL);
        if (st == FP_OK) st = fp_mem_fill(ctx, out2, 0xff, n * fp_dtype_size(dt), NULL);
        opt = base;
        opt.version = 2;
        opt.out = out2;
        fp_ab_report rep;
        if (st == FP_OK) {
            fp_ab_spec spec;
            fp_ab_spec_init(&spec);
            spec.baseline = axpby_fn;
            spec.baseline_user = &base;
            spec.optimized = axpby_fn;
            spec.optimized_user = &opt;
            spec.baseline_out = base.out;
            spec.optimized_out = out2;
            spec.out_count = n;
            spec.out_dtype = dt;
            spec.atol = 0; /* same arithmetic in the same order: bit-identical */
            spec.rtol = 0;
            spec.bytes = 3.0 * (double)n * (double)fp_dtype_size(dt);
            st = fp_ab_run(ctx, NULL, &spec, fb_timing(run), &rep);
        }
        if (st == FP_OK) fb_result_set_ab(r, &rep);
        else fb_result_fail(r, st, fp_last_error());
        fp_mem_free(ctx, base.x);
        fp_mem_free(ctx, base.y);
        fp_mem_free(ctx, base.out);
        fp_mem_free(ctx, out2);
    }
    return FP_OK;
}

typedef struct copy_case {
    fp_context *ctx;
    int version;
    void *dst;
    const void *src;
    size_t bytes;
} copy_case;

static fp_status copy_fn(void *user, fp_stream stream) {
    copy_case *c = user;
    return fp_copy(c->ctx, stream, c->version, c->dst, c->src, c->bytes);
}

static fp_status run_copy(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    int gpu = fb_kind(run) == FP_DEVICE_CUDA;
    int64_t mib_opt = fb_opt_int(run, "mib", gpu ? 1024 : (fb_quick(run) ? 16 : 64));
    /* mib << 20 must not wrap (2^44 + 1 MiB would measure a 1 MiB copy and
     * report it under the requested size). */
    size_t mib = mib_opt > 0 && mib_opt <= ((int64_t)1 << 40) ? (size_t)mib_opt : 0;
    size_t bytes = mib << 20, n = bytes / 4;
    fb_result *r = fb_result_new(run);
    fb_param_int(r, "mib", mib_opt);
    if (mib == 0) {
        fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--mib must be in [1, 2^40]");
        return FP_OK;
    }
    void *src = NULL, *d1 = NULL, *d2 = NULL;
    fp_status st = fb_alloc_random(ctx, n, FP_F32, 3, -1.0f, 1.0f, &src);
    if (st == FP_OK) st = fp_mem_alloc(ctx, bytes, &d1);
    if (st == FP_OK) st = fp_mem_alloc(ctx, bytes, &d2);
    if (st == FP_OK) st = fp_mem_fill(ctx, d1, 0xff, bytes, NULL);
    if (st == FP_OK) st = fp_mem_fill(ctx, d2, 0xff, bytes, NULL);
    copy_case base = {ctx, 1, d1, src, bytes}, opt = {ctx, 2, d2, src, bytes};
    fp_ab_report rep;
    if (st == FP_OK) {
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = copy_fn;
        spec.baseline_user = &base;
        spec.optimized = copy_fn;
        spec.optimized_user = &opt;
        spec.baseline_out = d1;
        spec.optimized_out = d2;
        spec.out_count = n;
        spec.out_dtype = FP_F32;
        spec.atol = 0;
        spec.rtol = 0;
        spec.bytes = 2.0 * (double)bytes;
        st = fp_ab_run(ctx, NULL, &spec, fb_timing(run), &rep);
    }
    if (st == FP_OK) {
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "baseline_gbps", 2.0 * (double)bytes / (rep.baseline.median_ms * 1e-3) / 1e9);
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_mem_free(ctx, src);
    fp_mem_free(ctx, d1);
    fp_mem_free(ctx, d2);
    return FP_OK;
}

static fp_status run_self_check(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    int gpu = fb_kind(run) == FP_DEVICE_CUDA;
    size_t n = (size_t)fb_opt_int(run, "n", gpu ? (16 << 20) : (1 << 20));
    fb_result *r = fb_result_new(run);
    fb_param_int(r, "n", (int64_t)n);
    axpby_case c = {ctx, 2, FP_F32, n, NULL, NULL, NULL};
    fp_status st = fb_alloc_random(ctx, n, FP_F32, 4, -1.0f, 1.0f, &c.x);
    if (st == FP_OK) st = fb_alloc_random(ctx, n, FP_F32, 5, -1.0f, 1.0f, &c.y);
    if (st == FP_OK) st = fp_mem_alloc(ctx, n * 4, &c.out);
    fp_ab_report rep;
    if (st == FP_OK) {
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = axpby_fn;
        spec.baseline_user = &c;
        spec.optimized = axpby_fn;
        spec.optimized_user = &c;
        spec.bytes = 12.0 * (double)n;
        st = fp_ab_run(ctx, NULL, &spec, fb_timing(run), &rep);
    }
    if (st == FP_OK) {
        fb_result_set_ab(r, &rep);
        /* A vs A must read SAME: anything else means the noise model lies. */
        fb_result_note(r, rep.verdict == FP_VERDICT_SAME ? "A=A ok" : "A=A verdict not SAME: noisy machine");
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_mem_free(ctx, c.x);
    fp_mem_free(ctx, c.y);
    fp_mem_free(ctx, c.out);
    return FP_OK;
}

FB_SCENARIO(fb_timing_elementwise, "timing/elementwise",
            "out = a*x + b*y: naive scalar (v1) vs 16-byte vectorized / threaded (v2)", run_elementwise)
FB_SCENARIO(fb_timing_copy, "timing/copy",
            "device copy: cudaMemcpy/memcpy vs vector copy kernel/threaded memcpy (memory roofline)", run_copy)
FB_SCENARIO(fb_timing_self_check, "timing/self_check",
            "the same callable as A and B: the verdict must be SAME", run_self_check)
