/* norm/... scenarios: the fused LayerNorm / RMSNorm (+ residual, bias,
 * activation) against the same math as separate unfused passes, through
 * fp_norm_validate / fp_norm_backward_validate (timing, agreement, roofline
 * from the bytes the fused op must move).
 *
 *   norm/layernorm_fwd   LayerNorm forward: "plain" (gamma, beta, stats) and
 *                        "fused" (residual + residual_out + gamma, beta, bias
 *                        + GELU tanh, stats)
 *   norm/rmsnorm_fwd     RMSNorm forward: "plain" (gamma, rstd) and "fused"
 *                        (residual + residual_out + gamma + bias + SiLU)
 *   norm/layernorm_bwd   LayerNorm backward: "plain" (dx, dgamma, dbeta) and
 *                        "fused" (through GELU tanh and bias, + dresidual_out)
 *   norm/rmsnorm_bwd     the same for RMSNorm (SiLU)
 *   norm/fwd_versions    forward kernel versions (CUDA only): v1 (scalar, three
 *                        passes over the row) as the baseline vs the automatic
 *                        choice, on rows past v2's registers where that is v3
 *                        (the row staged in shared memory): 2048x18432 and
 *                        1024x32768. Rows: "fused" (residual + LayerNorm +
 *                        bias + GELU with residual_out), "rmsnorm_fused"
 *                        (residual + RMSNorm + bias + SiLU), "plain"
 *                        (LayerNorm, gamma, beta, stats). --baseline B
 *                        --optimized O pick other versions (0 automatic,
 *                        1-4); with v2 or v4 on either side the shapes are
 *                        v2's (16384x4096, 4096x768, 8192x8192, 1000x5120,
 *                        16384x1024); --v4_params 1 adds
 *                        FP_NORM_VOPT_V4_PARAMS to the optimized side (v4
 *                        keeps gamma / beta / bias in registers). Default
 *                        dtype bf16.
 *   norm/bwd_versions    backward kernel versions (CUDA only): v2 (dx kernel
 *                        + a separate dgamma/dbeta pass re-reading dout and x)
 *                        as the baseline vs v3 (one pass), dx compared by the
 *                        timing engine and dgamma/dbeta compared after it;
 *                        "layernorm" (dgamma, dbeta) and "rmsnorm_fused"
 *                        (SiLU + dresidual_out, dgamma). Default dtype bf16.
 *                        Rows where v3 does not apply (odd cols, cols > 16384)
 *                        run v2 on both sides (param v3=0). Adds 2048x16384
 *                        (v3 with the row staged in shared memory).
 *                        --baseline B --optimized O pick other versions
 *                        (1-4; e.g. 3 and 4: v3 against v3 with the prefetch
 *                        ring); params base_ran / opt_ran say which ran.
 *                        --fused_reduce 1 adds FP_NORM_VOPT_FUSED_REDUCE to
 *                        the optimized side (v3 / v4 sum the dgamma / dbeta
 *                        partial rows in their last CTAs instead of a reduce
 *                        kernel after them; e.g. --baseline 4 --optimized 4
 *                        --fused_reduce 1): dgamma / dbeta then compare
 *                        exactly (param fused_reduce).
 *   norm/kernel_ab       the kernels' forms against each other (GELU tanh /
 *                        SiLU by tanhf / expf or the fast forms, LayerNorm's
 *                        statistics through two reductions or one), on the
 *                        same inputs, interleaved, outputs compared:
 *                        variants layernorm_fwd_fused,
 *                        layernorm_fwd_fused_two, layernorm_fwd_plain,
 *                        rmsnorm_fwd_fused, layernorm_bwd_fused,
 *                        rmsnorm_bwd_fused (CUDA only; 16384x4096, 4096x768,
 *                        8192x8192; bf16 unless --dtype).
 *
 * Shapes (GPU): 4096x768, 16384x4096, 8192x8192, 2048x12288, 1000x5120,
 * 333x1537, 2048x18432; --rows R --cols C for one shape. With --quick and on CPU
 * contexts: 256x768 and 333x1537. dtypes: bf16, f16, f32 (--dtype to pick;
 * CPU default bf16 only). Each row also reports the fused op's bandwidth
 * as a fraction of the measured copy bandwidth (device-to-device on a GPU,
 * memcpy on 64 MiB on a CPU; metric pct_of_copy, the target figure).
 */
#include <stdlib.h>
#include <string.h>

#include "fastpath/norm.h"
/* fp_norm_backward_version (static link). fastbench's include path has no
 * kernels/, hence the relative path. */
#include "internal.h"
#include "norm/norm_launch.h"
#include "norm/norm_internal.h" /* fp_norm_check_bwd: the desc the launchers take */
#include "scenario.h"

/* The six, and 2048x18432 (a hidden size past v2's registers: the
 * forward's v3 stages the row in shared memory, the backward runs dx v1). */
static const int64_t k_gpu_shapes[][2] = {{4096, 768},  {16384, 4096}, {8192, 8192}, {2048, 12288},
                                          {1000, 5120}, {333, 1537},   {2048, 18432}};
static const int64_t k_small_shapes[][2] = {{256, 768}, {333, 1537}};
/* norm/bwd_versions adds the row length v3 takes with the row staged in
 * shared memory (12288 < cols <= 16384). */
