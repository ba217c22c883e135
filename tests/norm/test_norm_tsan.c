/* The CPU norm implementations (fused and unfused forward and backward) on a
 * 4-thread pool under ThreadSanitizer: rows are split over the workers and
 * each writes disjoint rows / chunk partials, which TSan checks. Results are
 * compared with the double reference. Host sources only (see CMakeLists). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "norm/norm_internal.h"

static int failures = 0;

static void fill(float *v, size_t n, unsigned seed, float lo, float hi) {
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; ++i) {
        s = s * 1664525u + 1013904223u;
        float x = lo + (hi - lo) * (float)(s >> 8) / 16777216.0f;
        v[i] = x == 0.0f ? 0.25f : x;
    }
}

static void compare(const char *what, const float *ref, const float *got, size_t n, double tol) {
    for (size_t i = 0; i < n; ++i) {
        if (!(fabs((double)ref[i] - (double)got[i]) <= tol * (1.0 + fabs((double)ref[i])))) {
            fprintf(stderr, "%s[%zu]: got %.8g ref %.8g\n", what, i, got[i], ref[i]);
            failures++;
            return;
        }
    }
}

int main(void) {
    fp_thread_pool *pool = NULL;
    if (fp_thread_pool_create(4, &pool) != FP_OK) return 1;
    const int64_t rows = 67, cols = 333;
    const size_t n = (size_t)(rows * cols);
    float *x = malloc(n * 4), *res = malloc(n * 4), *dy = malloc(n * 4), *dres = malloc(n * 4);
    float *out = malloc(n * 4), *ro = malloc(n * 4), *ref = malloc(n * 4), *ref_ro = malloc(n * 4);
    float g[333], b[333], bias[333], dg[333], db[333], rdg[333], rdb[333];
    float mean[67], rstd[67], rmean[67], rrstd[67];
    fill(x, n, 1, -2, 3);
    fill(res, n, 2, -1, 1);
    fill(dy, n, 3, -1, 1);
    fill(dres, n, 4, -1, 1);
    fill(g, 333, 5, 0.5f, 1.5f);
    fill(b, 333, 6, -0.5f, 0.5f);
    fill(bias, 333, 7, -0.2f, 0.2f);
    for (int kind = 0; kind < 2; ++kind)
        for (int unfused = 0; unfused < 2; ++unfused) {
            fp_norm_fwd_desc d = {0};
            d.kind = kind;
            d.act = FP_NORM_ACT_GELU_TANH;
            d.dtype = FP_F32;
            d.rows = rows;
            d.cols = cols;
            d.x_stride = d.res_stride = d.res_out_stride = d.out_stride = cols;
            d.x = x;
            d.res = res;
            d.gamma = g;
            d.beta = b;
            d.bias = bias;
            d.eps = 1e-5f;
            fp_norm_fwd_desc r = d;
            d.out = out;
            d.res_out = ro;
            d.mean = kind == 0 ? mean : NULL;
            d.rstd = rstd;
            r.out = ref;
            r.res_out = ref_ro;
            r.mean = kind == 0 ? rmean : NULL;
            r.rstd = rrstd;
            if ((unfused ? fp_norm_fwd_cpu_unfused(pool, &d) : fp_norm_fwd_cpu(pool, &d)) != FP_OK) failures++;
            fp_norm_ref_forward(&r);
            compare("out", ref, out, n, 1e-4);
            compare("residual_out", ref_ro, ro, n, 1e-6);
            compare("rstd", rrstd, rstd, (size_t)rows, 1e-5);

            fp_norm_bwd_desc bd = {0};
            bd.kind = kind;
            bd.act = FP_NORM_ACT_SILU;
            bd.dtype = FP_F32;
            bd.rows = rows;
            bd.cols = cols;
            bd.dout_stride = bd.x_stride = bd.dres_stride = bd.dx_stride = cols;
            bd.dout = dy;
            bd.x = ro;
            bd.gamma = g;
            bd.beta = b;
            bd.bias = bias;
            bd.mean = kind == 0 ? rmean : NULL;
            bd.rstd = rrstd;
            bd.dres = dres;
            fp_norm_bwd_desc rb = bd;
            bd.dx = out;
            bd.dgamma = dg;
            bd.dbeta = db;
            rb.dx = ref;
            rb.dgamma = rdg;
            rb.dbeta = rdb;
            if ((unfused ? fp_norm_bwd_cpu_unfused(pool, &bd) : fp_norm_bwd_cpu(pool, &bd)) != FP_OK) failures++;
            fp_norm_ref_backward(&rb);
            compare("dx", ref, out, n, 1e-4);
            compare("dgamma", rdg, dg, 333, 1e-4);
            compare("dbeta", rdb, db, 333, 1e-4);
        }
    fp_thread_pool_destroy(pool);
    free(x); free(res); free(dy); free(dres); free(out); free(ro); free(ref); free(ref_ro);
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
