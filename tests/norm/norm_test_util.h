/* Test harness shared by the CPU and GPU norm tests: builds random inputs
 * (never zeros) for one option combination, runs the op on a context (CPU or
 * CUDA: the fp_mem_* helpers make the code the same), runs the double
 * reference on the host copies, and compares every element written. Output
 * buffers are poisoned with 0xFF bytes (NaN in every dtype) before each run,
 * and the bytes the op must not write (stride gaps, leading offsets) are
 * checked to still hold the poison. */
#ifndef NORM_TEST_UTIL_H
#define NORM_TEST_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "fastpath/norm.h"
#include "fp_test.h"
#include "norm/norm_internal.h"

/* ptr advanced by off bytes; NULL stays NULL. */
#define NT_OFF(ptr, off) ((ptr) ? (void *)((char *)(ptr) + (off)) : NULL)

typedef struct norm_case {
    fp_norm_kind kind;
    fp_norm_activation act;
    fp_dtype dtype;
    int64_t rows, cols;
    int64_t pad;         /* extra elements per row: every stride = cols + pad */
    int offset;          /* elements added to every pointer (misalignment) */
    int res, res_out, gamma, beta, bias, stats;
    float lo, hi;        /* x range (default [-2, 3) if lo == hi) */
    float gamma_hi;      /* gamma in [0.5, gamma_hi) (1.5 if 0): 25 drives the
                            activation into its tails (|y| up to ~50) */
} norm_case;

static void nc_describe(const norm_case *c, char *buf, size_t n) {
    snprintf(buf, n, "%s act=%s %s %lldx%lld pad=%lld off=%d res=%d res_out=%d gamma=%d beta=%d bias=%d stats=%d",
             fp_norm_kind_name(c->kind), fp_norm_activation_name(c->act), fp_dtype_name(c->dtype),
             (long long)c->rows, (long long)c->cols, (long long)c->pad, c->offset, c->res, c->res_out,
             c->gamma, c->beta, c->bias, c->stats);
}

/* Random tensor of n elements in dtype (host), values in [lo, hi), never 0. */
static void *nt_random(fp_dtype dt, size_t n, uint64_t seed, float lo, float hi) {
    float *f = malloc(n * sizeof(float));
    void *h = malloc(n * fp_dtype_size(dt) + 16);
    fp_test_fill(f, n, seed, lo, hi);
    fp_convert_host(f, FP_F32, h, dt, n);
    free(f);
    return h;
}

/* ctx copy of a host buffer. */
static void *nt_upload(fp_context *ctx, const void *h, size_t bytes) {
    void *d = NULL;
    if (fp_mem_alloc(ctx, bytes, &d) != FP_OK) {
        fprintf(stderr, "fp_mem_alloc(%zu): %s\n", bytes, fp_last_error());
        exit(1);
    }
    fp_mem_upload(ctx, d, h, bytes, NULL);
    return d;
}
static void *nt_poisoned(fp_context *ctx, size_t bytes) {
    void *d = NULL;
    if (fp_mem_alloc(ctx, bytes, &d) != FP_OK) {
        fprintf(stderr, "fp_mem_alloc(%zu): %s\n", bytes, fp_last_error());
        exit(1);
    }
    fp_mem_fill(ctx, d, 0xFF, bytes, NULL);
    return d;
}
static void *nt_download(fp_context *ctx, const void *d, size_t bytes) {
    void *h = malloc(bytes);
    fp_mem_download(ctx, h, d, bytes, NULL);
    fp_context_synchronize(ctx, NULL);
    return h;
}

static int nt_all_ff(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != 0xFF) return 0;
    return 1;
}

/* Compares a [rows, cols] strided tensor (starting `offset` elements in)
 * element by element, and checks that everything else still holds poison.
 * Returns the number of failures (0 or 1) and prints the first ones. */
static int nt_compare_tensor(const char *what, const char *desc, const void *ref, const void *got,
                             fp_dtype dt, int64_t rows, int64_t cols, int64_t stride, int offset,
                             double atol, double rtol) {
    const size_t es = fp_dtype_size(dt);
    const unsigned char *g = got, *r = ref;
    if (!nt_all_ff(g, (size_t)offset * es)) {
        fprintf(stderr, "[%s] %s: bytes before the tensor were written\n", desc, what);
        return 1;
    }
    size_t bad_rows = 0;
    for (int64_t i = 0; i < rows; ++i) {
        size_t base = ((size_t)offset + (size_t)i * (size_t)stride) * es;
        fp_compare_result cr;
        fp_compare_host(r + base, g + base, (size_t)cols, dt, atol, rtol, &cr);
        if (!cr.passed) {
            if (bad_rows < 3)
                fprintf(stderr, "[%s] %s: row %lld: %zu/%lld mismatches, first col %zu got %.8g ref %.8g "
                        "(max abs err %.3g, atol %.3g rtol %.3g)\n", desc, what, (long long)i,
                        cr.mismatches, (long long)cols, cr.first_bad, cr.first_bad_got, cr.first_bad_ref,
                        cr.max_abs_err, cr.atol, cr.rtol);
            bad_rows++;
        }
        if (stride > cols && !nt_all_ff(g + base + (size_t)cols * es, (size_t)(stride - cols) * es)) {
            fprintf(stderr, "[%s] %s: row %lld: stride gap was written\n", desc, what, (long long)i);
            return 1;
        }
    }
    return bad_rows ? 1 : 0;
}