static const int64_t k_gpu_shapes_bwd_versions[][2] = {{4096, 768},  {16384, 4096}, {8192, 8192}, {2048, 12288},
                                                       {2048, 16384}, {1000, 5120},  {333, 1537}};

/* Copy bandwidth (GB/s, read + write), or 0: the practical roofline the
 * fused kernels are judged against. Device-to-device on 512 MiB; on a CPU
 * context memcpy on 64 MiB (past the last-level cache). */
static double measure_copy_gbps(fb_run *run) {
    double gbps = 0.0;
    const size_t bytes = fb_kind(run) == FP_DEVICE_CUDA ? (size_t)512 << 20 : (size_t)64 << 20;
    if (fp_measure_copy_bandwidth(fb_ctx(run), bytes, &gbps) != FP_OK) gbps = 0.0;
    fp_clear_error();
    return gbps;
}

/* Forward params (defaults otherwise): kind, shape, every dtype dt, x. */
static void fwd_params(fp_norm_kind kind, int64_t rows, int64_t cols, fp_dtype dt, const void *x, fp_norm_params *p) {
    fp_norm_params_default(p);
    p->kind = kind;
    p->rows = rows;
    p->cols = cols;
    p->x_dtype = p->residual_dtype = p->out_dtype = p->param_dtype = dt;
    p->x = x;
}

/* mean / rstd of x as the forward saves them (the backward's inputs);
 * out is scratch of x's size, stats [2 * rows] f32 (mean, then rstd). */
static fp_status forward_stats(fp_context *ctx, fp_norm_kind kind, int64_t rows, int64_t cols, fp_dtype dt,
                               const void *x, void *out, float *stats) {
    fp_norm_params fp;
    fwd_params(kind, rows, cols, dt, x, &fp);
    fp.out = out;
    fp.mean = stats;
    fp.rstd = stats + rows;
    return fp_norm_forward(ctx, NULL, &fp);
}

typedef struct shape_list {
    int64_t (*shapes)[2];
    int n;
    int64_t one[1][2];
} shape_list;

static void pick_shapes(fb_run *run, shape_list *sl) {
    int small = fb_quick(run) || fb_kind(run) == FP_DEVICE_CPU;
    if (fb_opt_given(run, "rows") || fb_opt_given(run, "cols")) {
        sl->one[0][0] = fb_opt_int(run, "rows", 4096);
        sl->one[0][1] = fb_opt_int(run, "cols", 4096);
        sl->shapes = sl->one;
        sl->n = 1;
    } else if (small) {
        sl->shapes = (int64_t(*)[2])k_small_shapes;
        sl->n = (int)(sizeof k_small_shapes / sizeof k_small_shapes[0]);
    } else {
        sl->shapes = (int64_t(*)[2])k_gpu_shapes;
        sl->n = (int)(sizeof k_gpu_shapes / sizeof k_gpu_shapes[0]);
    }
}

static int pick_dtypes(fb_run *run, fp_dtype *dts) {
    int n = fb_dtypes(run, dts, 3);
    if (n > 0) return n;
    dts[0] = FP_BF16;
    dts[1] = FP_F16;
    dts[2] = FP_F32;
    return fb_kind(run) == FP_DEVICE_CPU ? 1 : 3;
}

static void report(fb_result *r, fp_status st, const fp_ab_report *rep, double copy_gbps) {
    if (st != FP_OK) {
        fb_result_fail(r, st, fp_last_error());
        return;
    }
    fb_result_set_ab(r, rep);
    if (copy_gbps > 0.0) fb_result_metric(r, "pct_of_copy", 100.0 * rep->achieved_gbps / copy_gbps);
    fb_result_metric(r, "baseline_gbps",
                     rep->baseline.median_ms > 0 ? rep->achieved_gbps * rep->optimized.median_ms /
                                                       rep->baseline.median_ms
                                                 : 0.0);
}

/* A new result row with the parameters every norm scenario reports. */
static fb_result *new_row(fb_run *run, int64_t rows, int64_t cols, fp_dtype dt, const char *variant) {
    fb_result *r = fb_result_new(run);
    fb_param_int(r, "rows", rows);
    fb_param_int(r, "cols", cols);
    fb_param_str(r, "dtype", fp_dtype_name(dt));
    fb_param_str(r, "variant", variant);
    return r;
}

/* The device inputs of a backward on rows x cols of dt: random x, dout,
 * dresidual_out (only when with_dres), gamma and beta (seeds seed ..
 * seed + 4), stats [2 * rows] f32 (mean, then rstd) and scratch tmp of
 * x's size; any not allocated stays NULL. */
typedef struct bwd_bufs {
    void *x, *dy, *dres, *g, *b, *stats, *tmp;
} bwd_bufs;

