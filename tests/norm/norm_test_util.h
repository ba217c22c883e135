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

typedef struct norm_case {
    fp_norm_kind kind;
    fp_norm_activation act;
    fp_dtype dtype;
    int64_t rows, cols;
    int64_t pad;         /* extra elements per row: every stride = cols + pad */
    int offset;          /* elements added to every pointer (misalignment) */
    int res, res_out, gamma, beta, bias, stats;
    float lo, hi;        /* x range (default [-2, 3) if lo == hi) */
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
    void *h_gamma = c->gamma ? nt_random(dt, vn, seed + 2, 0.5f, 1.5f) : NULL;
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
#define OFF(ptr) ((ptr) ? (void *)((char *)(ptr) + (size_t)c->offset * es) : NULL)
    p.x = OFF(d_x);
    p.residual = OFF(d_res);
    p.gamma = OFF(d_gamma);
    p.beta = OFF(d_beta);
    p.bias = OFF(d_bias);
    p.out = OFF(d_out);
    p.residual_out = OFF(d_res_out);
    p.mean = d_mean;
    p.rstd = d_rstd;
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
    hp.x = OFF(h_x);
    hp.residual = OFF(h_res);
    hp.gamma = OFF(h_gamma);
    hp.beta = OFF(h_beta);
    hp.bias = OFF(h_bias);
    hp.out = OFF(r_out);
    hp.residual_out = OFF(r_res_out);
    hp.mean = r_mean;
    hp.rstd = r_rstd;
#undef OFF
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

/* ---- backward ---- */

typedef struct norm_bwd_case {
    fp_norm_kind kind;
    fp_norm_activation act;
    fp_dtype dtype;
    int64_t rows, cols, pad;
    int offset;
    int gamma, beta, bias, dres, dgamma, dbeta, dbias;
} norm_bwd_case;

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
    const size_t sn = (size_t)c->rows * sizeof(float);
    const size_t off = (size_t)c->offset * es;
    void *h_x = nt_random(dt, tn, seed, -2.0f, 3.0f);
    void *h_dy = nt_random(dt, tn, seed + 1, -1.0f, 1.0f);
    void *h_gamma = c->gamma ? nt_random(dt, vn, seed + 2, 0.5f, 1.5f) : NULL;
    void *h_beta = c->beta ? nt_random(dt, vn, seed + 3, -0.5f, 0.5f) : NULL;
    void *h_bias = c->bias ? nt_random(dt, vn, seed + 4, -0.3f, 0.3f) : NULL;
    void *h_dres = c->dres ? nt_random(dt, tn, seed + 5, -1.0f, 1.0f) : NULL;
    /* mean / rstd of x from the reference forward (as training would save). */
    float *h_mean = malloc(sn), *h_rstd = malloc(sn);
    {
        void *tmp = malloc(tn * es);
        fp_norm_params fp;
        fp_norm_params_default(&fp);
        fp.kind = c->kind;
        fp.rows = c->rows;
        fp.cols = c->cols;
        fp.x_dtype = fp.residual_dtype = fp.out_dtype = fp.param_dtype = dt;
        fp.x_stride = fp.out_stride = stride;
        fp.x = (char *)h_x + off;
        fp.out = (char *)tmp + off;
        fp.mean = h_mean;
        fp.rstd = h_rstd;
        fp_norm_fwd_desc fd;
        if (fp_norm_check_fwd(&fp, &fd) != FP_OK || fp_norm_ref_forward(&fd) != FP_OK) {
            fprintf(stderr, "[%s] reference forward: %s\n", desc, fp_last_error());
            exit(1);
        }
        free(tmp);
    }
    void *d_x = nt_upload(ctx, h_x, tn * es), *d_dy = nt_upload(ctx, h_dy, tn * es);
    void *d_gamma = h_gamma ? nt_upload(ctx, h_gamma, vn * es) : NULL;
    void *d_beta = h_beta ? nt_upload(ctx, h_beta, vn * es) : NULL;
    void *d_bias = h_bias ? nt_upload(ctx, h_bias, vn * es) : NULL;
    void *d_dres = h_dres ? nt_upload(ctx, h_dres, tn * es) : NULL;
    void *d_mean = nt_upload(ctx, h_mean, sn), *d_rstd = nt_upload(ctx, h_rstd, sn);
    void *d_dx = nt_poisoned(ctx, tn * es);
    void *d_dgamma = c->dgamma ? nt_poisoned(ctx, vn * es) : NULL;
    void *d_dbeta = c->dbeta ? nt_poisoned(ctx, vn * es) : NULL;
    void *d_dbias = c->dbias ? nt_poisoned(ctx, vn * es) : NULL;

    fp_norm_backward_params p;
    fp_norm_backward_params_default(&p);
    p.kind = c->kind;
    p.activation = c->act;
    p.rows = c->rows;
    p.cols = c->cols;
    p.dtype = p.param_dtype = dt;
    p.dout_stride = p.x_stride = p.dresidual_out_stride = p.dx_stride = stride;
#define OFF(ptr) ((ptr) ? (void *)((char *)(ptr) + off) : NULL)
    p.dout = OFF(d_dy);
    p.x = OFF(d_x);
    p.gamma = OFF(d_gamma);
    p.beta = OFF(d_beta);
    p.bias = OFF(d_bias);
    p.mean = d_mean;
    p.rstd = d_rstd;
    p.dresidual_out = OFF(d_dres);
    p.dx = OFF(d_dx);
    p.dgamma = OFF(d_dgamma);
    p.dbeta = OFF(d_dbeta);
    p.dbias = OFF(d_dbias);
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
    hp.dout = OFF(h_dy);
    hp.x = OFF(h_x);
    hp.gamma = OFF(h_gamma);
    hp.beta = OFF(h_beta);
    hp.bias = OFF(h_bias);
    hp.mean = h_mean;
    hp.rstd = h_rstd;
    hp.dresidual_out = OFF(h_dres);
    hp.dx = OFF(r_dx);
    hp.dgamma = c->dgamma ? OFF(r_dgamma) : NULL;
    hp.dbeta = c->dbeta ? OFF(r_dbeta) : NULL;
    hp.dbias = c->dbias ? OFF(r_dbias) : NULL;
#undef OFF
    fp_norm_bwd_desc rd;
    if (fp_norm_check_bwd(&hp, &rd) != FP_OK || fp_norm_ref_backward(&rd) != FP_OK) {
        fprintf(stderr, "[%s] reference backward failed: %s\n", desc, fp_last_error());
        fail = 1;
    }
    if (!fail) {
        double atol, rtol;
        fp_default_tolerance(dt, &atol, &rtol);
        /* dx = rstd * (dn - avg(dn) - n avg(dn n)): the f32 row sums carry
         * ~cols * 2^-24 relative error into a difference of O(1) terms. */
        double dx_atol = atol + 4.0 * (double)c->cols * 6e-8;
        fail |= nt_compare_tensor("dx", desc, r_dx, g_dx, dt, c->rows, c->cols, stride, c->offset, dx_atol, rtol);
        /* dgamma/dbeta sum rows terms of size <= ~4 in f32. */
        double p_atol = atol + 4.0 * (double)c->rows * 6e-8 * 4.0;
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
    void *frees_h[] = {h_x, h_dy, h_gamma, h_beta, h_bias, h_dres, h_mean, h_rstd, g_dx, g_dgamma, g_dbeta,
                       g_dbias, r_dx, r_dgamma, r_dbeta, r_dbias};
    for (size_t i = 0; i < sizeof frees_h / sizeof frees_h[0]; ++i) free(frees_h[i]);
    void *frees_d[] = {d_x, d_dy, d_gamma, d_beta, d_bias, d_dres, d_mean, d_rstd, d_dx, d_dgamma, d_dbeta, d_dbias};
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
                                norm_case c = {0};
                                c.kind = (fp_norm_kind)kind;
                                c.act = (fp_norm_activation)act;
                                c.dtype = dts[di];
                                c.rows = rows;
                                c.cols = cols;
                                c.pad = pad;
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
    fp_norm_params_default(&p);
    p.rows = rows;
    p.cols = cols;
    p.activation = act;
    p.x_dtype = p.residual_dtype = p.out_dtype = p.param_dtype = dt;
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

#endif /* NORM_TEST_UTIL_H */