/* A forward case of kind, activation and dtype at rows x cols (stride
 * cols + pad); every option off, no offset. */
static norm_case nt_case_at(fp_norm_kind kind, fp_norm_activation act, fp_dtype dt, int64_t rows, int64_t cols,
                            int64_t pad) {
    norm_case c = {0};
    c.kind = kind;
    c.act = act;
    c.dtype = dt;
    c.rows = rows;
    c.cols = cols;
    c.pad = pad;
    return c;
}

/* Forward params (defaults otherwise): activation, shape and every dtype dt. */
static void nt_fwd_params(fp_norm_params *p, fp_dtype dt, int64_t rows, int64_t cols, fp_norm_activation act) {
    fp_norm_params_default(p);
    p->activation = act;
    p->rows = rows;
    p->cols = cols;
    p->x_dtype = p->residual_dtype = p->out_dtype = p->param_dtype = dt;
}

/* Points p's tensors at the given buffers, each `off` bytes in (NULL stays
 * NULL); mean and rstd as given. */
static void nt_fwd_set_ptrs(fp_norm_params *p, size_t off, void *x, void *res, void *gamma, void *beta, void *bias,
                            void *out, void *res_out, float *mean, float *rstd) {
    p->x = NT_OFF(x, off);
    p->residual = NT_OFF(res, off);
    p->gamma = NT_OFF(gamma, off);
    p->beta = NT_OFF(beta, off);
    p->bias = NT_OFF(bias, off);
    p->out = NT_OFF(out, off);
    p->residual_out = NT_OFF(res_out, off);
    p->mean = mean;
    p->rstd = rstd;
}

/* Runs one forward case on ctx. version < 0: the public fp_norm_forward;
 * >= 0: fp_norm_fwd_launch(desc, version) directly (CUDA contexts only).
 * Returns 1 on failure. */