static fp_status bwd_bufs_alloc(fp_context *ctx, int64_t rows, int64_t cols, fp_dtype dt, uint64_t seed,
                                int with_dres, bwd_bufs *bb) {
    const size_t n = (size_t)rows * (size_t)cols, es = fp_dtype_size(dt);
    memset(bb, 0, sizeof *bb);
    fp_status st = fb_alloc_random(ctx, n, dt, seed, -2.0f, 3.0f, &bb->x);
    if (st == FP_OK) st = fb_alloc_random(ctx, n, dt, seed + 1, -1.0f, 1.0f, &bb->dy);
    if (st == FP_OK && with_dres) st = fb_alloc_random(ctx, n, dt, seed + 2, -1.0f, 1.0f, &bb->dres);
    if (st == FP_OK) st = fb_alloc_random(ctx, (size_t)cols, dt, seed + 3, 0.5f, 1.5f, &bb->g);
    if (st == FP_OK) st = fb_alloc_random(ctx, (size_t)cols, dt, seed + 4, -0.5f, 0.5f, &bb->b);
    if (st == FP_OK) st = fp_mem_alloc(ctx, 2 * (size_t)rows * sizeof(float), &bb->stats);
    if (st == FP_OK) st = fp_mem_alloc(ctx, n * es, &bb->tmp);
    return st;
}

/* Backward params (defaults otherwise) over bb: kind, shape, dtype, dout, x,
 * gamma, mean and rstd. */
static void bwd_bufs_params(const bwd_bufs *bb, fp_norm_kind kind, int64_t rows, int64_t cols, fp_dtype dt,
                            fp_norm_backward_params *p) {
    fp_norm_backward_params_default(p);
    p->kind = kind;
    p->rows = rows;
    p->cols = cols;
    p->dtype = p->param_dtype = dt;
    p->dout = bb->dy;
    p->x = bb->x;
    p->gamma = bb->g;
    p->mean = (float *)bb->stats;
    p->rstd = (float *)bb->stats + rows;
}

static void bwd_bufs_free(fp_context *ctx, bwd_bufs *bb) {
    void *ptrs[] = {bb->x, bb->dy, bb->dres, bb->g, bb->b, bb->stats, bb->tmp};
    for (int k = 0; k < 7; ++k) fp_mem_free(ctx, ptrs[k]);
}

/* One row of a forward or backward sweep: runs and reports into r. */
typedef void (*sweep_cell)(fb_run *run, fb_result *r, fp_norm_kind kind, int64_t rows, int64_t cols, fp_dtype dt,
                           int fused, double copy_gbps);

/* Per shape and dtype, the plain and the fused variant: a row each. */
static fp_status run_sweep(fb_run *run, fp_norm_kind kind, sweep_cell cell) {
    shape_list sl;
    pick_shapes(run, &sl);
    fp_dtype dts[3];
    int ndt = pick_dtypes(run, dts);
    double copy_gbps = measure_copy_gbps(run);
    for (int si = 0; si < sl.n; ++si)
        for (int di = 0; di < ndt; ++di)
            for (int fused = 0; fused < 2; ++fused) {
                const int64_t rows = sl.shapes[si][0], cols = sl.shapes[si][1];
                const fp_dtype dt = dts[di];
                fb_result *r = new_row(run, rows, cols, dt, fused ? "fused" : "plain");
                cell(run, r, kind, rows, cols, dt, fused, copy_gbps);
                fb_rows_done(run);
            }
    return FP_OK;
}

/* ---- forward ---- */

/* fp_norm_validate: unfused passes vs the fused forward (fused adds residual,
 * bias and the activation). */
static void fwd_cell(fb_run *run, fb_result *r, fp_norm_kind kind, int64_t rows, int64_t cols, fp_dtype dt,
                     int fused, double copy_gbps) {
    fp_context *ctx = fb_ctx(run);
    const size_t n = (size_t)rows * (size_t)cols;
    void *x = NULL, *res = NULL, *g = NULL, *b = NULL, *bias = NULL, *stats = NULL;
    fp_status st = fb_alloc_random(ctx, n, dt, 1, -2.0f, 3.0f, &x);
    if (st == FP_OK && fused) st = fb_alloc_random(ctx, n, dt, 2, -1.0f, 1.0f, &res);
    if (st == FP_OK) st = fb_alloc_random(ctx, (size_t)cols, dt, 3, 0.5f, 1.5f, &g);
    if (st == FP_OK) st = fb_alloc_random(ctx, (size_t)cols, dt, 4, -0.5f, 0.5f, &b);
    if (st == FP_OK && fused) st = fb_alloc_random(ctx, (size_t)cols, dt, 5, -0.2f, 0.2f, &bias);
    if (st == FP_OK) st = fp_mem_alloc(ctx, 2 * (size_t)rows * sizeof(float), &stats);
    fp_ab_report rep;
    if (st == FP_OK) {
        fp_norm_params p;
        fwd_params(kind, rows, cols, dt, x, &p);
        p.gamma = g;
        p.beta = kind == FP_NORM_LAYERNORM ? b : NULL;
        p.mean = kind == FP_NORM_LAYERNORM ? (float *)stats : NULL;
        p.rstd = (float *)stats + rows;
        if (fused) {
            p.residual = res;
            p.residual_out = x; /* selects the fused write; validate uses scratch */
            p.bias = bias;
            p.activation = kind == FP_NORM_LAYERNORM ? FP_NORM_ACT_GELU_TANH : FP_NORM_ACT_SILU;
        }
        st = fp_norm_validate(ctx, NULL, &p, fb_timing(run), &rep);
    }
    report(r, st, &rep, copy_gbps);
    void *ptrs[] = {x, res, g, b, bias, stats};
    for (int k = 0; k < 6; ++k) fp_mem_free(ctx, ptrs[k]);
}

