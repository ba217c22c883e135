/* Fused normalization: the public API. Argument checks (every error names
 * the argument and leaves the outputs untouched), dispatch to the CPU
 * implementations or the CUDA launchers, and validate (unfused baseline vs
 * fused through the timing engine). */
#include <stdlib.h>

#include "norm/norm_internal.h"

const char *fp_norm_kind_name(fp_norm_kind kind) {
    switch (kind) {
    case FP_NORM_LAYERNORM: return "layernorm";
    case FP_NORM_RMSNORM: return "rmsnorm";
    }
    return "unknown";
}

const char *fp_norm_activation_name(fp_norm_activation act) {
    switch (act) {
    case FP_NORM_ACT_NONE: return "none";
    case FP_NORM_ACT_GELU_ERF: return "gelu_erf";
    case FP_NORM_ACT_GELU_TANH: return "gelu_tanh";
    case FP_NORM_ACT_RELU: return "relu";
    case FP_NORM_ACT_SILU: return "silu";
    }
    return "unknown";
}

/* The first published size of fp_norm_params (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define NORM_PARAMS_SIZE_FIRST sizeof(fp_norm_params)

fp_status fp_norm_params_default_sized(fp_norm_params *out, size_t struct_size) {
    fp_norm_params defaults, *p = &defaults;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->kind = FP_NORM_LAYERNORM;
    p->activation = FP_NORM_ACT_NONE;
    p->x_dtype = p->residual_dtype = p->out_dtype = p->param_dtype = FP_F32;
    p->eps = 1e-5f;
    return fp_struct_init(out, struct_size, p, NORM_PARAMS_SIZE_FIRST, sizeof *p, "fp_norm_params");
}

void(fp_norm_params_default)(fp_norm_params *p) {
    if (p) (void)fp_norm_params_default_sized(p, NORM_PARAMS_SIZE_FIRST);
}

/* The first published size of fp_norm_backward_params (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define NORM_BACKWARD_PARAMS_SIZE_FIRST sizeof(fp_norm_backward_params)

fp_status fp_norm_backward_params_default_sized(fp_norm_backward_params *out, size_t struct_size) {
    fp_norm_backward_params defaults, *p = &defaults;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->kind = FP_NORM_LAYERNORM;
    p->activation = FP_NORM_ACT_NONE;
    p->dtype = p->param_dtype = FP_F32;
    return fp_struct_init(out, struct_size, p, NORM_BACKWARD_PARAMS_SIZE_FIRST, sizeof *p, "fp_norm_backward_params");
}

void(fp_norm_backward_params_default)(fp_norm_backward_params *p) {
    if (p) (void)fp_norm_backward_params_default_sized(p, NORM_BACKWARD_PARAMS_SIZE_FIRST);
}

/* ---- argument checks ---- */

static int dtype_ok(fp_dtype d) { return d == FP_F32 || d == FP_F16 || d == FP_BF16; }

static fp_status check_shape_and_kind(int64_t rows, int64_t cols, fp_norm_kind kind,
                                      fp_norm_activation act) {
    FP_CHECK_ARG(kind == FP_NORM_LAYERNORM || kind == FP_NORM_RMSNORM,
                 "argument 'params->kind' (%d) is not FP_NORM_LAYERNORM or FP_NORM_RMSNORM", (int)kind);
    FP_CHECK_ARG(act >= FP_NORM_ACT_NONE && act <= FP_NORM_ACT_SILU,
                 "argument 'params->activation' (%d) is not a fp_norm_activation", (int)act);
    FP_CHECK_ARG(rows >= 1, "argument 'params->rows' must be >= 1 (got %lld)", (long long)rows);
    FP_CHECK_ARG(cols >= 1, "argument 'params->cols' must be >= 1 (got %lld)", (long long)cols);
    return FP_OK;
}