static int nt_run_fwd(fp_context *ctx, const norm_case *c, uint64_t seed, int version) {
    char desc[256];
    nc_describe(c, desc, sizeof desc);
    const fp_dtype dt = c->dtype;
    const size_t es = fp_dtype_size(dt);
    const int64_t stride = c->cols + c->pad;
    const size_t tn = (size_t)c->rows * (size_t)stride + (size_t)c->offset; /* elements */
    const size_t vn = (size_t)c->cols + (size_t)c->offset;
    const float lo = c->lo != c->hi ? c->lo : -2.0f, hi = c->lo != c->hi ? c->hi : 3.0f;
    void *h_x = nt_random(dt, tn, seed, lo, hi);
    void *h_res = c->res ? nt_random(dt, tn, seed + 1, -1.0f, 1.0f) : NULL;
    void *h_gamma = c->gamma ? nt_random(dt, vn, seed + 2, 0.5f, c->gamma_hi > 0.0f ? c->gamma_hi : 1.5f) : NULL;
    void *h_beta = c->beta ? nt_random(dt, vn, seed + 3, -0.5f, 0.5f) : NULL;
    void *h_bias = c->bias ? nt_random(dt, vn, seed + 4, -0.3f, 0.3f) : NULL;

    void *d_x = nt_upload(ctx, h_x, tn * es);
    void *d_res = h_res ? nt_upload(ctx, h_res, tn * es) : NULL;
    void *d_gamma = h_gamma ? nt_upload(ctx, h_gamma, vn * es) : NULL;
    void *d_beta = h_beta ? nt_upload(ctx, h_beta, vn * es) : NULL;
    void *d_bias = h_bias ? nt_upload(ctx, h_bias, vn * es) : NULL;
    void *d_out = nt_poisoned(ctx, tn * es);
    void *d_res_out = c->res_out ? nt_poisoned(ctx, tn * es) : NULL;
    const size_t sn = (size_t)c->rows * sizeof(float);
    float *d_mean = c->stats ? nt_poisoned(ctx, sn) : NULL;
    float *d_rstd = c->stats ? nt_poisoned(ctx, sn) : NULL;

    fp_norm_params p;
    fp_norm_params_default(&p);
    p.kind = c->kind;
    p.activation = c->act;
    p.rows = c->rows;
    p.cols = c->cols;
    p.x_dtype = p.residual_dtype = p.out_dtype = p.param_dtype = dt;
    p.x_stride = p.residual_stride = p.residual_out_stride = p.out_stride = stride;
    const size_t off = (size_t)c->offset * es;
    nt_fwd_set_ptrs(&p, off, d_x, d_res, d_gamma, d_beta, d_bias, d_out, d_res_out, d_mean, d_rstd);
    p.eps = 1e-5f;
    int fail = 0;
    fp_status st;
    if (version < 0) {
        st = fp_norm_forward(ctx, NULL, &p);
    } else {
        fp_norm_fwd_desc d;
        st = fp_norm_check_fwd(&p, &d);
        if (st == FP_OK && fp_norm_fwd_launch(&d, version, (cudaStream_t)fp_context_stream(ctx)) != cudaSuccess)
            st = FP_ERR_CUDA;
    }
    if (st != FP_OK) {
        fprintf(stderr, "[%s] forward failed: %s (%s)\n", desc, fp_status_string(st), fp_last_error());
        fail = 1;
    }
    st = fp_context_synchronize(ctx, NULL);
    if (st != FP_OK) {
        fprintf(stderr, "[%s] synchronize failed: %s\n", desc, fp_last_error());
        fail = 1;
    }
    void *g_out = nt_download(ctx, d_out, tn * es);
    void *g_res_out = d_res_out ? nt_download(ctx, d_res_out, tn * es) : NULL;
    float *g_mean = d_mean ? nt_download(ctx, d_mean, sn) : NULL;
    float *g_rstd = d_rstd ? nt_download(ctx, d_rstd, sn) : NULL;

    /* Reference on the host copies, into poisoned host buffers. */
    void *r_out = malloc(tn * es), *r_res_out = c->res_out ? malloc(tn * es) : NULL;
    float *r_mean = c->stats ? malloc(sn) : NULL, *r_rstd = c->stats ? malloc(sn) : NULL;
    memset(r_out, 0xFF, tn * es);
    if (r_res_out) memset(r_res_out, 0xFF, tn * es);
    if (r_mean) memset(r_mean, 0xFF, sn);
    if (r_rstd) memset(r_rstd, 0xFF, sn);
    fp_norm_params hp = p;
    nt_fwd_set_ptrs(&hp, off, h_x, h_res, h_gamma, h_beta, h_bias, r_out, r_res_out, r_mean, r_rstd);
    fp_norm_fwd_desc rd;
    if (fp_norm_check_fwd(&hp, &rd) != FP_OK || fp_norm_ref_forward(&rd) != FP_OK) {
        fprintf(stderr, "[%s] reference failed: %s\n", desc, fp_last_error());
        fail = 1;
    }
    if (!fail) {
        double atol, rtol;
        fp_default_tolerance(dt, &atol, &rtol);
        fail |= nt_compare_tensor("out", desc, r_out, g_out, dt, c->rows, c->cols, stride, c->offset, atol, rtol);
        if (c->res_out)
            fail |= nt_compare_tensor("residual_out", desc, r_res_out, g_res_out, dt, c->rows, c->cols, stride,
                                      c->offset, atol, rtol);
        if (c->stats) {
            /* RMSNorm leaves mean untouched: both still hold the poison. */
            if (c->kind == FP_NORM_LAYERNORM)
                fail |= nt_compare_tensor("mean", desc, r_mean, g_mean, FP_F32, 1, c->rows, c->rows, 0,
                                          1e-5, 1e-4);
            else if (!nt_all_ff((const unsigned char *)g_mean, sn)) {
                fprintf(stderr, "[%s] RMSNorm wrote mean\n", desc);
                fail = 1;
            }
            fail |= nt_compare_tensor("rstd", desc, r_rstd, g_rstd, FP_F32, 1, c->rows, c->rows, 0, 1e-5, 1e-4);
        }
    }
    void *frees_h[] = {h_x, h_res, h_gamma, h_beta, h_bias, g_out, g_res_out, g_mean, g_rstd,
                       r_out, r_res_out, r_mean, r_rstd};
    for (size_t i = 0; i < sizeof frees_h / sizeof frees_h[0]; ++i) free(frees_h[i]);
    void *frees_d[] = {d_x, d_res, d_gamma, d_beta, d_bias, d_out, d_res_out, d_mean, d_rstd};
    for (size_t i = 0; i < sizeof frees_d / sizeof frees_d[0]; ++i) fp_mem_free(ctx, frees_d[i]);
    if (fail) fp_test_failures++;
    return fail;
}

/* At each {rows, cols, pad} shape, per kind and dtype (f32, f16, bf16), with
 * seeds seed, seed + 1, ...: every option on (activation ln_act for
 * LayerNorm, SiLU for RMSNorm), then residual, residual_out, bias and the
 * activation off. */