/* ---- backward ---- */

/* fp_norm_backward_validate: unfused vs fused backward (fused adds the
 * activation, bias and dresidual_out). */
static void bwd_cell(fb_run *run, fb_result *r, fp_norm_kind kind, int64_t rows, int64_t cols, fp_dtype dt,
                     int fused, double copy_gbps) {
    fp_context *ctx = fb_ctx(run);
    bwd_bufs bb;
    fp_status st = bwd_bufs_alloc(ctx, rows, cols, dt, 11, fused, &bb);
    if (st == FP_OK) st = forward_stats(ctx, kind, rows, cols, dt, bb.x, bb.tmp, (float *)bb.stats);
    fp_ab_report rep;
    if (st == FP_OK) {
        fp_norm_backward_params p;
        bwd_bufs_params(&bb, kind, rows, cols, dt, &p);
        p.dgamma = bb.g; /* non-NULL selects dgamma/dbeta; validate writes scratch only */
        p.dbeta = kind == FP_NORM_LAYERNORM ? bb.b : NULL;
        if (fused) {
            p.activation = kind == FP_NORM_LAYERNORM ? FP_NORM_ACT_GELU_TANH : FP_NORM_ACT_SILU;
            p.beta = kind == FP_NORM_LAYERNORM ? bb.b : NULL;
            p.bias = bb.b;
            p.dresidual_out = bb.dres;
        }
        st = fp_norm_backward_validate(ctx, NULL, &p, fb_timing(run), &rep);
    }
    report(r, st, &rep, copy_gbps);
    bwd_bufs_free(ctx, &bb);
}

/* ---- kernel version sweeps ---- */

/* The shapes and dtypes of a version sweep: the scenario's own GPU shapes
 * (gpu_shapes) where pick_shapes would take the default list, bf16 unless
 * --dtype; returns the dtype count. */
static int versions_setup(fb_run *run, const int64_t (*gpu_shapes)[2], int n_gpu, shape_list *sl, fp_dtype *dts) {
    pick_shapes(run, sl);
    if (sl->shapes == (int64_t(*)[2])k_gpu_shapes) {
        sl->shapes = (int64_t(*)[2])gpu_shapes;
        sl->n = n_gpu;
    }
    int ndt = fb_dtypes(run, dts, 3);
    if (ndt == 0) {
        dts[0] = FP_BF16;
        ndt = 1;
    }
    return ndt;
}

/* One job function on two users, baseline then optimized, interleaved by
 * the timing engine; their outputs (n elements of dt) compared. */
static fp_status ab_jobs(fb_run *run, fp_timed_fn fn, void *base, void *opt, void *base_out, void *opt_out, size_t n,
                         fp_dtype dt, double bytes, fp_ab_report *rep) {
    fp_ab_spec spec;
    fp_ab_spec_init(&spec);
    spec.baseline = fn;
    spec.baseline_user = base;
    spec.optimized = fn;
    spec.optimized_user = opt;
    spec.baseline_out = base_out;
    spec.optimized_out = opt_out;
    spec.out_count = n;
    spec.out_dtype = dt;
    spec.bytes = bytes;
    return fp_ab_run(fb_ctx(run), NULL, &spec, fb_timing(run), rep);
}

/* ---- forward kernel versions: v1 vs the automatic choice ---- */

typedef struct fwd_version_job {
    fp_context *ctx;
    fp_norm_params p;
    int version;
} fwd_version_job;

static fp_status fwd_version_job_run(void *user, fp_stream stream) {
    fwd_version_job *j = user;
    return fp_norm_forward_version(j->ctx, stream, &j->p, j->version);
}

/* Rows past v2's registers, where the automatic choice is v3 (the row staged
 * in shared memory) and v1 ran before it: 2048x18432, 1024x32768. */
static const int64_t k_gpu_shapes_fwd_versions[][2] = {{2048, 18432}, {1024, 32768}};
/* v2's rows, for a sweep of v2 against v4 (--baseline 2 --optimized 4): a
 * block per row of 256 (16-bit) / 512 threads, 16384 rows (the issue's
 * shape); a warp per row; NV 4 (16-bit 8192); a partial last warp
 * (5120); 1024 cols at 16384 rows (a warp per row, many rows). */
static const int64_t k_gpu_shapes_fwd_v4[][2] = {{16384, 4096}, {4096, 768}, {8192, 8192}, {1000, 5120}, {16384, 1024}};