/* Resolves a row stride (0 = cols) and checks it against cols and overflow. */
static fp_status resolve_stride(const char *name, int64_t stride, int64_t rows, int64_t cols,
                                int64_t *out) {
    if (stride == 0) stride = cols;
    FP_CHECK_ARG(stride >= cols, "argument 'params->%s' (%lld) is smaller than cols (%lld)", name,
                 (long long)stride, (long long)cols);
    FP_CHECK_ARG(stride <= (INT64_MAX / 8) / rows, "argument 'params->%s' (%lld) times rows overflows",
                 name, (long long)stride);
    *out = stride;
    return FP_OK;
}

/* Element alignment: every kernel path (even the scalar one) loads whole
 * elements. */
static fp_status check_aligned(const char *name, const void *p, size_t align) {
    FP_CHECK_ARG(((uintptr_t)p % align) == 0, "argument 'params->%s' (%p) is not aligned to %zu bytes", name, p,
                 align);
    return FP_OK;
}

/* Every pointer of a params struct that must be aligned to `align` (NULL
 * passes): the first misaligned one is named. */
typedef struct named_ptr {
    const char *name;
    const void *ptr;
} named_ptr;
static fp_status check_all_aligned(const named_ptr *v, size_t n, size_t align) {
    for (size_t i = 0; i < n; ++i) FP_TRY(check_aligned(v[i].name, v[i].ptr, align));
    return FP_OK;
}
#define FP_NORM_COUNT(a) (sizeof(a) / sizeof((a)[0]))

static fp_status check_dtype_match(const char *name, fp_dtype d, fp_dtype want) {
    FP_CHECK_ARG(dtype_ok(d), "argument 'params->%s' (%d) is not f32, f16 or bf16", name, (int)d);
    FP_CHECK_ARG(d == want, "argument 'params->%s' (%s) differs from the tensor dtype (%s): "
                 "mixed dtypes are not supported", name, fp_dtype_name(d), fp_dtype_name(want));
    return FP_OK;
}

fp_status fp_norm_check_fwd(const fp_norm_params *p, fp_norm_fwd_desc *d) {
    FP_CHECK_ARG(p != NULL, "argument 'params' is NULL");
    fp_norm_params full;
    FP_STRUCT_IN(&p, full, NORM_PARAMS_SIZE_FIRST, fp_norm_params_default, "fp_norm_params (params)");
    FP_TRY(check_shape_and_kind(p->rows, p->cols, p->kind, p->activation));
    FP_CHECK_ARG(dtype_ok(p->x_dtype), "argument 'params->x_dtype' (%d) is not f32, f16 or bf16",
                 (int)p->x_dtype);
    FP_TRY(check_dtype_match("residual_dtype", p->residual_dtype, p->x_dtype));
    FP_TRY(check_dtype_match("out_dtype", p->out_dtype, p->x_dtype));
    FP_TRY(check_dtype_match("param_dtype", p->param_dtype, p->x_dtype));
    FP_CHECK_ARG(p->x != NULL, "argument 'params->x' is NULL");
    FP_CHECK_ARG(p->out != NULL, "argument 'params->out' is NULL");
    FP_CHECK_ARG(isfinite(p->eps) && p->eps > 0.0f,
                 "argument 'params->eps' must be > 0 and finite (got %g)", (double)p->eps);
    const size_t es = fp_dtype_size(p->x_dtype);
    const named_ptr tensors[] = {{"x", p->x},       {"residual", p->residual}, {"gamma", p->gamma},
                                 {"beta", p->beta}, {"bias", p->bias},         {"out", p->out},
                                 {"residual_out", p->residual_out}};
    const named_ptr stats[] = {{"mean", p->mean}, {"rstd", p->rstd}};
    FP_TRY(check_all_aligned(tensors, FP_NORM_COUNT(tensors), es));
    FP_TRY(check_all_aligned(stats, FP_NORM_COUNT(stats), sizeof(float)));
    fp_norm_fwd_desc r;
    memset(&r, 0, sizeof r);
    FP_TRY(resolve_stride("x_stride", p->x_stride, p->rows, p->cols, &r.x_stride));
    FP_TRY(resolve_stride("residual_stride", p->residual_stride, p->rows, p->cols, &r.res_stride));
    FP_TRY(resolve_stride("residual_out_stride", p->residual_out_stride, p->rows, p->cols,
                          &r.res_out_stride));
    FP_TRY(resolve_stride("out_stride", p->out_stride, p->rows, p->cols, &r.out_stride));
    r.kind = (int)p->kind;
    r.act = (int)p->activation;
    r.dtype = (int)p->x_dtype;
    r.rows = p->rows;
    r.cols = p->cols;
    r.x = p->x;
    r.res = p->residual;
    r.gamma = p->gamma;
    r.beta = p->beta;
    r.bias = p->bias;
    r.res_out = p->residual_out;
    r.out = p->out;
    r.mean = p->kind == FP_NORM_LAYERNORM ? p->mean : NULL;
    r.rstd = p->rstd;
    r.eps = p->eps;
    *d = r;
    return FP_OK;
}