static void nt_fwd_shapes(fp_context *ctx, const int64_t (*shapes)[3], size_t nshapes, fp_norm_activation ln_act,
                          uint64_t seed) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    for (size_t s = 0; s < nshapes; ++s)
        for (int kind = 0; kind < 2; ++kind)
            for (int di = 0; di < 3; ++di) {
                norm_case c = nt_case_at((fp_norm_kind)kind, kind ? FP_NORM_ACT_SILU : ln_act, dts[di], shapes[s][0],
                                         shapes[s][1], shapes[s][2]);
                c.res = c.res_out = c.gamma = c.beta = c.bias = c.stats = 1;
                nt_run_fwd(ctx, &c, seed++, -1);
                c.res = c.res_out = c.bias = 0;
                c.act = FP_NORM_ACT_NONE;
                nt_run_fwd(ctx, &c, seed++, -1);
            }
}

/* A large mean over a small spread (LayerNorm f32 8 x 4096, x in
 * [9999, 10001), gamma and stats): the two-pass variance keeps the digits. */
static norm_case nt_large_mean_case(void) {
    norm_case c = {0};
    c.kind = FP_NORM_LAYERNORM;
    c.dtype = FP_F32;
    c.rows = 8;
    c.cols = 4096;
    c.lo = 9999.0f;
    c.hi = 10001.0f;
    c.stats = 1;
    c.gamma = 1;
    return c;
}

/* ---- backward ---- */

typedef struct norm_bwd_case {
    fp_norm_kind kind;
    fp_norm_activation act;
    fp_dtype dtype;
    int64_t rows, cols, pad;
    int offset;
    int gamma, beta, bias, dres, dgamma, dbeta, dbias;
    float gamma_hi; /* as norm_case's */
} norm_bwd_case;

/* A backward case at rows x cols (stride cols + pad, `offset` elements in)
 * with option set opt (0..3): bit 0 gamma, beta, bias and dbeta; bit 1
 * dresidual_out; dgamma unless opt == 2; dbias when opt == 3. */
static norm_bwd_case nt_bwd_case_opt(fp_norm_kind kind, fp_norm_activation act, fp_dtype dt, int64_t rows,
                                     int64_t cols, int64_t pad, int offset, int opt) {
    norm_bwd_case c = {0};
    c.kind = kind;
    c.act = act;
    c.dtype = dt;
    c.rows = rows;
    c.cols = cols;
    c.pad = pad;
    c.offset = offset;
    c.gamma = c.beta = c.bias = opt & 1;
    c.dres = (opt >> 1) & 1;
    c.dgamma = opt != 2;
    c.dbeta = opt & 1;
    c.dbias = opt == 3;
    return c;
}

/* The inputs of one backward case: random x, dout (seeds seed, seed + 1),
 * gamma, beta, bias, dresidual_out (seed + 2 .. seed + 5) as c selects, on
 * the host (tn elements per tensor, vn per vector; the tensors start `off`
 * bytes in), mean / rstd of x from the reference forward (as training would
 * save them), and device copies of all. */
typedef struct nt_bwd_case_data {
    void *h_x, *h_dy, *h_gamma, *h_beta, *h_bias, *h_dres;
    float *h_mean, *h_rstd;
    void *d_x, *d_dy, *d_gamma, *d_beta, *d_bias, *d_dres, *d_mean, *d_rstd;
} nt_bwd_case_data;

static void nt_bwd_case_data_make(fp_context *ctx, const norm_bwd_case *c, uint64_t seed, size_t tn, size_t vn,
                                  size_t off, const char *desc, nt_bwd_case_data *in) {
    const fp_dtype dt = c->dtype;
    const size_t es = fp_dtype_size(dt);
    const size_t sn = (size_t)c->rows * sizeof(float);
    in->h_x = nt_random(dt, tn, seed, -2.0f, 3.0f);
    in->h_dy = nt_random(dt, tn, seed + 1, -1.0f, 1.0f);
    in->h_gamma = c->gamma ? nt_random(dt, vn, seed + 2, 0.5f, c->gamma_hi > 0.0f ? c->gamma_hi : 1.5f) : NULL;
    in->h_beta = c->beta ? nt_random(dt, vn, seed + 3, -0.5f, 0.5f) : NULL;
    in->h_bias = c->bias ? nt_random(dt, vn, seed + 4, -0.3f, 0.3f) : NULL;
    in->h_dres = c->dres ? nt_random(dt, tn, seed + 5, -1.0f, 1.0f) : NULL;
    in->h_mean = malloc(sn);
    in->h_rstd = malloc(sn);
    {
        void *tmp = malloc(tn * es);
        fp_norm_params fp;
        fp_norm_params_default(&fp);
        fp.kind = c->kind;
        fp.rows = c->rows;
        fp.cols = c->cols;
        fp.x_dtype = fp.residual_dtype = fp.out_dtype = fp.param_dtype = dt;
        fp.x_stride = fp.out_stride = c->cols + c->pad;
        fp.x = (char *)in->h_x + off;
        fp.out = (char *)tmp + off;
        fp.mean = in->h_mean;
        fp.rstd = in->h_rstd;
        fp_norm_fwd_desc fd;
        if (fp_norm_check_fwd(&fp, &fd) != FP_OK || fp_norm_ref_forward(&fd) != FP_OK) {
            fprintf(stderr, "[%s] reference forward: %s\n", desc, fp_last_error());
            exit(1);
        }
        free(tmp);
    }
    in->d_x = nt_upload(ctx, in->h_x, tn * es);
    in->d_dy = nt_upload(ctx, in->h_dy, tn * es);
    in->d_gamma = in->h_gamma ? nt_upload(ctx, in->h_gamma, vn * es) : NULL;
    in->d_beta = in->h_beta ? nt_upload(ctx, in->h_beta, vn * es) : NULL;
    in->d_bias = in->h_bias ? nt_upload(ctx, in->h_bias, vn * es) : NULL;
    in->d_dres = in->h_dres ? nt_upload(ctx, in->h_dres, tn * es) : NULL;
    in->d_mean = nt_upload(ctx, in->h_mean, sn);
    in->d_rstd = nt_upload(ctx, in->h_rstd, sn);
}