static fp_status run_fwd_versions(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "CUDA only: compares CUDA kernel versions");
    const int64_t base_v = fb_opt_int(run, "baseline", 1), opt_v = fb_opt_int(run, "optimized", 0);
    const int64_t v4_params = fb_opt_int(run, "v4_params", 0);
    if (base_v < 0 || base_v > 4 || opt_v < 0 || opt_v > 4 || v4_params < 0 || v4_params > 1)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "--baseline and --optimized take a forward version 0-4 (0: automatic), --v4_params 0 "
                            "or 1 (got %lld, %lld and %lld)",
                            (long long)base_v, (long long)opt_v, (long long)v4_params);
    /* v2 / v4 asked for: their rows; else the rows v3 took over from v1 */
    const int v2_rows = base_v == 2 || base_v == 4 || opt_v == 2 || opt_v == 4;
    fp_context *ctx = fb_ctx(run);
    shape_list sl;
    fp_dtype dts[3];
    const int ndt =
        v2_rows ? versions_setup(run, k_gpu_shapes_fwd_v4, (int)(sizeof k_gpu_shapes_fwd_v4 / sizeof k_gpu_shapes_fwd_v4[0]),
                                 &sl, dts)
                : versions_setup(run, k_gpu_shapes_fwd_versions,
                                 (int)(sizeof k_gpu_shapes_fwd_versions / sizeof k_gpu_shapes_fwd_versions[0]), &sl,
                                 dts);
    static const char *const names[] = {"fused", "rmsnorm_fused", "plain"};
    double copy_gbps = measure_copy_gbps(run);
    for (int si = 0; si < sl.n; ++si)
        for (int di = 0; di < ndt; ++di)
            for (int v = 0; v < 3; ++v) {
                const int64_t rows = sl.shapes[si][0], cols = sl.shapes[si][1];
                const fp_dtype dt = dts[di];
                const size_t n = (size_t)rows * (size_t)cols, es = fp_dtype_size(dt);
                fb_result *r = new_row(run, rows, cols, dt, names[v]);
                void *x = NULL, *res = NULL, *g = NULL, *b = NULL, *stats = NULL, *out[2] = {NULL, NULL},
                     *sum[2] = {NULL, NULL};
                fp_status st = fb_alloc_random(ctx, n, dt, 31, -2.0f, 3.0f, &x);
                if (st == FP_OK) st = fb_alloc_random(ctx, n, dt, 32, -1.0f, 1.0f, &res);
                if (st == FP_OK) st = fb_alloc_random(ctx, (size_t)cols, dt, 33, 0.5f, 1.5f, &g);
                if (st == FP_OK) st = fb_alloc_random(ctx, (size_t)cols, dt, 34, -0.5f, 0.5f, &b);
                if (st == FP_OK) st = fp_mem_alloc(ctx, 2 * (size_t)rows * sizeof(float), &stats);
                for (int k = 0; k < 2 && st == FP_OK; ++k) {
                    st = fp_mem_alloc(ctx, n * es, &out[k]);
                    if (st == FP_OK && v < 2) st = fp_mem_alloc(ctx, n * es, &sum[k]);
                }
                fp_ab_report rep;
                if (st == FP_OK) {
                    /* fused: residual + LayerNorm + bias + GELU, residual_out
                     * written; rmsnorm_fused: residual + RMSNorm + bias + SiLU;
                     * plain: LayerNorm with gamma, beta, mean and rstd */
                    fwd_version_job job[2];
                    const fp_norm_kind kind = v == 1 ? FP_NORM_RMSNORM : FP_NORM_LAYERNORM;
                    for (int k = 0; k < 2; ++k) {
                        fwd_params(kind, rows, cols, dt, x, &job[k].p);
                        job[k].p.gamma = g;
                        job[k].p.out = out[k];
                        if (v < 2) {
                            job[k].p.residual = res;
                            job[k].p.bias = b;
                            job[k].p.activation = v == 0 ? FP_NORM_ACT_GELU_ERF : FP_NORM_ACT_SILU;
                            job[k].p.residual_out = sum[k];
                        }
                        if (v != 1) job[k].p.beta = b;
                        if (v == 2) {
                            job[k].p.mean = (float *)stats;
                            job[k].p.rstd = (float *)stats + rows;
                        }
                        job[k].ctx = ctx;
                        job[k].version = (int)(k == 0 ? base_v : opt_v | (v4_params ? FP_NORM_VOPT_V4_PARAMS : 0));
                    }
                    fb_param_int(r, "baseline", base_v);
                    fb_param_int(r, "optimized", opt_v);
                    if (v4_params) fb_param_int(r, "v4_params", 1);
                    st = ab_jobs(run, fwd_version_job_run, &job[0], &job[1], out[0], out[1], n, dt,
                                 fp_norm_forward_bytes(&job[1].p), &rep);
                }
                report(r, st, &rep, copy_gbps);
                void *ptrs[] = {x, res, g, b, stats, out[0], out[1], sum[0], sum[1]};
                for (int k = 0; k < 9; ++k) fp_mem_free(ctx, ptrs[k]);
            }
    return FP_OK;
}

/* ---- backward kernel versions: v2 vs v3 ---- */

typedef struct bwd_version_job {
    fp_context *ctx;
    fp_norm_backward_params p;
    int version;
} bwd_version_job;

static fp_status bwd_version_job_run(void *user, fp_stream stream) {
    bwd_version_job *j = user;
    return fp_norm_backward_version(j->ctx, stream, &j->p, j->version);
}