fp_status fp_norm_check_bwd(const fp_norm_backward_params *p, fp_norm_bwd_desc *d) {
    FP_CHECK_ARG(p != NULL, "argument 'params' is NULL");
    fp_norm_backward_params full;
    FP_STRUCT_IN(&p, full, NORM_BACKWARD_PARAMS_SIZE_FIRST, fp_norm_backward_params_default,
                 "fp_norm_backward_params (params)");
    FP_TRY(check_shape_and_kind(p->rows, p->cols, p->kind, p->activation));
    FP_CHECK_ARG(dtype_ok(p->dtype), "argument 'params->dtype' (%d) is not f32, f16 or bf16", (int)p->dtype);
    FP_TRY(check_dtype_match("param_dtype", p->param_dtype, p->dtype));
    FP_CHECK_ARG(p->dout != NULL, "argument 'params->dout' is NULL");
    FP_CHECK_ARG(p->x != NULL, "argument 'params->x' is NULL");
    FP_CHECK_ARG(p->rstd != NULL, "argument 'params->rstd' is NULL");
    FP_CHECK_ARG(p->kind != FP_NORM_LAYERNORM || p->mean != NULL,
                 "argument 'params->mean' is NULL (required for LayerNorm)");
    FP_CHECK_ARG(p->dx != NULL, "argument 'params->dx' is NULL");
    const size_t es = fp_dtype_size(p->dtype);
    const named_ptr tensors[] = {{"dout", p->dout},   {"x", p->x},   {"gamma", p->gamma},
                                 {"beta", p->beta},   {"bias", p->bias}, {"dresidual_out", p->dresidual_out},
                                 {"dx", p->dx},       {"dgamma", p->dgamma}, {"dbeta", p->dbeta},
                                 {"dbias", p->dbias}};
    const named_ptr stats[] = {{"mean", p->mean}, {"rstd", p->rstd}};
    FP_TRY(check_all_aligned(tensors, FP_NORM_COUNT(tensors), es));
    FP_TRY(check_all_aligned(stats, FP_NORM_COUNT(stats), sizeof(float)));
    fp_norm_bwd_desc r;
    memset(&r, 0, sizeof r);
    FP_TRY(resolve_stride("dout_stride", p->dout_stride, p->rows, p->cols, &r.dout_stride));
    FP_TRY(resolve_stride("x_stride", p->x_stride, p->rows, p->cols, &r.x_stride));
    FP_TRY(resolve_stride("dresidual_out_stride", p->dresidual_out_stride, p->rows, p->cols,
                          &r.dres_stride));
    FP_TRY(resolve_stride("dx_stride", p->dx_stride, p->rows, p->cols, &r.dx_stride));
    r.kind = (int)p->kind;
    r.act = (int)p->activation;
    r.dtype = (int)p->dtype;
    r.rows = p->rows;
    r.cols = p->cols;
    r.dout = p->dout;
    r.x = p->x;
    r.gamma = p->gamma;
    r.beta = p->beta;
    r.bias = p->bias;
    r.mean = p->kind == FP_NORM_LAYERNORM ? p->mean : NULL;
    r.rstd = p->rstd;
    r.dres = p->dresidual_out;
    r.dx = p->dx;
    r.dgamma = p->dgamma;
    r.dbeta = p->dbeta;
    r.dbias = p->dbias;
    *d = r;
    return FP_OK;
}