/* Points p's inputs at the given buffers, each tensor `off` bytes in (NULL
 * stays NULL); mean and rstd as given. */
static void nt_bwd_set_inputs(fp_norm_backward_params *p, size_t off, void *dy, void *x, void *gamma, void *beta,
                              void *bias, const float *mean, const float *rstd, void *dres) {
    p->dout = NT_OFF(dy, off);
    p->x = NT_OFF(x, off);
    p->gamma = NT_OFF(gamma, off);
    p->beta = NT_OFF(beta, off);
    p->bias = NT_OFF(bias, off);
    p->mean = mean;
    p->rstd = rstd;
    p->dresidual_out = NT_OFF(dres, off);
}

/* Backward params of case c over the device inputs (`off` bytes in, every
 * stride = stride); the outputs (dx, dgamma, dbeta, dbias) are left NULL. */
static void nt_bwd_case_data_params(const norm_bwd_case *c, const nt_bwd_case_data *in, int64_t stride, size_t off,
                                    fp_norm_backward_params *p) {
    fp_norm_backward_params_default(p);
    p->kind = c->kind;
    p->activation = c->act;
    p->rows = c->rows;
    p->cols = c->cols;
    p->dtype = p->param_dtype = c->dtype;
    p->dout_stride = p->x_stride = p->dresidual_out_stride = p->dx_stride = stride;
    nt_bwd_set_inputs(p, off, in->d_dy, in->d_x, in->d_gamma, in->d_beta, in->d_bias, in->d_mean, in->d_rstd,
                      in->d_dres);
}

/* Points p's inputs at the host copies (for the reference backward). */
static void nt_bwd_case_data_host(const nt_bwd_case_data *in, size_t off, fp_norm_backward_params *p) {
    nt_bwd_set_inputs(p, off, in->h_dy, in->h_x, in->h_gamma, in->h_beta, in->h_bias, in->h_mean, in->h_rstd,
                      in->h_dres);
}

static void nt_bwd_case_data_free(fp_context *ctx, nt_bwd_case_data *in) {
    void *hs[] = {in->h_x, in->h_dy, in->h_gamma, in->h_beta, in->h_bias, in->h_dres, in->h_mean, in->h_rstd};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; ++i) free(hs[i]);
    void *ds[] = {in->d_x, in->d_dy, in->d_gamma, in->d_beta, in->d_bias, in->d_dres, in->d_mean, in->d_rstd};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; ++i) fp_mem_free(ctx, ds[i]);
}

/* The reference backward of hp (host pointers): 1 (with a message) when it
 * fails. */
static int nt_ref_bwd(const fp_norm_backward_params *hp, const char *desc) {
    fp_norm_bwd_desc rd;
    if (fp_norm_check_bwd(hp, &rd) != FP_OK || fp_norm_ref_backward(&rd) != FP_OK) {
        fprintf(stderr, "[%s] reference backward failed: %s\n", desc, fp_last_error());
        return 1;
    }
    return 0;
}

/* Tolerances of case c's backward outputs. dx = rstd * (dn - avg(dn) -
 * n avg(dn n)): the f32 row sums carry ~cols * 2^-24 relative error into a
 * difference of O(1) terms; dgamma/dbeta sum rows terms of size <= ~4 in
 * f32. */
static void nt_bwd_tolerance(const norm_bwd_case *c, double *dx_atol, double *p_atol, double *rtol) {
    double atol;
    fp_default_tolerance(c->dtype, &atol, rtol);
    *dx_atol = atol + 4.0 * (double)c->cols * 6e-8;
    *p_atol = atol + 4.0 * (double)c->rows * 6e-8 * 4.0;
}