static fp_status run_bwd_versions(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "CUDA only: compares CUDA kernel versions");
    const int64_t base_v = fb_opt_int(run, "baseline", 2), opt_v = fb_opt_int(run, "optimized", 3);
    const int64_t fused_reduce = fb_opt_int(run, "fused_reduce", 0);
    if (base_v < 1 || base_v > 4 || opt_v < 1 || opt_v > 4)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "--baseline and --optimized take a backward version 1-4 (got %lld and %lld)",
                            (long long)base_v, (long long)opt_v);
    if (fused_reduce != 0 && fused_reduce != 1)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "--fused_reduce takes 0 or 1 (got %lld)",
                            (long long)fused_reduce);
    fp_context *ctx = fb_ctx(run);
    shape_list sl;
    fp_dtype dts[3];
    const int ndt = versions_setup(run, k_gpu_shapes_bwd_versions,
                                   (int)(sizeof k_gpu_shapes_bwd_versions / sizeof k_gpu_shapes_bwd_versions[0]),
                                   &sl, dts);
    double copy_gbps = measure_copy_gbps(run);
    for (int si = 0; si < sl.n; ++si)
        for (int di = 0; di < ndt; ++di)
            for (int fused = 0; fused < 2; ++fused) {
                const int64_t rows = sl.shapes[si][0], cols = sl.shapes[si][1];
                const fp_dtype dt = dts[di];
                const fp_norm_kind kind = fused ? FP_NORM_RMSNORM : FP_NORM_LAYERNORM;
                const size_t n = (size_t)rows * (size_t)cols, es = fp_dtype_size(dt);
                fb_result *r = new_row(run, rows, cols, dt, fused ? "rmsnorm_fused" : "layernorm");
                void *out[2] = {NULL, NULL};
                bwd_bufs bb;
                fp_status st = bwd_bufs_alloc(ctx, rows, cols, dt, 21, fused, &bb);
                /* per side: [dx | dgamma | dbeta], 256-byte aligned pieces */
                const size_t tb = (n * es + 255) & ~(size_t)255, vb = ((size_t)cols * es + 255) & ~(size_t)255;
                for (int k = 0; k < 2 && st == FP_OK; ++k) {
                    st = fp_mem_alloc(ctx, tb + 2 * vb, &out[k]);
                    if (st == FP_OK) st = fp_mem_fill(ctx, out[k], 0xFF, tb + 2 * vb, NULL);
                }
                if (st == FP_OK) st = forward_stats(ctx, kind, rows, cols, dt, bb.x, bb.tmp, (float *)bb.stats);
                fp_ab_report rep;
                bwd_version_job job[2];
                if (st == FP_OK) {
                    for (int k = 0; k < 2; ++k) {
                        fp_norm_backward_params *p = &job[k].p;
                        bwd_bufs_params(&bb, kind, rows, cols, dt, p);
                        p->dx = out[k];
                        p->dgamma = (char *)out[k] + tb;
                        if (fused) {
                            p->activation = FP_NORM_ACT_SILU;
                            p->bias = bb.b;
                            p->dresidual_out = bb.dres;
                        } else {
                            p->beta = bb.b;
                            p->dbeta = (char *)out[k] + tb + vb;
                        }
                        job[k].ctx = ctx;
                        job[k].version =
                            (int)(k == 0 ? base_v : opt_v | (fused_reduce ? FP_NORM_VOPT_FUSED_REDUCE : 0));
                    }
                    fb_param_int(r, "fused_reduce", fused_reduce);
                    {
                        fp_norm_bwd_desc dd;
                        fb_param_int(r, "fused_ran",
                                     fp_norm_check_bwd(&job[1].p, &dd) == FP_OK &&
                                         fp_norm_bwd_fused_reduce_used(&dd, job[1].version));
                    }
                    fb_param_int(r, "v3", fp_norm_backward_version_used(&job[1].p, 3) == 3);
                    fb_param_int(r, "base_ran", fp_norm_backward_version_used(&job[0].p, (int)base_v));
                    fb_param_int(r, "opt_ran", fp_norm_backward_version_used(&job[1].p, (int)opt_v));
                    st = ab_jobs(run, bwd_version_job_run, &job[0], &job[1], out[0], out[1], n, dt,
                                 fp_norm_backward_bytes(&job[1].p), &rep);
                }
                report(r, st, &rep, copy_gbps);
                if (st == FP_OK) {
                    /* dgamma (and dbeta) sum rows in a different order: f32
                     * rounding differences only, at the dtype's tolerance;
                     * one version with and without the fused reduce: the
                     * same adds in the same order, so exactly. */
                    double atol, rtol;
                    fp_default_tolerance(dt, &atol, &rtol);
                    if (fused_reduce && base_v == opt_v) atol = rtol = 0.0;
                    size_t bad = 0;
                    for (int v = 0; v < (fused ? 1 : 2); ++v) {
                        fp_compare_result cr;
                        const size_t o = tb + (size_t)v * vb;
                        if (fp_compare(ctx, (char *)out[0] + o, (char *)out[1] + o, (size_t)cols, dt, 2.0 * atol,
                                       2.0 * rtol, &cr) == FP_OK)
                            bad += cr.mismatches;
                        else
                            fp_clear_error();
                    }
                    fb_result_metric(r, "dparam_mismatches", (double)bad);
                    if (bad)
                        fb_result_note(r, "dgamma/dbeta: %zu mismatches v%lld vs v%lld", bad, (long long)base_v,
                                       (long long)opt_v);
                }
                bwd_bufs_free(ctx, &bb);
                fp_mem_free(ctx, out[0]);
                fp_mem_free(ctx, out[1]);
            }
    return FP_OK;
}