/* ---- bytes (roofline) ---- */

static double fwd_bytes(const fp_norm_fwd_desc *d) {
    double es = (double)fp_dtype_size((fp_dtype)d->dtype), n = (double)d->rows * (double)d->cols;
    double tensors = 2.0 + (d->res ? 1.0 : 0.0) + (d->res_out ? 1.0 : 0.0);
    double vecs = (d->gamma ? 1.0 : 0.0) + (d->beta ? 1.0 : 0.0) + (d->bias ? 1.0 : 0.0);
    double stats = (d->mean ? 4.0 : 0.0) + (d->rstd ? 4.0 : 0.0);
    return tensors * n * es + vecs * (double)d->cols * es + stats * (double)d->rows;
}

double fp_norm_forward_bytes(const fp_norm_params *params) {
    fp_norm_fwd_desc d;
    if (fp_norm_check_fwd(params, &d) != FP_OK) {
        return 0.0;
    }
    return fwd_bytes(&d);
}

static double bwd_bytes(const fp_norm_bwd_desc *d) {
    double es = (double)fp_dtype_size((fp_dtype)d->dtype), n = (double)d->rows * (double)d->cols;
    double tensors = 3.0 + (d->dres ? 1.0 : 0.0);
    double vecs = (d->gamma ? 1.0 : 0.0) + (d->beta ? 1.0 : 0.0) + (d->bias ? 1.0 : 0.0) +
                  (d->dgamma ? 1.0 : 0.0) + (d->dbeta ? 1.0 : 0.0) + (d->dbias ? 1.0 : 0.0);
    double stats = (d->mean ? 4.0 : 0.0) + 4.0;
    return tensors * n * es + vecs * (double)d->cols * es + stats * (double)d->rows;
}

double fp_norm_backward_bytes(const fp_norm_backward_params *params) {
    fp_norm_bwd_desc d;
    if (fp_norm_check_bwd(params, &d) != FP_OK) {
        return 0.0;
    }
    return bwd_bytes(&d);
}

/* ---- dispatch ---- */

static fp_status launch_status(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return FP_OK;
    return fp_cuda_status(err, what, __FILE__, __LINE__);
}

/* version: the fused kernel version (0 = automatic; see norm_fwd.cu). */
static fp_status fwd_run(fp_context *ctx, fp_stream stream, const fp_norm_fwd_desc *d, int unfused, int version) {
    if (ctx->kind == FP_DEVICE_CPU)
        return unfused ? fp_norm_fwd_cpu_unfused(ctx->pool, d) : fp_norm_fwd_cpu(ctx->pool, d);
    FP_TRY(fp_ctx_activate(ctx));
    cudaStream_t s = fp_ctx_stream(ctx, stream);
    fp_norm_fwd_desc dd = *d;
    dd.sm_count = ctx->info.sm_count;
    dd.pdl = ctx->launch_pdl;
    if (unfused) return launch_status(fp_norm_fwd_unfused_launch(&dd, s), "fp_norm_fwd_unfused_launch");
    return launch_status(fp_norm_fwd_launch(&dd, version, s), "fp_norm_fwd_launch");
}

/* The ops: one span (trace.h) around the launch, begun after the arguments
 * were checked: "norm_fwd", and "norm_fwd_unfused" for validate's baseline,
 * both with the op's required bytes (the roofline's). */
static fp_status fwd_op(fp_context *ctx, fp_stream stream, const fp_norm_fwd_desc *d, int unfused, int version) {
    fp_norm_fwd_desc kd = *d; /* with the span's stamp (its kernels time it under the kernel timer) */
    const uint64_t span = fp_ctx_trace_begin_stamped(ctx, stream, unfused ? "norm_fwd_unfused" : "norm_fwd", "op",
                                                     fwd_bytes(d), 0, &kd.stamp);
    const fp_status st = fwd_run(ctx, stream, &kd, unfused, version);
    fp_ctx_trace_end(ctx, span);
    return st;
}