static int nt_run_bwd(fp_context *ctx, const norm_bwd_case *c, uint64_t seed) {
    char desc[256];
    snprintf(desc, sizeof desc, "bwd %s act=%s %s %lldx%lld pad=%lld off=%d gamma=%d beta=%d bias=%d dres=%d "
             "dgamma=%d dbeta=%d dbias=%d", fp_norm_kind_name(c->kind), fp_norm_activation_name(c->act),
             fp_dtype_name(c->dtype), (long long)c->rows, (long long)c->cols, (long long)c->pad, c->offset,
             c->gamma, c->beta, c->bias, c->dres, c->dgamma, c->dbeta, c->dbias);
    const fp_dtype dt = c->dtype;
    const size_t es = fp_dtype_size(dt);
    const int64_t stride = c->cols + c->pad;
    const size_t tn = (size_t)c->rows * (size_t)stride + (size_t)c->offset;
    const size_t vn = (size_t)c->cols + (size_t)c->offset;
    const size_t off = (size_t)c->offset * es;
    nt_bwd_case_data in;
    nt_bwd_case_data_make(ctx, c, seed, tn, vn, off, desc, &in);
    void *d_dx = nt_poisoned(ctx, tn * es);
    void *d_dgamma = c->dgamma ? nt_poisoned(ctx, vn * es) : NULL;
    void *d_dbeta = c->dbeta ? nt_poisoned(ctx, vn * es) : NULL;
    void *d_dbias = c->dbias ? nt_poisoned(ctx, vn * es) : NULL;

    fp_norm_backward_params p;
    nt_bwd_case_data_params(c, &in, stride, off, &p);
    p.dx = NT_OFF(d_dx, off);
    p.dgamma = NT_OFF(d_dgamma, off);
    p.dbeta = NT_OFF(d_dbeta, off);
    p.dbias = NT_OFF(d_dbias, off);
    int fail = 0;
    fp_status st = fp_norm_backward(ctx, NULL, &p);
    if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
    if (st != FP_OK) {
        fprintf(stderr, "[%s] backward failed: %s (%s)\n", desc, fp_status_string(st), fp_last_error());
        fail = 1;
    }
    void *g_dx = nt_download(ctx, d_dx, tn * es);
    void *g_dgamma = d_dgamma ? nt_download(ctx, d_dgamma, vn * es) : NULL;
    void *g_dbeta = d_dbeta ? nt_download(ctx, d_dbeta, vn * es) : NULL;
    void *g_dbias = d_dbias ? nt_download(ctx, d_dbias, vn * es) : NULL;

    void *r_dx = malloc(tn * es), *r_dgamma = malloc(vn * es), *r_dbeta = malloc(vn * es),
         *r_dbias = malloc(vn * es);
    memset(r_dx, 0xFF, tn * es);
    memset(r_dgamma, 0xFF, vn * es);
    memset(r_dbeta, 0xFF, vn * es);
    memset(r_dbias, 0xFF, vn * es);
    fp_norm_backward_params hp = p;
    nt_bwd_case_data_host(&in, off, &hp);
    hp.dx = NT_OFF(r_dx, off);
    hp.dgamma = c->dgamma ? NT_OFF(r_dgamma, off) : NULL;
    hp.dbeta = c->dbeta ? NT_OFF(r_dbeta, off) : NULL;
    hp.dbias = c->dbias ? NT_OFF(r_dbias, off) : NULL;
    fail |= nt_ref_bwd(&hp, desc);
    if (!fail) {
        double dx_atol, p_atol, rtol;
        nt_bwd_tolerance(c, &dx_atol, &p_atol, &rtol);
        fail |= nt_compare_tensor("dx", desc, r_dx, g_dx, dt, c->rows, c->cols, stride, c->offset, dx_atol, rtol);
        if (c->dgamma)
            fail |= nt_compare_tensor("dgamma", desc, r_dgamma, g_dgamma, dt, 1, c->cols, c->cols, c->offset,
                                      p_atol, rtol);
        if (c->dbeta)
            fail |= nt_compare_tensor("dbeta", desc, r_dbeta, g_dbeta, dt, 1, c->cols, c->cols, c->offset,
                                      p_atol, rtol);
        if (c->dbias)
            fail |= nt_compare_tensor("dbias", desc, r_dbias, g_dbias, dt, 1, c->cols, c->cols, c->offset,
                                      p_atol, rtol);
    }
    void *frees_h[] = {g_dx, g_dgamma, g_dbeta, g_dbias, r_dx, r_dgamma, r_dbeta, r_dbias};
    for (size_t i = 0; i < sizeof frees_h / sizeof frees_h[0]; ++i) free(frees_h[i]);
    nt_bwd_case_data_free(ctx, &in);
    void *frees_d[] = {d_dx, d_dgamma, d_dbeta, d_dbias};
    for (size_t i = 0; i < sizeof frees_d / sizeof frees_d[0]; ++i) fp_mem_free(ctx, frees_d[i]);
    if (fail) fp_test_failures++;
    return fail;
}