/* ---- the kernels' other forms against each other (session 28) ---- */

/* Each row: one op on the same inputs twice, under two sets of the
 * FP_NORM_VOPT_* bits (version 0, the automatic kernel, with GELU (tanh) /
 * SiLU by tanhf / expf and an IEEE division: ACCURATE_ACT; LayerNorm's
 * statistics through two reductions: TWO_REDUCTIONS, today's default, or
 * one of the threads' moments: ONE_REDUCTION, session 28's), interleaved by
 * the timing engine, outputs compared at the dtype's tolerance (their
 * difference is the fast forms' error on this device). Rows, baseline ->
 * optimized:
 *   layernorm_fwd_fused      residual + LayerNorm + bias + GELU (tanh),
 *                            residual_out, stats: accurate GELU and two
 *                            reductions -> fast GELU and one (session 28's
 *                            change as a whole, as session 41 measured it)
 *   layernorm_fwd_fused_two  the same op: accurate GELU -> fast GELU, two
 *                            reductions on both sides (today's default)
 *   layernorm_fwd_plain      LayerNorm with gamma, beta, stats: two
 *                            reductions (the default) -> one
 *   rmsnorm_fwd_fused        residual + RMSNorm + bias + SiLU: the fast SiLU
 *   layernorm_bwd_fused      through GELU (tanh), bias, dresidual_out, dgamma /
 *                            dbeta: the fast GELU derivative, the activation's switch per vector
 *   rmsnorm_bwd_fused        through SiLU, dresidual_out, dgamma */
typedef struct kab_job {
    fp_context *ctx;
    int bwd, version;
    fp_norm_params fp;
    fp_norm_backward_params bp;
} kab_job;

static fp_status kab_job_run(void *user, fp_stream stream) {
    kab_job *j = user;
    return j->bwd ? fp_norm_backward_version(j->ctx, stream, &j->bp, j->version)
                  : fp_norm_forward_version(j->ctx, stream, &j->fp, j->version);
}

static const int64_t k_gpu_shapes_kernel_ab[][2] = {{16384, 4096}, {4096, 768}, {8192, 8192}};

typedef struct kab_variant {
    const char *name;
    fp_norm_kind kind;
    int bwd, fused;
    int base_bits, opt_bits;
} kab_variant;

static const kab_variant k_kab_variants[] = {
    {"layernorm_fwd_fused", FP_NORM_LAYERNORM, 0, 1, FP_NORM_VOPT_ACCURATE_ACT | FP_NORM_VOPT_TWO_REDUCTIONS,
     FP_NORM_VOPT_ONE_REDUCTION},
    {"layernorm_fwd_fused_two", FP_NORM_LAYERNORM, 0, 1, FP_NORM_VOPT_ACCURATE_ACT | FP_NORM_VOPT_TWO_REDUCTIONS, 0},
    {"layernorm_fwd_plain", FP_NORM_LAYERNORM, 0, 0, 0, FP_NORM_VOPT_ONE_REDUCTION},
    {"rmsnorm_fwd_fused", FP_NORM_RMSNORM, 0, 1, FP_NORM_VOPT_ACCURATE_ACT, 0},
    {"layernorm_bwd_fused", FP_NORM_LAYERNORM, 1, 1, FP_NORM_VOPT_ACCURATE_ACT, 0},
    {"rmsnorm_bwd_fused", FP_NORM_RMSNORM, 1, 1, FP_NORM_VOPT_ACCURATE_ACT, 0},
};

/* Forward params of a variant (fused: residual, bias and the activation)
 * over bb's inputs (x, dres as the residual, g, b) into out / sum / stats. */
static void kab_fwd_params(const kab_variant *kv, const bwd_bufs *bb, int64_t rows, int64_t cols, fp_dtype dt,
                           void *out, void *sum, fp_norm_params *p) {
    const fp_norm_kind kind = kv->kind;
    fwd_params(kind, rows, cols, dt, bb->x, p);
    p->gamma = bb->g;
    p->beta = kind == FP_NORM_LAYERNORM ? bb->b : NULL;
    p->mean = kind == FP_NORM_LAYERNORM ? (float *)bb->stats : NULL;
    p->rstd = (float *)bb->stats + rows;
    p->out = out;
    if (kv->fused) {
        p->residual = bb->dres;
        p->residual_out = sum;
        p->bias = bb->b;
        p->activation = kind == FP_NORM_LAYERNORM ? FP_NORM_ACT_GELU_TANH : FP_NORM_ACT_SILU;
    }
}