fp_status fp_norm_forward(fp_context *ctx, fp_stream stream, const fp_norm_params *params) {
    FP_TRY(fp_ctx_check(ctx, -1));
    fp_norm_fwd_desc d;
    FP_TRY(fp_norm_check_fwd(params, &d));
    return fwd_op(ctx, stream, &d, 0, 0);
}

fp_status fp_norm_forward_version(fp_context *ctx, fp_stream stream, const fp_norm_params *params, int version) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_ARG(version >= 0 && (version & FP_NORM_VERSION_MASK) <= 4 &&
                     !(version & ~(FP_NORM_VERSION_MASK | FP_NORM_VOPT_FWD_ALL)),
                 "argument 'version' (%d) is not 0, 1, 2, 3 or 4 (with FP_NORM_VOPT_* bits)", version);
    fp_norm_fwd_desc d;
    FP_TRY(fp_norm_check_fwd(params, &d));
    return fwd_op(ctx, stream, &d, 0, version);
}

/* version: the fused kernel version (0 = automatic; see norm_launch.h). The
 * unfused baseline always runs version 2's norm backward. */
static fp_status bwd_run(fp_context *ctx, fp_stream stream, const fp_norm_bwd_desc *d, int unfused, int version) {
    if (ctx->kind == FP_DEVICE_CPU)
        return unfused ? fp_norm_bwd_cpu_unfused(ctx->pool, d) : fp_norm_bwd_cpu(ctx->pool, d);
    FP_TRY(fp_ctx_activate(ctx));
    cudaStream_t s = fp_ctx_stream(ctx, stream);
    const int sm_count = ctx->info.sm_count;
    const size_t nfloat = fp_norm_bwd_partial_floats(d, unfused ? 2 : version, sm_count);
    /* the dgamma/dbeta partial sums: in the stream's workspace (no
     * allocation once warmed up; capturable), with the stream's arrival
     * counters for the fused reduce (FP_NORM_VOPT_FUSED_REDUCE: kernels/norm/
     * norm_bwd.cu, fused_reduce) */
    fp_scratch w;
    const size_t ncounters = !unfused && nfloat ? 2 : 0;
    FP_TRY(fp_ctx_scratch_get_counted(ctx, s, nfloat * sizeof(float), ncounters,
                                      "norm backward (dgamma/dbeta partial sums)", &w));
    float *partial = w.ptr;
    fp_norm_bwd_desc kd = *d;
    kd.counters = w.counters;
    fp_status st = unfused ? launch_status(fp_norm_bwd_unfused_launch(d, partial, s), "fp_norm_bwd_unfused_launch")
                           : launch_status(fp_norm_bwd_launch(&kd, version, sm_count, partial, s),
                                           "fp_norm_bwd_launch");
    const fp_status put = fp_ctx_scratch_put(&w);
    return st != FP_OK ? st : put;
}

static fp_status bwd_op(fp_context *ctx, fp_stream stream, const fp_norm_bwd_desc *d, int unfused, int version) {
    fp_norm_bwd_desc kd = *d; /* with the span's stamp (its kernels time it under the kernel timer) */
    const uint64_t span = fp_ctx_trace_begin_stamped(ctx, stream, unfused ? "norm_bwd_unfused" : "norm_bwd", "op",
                                                     bwd_bytes(d), 0, &kd.stamp);
    const fp_status st = bwd_run(ctx, stream, &kd, unfused, version);
    fp_ctx_trace_end(ctx, span);
    return st;
}

fp_status fp_norm_backward(fp_context *ctx, fp_stream stream, const fp_norm_backward_params *params) {
    FP_TRY(fp_ctx_check(ctx, -1));
    fp_norm_bwd_desc d;
    FP_TRY(fp_norm_check_bwd(params, &d));
    return bwd_op(ctx, stream, &d, 0, 0);
}