/* Every option combination of the forward at one shape. Returns failures. */
static int nt_fwd_all_combos(fp_context *ctx, int64_t rows, int64_t cols, int64_t pad, int offset,
                             int version, uint64_t seed) {
    int fails = 0;
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    for (int kind = 0; kind < 2; ++kind)
        for (int res = 0; res < 2; ++res)
            for (int aff = 0; aff < 3; ++aff) /* none, gamma, gamma+beta */
                for (int bias = 0; bias < 2; ++bias)
                    for (int act = 0; act <= FP_NORM_ACT_SILU; ++act)
                        for (int di = 0; di < 3; ++di)
                            for (int stats = 0; stats < 2; ++stats) {
                                norm_case c = nt_case_at((fp_norm_kind)kind, (fp_norm_activation)act, dts[di],
                                                         rows, cols, pad);
                                c.offset = offset;
                                c.res = res;
                                /* residual_out with a residual; once a while without. */
                                c.res_out = res || (stats && act == 1);
                                c.gamma = aff >= 1;
                                c.beta = aff >= 2;
                                c.bias = bias;
                                c.stats = stats;
                                fails += nt_run_fwd(ctx, &c, seed++, version);
                                if (fails > 10) return fails;
                            }
    return fails;
}

/* out aliasing x and residual_out aliasing residual (documented as allowed)
 * must give the same bytes as separate buffers. */
static void nt_in_place(fp_context *ctx, fp_dtype dt, int64_t rows, int64_t cols, fp_norm_activation act) {
    const size_t es = fp_dtype_size(dt), n = (size_t)(rows * cols), bytes = n * es;
    void *hx = nt_random(dt, n, 41, -1, 2), *hr = nt_random(dt, n, 42, -1, 1);
    void *x = nt_upload(ctx, hx, bytes), *r = nt_upload(ctx, hr, bytes);
    void *x2 = nt_upload(ctx, hx, bytes), *r2 = nt_upload(ctx, hr, bytes);
    void *out = nt_poisoned(ctx, bytes), *ro = nt_poisoned(ctx, bytes);
    fp_norm_params p;
    nt_fwd_params(&p, dt, rows, cols, act);
    p.x = x;
    p.residual = r;
    p.out = out;
    p.residual_out = ro;
    CHECK_OK(fp_norm_forward(ctx, NULL, &p));
    p.x = x2;
    p.residual = r2;
    p.out = x2;
    p.residual_out = r2;
    CHECK_OK(fp_norm_forward(ctx, NULL, &p));
    void *a = nt_download(ctx, out, bytes), *b = nt_download(ctx, x2, bytes);
    void *c = nt_download(ctx, ro, bytes), *d = nt_download(ctx, r2, bytes);
    CHECK_MSG(memcmp(a, b, bytes) == 0, "in-place out differs (%s %lldx%lld)", fp_dtype_name(dt), (long long)rows,
              (long long)cols);
    CHECK_MSG(memcmp(c, d, bytes) == 0, "in-place residual_out differs (%s %lldx%lld)", fp_dtype_name(dt),
              (long long)rows, (long long)cols);
    void *hs[] = {hx, hr, a, b, c, d};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; ++i) free(hs[i]);
    void *ds[] = {x, r, x2, r2, out, ro};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; ++i) fp_mem_free(ctx, ds[i]);
}

/* The inputs of a backward on rows x cols of dtype dt, random on the host
 * (x, dout, dresidual_out, gamma, beta: seeds seed .. seed + 4) with fixed
 * per-row mean and rstd, and their device copies. */
typedef struct {
    void *hx, *hdy, *hdr, *hg, *hb;
    float *hm, *hr;
    void *x, *dy, *dr, *g, *b, *m, *rs;
} nt_bwd_inputs;

static void nt_bwd_inputs_make(fp_context *ctx, fp_dtype dt, int64_t rows, int64_t cols, uint64_t seed,
                               nt_bwd_inputs *in) {
    const size_t es = fp_dtype_size(dt), n = (size_t)(rows * cols), sn = (size_t)rows * sizeof(float);
    in->hx = nt_random(dt, n, seed, -2, 3);
    in->hdy = nt_random(dt, n, seed + 1, -1, 1);
    in->hdr = nt_random(dt, n, seed + 2, -1, 1);
    in->hg = nt_random(dt, (size_t)cols, seed + 3, 0.5f, 1.5f);
    in->hb = nt_random(dt, (size_t)cols, seed + 4, -0.5f, 0.5f);
    in->hm = malloc(sn);
    in->hr = malloc(sn);
    for (int64_t r = 0; r < rows; ++r) {
        in->hm[r] = 0.5f + 0.001f * (float)(r % 7);
        in->hr[r] = 0.8f + 0.01f * (float)(r % 5);
    }
    in->x = nt_upload(ctx, in->hx, n * es);
    in->dy = nt_upload(ctx, in->hdy, n * es);
    in->dr = nt_upload(ctx, in->hdr, n * es);
    in->g = nt_upload(ctx, in->hg, (size_t)cols * es);
    in->b = nt_upload(ctx, in->hb, (size_t)cols * es);
    in->m = nt_upload(ctx, in->hm, sn);
    in->rs = nt_upload(ctx, in->hr, sn);
}