static fp_status run_kernel_ab(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "CUDA only: compares CUDA kernel forms");
    fp_context *ctx = fb_ctx(run);
    shape_list sl;
    fp_dtype dts[3];
    const int ndt = versions_setup(run, k_gpu_shapes_kernel_ab,
                                   (int)(sizeof k_gpu_shapes_kernel_ab / sizeof k_gpu_shapes_kernel_ab[0]), &sl,
                                   dts);
    double copy_gbps = measure_copy_gbps(run);
    for (int si = 0; si < sl.n; ++si)
        for (int di = 0; di < ndt; ++di)
            for (size_t v = 0; v < sizeof k_kab_variants / sizeof k_kab_variants[0]; ++v) {
                const kab_variant *kv = &k_kab_variants[v];
                const int64_t rows = sl.shapes[si][0], cols = sl.shapes[si][1];
                const fp_dtype dt = dts[di];
                const size_t n = (size_t)rows * (size_t)cols, es = fp_dtype_size(dt);
                const int bwd = kv->bwd;
                const fp_norm_kind kind = kv->kind;
                fb_result *r = new_row(run, rows, cols, dt, kv->name);
                bwd_bufs bb;
                void *out[2] = {NULL, NULL}, *sum[2] = {NULL, NULL}, *dpar[2] = {NULL, NULL};
                fp_status st = bwd_bufs_alloc(ctx, rows, cols, dt, 41, 1, &bb);
                for (int k = 0; k < 2 && st == FP_OK; ++k) {
                    st = fp_mem_alloc(ctx, n * es, &out[k]);
                    if (st == FP_OK && !bwd) st = fp_mem_alloc(ctx, n * es, &sum[k]);
                    if (st == FP_OK && bwd) st = fp_mem_alloc(ctx, 2 * (size_t)cols * es, &dpar[k]);
                }
                if (st == FP_OK && bwd) st = forward_stats(ctx, kind, rows, cols, dt, bb.x, bb.tmp, (float *)bb.stats);
                fp_ab_report rep;
                if (st == FP_OK) {
                    kab_job job[2];
                    for (int k = 0; k < 2; ++k) {
                        memset(&job[k], 0, sizeof job[k]);
                        job[k].ctx = ctx;
                        job[k].bwd = bwd;
                        job[k].version = k == 0 ? kv->base_bits : kv->opt_bits;
                        if (!bwd) {
                            kab_fwd_params(kv, &bb, rows, cols, dt, out[k], sum[k], &job[k].fp);
                        } else {
                            fp_norm_backward_params *p = &job[k].bp;
                            bwd_bufs_params(&bb, kind, rows, cols, dt, p);
                            p->dx = out[k];
                            p->dgamma = dpar[k];
                            p->activation = kind == FP_NORM_LAYERNORM ? FP_NORM_ACT_GELU_TANH : FP_NORM_ACT_SILU;
                            p->bias = bb.b;
                            p->dresidual_out = bb.dres;
                            if (kind == FP_NORM_LAYERNORM) {
                                p->beta = bb.b;
                                p->dbeta = (char *)dpar[k] + (size_t)cols * es;
                            }
                        }
                    }
                    st = ab_jobs(run, kab_job_run, &job[0], &job[1], out[0], out[1], n, dt,
                                 bwd ? fp_norm_backward_bytes(&job[1].bp) : fp_norm_forward_bytes(&job[1].fp), &rep);
                }
                report(r, st, &rep, copy_gbps);
                bwd_bufs_free(ctx, &bb);
                void *ptrs[] = {out[0], out[1], sum[0], sum[1], dpar[0], dpar[1]};
                for (int k = 0; k < 6; ++k) fp_mem_free(ctx, ptrs[k]);
                fb_rows_done(run);
            }
    return FP_OK;
}

static fp_status run_layernorm_fwd(fb_run *run) { return run_sweep(run, FP_NORM_LAYERNORM, fwd_cell); }
static fp_status run_rmsnorm_fwd(fb_run *run) { return run_sweep(run, FP_NORM_RMSNORM, fwd_cell); }
static fp_status run_layernorm_bwd(fb_run *run) { return run_sweep(run, FP_NORM_LAYERNORM, bwd_cell); }
static fp_status run_rmsnorm_bwd(fb_run *run) { return run_sweep(run, FP_NORM_RMSNORM, bwd_cell); }

FB_SCENARIO(norm_layernorm_fwd, "norm/layernorm_fwd",
            "LayerNorm forward: fused (residual, bias, GELU) vs unfused passes", run_layernorm_fwd)
FB_SCENARIO(norm_rmsnorm_fwd, "norm/rmsnorm_fwd",
            "RMSNorm forward: fused (residual, bias, SiLU) vs unfused passes", run_rmsnorm_fwd)
FB_SCENARIO(norm_layernorm_bwd, "norm/layernorm_bwd",
            "LayerNorm backward (dx, dgamma, dbeta; through GELU + residual) vs unfused", run_layernorm_bwd)
FB_SCENARIO(norm_rmsnorm_bwd, "norm/rmsnorm_bwd",
            "RMSNorm backward (dx, dgamma; through SiLU + residual) vs unfused", run_rmsnorm_bwd)
FB_SCENARIO(norm_fwd_versions, "norm/fwd_versions",
            "norm forward v1 vs the automatic kernel (v3: the row staged in shared memory) on rows past v2's "
            "registers; CUDA only",
            run_fwd_versions)
FB_SCENARIO(norm_kernel_ab, "norm/kernel_ab",
            "norm kernels' forms against each other (accurate vs fast GELU / SiLU, LayerNorm's two "
            "reductions vs one), interleaved, outputs compared; CUDA only",
            run_kernel_ab)
FB_SCENARIO(norm_bwd_versions, "norm/bwd_versions",
            "norm backward v2 (dx + separate dgamma/dbeta pass) vs v3 (one pass); CUDA only", run_bwd_versions)
