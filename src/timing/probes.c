/* Probe ops (see probes.h) and the public copy-bandwidth measurement. */
#include <string.h>

#include "half.h"
#include "internal.h"
#include "fastpath/timing.h"
#include "timing/bandwidth.h"
#include "timing/probes.h"

typedef struct axpby_job {
    fp_dtype dtype;
    float alpha, beta;
    const void *x, *y;
    void *out;
} axpby_job;

/* Optimized CPU body: one dtype branch per chunk, tight loops inside. */
static void axpby_chunk(void *arg, size_t begin, size_t end) {
    const axpby_job *j = arg;
    const float a = j->alpha, b = j->beta;
    if (j->dtype == FP_F32) {
        const float *x = j->x, *y = j->y;
        float *o = j->out;
        for (size_t i = begin; i < end; ++i) o[i] = a * x[i] + b * y[i];
    } else if (j->dtype == FP_BF16) {
        const uint16_t *x = j->x, *y = j->y;
        uint16_t *o = j->out;
        for (size_t i = begin; i < end; ++i)
            o[i] = fp_f2b(a * fp_b2f(x[i]) + b * fp_b2f(y[i]));
    } else {
        const uint16_t *x = j->x, *y = j->y;
        uint16_t *o = j->out;
        for (size_t i = begin; i < end; ++i)
            o[i] = fp_f2h(a * fp_h2f(x[i]) + b * fp_h2f(y[i]));
    }
}

fp_status fp_axpby_stamped(fp_context *ctx, fp_stream stream, int version, fp_dtype dtype, size_t n, float alpha,
                           const void *x, float beta, const void *y, void *out, const struct fp_span_stamp *stamp) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(x);
    FP_CHECK_NOT_NULL(y);
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(version == 1 || version == 2, "version must be 1 or 2 (got %d)", version);
    FP_CHECK_ARG(dtype == FP_F32 || dtype == FP_F16 || dtype == FP_BF16,
                 "dtype %s not supported (f32, f16, bf16)", fp_dtype_name(dtype));
    if (ctx->kind == FP_DEVICE_CUDA) {
        FP_TRY(fp_ctx_activate(ctx));
        FP_CUDA_TRY(fp_launch_axpby(version, (int)dtype, n, alpha, x, beta, y, out, ctx->info.sm_count,
                                    ctx->launch_pdl, stamp, fp_ctx_stream(ctx, stream)));
        return FP_OK;
    }
    if (version == 1) {
        for (size_t i = 0; i < n; ++i) fp_store_f32(out, dtype, i, alpha * fp_load_f32(x, dtype, i) + beta * fp_load_f32(y, dtype, i));
        return FP_OK;
    }
    axpby_job job = {dtype, alpha, beta, x, y, out};
    fp_parallel_for(ctx->pool, n, 1 << 16, axpby_chunk, &job);
    return FP_OK;
}

fp_status fp_axpby(fp_context *ctx, fp_stream stream, int version, fp_dtype dtype, size_t n, float alpha,
                   const void *x, float beta, const void *y, void *out) {
    return fp_axpby_stamped(ctx, stream, version, dtype, n, alpha, x, beta, y, out, NULL);
}

fp_status fp_launch_probe(fp_context *ctx, fp_stream stream, int variant) {
    FP_TRY(fp_ctx_check(ctx, FP_DEVICE_CUDA));
    FP_CHECK_ARG(variant >= 0 && variant <= 2, "variant must be 0, 1 or 2 (got %d)", variant);
    const cudaError_t e = fp_launch_empty(variant, fp_ctx_stream(ctx, stream));
    if (e == cudaErrorNotSupported) {
        (void)cudaGetLastError();
        return fp_set_error(FP_ERR_UNSUPPORTED, "launch probe %d: not available here (%s)", variant,
                            cudaGetErrorString(e));
    }
    FP_CUDA_TRY(e);
    return FP_OK;
}

typedef struct copy_job {
    unsigned char *dst;
    const unsigned char *src;
} copy_job;

static void copy_chunk(void *arg, size_t begin, size_t end) {
    copy_job *j = arg;
    memcpy(j->dst + begin, j->src + begin, end - begin);
}

fp_status fp_copy(fp_context *ctx, fp_stream stream, int version, void *dst, const void *src,
                  size_t bytes) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(dst);
    FP_CHECK_NOT_NULL(src);
    FP_CHECK_ARG(version == 1 || version == 2, "version must be 1 or 2 (got %d)", version);
    if (ctx->kind == FP_DEVICE_CUDA) {
        FP_TRY(fp_ctx_activate(ctx));
        cudaStream_t s = fp_ctx_stream(ctx, stream);
        if (version == 1) FP_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
        else FP_CUDA_TRY(fp_launch_copy(dst, src, bytes, ctx->info.sm_count, s));
        return FP_OK;
    }
    if (version == 1) {
        memcpy(dst, src, bytes);
        return FP_OK;
    }
    copy_job job = {dst, src};
    fp_parallel_for(ctx->pool, bytes, 1 << 20, copy_chunk, &job);
    return FP_OK;
}

typedef struct copy_call {
    fp_context *ctx;
    void *dst;
    const void *src;
    size_t bytes;
} copy_call;

static fp_status copy_fn(void *user, fp_stream stream) {
    copy_call *c = user;
    return fp_copy(c->ctx, stream, 1, c->dst, c->src, c->bytes);
}

fp_status fp_measure_copy_bandwidth(fp_context *ctx, size_t bytes, double *gbps) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(gbps);
    if (bytes == 0) bytes = ctx->kind == FP_DEVICE_CUDA ? (size_t)1 << 30 : (size_t)64 << 20;
    void *a = NULL, *b = NULL;
    fp_status st = fp_mem_alloc(ctx, bytes, &a);
    if (st == FP_OK) st = fp_mem_alloc(ctx, bytes, &b);
    if (st == FP_OK) st = fp_mem_fill(ctx, a, 0x5a, bytes, NULL);
    fp_stats stats;
    if (st == FP_OK) {
        fp_timing_config cfg;
        fp_timing_config_default(&cfg);
        cfg.max_time_s = 1.0;
        copy_call call = {ctx, b, a, bytes};
        st = fp_time(ctx, NULL, copy_fn, &call, &cfg, &stats);
    }
    if (st == FP_OK) *gbps = 2.0 * (double)bytes / (stats.median_ms * 1e-3) / 1e9;
    fp_mem_free(ctx, a);
    fp_mem_free(ctx, b);
    return st;
}