fp_status fp_norm_backward_version(fp_context *ctx, fp_stream stream, const fp_norm_backward_params *params,
                                   int version) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_ARG(version >= 0 && (version & FP_NORM_VERSION_MASK) <= 4 &&
                     !(version & ~(FP_NORM_VERSION_MASK | FP_NORM_VOPT_BWD_ALL)),
                 "argument 'version' (%d) is not 0, 1, 2, 3 or 4 (with FP_NORM_VOPT_* bits)", version);
    fp_norm_bwd_desc d;
    FP_TRY(fp_norm_check_bwd(params, &d));
    return bwd_op(ctx, stream, &d, 0, version);
}

int fp_norm_backward_version_used(const fp_norm_backward_params *params, int version) {
    fp_norm_bwd_desc d;
    if (fp_norm_check_bwd(params, &d) != FP_OK) {
        return 0;
    }
    return fp_norm_bwd_version_used(&d, version);
}

/* ---- validate ---- */

typedef struct fwd_job {
    fp_context *ctx;
    fp_norm_fwd_desc d;
    int unfused;
} fwd_job;

static fp_status fwd_job_run(void *user, fp_stream stream) {
    fwd_job *j = user;
    return fwd_op(j->ctx, stream, &j->d, j->unfused, 0);
}

fp_status fp_norm_validate(fp_context *ctx, fp_stream stream, const fp_norm_params *params,
                           const fp_timing_config *cfg, fp_ab_report *report) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(report);
    /* out may be NULL here: validate writes only its own scratch. */
    fp_norm_params p;
    FP_CHECK_NOT_NULL(params);
    p = *params;
    static float dummy_out;
    if (!p.out) p.out = &dummy_out;
    fp_norm_fwd_desc d;
    FP_TRY(fp_norm_check_fwd(&p, &d));

    /* Dense scratch outputs for each side: [out | res_out] and [mean | rstd]. */
    /* Every piece 256-byte aligned, as fp_mem_alloc gives the user's buffers:
     * an unaligned scratch pointer would send the fused op down the scalar
     * path and misreport its speed. */
    size_t es = fp_dtype_size((fp_dtype)d.dtype), n = (size_t)d.rows * (size_t)d.cols;
    size_t tensor_bytes = (n * es + 255) & ~(size_t)255;
    size_t stat_bytes = ((size_t)d.rows * sizeof(float) + 255) & ~(size_t)255;
    size_t side_bytes = tensor_bytes * (d.res_out ? 2 : 1) + 2 * stat_bytes;
    void *buf[2] = {NULL, NULL};
    fp_status st = fp_mem_alloc(ctx, side_bytes, &buf[0]);
    if (st == FP_OK) st = fp_mem_alloc(ctx, side_bytes, &buf[1]);
    fwd_job job[2];
    for (int k = 0; k < 2 && st == FP_OK; ++k) {
        char *b = buf[k];
        job[k].ctx = ctx;
        job[k].unfused = k == 0;
        job[k].d = d;
        job[k].d.out = b;
        job[k].d.out_stride = d.cols;
        size_t off = tensor_bytes;
        if (d.res_out) {
            job[k].d.res_out = b + off;
            job[k].d.res_out_stride = d.cols;
            off += tensor_bytes;
        }
        if (d.mean) job[k].d.mean = (float *)(b + off);
        if (d.rstd) job[k].d.rstd = (float *)(b + off + stat_bytes);
        /* Poison so an element a side fails to write shows as a mismatch. */
        st = fp_mem_fill(ctx, b, 0xFF, side_bytes, stream);
    }
    if (st == FP_OK) {
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = fwd_job_run;
        spec.baseline_user = &job[0];
        spec.optimized = fwd_job_run;
        spec.optimized_user = &job[1];
        spec.baseline_out = job[0].d.out;
        spec.optimized_out = job[1].d.out;
        spec.out_count = n;
        spec.out_dtype = (fp_dtype)d.dtype;
        /* The baseline rounds each intermediate to the dtype: for f16/bf16
         * that is up to three extra roundings, so twice the default. */
        if (d.dtype != FP_F32) {
            fp_default_tolerance((fp_dtype)d.dtype, &spec.atol, &spec.rtol);
            spec.atol *= 2.0;
            spec.rtol *= 2.0;
        }
        spec.bytes = fwd_bytes(&d);
        st = fp_ab_run(ctx, stream, &spec, cfg, report);
    }
    if (buf[0] || buf[1]) {
        fp_context_synchronize(ctx, stream);
        fp_mem_free(ctx, buf[0]);
        fp_mem_free(ctx, buf[1]);
    }
    return st;
}