/* Backward params (defaults otherwise) over in: activation, shape, dtype and
 * param_dtype dt, dout, x, gamma, beta, mean, rstd. */
static void nt_bwd_inputs_params(const nt_bwd_inputs *in, fp_dtype dt, int64_t rows, int64_t cols,
                                 fp_norm_activation act, fp_norm_backward_params *p) {
    fp_norm_backward_params_default(p);
    p->activation = act;
    p->rows = rows;
    p->cols = cols;
    p->dtype = p->param_dtype = dt;
    p->dout = in->dy;
    p->x = in->x;
    p->gamma = in->g;
    p->beta = in->b;
    p->mean = in->m;
    p->rstd = in->rs;
}

static void nt_bwd_inputs_free(fp_context *ctx, nt_bwd_inputs *in) {
    void *hs[] = {in->hx, in->hdy, in->hdr, in->hg, in->hb, in->hm, in->hr};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; ++i) free(hs[i]);
    void *ds[] = {in->x, in->dy, in->dr, in->g, in->b, in->m, in->rs};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; ++i) fp_mem_free(ctx, ds[i]);
}

/* fp_norm_backward_validate on one configuration: the unfused baseline and
 * the fused backward must agree. Prints the timing when verbose. */
static void nt_bwd_validate(fp_context *ctx, fp_norm_kind kind, fp_norm_activation act, fp_dtype dt, int64_t rows,
                            int64_t cols, int with_dres, const fp_timing_config *cfg, int verbose) {
    const size_t es = fp_dtype_size(dt);
    nt_bwd_inputs in;
    nt_bwd_inputs_make(ctx, dt, rows, cols, 31, &in);
    void *g = in.g, *b = in.b;
    fp_norm_backward_params p;
    nt_bwd_inputs_params(&in, dt, rows, cols, act, &p);
    p.kind = kind;
    p.bias = b;
    p.dresidual_out = with_dres ? in.dr : NULL;
    p.dx = NULL;
    /* Non-NULL dgamma/dbeta select what is computed; validate writes only
     * its scratch, so pointing them at gamma/beta checks that too. */
    p.dgamma = g;
    p.dbeta = b;
    fp_ab_report rep;
    void *hg_before = nt_download(ctx, g, (size_t)cols * es);
    CHECK_OK(fp_norm_backward_validate(ctx, NULL, &p, cfg, &rep));
    CHECK_MSG(rep.compared && rep.agreement.passed, "bwd validate %s %s %s %lldx%lld: %zu mismatches (max abs %g)",
              fp_norm_kind_name(kind), fp_norm_activation_name(act), fp_dtype_name(dt), (long long)rows,
              (long long)cols, rep.agreement.mismatches, rep.agreement.max_abs_err);
    void *hg_after = nt_download(ctx, g, (size_t)cols * es);
    CHECK(memcmp(hg_before, hg_after, (size_t)cols * es) == 0);
    if (verbose)
        printf("bwd validate %s %s %lldx%lld %s: unfused %.4f ms fused %.4f ms speedup %.2fx %s, %.0f GB/s\n",
               fp_norm_kind_name(kind), fp_norm_activation_name(act), (long long)rows, (long long)cols,
               fp_dtype_name(dt), rep.baseline.median_ms, rep.optimized.median_ms, rep.speedup,
               fp_verdict_string(rep.verdict), rep.achieved_gbps);
    free(hg_before);
    free(hg_after);
    nt_bwd_inputs_free(ctx, &in);
}

/* Per dtype (f32, f16, bf16), nt_bwd_validate of LayerNorm + GELU (tanh)
 * with dresidual_out at ln_rows x ln_cols and of RMSNorm without an
 * activation or dresidual_out at rms_rows x rms_cols. */
static void nt_bwd_validate_dtypes(fp_context *ctx, int64_t ln_rows, int64_t ln_cols, int64_t rms_rows,
                                   int64_t rms_cols, const fp_timing_config *cfg, int verbose) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    for (int di = 0; di < 3; ++di) {
        nt_bwd_validate(ctx, FP_NORM_LAYERNORM, FP_NORM_ACT_GELU_TANH, dts[di], ln_rows, ln_cols, 1, cfg, verbose);
        nt_bwd_validate(ctx, FP_NORM_RMSNORM, FP_NORM_ACT_NONE, dts[di], rms_rows, rms_cols, 0, cfg, verbose);
    }
}

#endif /* NORM_TEST_UTIL_H */