typedef struct bwd_job {
    fp_context *ctx;
    fp_norm_bwd_desc d;
    int unfused;
} bwd_job;

static fp_status bwd_job_run(void *user, fp_stream stream) {
    bwd_job *j = user;
    return bwd_op(j->ctx, stream, &j->d, j->unfused, 0);
}

fp_status fp_norm_backward_validate(fp_context *ctx, fp_stream stream, const fp_norm_backward_params *params,
                                    const fp_timing_config *cfg, fp_ab_report *report) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(report);
    FP_CHECK_NOT_NULL(params);
    fp_norm_backward_params p = *params;
    static float dummy_dx;
    if (!p.dx) p.dx = &dummy_dx;
    fp_norm_bwd_desc d;
    FP_TRY(fp_norm_check_bwd(&p, &d));

    /* Dense scratch for each side: [dx | dgamma | dbeta | dbias]. */
    size_t es = fp_dtype_size((fp_dtype)d.dtype), n = (size_t)d.rows * (size_t)d.cols;
    size_t tensor_bytes = (n * es + 255) & ~(size_t)255, vec_bytes = ((size_t)d.cols * es + 255) & ~(size_t)255;
    size_t side_bytes = tensor_bytes + 3 * vec_bytes;
    void *buf[2] = {NULL, NULL};
    fp_status st = fp_mem_alloc(ctx, side_bytes, &buf[0]);
    if (st == FP_OK) st = fp_mem_alloc(ctx, side_bytes, &buf[1]);
    bwd_job job[2];
    for (int k = 0; k < 2 && st == FP_OK; ++k) {
        char *b = buf[k];
        job[k].ctx = ctx;
        job[k].unfused = k == 0;
        job[k].d = d;
        job[k].d.dx = b;
        job[k].d.dx_stride = d.cols;
        if (d.dgamma) job[k].d.dgamma = b + tensor_bytes;
        if (d.dbeta) job[k].d.dbeta = b + tensor_bytes + vec_bytes;
        if (d.dbias) job[k].d.dbias = b + tensor_bytes + 2 * vec_bytes;
        st = fp_mem_fill(ctx, b, 0xFF, side_bytes, stream);
    }
    if (st == FP_OK) {
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = bwd_job_run;
        spec.baseline_user = &job[0];
        spec.optimized = bwd_job_run;
        spec.optimized_user = &job[1];
        spec.baseline_out = job[0].d.dx;
        spec.optimized_out = job[1].d.dx;
        spec.out_count = n;
        spec.out_dtype = (fp_dtype)d.dtype;
        /* The baseline rounds g = dout * act'(y) to the dtype before the
         * norm backward: twice the default tolerance for f16/bf16. */
        fp_default_tolerance((fp_dtype)d.dtype, &spec.atol, &spec.rtol);
        spec.atol *= 2.0;
        spec.rtol *= 2.0;
        spec.bytes = fp_norm_backward_bytes(&p);
        st = fp_ab_run(ctx, stream, &spec, cfg, report);
    }
    if (buf[0] || buf[1]) {
        fp_context_synchronize(ctx, stream);
        fp_mem_free(ctx, buf[0]);
        fp_mem_free(ctx, buf[1]);
    }
    return st;
}
